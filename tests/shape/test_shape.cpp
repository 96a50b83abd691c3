// Shape algebra: axes, printing, broadcasting, matmul shapes, permutations, views.
#include "support.hpp"

#include <dimsum/shape/matmul_shape.hpp>
#include <dimsum/shape/permute.hpp>
#include <dimsum/shape/reshape.hpp>

namespace ds = dimsum;
namespace dd = dimsum::detail;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;
using Head = ds::axis<"head", 64>;

template <class S>
std::string text(const S& s) {
    std::ostringstream os;
    os << s;
    return os.str();
}

TEST_CASE("a shape stores only its run-time extents and prints with axis names") {
    ds::shape<Batch, Seq, Model> s(Batch{2}, Seq{10});
    STATIC_REQUIRE(sizeof(s) == 2 * sizeof(std::size_t));
    STATIC_REQUIRE(sizeof(ds::shape<Model, Heads>) == 1);  // nothing at run time
    REQUIRE(s.extents() == std::array<std::size_t, 3>{2, 10, 768});
    REQUIRE(s.size() == 2 * 10 * 768);
    REQUIRE(text(s) == "(batch=2, seq=10, model=768)");

    ds::message m;
    ds::write_static_shape<ds::shape<Batch, Seq, Model, ds::dim<5>, ds::dim<>>>(m);
    REQUIRE(m.view() == "(batch=?, seq=?, model=768, 5, ?)");
}

TEST_CASE("a static axis given another extent is a shape_error") {
    REQUIRE(test::error_of([] { Model{512}; }) == "dimsum: axis model has extent 768, not 512");
    REQUIRE(test::error_of([] { ds::shape<Seq, Model>::from_extents({3, 5}, "view"); }) ==
            "dimsum: view: axis model=768 given extent 5");
}

TEST_CASE("sizes that overflow are a shape_error, not a wrapped number") {
    using Huge = ds::axis<"huge">;
    ds::shape<Huge, Huge, Huge> s({std::size_t{1} << 30, std::size_t{1} << 30, std::size_t{1} << 30});
    REQUIRE_THROWS_AS(s.size(), ds::shape_error);
    REQUIRE(test::error_of([&] { s.size(); }).find("size overflows") != std::string::npos);
    REQUIRE_THROWS_AS((ds::tensor<float, Huge, Huge, Huge>(s)), ds::shape_error);
}

TEST_CASE("broadcasting aligns from the last axis and matches names") {
    using B = dd::broadcast<ds::shape<Batch, Seq, Model>, ds::shape<Model>>;
    STATIC_REQUIRE(std::is_same_v<B::type, ds::shape<Batch, Seq, Model>>);
    STATIC_REQUIRE(B::error("add").length == 0);

    // An unnamed or extent-1 axis broadcasts against anything of its position.
    using C = dd::broadcast<ds::shape<Seq, ds::dim<1>>, ds::shape<ds::dim<>, Model>>;
    STATIC_REQUIRE(std::is_same_v<C::type, ds::shape<Seq, Model>>);

    // Different names never broadcast, whatever the extents.
    using D = dd::broadcast<ds::shape<Seq, Heads>, ds::shape<Seq, ds::axis<"other", 12>>>;
    REQUIRE(D::error("add").view() ==
            "dimsum: add: cannot broadcast heads=12 with other=12 in (seq=?, heads=12) and (seq=?, other=12)");

    // Run-time extents: equal, or one of them 1.
    ds::shape<Seq, Model> a(Seq{4});
    ds::shape<Seq, Model> one(Seq{1});
    REQUIRE(dd::broadcast<ds::shape<Seq, Model>, ds::shape<Seq, Model>>::extents(a, one, "add").extent(0) == 4);
    ds::shape<Seq, Model> five(Seq{5});
    REQUIRE(test::error_of([&] {
                dd::broadcast<ds::shape<Seq, Model>, ds::shape<Seq, Model>>::extents(a, five, "add");
            }) == "dimsum: add: cannot broadcast seq=4 with seq=5 in (seq=4, model=768) and (seq=5, model=768)");
}

