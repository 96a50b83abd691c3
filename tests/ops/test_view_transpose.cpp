// view, transpose, permute, select and rename: free for tensors, correct for formulas.
#include "support.hpp"

#include <xtensor/xmanipulation.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xview.hpp>

#include <dimsum/evaluation/layout.hpp>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 12>;
using Heads = ds::axis<"heads", 3>;
using Head = ds::axis<"head", 4>;

TEST_CASE("view and transpose of a tensor are views of the same memory") {
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{5});
    ds::fill_uniform(x, 1);
    auto split = ds::view<Batch, Seq, Heads, Head>(x);
    STATIC_REQUIRE(std::is_same_v<decltype(split), ds::tensor_view<float, Batch, Seq, Heads, Head>>);
    REQUIRE(split.data() == x.data());
    auto heads_first = ds::transpose<Seq, Heads>(split);
    STATIC_REQUIRE(std::is_same_v<decltype(heads_first), ds::tensor_view<float, Batch, Heads, Seq, Head>>);
    REQUIRE(heads_first.data() == x.data());
    REQUIRE(heads_first.strides() == std::array<std::ptrdiff_t, 4>{60, 4, 12, 1});
    REQUIRE(heads_first(1, 2, 3, 1) == x(1, 3, 2 * 4 + 1));

    // Writing through a view writes the tensor.
    ds::transpose(ds::view<Batch, Seq, Heads, Head>(x))(0, 0, 1, 2) = 42.0f;  // (batch, seq, head, heads)
    REQUIRE(x(0, 0, 2 * 4 + 1) == 42.0f);

    const auto& constant = x;
    auto read_only = ds::transpose(constant);
    STATIC_REQUIRE(std::is_same_v<decltype(read_only), ds::tensor_view<const float, Batch, Model, Seq>>);
}

TEST_CASE("permute by position and by name against xtensor") {
    ds::tensor<double, Batch, Seq, Model> x(Batch{3}, Seq{7});
    ds::fill_uniform(x, 2);
    auto xx = test::to_xt(x);
    test::require_close(ds::permute<2, 0, 1>(x), xt::transpose(xx, {2, 0, 1}), 0, 0);
    test::require_close(ds::permute<Model, Batch, Seq>(x), xt::transpose(xx, {2, 0, 1}), 0, 0);
    test::require_close(ds::transpose(x), xt::transpose(xx, {0, 2, 1}), 0, 0);
    // Of a formula: a lazy node the evaluator reads through strides.
    test::require_close(ds::eval(ds::permute<1, 2, 0>(x * 2.0)), xt::transpose(xt::xarray<double>(2.0 * xx), {1, 2, 0}), 0, 0);
}

TEST_CASE("views of formulas and of strided views, copy-free where the layout allows") {
    ds::tensor<double, Batch, Seq, Model> x(Batch{2}, Seq{7});
    ds::fill_uniform(x, 3);
    auto xx = test::to_xt(x);
    xt::xarray<double> split = xt::reshape_view(xx, {2, 7, 3, 4});
    test::require_close(ds::eval(ds::view<Batch, Seq, Heads, Head>(x + 0.0)), split, 0, 0);

    // (batch, heads, seq, head) back to (batch, seq, model): needs a copy, which the evaluator makes.
    auto heads_first = ds::transpose<Seq, Heads>(ds::view<Batch, Seq, Heads, Head>(x));
    auto merged = ds::eval(ds::view<Batch, Seq, Model>(ds::transpose<Heads, Seq>(heads_first)));
    test::require_close(merged, xx, 0, 0);
    auto flattened = ds::eval(ds::view<ds::axis<"flat">>(heads_first));
    xt::xarray<double> want = xt::flatten(xt::xarray<double>(xt::transpose(split, {0, 2, 1, 3})));
    test::require_close(flattened, want, 0, 0);
}

