// ds::map: a user's function element by element, against loops over the same values, on odd
// sizes, NaN and infinities, broadcast, transposed, mask and integer operands; fused into a
// GEMM epilogue and an attention score tile on the CPU backend, against the reference backend.
#include "support.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

namespace ds = dimsum;

namespace {

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Inner = ds::axis<"inner">;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head">;

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

// Not one of dimsum's functions: a squared hinge with a leak, and NaN kept.
template <class T>
T leaky_square(T v) {
    return v < T(0) ? T(0.25) * v : v * v + T(1);
}

template <class T>
void add_edge_cases(ds::tensor<T, Rows, Cols>& x) {
    const std::size_t rows = x.shape().extent(0), cols = x.shape().extent(1);
    x(0, 0) = static_cast<T>(not_a_number);
    x(rows - 1, cols - 1) = static_cast<T>(inf);
    if (cols > 2) x(0, cols / 2) = static_cast<T>(-inf);
}

// The loop the map must equal, element by element, in T.
template <class T, class F>
xt::xarray<double> loop(const ds::tensor<T, Rows, Cols>& x, F&& f) {
    xt::xarray<double> out = test::to_xt(x);
    for (std::size_t i = 0; i < x.shape().extent(0); ++i) {
        for (std::size_t j = 0; j < x.shape().extent(1); ++j) out(i, j) = static_cast<double>(f(x(i, j)));
    }
    return out;
}

}  // namespace

TEMPLATE_TEST_CASE("map applies a user's function element by element, NaN and infinities in every lane, both backends",
                   "", float, double) {
    using T = TestType;
    for (std::size_t rows : {1, 2, 5}) {
        for (std::size_t cols : test::odd_sizes) {
            INFO("rows=" << rows << " cols=" << cols);
            ds::tensor<T, Rows, Cols> x(Rows{rows}, Cols{cols});
            ds::fill_uniform(x, rows * 100 + cols, -2.0, 2.0);
            add_edge_cases(x);
            const xt::xarray<double> want = loop(x, leaky_square<T>);
            auto f = [](T v) { return leaky_square(v); };
            test::require_close(ds::eval(ds::map(f, x)), want, 0, 0);
            test::require_close(ds::eval(ds::map(f, x), ds::backend::reference::evaluator{}), want, 0, 0);
            // inside a formula, on both sides of the function
            ds::tensor<T, Rows, Cols> y = ds::eval(ds::exp(ds::map(f, x * T(0.5))) + T(1));
            const xt::xarray<double> half = loop(x, [](T v) { return std::exp(leaky_square<T>(v * T(0.5))) + T(1); });
            test::require_close(y, half, std::is_same_v<T, float> ? 1e-6 : 1e-14, 0);
        }
    }
}

TEST_CASE("map broadcasts and transposes its operands as arithmetic does, on both backends") {
    const std::size_t rows = 7, cols = 17;
    ds::tensor<double, Rows, Cols> x(Rows{rows}, Cols{cols});
    ds::tensor<double, Cols, Rows> y(Cols{cols}, Rows{rows});
    ds::tensor<double, Cols> bias(Cols{cols});
    ds::fill_uniform(x, 1, -1.0, 1.0);
    ds::fill_uniform(y, 2, -1.0, 1.0);
    ds::fill_uniform(bias, 3, -1.0, 1.0);
    auto f = [](double a, double b, double c) { return std::hypot(a, b) * c; };
    auto formula = ds::map(f, x, ds::transpose(y), bias);
    xt::xarray<double> want = xt::zeros<double>({rows, cols});
    for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) want(i, j) = f(x(i, j), y(j, i), bias(j));
    }
    test::require_close(ds::eval(formula), want, 0, 0);
    test::require_close(ds::eval(formula, ds::backend::reference::evaluator{}), want, 0, 0);
}

