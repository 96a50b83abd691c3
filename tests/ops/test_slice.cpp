// slice, split and chunk: views of tensors and views (zero-copy, writable), nodes of
// formulas on both backends against xtensor, static extents where the bounds are static,
// and one clear error for each mistake.
#include "support.hpp"

#include <xtensor/xview.hpp>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 12>;
using Out = ds::axis<"out", 5>;

namespace {

// x[begin:end:step] along one axis of a 2-D or 3-D xtensor array.
xt::xarray<double> xt_slice(const xt::xarray<double>& a, std::size_t axis, std::size_t begin, std::size_t end,
                            std::size_t step) {
    auto range = xt::range(static_cast<long>(begin), static_cast<long>(end), static_cast<long>(step));
    if (a.dimension() == 2) return axis == 0 ? xt::xarray<double>(xt::view(a, range, xt::all())) : xt::view(a, xt::all(), range);
    if (axis == 0) return xt::view(a, range, xt::all(), xt::all());
    return axis == 1 ? xt::xarray<double>(xt::view(a, xt::all(), range, xt::all())) : xt::view(a, xt::all(), xt::all(), range);
}

template <class Formula>
void require_both_backends(const Formula& f, const xt::xarray<double>& want, double rtol = 1e-12) {
    test::require_close(ds::eval(f, ds::backend::cpu::evaluator{}), want, rtol, 1e-12);
    test::require_close(ds::eval(f, ds::backend::reference::evaluator{}), want, rtol, 1e-12);
}

}  // namespace

TEST_CASE("a slice of a tensor is a writable view of the same memory") {
    ds::tensor<float, Seq, Model> x(Seq{10});
    ds::fill_uniform(x, 1);
    auto every_third = ds::slice<Seq>(x, 2, 10, 3);  // positions 2, 5, 8
    STATIC_REQUIRE(std::is_same_v<decltype(every_third), ds::tensor_view<float, Seq, Model>>);
    REQUIRE(every_third.shape().extent(0) == 3);
    REQUIRE(every_third.data() == &x(2, 0));
    REQUIRE(every_third.strides() == ds::strides_t<2>{36, 1});
    REQUIRE(every_third(2, 7) == x(8, 7));

    every_third = every_third * 0.0f - 1.0f;  // writes positions 2, 5 and 8 only
    for (std::size_t s = 0; s < 10; ++s) REQUIRE((x(s, 3) == -1.0f) == (s % 3 == 2));

    // Static bounds keep a static extent; a slice of a const tensor reads only.
    const auto& constant = x;
    auto middle = ds::slice<Model, 4, 10, 2>(constant);
    STATIC_REQUIRE(std::is_same_v<decltype(middle), ds::tensor_view<const float, Seq, ds::axis<"model", 3>>>);
    REQUIRE(middle(9, 2) == x(9, 8));

    // Empty slices, at either end.
    REQUIRE(ds::slice<Seq>(x, 10, 10).size() == 0);
    REQUIRE(ds::slice<Seq>(x, 0, 0).size() == 0);
}

TEST_CASE("slices of views, of slices and of formulas, on both backends, against xtensor") {
    ds::tensor<double, Batch, Seq, Model> x(Batch{3}, Seq{17});
    ds::fill_uniform(x, 2);
    ds::tensor<double, Model, Out> w;
    ds::fill_uniform(w, 3);
    const auto xx = test::to_xt(x);
    for (std::size_t step : {1, 2, 3}) {
        for (auto [begin, end] : {std::pair<std::size_t, std::size_t>{0, 17}, {1, 16}, {5, 6}, {16, 17}, {7, 7}}) {
            INFO("seq " << begin << ":" << end << ":" << step);
            auto want = xt_slice(xx, 1, begin, end, step);
            test::require_close(ds::slice<Seq>(x, begin, end, step), want, 0, 0);
            require_both_backends(ds::slice<Seq>(x * 2.0 + 1.0, begin, end, step), want * 2.0 + 1.0);
            // a slice of a transposed view, and a slice of a slice
            auto transposed = ds::transpose<Seq, Model>(x);  // (batch, model, seq)
            test::require_close(ds::slice<Seq>(transposed, begin, end, step), xt::transpose(want, {0, 2, 1}), 0, 0);
            test::require_close(ds::slice<Seq>(ds::slice<Seq>(x, 0, 17, 1), begin, end, step), want, 0, 0);
            // a product of a slice, and a slice of a product
            auto product_of_slice = ds::matmul(ds::slice<Seq>(x, begin, end, step), w);
            auto slice_of_product = ds::slice<Seq>(ds::matmul(x, w), begin, end, step);
            xt::xarray<double> want_product = xt::zeros<double>({3ul, want.shape()[1], 5ul});
            for (std::size_t b = 0; b < 3; ++b)
                for (std::size_t s = 0; s < want.shape()[1]; ++s)
                    for (std::size_t o = 0; o < 5; ++o)
                        for (std::size_t m = 0; m < 12; ++m) want_product(b, s, o) += want(b, s, m) * w(m, o);
            require_both_backends(product_of_slice, want_product);
            require_both_backends(slice_of_product, want_product);
        }
    }
    // Along the last axis, static bounds, in a formula.
    require_both_backends(ds::exp(ds::slice<Model, 3, 12, 4>(x)), xt::exp(xt_slice(xx, 2, 3, 12, 4)));
}