TEST_CASE("the copy-free reshape test agrees with what a copy gives") {
    namespace ev = dimsum::evaluation;
    const ev::extents_t extents{2, 3, 4};
    const ev::layout contiguous{3, extents, {12, 4, 1}}, transposed{3, extents, {1, 2, 6}}, padded{3, extents, {24, 8, 1}};
    // Merging the last two axes of a row-major array: copy-free.
    auto merged = ev::reshape(contiguous, 2, {2, 12});
    REQUIRE(merged);
    REQUIRE(merged->strides[0] == 12);
    REQUIRE(merged->strides[1] == 1);
    // Merging axes that are not laid out together: needs a copy.
    REQUIRE(!ev::reshape(transposed, 2, {6, 4}));
    // Padded rows still split and merge within a row.
    auto within = ev::reshape(padded, 4, {2, 3, 2, 2});
    REQUIRE(within);
    REQUIRE(within->strides == ev::strides_t{24, 8, 2, 1});
    // Rows padded to 8: merging the batch with the rows is free, a row with the padding is not.
    auto rows = ev::reshape(padded, 2, {6, 4});
    REQUIRE(rows);
    REQUIRE(rows->strides[0] == 8);
    REQUIRE(!ev::reshape(padded, 2, {2, 12}));
    // Extents of 1 constrain nothing.
    REQUIRE(ev::reshape(ev::layout{2, {1, 5}, {999, 3}}, 2, {5, 1}));
}

TEST_CASE("select takes one slice along a named axis") {
    using Part = ds::axis<"part", 3>;
    ds::tensor<float, Seq, Part, Model> qkv(Seq{5});
    ds::fill_uniform(qkv, 4);
    auto xq = test::to_xt(qkv);
    for (std::size_t part = 0; part < 3; ++part) {
        auto slice = ds::select<Part>(qkv, part);
        STATIC_REQUIRE(std::is_same_v<decltype(slice), ds::tensor_view<float, Seq, Model>>);
        xt::xarray<double> want = xt::view(xq, xt::all(), part, xt::all());
        test::require_close(slice, want, 0, 0);
        test::require_close(ds::eval(ds::select<Part>(qkv * 1.0f, part)), want, 0, 0);
    }
    REQUIRE(test::error_of([&] { ds::select<Part>(qkv, 3); }) == "dimsum: index 3 out of range for axis part=3");
}

TEST_CASE("rename gives an axis another name, at no cost") {
    using Key = ds::axis<"key">;
    ds::tensor<float, Seq, Model> k(Seq{5});
    auto keys = ds::rename<Seq, Key>(k);
    STATIC_REQUIRE(std::is_same_v<decltype(keys), ds::tensor_view<float, Key, Model>>);
    REQUIRE(keys.data() == k.data());
    REQUIRE(keys.extent(0) == 5);
}

TEST_CASE("unsqueeze inserts an extent-1 axis, squeeze removes one, views of tensors, nodes of formulas") {
    using Group = ds::axis<"group">;
    ds::tensor<double, Batch, Seq, Model> x(Batch{2}, Seq{3});
    ds::fill_uniform(x, 12);
    const auto xx = test::to_xt(x);
    auto grouped = ds::unsqueeze<Group, 1>(x);  // (batch, group=1, seq, model)
    STATIC_REQUIRE(std::is_same_v<decltype(grouped), ds::tensor_view<double, Batch, ds::axis<"group", 1>, Seq, Model>>);
    REQUIRE(grouped.data() == x.data());
    REQUIRE(grouped.is_contiguous());
    REQUIRE(grouped(1, 0, 2, 11) == x(1, 2, 11));
    auto last = ds::unsqueeze<Group, 3>(x);  // after the last axis
    REQUIRE(last.is_contiguous());
    REQUIRE(last(1, 2, 11, 0) == x(1, 2, 11));

    auto formula = ds::unsqueeze<Group, 0>(x * 2.0);  // a node: (group=1, batch, seq, model)
    for (const auto& got : {ds::eval(formula, ds::backend::cpu::evaluator{}), ds::eval(formula, ds::backend::reference::evaluator{})}) {
        test::require_close(got, xt::expand_dims(xx * 2.0, 0), 0, 0);
    }
    // it broadcasts by name against an axis of any extent
    ds::tensor<double, Batch, Group, Seq, Model> four(Batch{2}, Group{4}, Seq{3});
    ds::fill_uniform(four, 13);
    test::require_close(ds::eval(four - grouped), test::to_xt(four) - xt::expand_dims(xx, 1), 1e-15, 0);

    auto back = ds::squeeze<Group>(grouped);
    STATIC_REQUIRE(std::is_same_v<decltype(back), ds::tensor_view<double, Batch, Seq, Model>>);
    REQUIRE(back.data() == x.data());
    test::require_close(ds::eval(ds::squeeze<Group>(formula)), xx * 2.0, 0, 0);
    ds::tensor<double, Batch, Seq, Model> one_seq(Batch{2}, Seq{1});
    REQUIRE(ds::squeeze<Seq>(one_seq).shape().extent(0) == 2);
    REQUIRE(test::error_of([&] { ds::squeeze<Seq>(x); }) == "dimsum: squeeze: seq=3 is not of extent 1");
}
