// interop/xtensor.hpp and interop/buffer.hpp: xtensor containers, xtensor strided views and
// plain buffers as dimsum views, and dimsum tensors as xtensor adaptors; the same memory
// either way, formulas over it against xtensor's own results, and one clear error per mistake.
#include "support.hpp"

#include <dimsum/interop/xtensor.hpp>

#include <xtensor/xfixed.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Batch = ds::axis<"batch">;
using Model = ds::axis<"model", 4>;
using K = ds::axis<"k">;
using N = ds::axis<"n">;

namespace {

// 0, 1, 2, ... in row-major order: every element tells where it came from.
template <class A>
void fill_counting(A& a) {
    for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = static_cast<typename A::value_type>(i);
}

// Every element of the view equals the xtensor expression's at the same index.
template <class V, class E>
void require_same_elements(const V& view, const E& expected) {
    REQUIRE(expected.dimension() == 2);
    REQUIRE(view.extent(0) == expected.shape()[0]);
    REQUIRE(view.extent(1) == expected.shape()[1]);
    for (std::size_t r = 0; r < view.extent(0); ++r) {
        for (std::size_t c = 0; c < view.extent(1); ++c) REQUIRE(view(r, c) == expected(r, c));
    }
}

// (m, k) x (k, n) as xtensor computes it: broadcast to (m, k, n), sum over k.
xt::xarray<double> xt_matmul(const xt::xarray<double>& a, const xt::xarray<double>& b) {
    return xt::sum(xt::view(a, xt::all(), xt::all(), xt::newaxis()) * xt::view(b, xt::newaxis(), xt::all(), xt::all()),
                   {1});
}

}  // namespace

TEST_CASE("adapt: a row-major xarray and xtensor are views of their memory, writable through") {
    xt::xarray<double> a = xt::zeros<double>({5, 3});  // (rows=5, cols=3)
    fill_counting(a);
    auto x = ds::adapt<Rows, Cols>(a);
    STATIC_REQUIRE(std::is_same_v<decltype(x), ds::tensor_view<double, Rows, Cols>>);
    REQUIRE(x.data() == a.data());
    REQUIRE(x.shape().extents() == std::array<std::size_t, 2>{5, 3});
    REQUIRE(x.strides() == ds::strides_t<2>{3, 1});
    REQUIRE(x.is_contiguous());
    require_same_elements(x, a);

    x(4, 2) = -1.0;  // written through the view, read in xtensor
    REQUIRE(a(4, 2) == -1.0);
    a(0, 1) = 42.0;
    REQUIRE(x(0, 1) == 42.0);

    xt::xtensor<float, 3> b = xt::zeros<float>({2, 3, 4});  // (batch=2, rows=3, model=4)
    fill_counting(b);
    auto y = ds::adapt<Batch, Rows, Model>(b);
    STATIC_REQUIRE(std::is_same_v<decltype(y), ds::tensor_view<float, Batch, Rows, Model>>);
    REQUIRE(y.strides() == ds::strides_t<3>{12, 4, 1});
    REQUIRE(y(1, 2, 3) == b(1, 2, 3));

    // A const container gives a view of const elements.
    const xt::xtensor<float, 3>& constant = b;
    auto read_only = ds::adapt<Batch, Rows, Model>(constant);
    STATIC_REQUIRE(std::is_same_v<decltype(read_only), ds::tensor_view<const float, Batch, Rows, Model>>);
    REQUIRE(read_only.data() == b.data());
}

TEST_CASE("adapt: xtensor_fixed, with its extents checked against static axes") {
    xt::xtensor_fixed<double, xt::xshape<3, 4>> f;  // (rows=3, model=4)
    fill_counting(f);
    auto x = ds::adapt<Rows, Model>(f);
    STATIC_REQUIRE(std::is_same_v<decltype(x), ds::tensor_view<double, Rows, Model>>);
    REQUIRE(x.data() == f.data());
    REQUIRE(x.strides() == ds::strides_t<2>{4, 1});
    require_same_elements(x, f);
}

TEST_CASE("adapt: transposed and strided xtensor views keep their strides and their memory") {
    xt::xarray<double> a = xt::zeros<double>({8, 5});  // (rows=8, cols=5)
    fill_counting(a);

    auto t = ds::adapt<Cols, Rows>(xt::transpose(a));  // (cols=5, rows=8)
    REQUIRE(t.data() == a.data());
    REQUIRE(t.strides() == ds::strides_t<2>{1, 5});
    REQUIRE_FALSE(t.is_contiguous());
    require_same_elements(t, xt::transpose(a));

    // Rows 1, 3, 5: the view starts one row in, at the view's data_offset().
    auto odd_rows = xt::view(a, xt::range(1, 7, 2), xt::all());  // (rows=3, cols=5)
    auto o = ds::adapt<Rows, Cols>(odd_rows);
    REQUIRE(o.data() == a.data() + 5);
    REQUIRE(o.strides() == ds::strides_t<2>{10, 1});
    require_same_elements(o, odd_rows);
    o(2, 4) = -7.0;  // row 5 of a
    REQUIRE(a(5, 4) == -7.0);

    // Every other column, from the end backwards: a negative stride.
    auto backwards = xt::strided_view(a, {xt::all(), xt::range(4, xt::placeholders::_, -2)});  // (rows=8, cols=3)
    auto b = ds::adapt<Rows, Cols>(backwards);
    REQUIRE(b.strides() == ds::strides_t<2>{5, -2});
    require_same_elements(b, backwards);

    // A view of a view, and a view of a const container.
    const xt::xarray<double>& constant = a;
    auto nested = ds::adapt<Cols, Rows>(xt::transpose(xt::view(constant, xt::range(1, 7, 2), xt::all())));
    STATIC_REQUIRE(std::is_same_v<decltype(nested), ds::tensor_view<const double, Cols, Rows>>);
    require_same_elements(nested, xt::transpose(odd_rows));
}