TEST_CASE("matmul contracts the last axis with the one before last and broadcasts batches") {
    using Q = ds::shape<Batch, Heads, Seq, Head>;
    using KT = ds::shape<Batch, Heads, Head, Seq>;
    using R = dd::matmul_shape<Q, KT>;
    STATIC_REQUIRE(dd::matmul_error<Q, KT>().length == 0);
    STATIC_REQUIRE(std::is_same_v<R::type, ds::shape<Batch, Heads, Seq, Seq>>);

    using W = ds::shape<Model, Model>;
    using X = ds::shape<Batch, Seq, Model>;
    STATIC_REQUIRE(std::is_same_v<dd::matmul_shape<X, W>::type, ds::shape<Batch, Seq, Model>>);

    REQUIRE(dd::matmul_error<X, ds::shape<Heads, Head>>().view() ==
            "dimsum: matmul: contracted axes differ: model=768 vs heads=12");
    REQUIRE(dd::matmul_error<ds::shape<Model>, W>().view() ==
            "dimsum: matmul: both operands need two or more axes: (model=768) x (model=768, model=768)");

    X x(Batch{2}, Seq{3});
    REQUIRE(R::type::rank == 4);
    auto out = dd::matmul_shape<X, W>::extents(x, W{});
    REQUIRE(out.extents() == std::array<std::size_t, 3>{2, 3, 768});
}

TEST_CASE("permutations by position and by name") {
    using S = ds::shape<Batch, Seq, Heads, Head>;
    constexpr auto swapped = dd::swap_named<S, Seq, Heads>();
    STATIC_REQUIRE(swapped.error.length == 0);
    STATIC_REQUIRE(std::is_same_v<dd::permute_t<S, swapped.order>, ds::shape<Batch, Heads, Seq, Head>>);

    constexpr auto last = dd::swap_last_two<S>();
    STATIC_REQUIRE(std::is_same_v<dd::permute_t<S, last.order>, ds::shape<Batch, Seq, Head, Heads>>);

    constexpr auto named = dd::order_by_name<S, Head, Batch, Heads, Seq>();
    STATIC_REQUIRE(named.order == std::array<std::size_t, 4>{3, 0, 2, 1});

    REQUIRE(dd::check_permutation<S, 4>("permute", {0, 1, 1, 3}).error.view() ==
            "dimsum: permute: (0, 1, 1, 3) is not a permutation of the axes of (batch=?, seq=?, heads=12, head=64)");
    REQUIRE(dd::swap_named<S, Seq, Model>().error.view() ==
            "dimsum: transpose: no axis named model in (batch=?, seq=?, heads=12, head=64)");
}

TEST_CASE("a view splits and merges axes, taking run-time extents by name") {
    using From = ds::shape<Batch, Seq, Model>;
    using To = ds::shape<Batch, Seq, Heads, Head>;
    STATIC_REQUIRE(dd::reshape_error<From, To>().length == 0);
    auto to = dd::reshape_extents<From, To>(From(Batch{2}, Seq{10}));
    REQUIRE(to.extents() == std::array<std::size_t, 4>{2, 10, 12, 64});

    // One run-time extent without a source axis of its name is inferred from the size.
    using Flat = ds::shape<ds::axis<"tokens">, Model>;
    auto flat = dd::reshape_extents<From, Flat>(From(Batch{2}, Seq{10}));
    REQUIRE(flat.extents() == std::array<std::size_t, 2>{20, 768});

    using Wrong = ds::shape<Batch, Seq, Heads, ds::axis<"head", 60>>;
    REQUIRE(dd::reshape_error<From, Wrong>().view() ==
            "dimsum: view: sizes do not multiply out: (batch=?, seq=?, model=768) has 768 elements per run-time "
            "index, (batch=?, seq=?, heads=12, head=60) has 720");

    using Two = ds::shape<ds::axis<"a">, ds::axis<"b">>;
    REQUIRE(dd::reshape_error<From, Two>().view() ==
            "dimsum: view: cannot infer more than one run-time extent of (a=?, b=?) from (batch=?, seq=?, model=768)");

    // Sizes checked at run time when only then known.
    using Seqs = ds::shape<ds::axis<"tokens">, ds::dim<7>>;
    REQUIRE(test::error_of([] { dd::reshape_extents<ds::shape<Seq>, Seqs>(ds::shape<Seq>(Seq{10})); }) ==
            "dimsum: view: sizes do not multiply out: (seq=10) has 10 elements, (tokens=?, 7) would have a "
            "multiple of 7");
}
