// Run-time shape errors: each names the operation, the axes and both extents (and the line
// that built the operation, where a named function built it), and leaves everything as it was.
#include "support.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

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

namespace {

// What f throws: the message, and the site the shape_error names (empty if none).
template <class F>
std::pair<std::string, std::optional<ds::call_site>> thrown_by(F&& f) {
    try {
        f();
    } catch (const ds::shape_error& e) {
        return {e.what(), e.site()};
    }
    return {"", std::nullopt};
}

std::string at_line(unsigned line) { return " (at " + std::string(__FILE__) + ":" + std::to_string(line) + ")"; }

}  // namespace

TEST_CASE("a run-time shape_error names the file and line of the call that built the failing operation") {
    using Heads = ds::axis<"heads", 2>;
    using Head = ds::axis<"head", 4>;
    ds::tensor<float, Seq, Key> weights(Seq{4}, Key{5});
    ds::tensor<float, Key, Model> values(Key{6});

    const unsigned matmul_line = __LINE__ + 1;
    auto [what, site] = thrown_by([&] { (void)ds::matmul(weights, values); });
    REQUIRE(site);
    CHECK(site->line() == matmul_line);
    CHECK(std::string_view(site->file_name()) == __FILE__);
    CHECK(what == "dimsum: matmul: contracted axes differ: key=5 vs key=6 in (seq=4, key=5) x (key=6, model=8)" +
                      at_line(matmul_line));

    // Inside nn's functions and layers: the user's line, not one in dimsum's headers.
    ds::tensor<float, Heads, Seq, Head> q(Seq{3}), k(Seq{5}), v(Seq{6});
    const unsigned attention_line = __LINE__ + 1;
    std::tie(what, site) = thrown_by([&] { (void)ds::nn::attention(q, k, v); });
    REQUIRE(site);
    CHECK(site->line() == attention_line);
    CHECK(what.ends_with(at_line(attention_line)));

    ds::nn::kv_cache<float, Batch, Heads, Seq, Head> cache(2, 8);
    ds::tensor<float, Batch, Heads, Seq, Head> step(Batch{2}, Seq{1}), other(Batch{2}, Seq{2});
    const unsigned append_line = __LINE__ + 1;
    std::tie(what, site) = thrown_by([&] { cache.append(step, other); });
    REQUIRE(site);
    CHECK(site->line() == append_line);

    // `tensor y = formula` and ds::assign name their own line.
    ds::tensor<float, Seq, Model> x(Seq{3}), y(Seq{4});
    const unsigned assign_line = __LINE__ + 1;
    std::tie(what, site) = thrown_by([&] { ds::assign(y, x * 2.0f); });
    REQUIRE(site);
    CHECK(site->line() == assign_line);

    // An operator cannot take a location: outside any named call, its error names none.
    std::tie(what, site) = thrown_by([&] { (void)(x + y); });
    CHECK(!site);
    CHECK(what == "dimsum: add: cannot broadcast seq=3 with seq=4 in (seq=3, model=8) and (seq=4, model=8)");
}