TEST_CASE("adapt: extent-1 axes, whose stride xtensor reports as 0, give a contiguous view") {
    xt::xarray<float> a = xt::zeros<float>({1, 4, 1});  // (batch=1, model=4, cols=1)
    fill_counting(a);
    REQUIRE(a.strides()[0] == 0);
    auto x = ds::adapt<Batch, Model, Cols>(a);
    REQUIRE(x.strides() == ds::strides_t<3>{4, 1, 1});
    REQUIRE(x.is_contiguous());
    REQUIRE(x(0, 3, 0) == 3.0f);

    // One row of a strided view: extent 1, and no layout to agree with but its own.
    xt::xarray<double> b = xt::zeros<double>({6, 3});
    fill_counting(b);
    auto one_row = ds::adapt<Rows, Cols>(xt::view(b, xt::range(4, 5), xt::all()));  // (rows=1, cols=3)
    REQUIRE(one_row.shape().extents() == std::array<std::size_t, 2>{1, 3});
    REQUIRE(one_row(0, 2) == b(4, 2));
}

TEST_CASE("adapt: formulas over an adapted xtensor agree with xtensor's own computation") {
    xt::xarray<double> logits = xt::zeros<double>({7, 17});  // (rows=7, cols=17)
    for (std::size_t i = 0; i < logits.size(); ++i) logits.data()[i] = std::sin(0.7 * static_cast<double>(i)) * 5;
    xt::xarray<double> top = xt::amax(logits, {1}, xt::keep_dims);
    xt::xarray<double> e = xt::exp(logits - top);
    xt::xarray<double> total = xt::sum(e, {1}, xt::keep_dims);
    xt::xarray<double> want_softmax = e / total;
    test::require_close(ds::eval(ds::softmax(ds::adapt<Rows, Cols>(logits))), want_softmax, 1e-13, 1e-13);

    // A product of a strided view and a transposed one.
    xt::xarray<double> a = xt::zeros<double>({14, 3});  // every other row: (m=7, k=3)
    xt::xarray<double> bt = xt::zeros<double>({5, 3});  // transposed: (k=3, n=5)
    for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = std::cos(1.3 * static_cast<double>(i));
    for (std::size_t i = 0; i < bt.size(); ++i) bt.data()[i] = std::sin(0.4 * static_cast<double>(i) + 1);
    auto every_other = xt::view(a, xt::range(0, 14, 2), xt::all());
    auto product = ds::eval(ds::matmul(ds::adapt<Rows, K>(every_other), ds::adapt<K, N>(xt::transpose(bt))));
    test::require_close(product, xt_matmul(every_other, xt::transpose(bt)), 1e-13, 1e-13);

    // Assigning a formula to an adapted view writes the xtensor container.
    xt::xarray<double> out = xt::zeros<double>({7, 17});
    ds::adapt<Rows, Cols>(out) = ds::softmax(ds::adapt<Rows, Cols>(logits));
    test::require_close(ds::adapt<Rows, Cols>(out), want_softmax, 1e-13, 1e-13);
}

TEST_CASE("adapt: a rank or extent that differs from the axes is a shape_error naming them") {
    xt::xarray<double> a = xt::zeros<double>({2, 3, 4});
    REQUIRE_THROWS_AS((ds::adapt<Rows, Cols>(a)), ds::shape_error);
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(a)),
                        Catch::Contains("dimsum: adapt: 3 extents given for (rows=?, cols=?), which has 2 axes"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Model, Cols>(a)),
                        Catch::Contains("dimsum: adapt: axis model=4 given extent 3"));
    // A strided view of a dynamic rank is checked the same way.
    REQUIRE_THROWS_WITH((ds::adapt<Rows>(xt::transpose(a))),
                        Catch::Contains("dimsum: adapt: 3 extents given for (rows=?), which has 1 axis"));
    // xtensor<T, N> fixes the rank, so there the mistake is a compile error (see
    // tests/compile_fail/adapt_expression.cpp for the convention); its extents are checked here.
    xt::xtensor<float, 2> b = xt::zeros<float>({3, 5});
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Model>(b)), Catch::Contains("dimsum: adapt: axis model=4 given extent 5"));
}

