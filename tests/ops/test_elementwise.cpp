// Elementwise arithmetic, functions, broadcasting, scalars, masks: against xtensor.
#include "support.hpp"

#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xview.hpp>

#include <bit>
#include <cstdint>
#include <iterator>
#include <limits>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;

TEMPLATE_TEST_CASE("binary arithmetic between tensors of odd sizes", "", float, double) {
    for (std::size_t rows : test::odd_sizes) {
        for (std::size_t cols : {std::size_t{1}, std::size_t{7}, std::size_t{65}}) {
            ds::tensor<TestType, Rows, Cols> a(Rows{rows}, Cols{cols}), b(Rows{rows}, Cols{cols});
            ds::fill_uniform(a, rows * 100 + cols);
            ds::fill_uniform(b, rows * 100 + cols + 1, 0.5, 2.0);
            auto xa = test::to_xt(a), xb = test::to_xt(b);
            double tol = std::is_same_v<TestType, float> ? 1e-6 : 1e-14;
            test::require_close(ds::eval(a + b), xa + xb, tol);
            test::require_close(ds::eval(a - b), xa - xb, tol, tol);
            test::require_close(ds::eval(a * b), xa * xb, tol);
            test::require_close(ds::eval(a / b), xa / xb, tol);
            test::require_close(ds::eval(ds::max(a, b)), xt::maximum(xa, xb), tol);
            test::require_close(ds::eval(ds::min(a, b)), xt::minimum(xa, xb), tol);
        }
    }
}

TEST_CASE("unary functions and scalars") {
    ds::tensor<double, Rows, Cols> a(Rows{17}, Cols{7});
    ds::fill_uniform(a, 3, -4.0, 4.0);
    auto xa = test::to_xt(a);
    test::require_close(ds::eval(ds::exp(a)), xt::exp(xa), 1e-14);
    test::require_close(ds::eval(ds::log(ds::abs(a) + 1.0)), xt::log(xt::abs(xa) + 1.0), 1e-14);
    test::require_close(ds::eval(ds::sqrt(ds::abs(a))), xt::sqrt(xt::abs(xa)), 1e-14);
    test::require_close(ds::eval(ds::tanh(a)), xt::tanh(xa), 1e-14);
    test::require_close(ds::eval(ds::erf(a)), xt::erf(xa), 1e-14);
    test::require_close(ds::eval(ds::sigmoid(a)), 1.0 / (1.0 + xt::exp(-xa)), 1e-14);
    test::require_close(ds::eval(ds::silu(a)), xa / (1.0 + xt::exp(-xa)), 1e-14);
    test::require_close(ds::eval(ds::gelu(a)), xa * (1.0 + xt::erf(xa / std::sqrt(2.0))) / 2.0, 1e-11, 1e-300);
    test::require_close(ds::eval(ds::sin(a * 1000.0)), xt::sin(xa * 1000.0), 1e-13, 1e-15);  // far from 0 too
    test::require_close(ds::eval(ds::cos(a)), xt::cos(xa), 1e-14, 1e-15);
    test::require_close(ds::eval(ds::rsqrt(ds::abs(a) + 0.5)), 1.0 / xt::sqrt(xt::abs(xa) + 0.5), 1e-15);
    test::require_close(ds::eval(ds::pow(ds::abs(a), a)), xt::pow(xt::abs(xa), xa), 1e-14);
    test::require_close(ds::eval(ds::pow(10000.0, -a / 8.0)), xt::pow(10000.0, -xa / 8.0), 1e-14);  // RoPE's frequencies
    test::require_close(ds::eval(ds::pow(a, 3.0)), xa * xa * xa, 1e-14);  // negative bases, integer exponent
    test::require_close(ds::eval(-a), -xa, 1e-14);
    test::require_close(ds::eval(2 * a - 1.5), 2.0 * xa - 1.5, 1e-14);
    test::require_close(ds::eval(1.0 / (a * a + 1)), 1.0 / (xa * xa + 1.0), 1e-14);
    test::require_close(ds::eval(ds::max(a, 0.0)), xt::maximum(xa, 0.0), 1e-14);  // relu
}

