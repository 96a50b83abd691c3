// Assignment: dst = formula, into tensors and views, when dst is also read.
#include "support.hpp"

#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>

namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using N = ds::axis<"n", 17>;

TEST_CASE("assigning a formula that reads its own destination") {
    ds::tensor<double, N, N> x, w;
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    xt::xarray<double> xx = test::to_xt(x), xw = test::to_xt(w);

    x = ds::transpose(x);  // every element moves: needs a temporary
    test::require_close(x, xt::transpose(xx), 0, 0);
    xx = xt::transpose(xx);

    x = x * 2.0 + 1.0;
    xx = xx * 2.0 + 1.0;
    test::require_close(x, xx, 1e-15);

    x = ds::matmul(x, w);  // reads rows of x while writing them
    xt::xarray<double> product = xt::sum(xt::expand_dims(xx, 2) * xt::expand_dims(xw, 0), {1});
    test::require_close(x, product, 1e-13, 1e-13);
}

TEST_CASE("assigning through views writes the viewed memory") {
    ds::tensor<float, Rows, N> x(Rows{3});
    ds::tensor<float, N, Rows> y(Rows{3});
    ds::fill_uniform(y, 3);
    ds::transpose(x) = y;
    test::require_close(x, xt::transpose(test::to_xt(y)), 0, 0);

    // A view assigned from an overlapping view of the same memory.
    ds::tensor<float, N, N> square;
    ds::fill_uniform(square, 4);
    xt::xarray<double> before = test::to_xt(square);
    auto v = square.view();
    v = ds::transpose(square);
    test::require_close(square, xt::transpose(before), 0, 0);
}

TEST_CASE("a tensor takes the run-time extents of what it is assigned") {
    ds::tensor<float, Rows, N> a(Rows{2}), b(Rows{5});
    ds::fill_uniform(b, 5);
    a = b * 1.0f;
    REQUIRE(a.extent(0) == 5);
    test::require_close(a, test::to_xt(b), 0, 0);

    // A view cannot: its memory is fixed.
    ds::tensor<float, Rows, N> small(Rows{2});
    auto view = small.view();
    REQUIRE(test::error_of([&] { view = b * 1.0f; }) ==
            "dimsum: assign: cannot store (rows=5, n=17) in (rows=2, n=17)");
}

TEST_CASE("evaluating a formula in a loop gives the same result every time") {
    ds::tensor<float, Rows, N> x(Rows{7}), y(Rows{7});
    ds::fill_uniform(x, 6);
    for (int i = 0; i < 3; ++i) {
        y = ds::softmax(x * 3.0f);
        test::require_close(y, test::to_xt(ds::eval(ds::softmax(x * 3.0f))), 0, 0);
    }
}
