// Run-time shape errors: each names the operation, the axes and both extents, and leaves
// everything as it was.
#include "support.hpp"

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Key = ds::axis<"key">;
using Model = ds::axis<"model", 8>;

TEST_CASE("matmul: a shared run-time axis that differs") {
    ds::tensor<float, Seq, Key> weights(Seq{4}, Key{5});
    ds::tensor<float, Key, Model> values(Key{6});
    REQUIRE(test::error_of([&] { ds::matmul(weights, values); }) ==
            "dimsum: matmul: contracted axes differ: key=5 vs key=6 in (seq=4, key=5) x (key=6, model=8)");
}

TEST_CASE("matmul: batch axes that do not broadcast") {
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{3});
    ds::tensor<float, Batch, Model, Key> w(Batch{3}, Key{4});
    REQUIRE(test::error_of([&] { ds::matmul(x, w); }) ==
            "dimsum: matmul batch axes: cannot broadcast batch=2 with batch=3 in (batch=2) and (batch=3)");
}

TEST_CASE("elementwise: run-time extents that neither match nor are 1") {
    ds::tensor<double, Batch, Seq> a(Batch{2}, Seq{3}), b(Batch{2}, Seq{4});
    REQUIRE(test::error_of([&] { a + b; }) ==
            "dimsum: add: cannot broadcast seq=3 with seq=4 in (batch=2, seq=3) and (batch=2, seq=4)");
    ds::tensor<double, Seq, Seq> scores(Seq{4}, Seq{4});
    REQUIRE(test::error_of([&] { ds::where(ds::causal_mask(Seq{3}, Seq{3}), scores, 0.0); }) ==
            "dimsum: where: cannot broadcast seq=3 with seq=4 in (seq=3, seq=3) and (seq=4, seq=4)");
}

TEST_CASE("view: sizes that do not multiply out at run time") {
    using Heads = ds::axis<"heads", 3>;
    using Head = ds::axis<"head">;
    ds::tensor<float, Seq, Model> x(Seq{5});
    auto ok = ds::view<Seq, ds::axis<"heads", 2>, ds::axis<"head", 4>>(x);
    REQUIRE(ok.extent(2) == 4);
    REQUIRE(test::error_of([&] { ds::view<Seq, Heads, Head>(x); }) ==
            "dimsum: view: sizes do not multiply out: (seq=5, model=8) has 40 elements, (seq=?, heads=3, head=?) "
            "would have a multiple of 15");
}

TEST_CASE("a failed assignment leaves the destination as it was") {
    ds::tensor<float, Seq, Model> x(Seq{3});
    ds::fill_uniform(x, 1);
    auto before = x;
    ds::tensor<float, Seq, Model> y(Seq{4}), z(Seq{5});
    REQUIRE_THROWS_AS(x = y + z, ds::shape_error);
    REQUIRE(std::equal(x.data(), x.data() + x.size(), before.data()));
    auto view = x.view();
    REQUIRE_THROWS_AS(view = y, ds::shape_error);
    REQUIRE(std::equal(x.data(), x.data() + x.size(), before.data()));
}

TEST_CASE("a causal mask or an axis given a wrong static extent") {
    REQUIRE(test::error_of([] { ds::causal_mask(Seq{3}, Model{7}); }) == "dimsum: axis model has extent 8, not 7");
}