TEST_CASE("broadcasting: missing leading axes, extent-1 axes, unnamed axes") {
    for (std::size_t n : test::odd_sizes) {
        ds::tensor<float, Batch, Rows, Cols> x(Batch{3}, Rows{n}, Cols{7});
        ds::tensor<float, Cols> bias(Cols{7});
        ds::tensor<float, Batch, Rows, Cols> row(Batch{1}, Rows{n}, Cols{7});  // batch extent 1 at run time
        ds::tensor<float, ds::dim<>, ds::dim<1>> column(ds::dim<>{n});           // unnamed axes
        ds::fill_uniform(x, n);
        ds::fill_uniform(bias, n + 1);
        ds::fill_uniform(row, n + 2);
        ds::fill_uniform(column, n + 3);
        auto xx = test::to_xt(x);
        test::require_close(ds::eval(x + bias), xx + test::to_xt(bias), 1e-6);
        test::require_close(ds::eval(x * row), xx * test::to_xt(row), 1e-6);
        test::require_close(ds::eval(x - column), xx - test::to_xt(column), 1e-6, 1e-6);
    }
}

TEST_CASE("strided and transposed operands") {
    ds::tensor<float, Cols, Rows> t(Cols{7}, Rows{17});
    ds::tensor<float, Rows, Cols> a(Rows{17}, Cols{7});
    ds::fill_uniform(t, 1);
    ds::fill_uniform(a, 2);
    auto xt_t = xt::xarray<double>(xt::transpose(test::to_xt(t)));
    test::require_close(ds::eval(a + ds::transpose(t)), test::to_xt(a) + xt_t, 1e-6);

    // Every third element of the user's memory, as a (rows=17, cols=7) view.
    std::vector<float> memory(17 * 7 * 3);
    for (std::size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<float>(i % 11) - 5.0f;
    ds::tensor_view<float, Rows, Cols> strided(std::span<float>(memory), ds::shape<Rows, Cols>(Rows{17}, Cols{7}),
                                               {21, 3});
    xt::xarray<double> want = test::to_xt(a) * test::to_xt(strided);
    test::require_close(ds::eval(a * strided), want, 1e-6);
}

TEST_CASE("where, masked_fill and the causal mask") {
    using Q = ds::axis<"q">;
    using K = ds::axis<"k">;
    for (std::size_t queries : {std::size_t{1}, std::size_t{3}, std::size_t{7}}) {
        for (std::size_t keys : {std::size_t{1}, std::size_t{7}, std::size_t{17}}) {
            ds::tensor<double, Batch, Q, K> scores(Batch{2}, Q{queries}, K{keys});
            ds::fill_uniform(scores, queries * keys);
            double inf = std::numeric_limits<double>::infinity();
            auto got = ds::eval(ds::masked_fill(scores, ds::causal_mask(Q{queries}, K{keys}), -inf));
            xt::xarray<double> want = test::to_xt(scores);
            for (std::size_t b = 0; b < 2; ++b) {
                for (std::size_t q = 0; q < queries; ++q) {
                    for (std::size_t k = 0; k < keys; ++k) {
                        // the last query sees every key; each earlier one, one key fewer
                        if (k + queries > q + keys) want(b, q, k) = -inf;
                    }
                }
            }
            test::require_close(got, want, 0, 0);
        }
    }
    // where picks a where the condition holds, else b.
    ds::tensor<float, Q, K> a(Q{7}, K{7}), b(Q{7}, K{7});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(b, 2);
    xt::xarray<double> xa = test::to_xt(a), xb = test::to_xt(b), want = xb;
    for (std::size_t q = 0; q < 7; ++q) {
        for (std::size_t k = q + 1; k < 7; ++k) want(q, k) = xa(q, k);
    }
    test::require_close(ds::eval(ds::where(ds::causal_mask(Q{7}, K{7}), a, b)), want, 0, 0);

    // A single query against many keys (decoding) sees every key.
    auto none = ds::eval(ds::where(ds::causal_mask(ds::dim<1>{}, K{65}), 1.0f, 0.0f));  // (1, k=65)
    test::require_close(none, xt::xarray<double>(xt::zeros<double>({1, 65})), 0, 0);
}

TEST_CASE("cast<double> of a float formula computes in double, cast<float> of a double tensor or view rounds each value") {
    const ds::backend::reference::evaluator reference;
    for (std::size_t rows : test::odd_sizes) {
        const std::size_t cols = 7;
        ds::tensor<float, Rows, Cols> a(Rows{rows}, Cols{cols}), b(Rows{rows}, Cols{cols});
        ds::tensor<float, Cols, Rows> at(Cols{cols}, Rows{rows});
        ds::fill_uniform(a, rows, -3.0, 3.0);
        ds::fill_uniform(b, rows + 1, -3.0, 3.0);
        ds::fill_uniform(at, rows + 2, -3.0, 3.0);
        ds::tensor<double, Cols> scale(Cols{cols});
        ds::fill_uniform(scale, rows + 3);

        // The float values widen exactly and the arithmetic is double's: float arithmetic
        // would be off by about 1e-7 of each product.
        auto widened = [&](const auto& engine) {
            return ds::eval(ds::cast<double>(a * b + ds::transpose(at)) * scale + 1.0, engine);
        };
        std::vector<double> want(rows * cols);
        for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < cols; ++j) {
                want[i * cols + j] = (double(a(i, j)) * double(b(i, j)) + double(at(j, i))) * scale(j) + 1.0;
            }
        }
        for (const auto& got : {widened(ds::backend::cpu::evaluator{}), widened(reference)}) {
            for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(got.data()[i] == Approx(want[i]).epsilon(1e-15).margin(1e-15));
        }

        // Rounding a tensor of double, read through a transposed view, with every special
        // value in every position: NaN, infinities, -0, past float's largest (infinity), ties.
        ds::tensor<double, Cols, Rows> d(Cols{cols}, Rows{rows});
        ds::fill_uniform(d, rows + 4, -1e3, 1e3);
        const double specials[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(), -0.0, 1e39, -1e39, 1e-46,
                                   1.0 + 0x1p-24, 1.0 + 0x1p-24 + 0x1p-50, 3.0 * 0x1p-150};
        for (std::size_t i = 0; i < d.size(); ++i) {
            if (i % 3 == 0) d.data()[i] = specials[(i / 3) % std::size(specials)];
        }
        auto narrowed = [&](const auto& engine) { return ds::eval(ds::cast<float>(ds::transpose(d)) * 2.0f - a, engine); };
        for (const auto& got : {narrowed(ds::backend::cpu::evaluator{}), narrowed(reference)}) {
            for (std::size_t i = 0; i < rows; ++i) {
                for (std::size_t j = 0; j < cols; ++j) {
                    const float want_ij = static_cast<float>(d(j, i)) * 2.0f - a(i, j);
                    const float got_ij = got(i, j);
                    if (std::isnan(want_ij)) REQUIRE(std::isnan(got_ij));
                    else REQUIRE(std::bit_cast<std::uint32_t>(got_ij) == std::bit_cast<std::uint32_t>(want_ij));
                }
            }
        }
        // A product reads the rounded values as its operand.
        ds::tensor<double, Cols, Rows> w(Cols{cols}, Rows{rows});
        ds::fill_uniform(w, rows + 5);
        ds::tensor<float, Cols, Rows> w_float(Cols{cols}, Rows{rows});
        for (std::size_t i = 0; i < w.size(); ++i) w_float.data()[i] = static_cast<float>(w.data()[i]);
        test::require_close(ds::eval(ds::matmul(a, ds::cast<float>(w))), test::to_xt(ds::eval(ds::matmul(a, w_float))), 0, 0);
    }
    // The plan says so: a convert entry reads the tensor of double into the formula's float.
    ds::tensor<double, Rows, Cols> d(Rows{3}, Cols{7});
    ds::tensor<float, Rows, Cols> f(Rows{3}, Cols{7});
    CHECK(ds::explain(ds::cast<float>(d) + f).find("convert") != std::string::npos);
}