TEST_CASE("map passes masks as bool and integers as integers, and a function returning bool gives a mask") {
    const std::size_t rows = 3, cols = 65;
    ds::tensor<float, Rows, Cols> x(Rows{rows}, Cols{cols});
    ds::fill_uniform(x, 4, -3.0, 3.0);
    add_edge_cases(x);
    ds::tensor<std::int32_t, Cols> ids(Cols{cols});
    for (std::size_t j = 0; j < cols; ++j) ids(j) = static_cast<std::int32_t>(j) - 30;

    auto finite = ds::map([](float v) { return std::isfinite(v); }, x);
    static_assert(std::is_same_v<ds::value_type_of<decltype(finite)>, bool>);
    auto kept = ds::eval(ds::where(finite, x, 0.0f));
    auto shifted = ds::eval(ds::map([](float v, bool positive, std::int32_t id) { return positive ? v + float(id) : -v; },
                                    x, x > 0.0f, ids));
    for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) {
            INFO("i=" << i << " j=" << j);
            const float v = x(i, j);
            CHECK(kept(i, j) == (std::isfinite(v) ? v : 0.0f));
            const float want = v > 0.0f ? v + float(int(j) - 30) : -v;
            CHECK((std::isnan(want) ? std::isnan(shifted(i, j)) : shifted(i, j) == want));
        }
    }
}

TEST_CASE("map fuses into a GEMM epilogue and into the attention's score tiles, equal to the reference backend") {
    const std::size_t m = 37, k = 19, n = 65;
    ds::tensor<double, Rows, Inner> a(Rows{m}, Inner{k});
    ds::tensor<double, Inner, Cols> b(Inner{k}, Cols{n});
    ds::tensor<double, Cols> bias(Cols{n});
    ds::fill_uniform(a, 5, -1.0, 1.0);
    ds::fill_uniform(b, 6, -1.0, 1.0);
    ds::fill_uniform(bias, 7, -1.0, 1.0);
    auto f = [](double v) { return leaky_square(v); };
    auto product = ds::map(f, ds::matmul(a, b) + bias);
    CHECK_THAT(ds::explain(product), Catch::Contains("gemm") && Catch::Contains("map"));
    const auto want = ds::eval(product, ds::backend::reference::evaluator{});
    test::require_close(ds::eval(product), test::to_xt(want), 1e-13, 1e-13);

    // a logit soft-cap (Gemma 2) as a user's function of the scores, causal, on each tile
    const std::size_t queries = 70, keys = 70, d = 16;
    ds::tensor<double, Query, Head> q(Query{queries}, Head{d});
    ds::tensor<double, Key, Head> key(Key{keys}, Head{d}), value(Key{keys}, Head{d});
    ds::fill_uniform(q, 8, -2.0, 2.0);
    ds::fill_uniform(key, 9, -2.0, 2.0);
    ds::fill_uniform(value, 10, -1.0, 1.0);
    auto soft_cap = [](double s) { return 5.0 * std::tanh(s / 5.0); };
    auto scores = ds::map(soft_cap, ds::matmul(q, ds::transpose(key)) * 0.25);
    auto attention = ds::matmul(ds::softmax<Key>(ds::masked_fill(scores, ds::causal_mask(Query{queries}, Key{keys}), -inf)),
                                value);
    CHECK_THAT(ds::explain(attention), Catch::Contains("attention"));
    const auto expected = ds::eval(attention, ds::backend::reference::evaluator{});
    test::require_close(ds::eval(attention), test::to_xt(expected), 1e-12, 1e-13);
}

TEST_CASE("map over arrays large enough for every thread: each element once, as the loop") {
    const std::size_t rows = 300, cols = 1001;
    ds::tensor<float, Rows, Cols> x(Rows{rows}, Cols{cols});
    ds::fill_uniform(x, 11, -4.0, 4.0);
    test::require_close(ds::eval(ds::map([](float v) { return leaky_square(v); }, x)), loop(x, leaky_square<float>), 0, 0);
}
