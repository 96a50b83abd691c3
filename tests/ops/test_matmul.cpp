// matmul against xtensor: odd sizes, batches that broadcast, transposed and strided operands.
#include "support.hpp"

#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using M = ds::axis<"m">;
using K = ds::axis<"k">;
using N = ds::axis<"n">;

// (..., m, k) x (..., k, n) as xtensor computes it: broadcast to (..., m, k, n), sum over k.
xt::xarray<double> xt_matmul(const xt::xarray<double>& a, const xt::xarray<double>& b) {
    auto expanded_a = xt::expand_dims(a, a.dimension());      // (..., m, k, 1)
    auto expanded_b = xt::expand_dims(b, b.dimension() - 2);  // (..., 1, k, n)
    std::size_t rank = std::max(a.dimension(), b.dimension()) + 1;
    return xt::sum(expanded_a * expanded_b, {rank - 2});
}

TEMPLATE_TEST_CASE("matmul of odd sizes", "", float, double) {
    for (std::size_t m : test::odd_sizes) {
        for (std::size_t k : test::odd_sizes) {
            for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{65}}) {
                ds::tensor<TestType, M, K> a(M{m}, K{k});
                ds::tensor<TestType, K, N> b(K{k}, N{n});
                ds::fill_uniform(a, m * 1000 + k);
                ds::fill_uniform(b, k * 1000 + n);
                auto got = ds::eval(ds::matmul(a, b));
                STATIC_REQUIRE(std::is_same_v<decltype(got), ds::tensor<TestType, M, N>>);
                double tol = std::is_same_v<TestType, float> ? 1e-5 : 1e-12;
                test::require_close(got, xt_matmul(test::to_xt(a), test::to_xt(b)), tol, tol);
            }
        }
    }
}

TEST_CASE("batched matmul broadcasts missing and extent-1 batch axes") {
    for (std::size_t batch : {std::size_t{1}, std::size_t{3}}) {
        ds::tensor<double, Batch, M, K> a(Batch{batch}, M{7}, K{17});
        ds::tensor<double, Batch, K, N> b(Batch{batch}, K{17}, N{3});
        ds::tensor<double, K, N> shared(K{17}, N{3});
        ds::tensor<double, Batch, K, N> single(Batch{1}, K{17}, N{3});
        ds::fill_uniform(a, 1);
        ds::fill_uniform(b, 2);
        ds::fill_uniform(shared, 3);
        ds::fill_uniform(single, 4);
        auto xa = test::to_xt(a);
        test::require_close(ds::eval(ds::matmul(a, b)), xt_matmul(xa, test::to_xt(b)), 1e-12, 1e-12);
        test::require_close(ds::eval(ds::matmul(a, shared)), xt_matmul(xa, test::to_xt(shared)), 1e-12, 1e-12);
        test::require_close(ds::eval(ds::matmul(a, single)), xt_matmul(xa, test::to_xt(single)), 1e-12, 1e-12);
    }
}

TEST_CASE("matmul reads transposed and strided operands as they are") {
    ds::tensor<float, Batch, N, K> bt(Batch{2}, N{65}, K{7});   // stored transposed
    ds::tensor<float, Batch, M, K> a(Batch{2}, M{3}, K{7});
    ds::fill_uniform(bt, 5);
    ds::fill_uniform(a, 6);
    xt::xarray<double> b = xt::transpose(test::to_xt(bt), {0, 2, 1});
    test::require_close(ds::eval(ds::matmul(a, ds::transpose(bt))), xt_matmul(test::to_xt(a), b), 1e-5, 1e-5);

    // The user's memory: every second row of a (m=17, k=14) matrix, columns reversed in pairs.
    std::vector<float> memory(34 * 7);
    for (std::size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<float>((i * 7) % 13) / 13.0f - 0.5f;
    ds::tensor_view<float, M, K> rows(std::span<float>(memory), ds::shape<M, K>(M{17}, K{7}), {14, 1});
    ds::tensor<float, K, N> w(K{7}, N{17});
    ds::fill_uniform(w, 8);
    test::require_close(ds::eval(ds::matmul(rows, w)), xt_matmul(test::to_xt(rows), test::to_xt(w)), 1e-5, 1e-5);
}

TEST_CASE("matmul inside a formula: scale, bias, activation, residual") {
    ds::tensor<float, M, K> x(M{17}, K{65});
    ds::tensor<float, K, K> w(K{65}, K{65});
    ds::tensor<float, K> bias(K{65});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2, -0.2, 0.2);
    ds::fill_uniform(bias, 3);
    auto xx = test::to_xt(x);
    xt::xarray<double> want = xt::maximum(xt_matmul(xx, test::to_xt(w)) * 0.5 + test::to_xt(bias), 0.0) + xx;
    test::require_close(ds::eval(ds::max(ds::matmul(x, w) * 0.5f + bias, 0.0f) + x), want, 1e-5, 1e-5);
}

// A few rows times a row-major B large enough to share (decoding: gemm.hpp cuts B along its
// depth, in groups of rows fixed by k, and adds the groups' sums in order): the same bits on
// one thread and on two, and xtensor's values, NaN and infinity included. B's rows are strided
// (a slice of a wider matrix), k and n fit neither the groups of 128 rows nor the SIMD width,
// and the specials sit in the first lanes, the middle and the tail of B's rows.
TEMPLATE_TEST_CASE("a few rows times a large B: the same bits on 1 and 2 threads, NaN and infinity kept", "", float, double) {
    using Wide = ds::axis<"wide">;
    struct extents {
        std::size_t k, n;
    };
    const TestType nan = std::numeric_limits<TestType>::quiet_NaN(), inf = std::numeric_limits<TestType>::infinity();
    for (const auto [k, n] : {extents{1031, 263}, extents{129, 2049}}) {
        ds::tensor<TestType, K, Wide> wide(K{k}, Wide{n + 3});
        ds::fill_uniform(wide, k + n);
        const std::size_t specials[][2] = {{0, 0}, {k / 2, 5}, {k - 1, n / 2}, {128, n - 2}, {k - 2, n - 1}};
        for (const auto [row, col] : specials) wide(row, col) = (col % 2 == 0) ? nan : inf;
        wide(k / 3, n - 2) = -inf;  // meets +inf in column n - 2: NaN
        const auto b = ds::rename<Wide, N>(ds::slice<Wide>(wide, 0, n));
        ds::tensor<TestType, N> bias(N{n});
        ds::fill_uniform(bias, 7);
        for (std::size_t m = 1; m <= 4; ++m) {
            INFO(m << " x " << k << " x " << n);
            ds::tensor<TestType, M, K> a(M{m}, K{k});
            ds::fill_uniform(a, m);
            ds::set_num_threads(1);
            const ds::tensor<TestType, M, N> one = ds::matmul(a, b) + bias;
            const auto loops_before = ds::runtime::thread_team::instance().loops_run();
            ds::set_num_threads(2);
            const ds::tensor<TestType, M, N> two = ds::matmul(a, b) + bias;
            ds::set_num_threads(0);
            REQUIRE(ds::runtime::thread_team::instance().loops_run() > loops_before);  // shared, not run alone
            test::require_same_bits(two, one);
            const double tol = std::is_same_v<TestType, float> ? 1e-4 : 1e-10;
            test::require_close(one, xt_matmul(test::to_xt(a), test::to_xt(ds::slice<Wide>(wide, 0, n))) + test::to_xt(bias), tol, tol);
        }
    }
}