TEST_CASE("attention to the first positions of a cache reads slices in place") {
    using Heads = ds::axis<"heads", 2>;
    using Query = ds::axis<"query">;
    using Key = ds::axis<"key">;
    using Head = ds::axis<"head", 8>;
    ds::tensor<float, Batch, Heads, Key, Head> k_cache(Batch{2}, Heads{}, Key{40}, Head{}), v_cache = k_cache;
    ds::tensor<float, Batch, Heads, Query, Head> q(Batch{2}, Heads{}, Query{1}, Head{});
    ds::fill_normal(k_cache, 4);
    ds::fill_normal(v_cache, 5);
    ds::fill_normal(q, 6);
    for (std::size_t t : {0, 1, 16, 39}) {
        INFO("step " << t);
        auto k = ds::slice<Key>(k_cache, 0, t + 1), v = ds::slice<Key>(v_cache, 0, t + 1);
        ds::tensor<float, Batch, Heads, Key, Head> k_copy = k, v_copy = v;  // the same values, contiguous
        auto want = test::to_xt(ds::eval(ds::nn::attention(q, k_copy, v_copy)));
        test::require_close(ds::eval(ds::nn::attention(q, k, v)), want, 1e-6, 1e-7);
        REQUIRE(ds::explain(ds::nn::attention(q, k, v)).find("[fused") != std::string::npos);
    }
}

TEST_CASE("assigning a slice of a tensor to an overlapping slice of it is a shift") {
    ds::tensor<double, Seq, Model> x(Seq{9});
    ds::fill_uniform(x, 7);
    auto before = test::to_xt(x);
    ds::slice<Seq>(x, 0, 8) = ds::slice<Seq>(x, 1, 9);  // reads what it writes: through a temporary
    test::require_close(ds::slice<Seq>(x, 0, 8), xt_slice(before, 0, 1, 9, 1), 0, 0);
}

TEST_CASE("split and chunk give views, static chunks where the axis allows") {
    ds::tensor<float, Seq, Model> x(Seq{10});
    ds::fill_uniform(x, 8);
    auto [head, middle, tail] = ds::split<Seq>(x, 3, 0, 7);
    REQUIRE(head.shape().extent(0) == 3);
    REQUIRE(middle.size() == 0);
    REQUIRE(tail.data() == &x(3, 0));
    REQUIRE(tail(6, 11) == x(9, 11));

    auto quarters = ds::chunk<Seq, 4>(x);  // 3, 3, 3, 1, as torch.chunk
    REQUIRE(quarters[3].shape().extent(0) == 1);
    REQUIRE(quarters[2].data() == &x(6, 0));
    auto thirds = ds::chunk<Model, 3>(x);  // model=12: three static (model=4) views
    STATIC_REQUIRE(std::is_same_v<decltype(thirds), std::array<ds::tensor_view<float, Seq, ds::axis<"model", 4>>, 3>>);
    REQUIRE(thirds[2](9, 3) == x(9, 11));
    auto many = ds::chunk<Seq, 4>(ds::slice<Seq>(x, 0, 2));  // more chunks than positions: empty ones at the end
    REQUIRE(many[1].shape().extent(0) == 1);
    REQUIRE(many[3].size() == 0);
}

TEST_CASE("a slice outside its axis, a step of 0 and sizes that do not add up are shape_errors") {
    ds::tensor<float, Seq, Model> x(Seq{10});
    REQUIRE(test::error_of([&] { ds::slice<Seq>(x, 3, 11); }) == "dimsum: slice: [3, 11) does not lie within seq=10");
    REQUIRE(test::error_of([&] { ds::slice<Seq>(x, 5, 4); }) == "dimsum: slice: [5, 4) does not lie within seq=10");
    REQUIRE(test::error_of([&] { ds::slice<Seq>(x + 1.0f, 0, 4, 0); }) == "dimsum: slice: a step of 0 along seq=10");
    REQUIRE(test::error_of([&] { ds::slice<Seq, 8, 12>(x); }) == "dimsum: slice: [8, 12) does not lie within seq=10");
    REQUIRE(test::error_of([&] { ds::split<Seq>(x, 3, 4); }) == "dimsum: split: the sizes add up to 7, not to seq=10");
}