TEST_CASE("adapt: a plain buffer with extents and strides in elements, checked") {
    std::vector<double> buffer(24);  // (8, 3), row-major
    for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<double>(i);

    auto all = ds::adapt<Rows, Cols>(buffer.data(), {8, 3});
    REQUIRE(all.strides() == ds::strides_t<2>{3, 1});
    REQUIRE(all(7, 2) == 23.0);

    // Every other row, with the extents and strides of a C API (signed, 64-bit) in a span.
    const std::int64_t extents[] = {4, 3}, strides[] = {6, 1};
    auto every_other = ds::adapt<Rows, Cols>(std::span(buffer), std::span(extents), std::span(strides));
    REQUIRE(every_other(3, 1) == 19.0);
    every_other(0, 0) = -1.0;
    REQUIRE(buffer[0] == -1.0);

    // The same memory back as xtensor sees it.
    auto back = ds::to_xtensor(every_other);
    REQUIRE(back.data() == buffer.data());
    require_same_elements(every_other, back);
    xt::xarray<double> plus_one = back + 1.0;  // xtensor walking the strided adaptor
    REQUIRE(plus_one(3, 2) == buffer[3 * 6 + 2] + 1.0);
    back(1, 0) = 100.0;
    REQUIRE(buffer[6] == 100.0);

    // Unsigned extents from a std::vector, a read-only buffer.
    const std::vector<double>& constant = buffer;
    auto read_only = ds::adapt<Rows, Cols, Model>(constant.data(), std::vector<std::size_t>{2, 3, 4});
    STATIC_REQUIRE(std::is_same_v<decltype(read_only), ds::tensor_view<const double, Rows, Cols, Model>>);

    // Each mistake, with its values.
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(buffer.data(), {-2, 3}, {3, 1})),
                        Catch::Contains("dimsum: adapt: axis rows=? given extent -2, which is negative"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(buffer.data(), std::vector<std::size_t>{2, SIZE_MAX})),
                        Catch::Contains("dimsum: adapt: axis cols=? given extent 18446744073709551615, more than an "
                                        "offset can count"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(buffer.data(), std::vector<std::uint64_t>{2, 3},
                                              std::vector<std::uint64_t>{UINT64_MAX, 1})),
                        Catch::Contains("dimsum: adapt: axis rows=? given stride 18446744073709551615"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(buffer.data(), std::vector<int>{8, 3, 1})),
                        Catch::Contains("dimsum: adapt: 3 extents given for (rows=?, cols=?), which has 2 axes"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(buffer.data(), {8, 3}, std::vector<int>{1})),
                        Catch::Contains("dimsum: adapt: 1 strides given for (rows=?, cols=?), which has 2 axes"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Model>(buffer.data(), {8, 3})),
                        Catch::Contains("dimsum: adapt: axis model=4 given extent 3"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(buffer.data(), {PTRDIFF_MAX / 2, 3}, {4, 1})),
                        Catch::Contains("reaches beyond the address space"));
    REQUIRE_THROWS_WITH((ds::adapt<Rows, Cols>(std::span(buffer), {5, 3}, {6, 1})),
                        Catch::Contains("reaches outside the 24 elements given"));
}

TEST_CASE("to_xtensor: an xtensor adaptor over a tensor's or a view's memory, writable when it is") {
    ds::tensor<float, Rows, Cols> t(Rows{4}, Cols{5});
    ds::fill_uniform(t, 3);
    auto a = ds::to_xtensor(t);
    REQUIRE(a.data() == t.data());
    REQUIRE(a.shape() == std::array<std::size_t, 2>{4, 5});
    require_same_elements(t.view(), a);
    a(2, 3) = 9.0f;  // written in xtensor, read in dimsum
    REQUIRE(t(2, 3) == 9.0f);
    // xtensor's own computation over the adaptor.
    xt::xarray<double> doubled = 2.0 * xt::cast<double>(a);
    test::require_close(ds::eval(t * 2.0f), doubled, 1e-6, 1e-6);

    // A transposed view: the adaptor keeps its strides.
    auto tt = ds::to_xtensor(ds::transpose(t));
    REQUIRE(tt.shape() == std::array<std::size_t, 2>{5, 4});
    require_same_elements(ds::transpose(t), tt);
    tt(4, 1) = -3.0f;
    REQUIRE(t(1, 4) == -3.0f);

    // A read-only source gives a read-only adaptor.
    const auto& constant = t;
    auto c = ds::to_xtensor(constant);
    STATIC_REQUIRE(std::is_const_v<std::remove_reference_t<decltype(c(0, 0))>>);

    // Round trip: adapting the adaptor gives the same view.
    auto again = ds::adapt<Cols, Rows>(tt);
    REQUIRE(again.data() == t.data());
    REQUIRE(again.strides() == ds::transpose(t).strides());

    // A view with a negative stride has no xtensor adaptor.
    xt::xarray<double> x = xt::zeros<double>({3, 4});
    auto backwards = ds::adapt<Rows, Cols>(xt::strided_view(x, {xt::all(), xt::range(3, xt::placeholders::_, -1)}));
    REQUIRE_THROWS_WITH((ds::to_xtensor(backwards)),
                        Catch::Contains("dimsum: to_xtensor: (rows=3, cols=4) has a negative stride"));
}
