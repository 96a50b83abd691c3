// Parity: the CPU backend's matrix products (GEMM, batches, epilogues) against the reference
// backend, on odd sizes (1, 3, 7, 17, 65, 257) with transposed, strided and broadcast operands,
// and with one and two threads.
#include "parity.hpp"

using namespace parity;

TEMPLATE_TEST_CASE("gemm of odd sizes, plain and transposed operands", "", float, double) {
    with_one_and_two_threads([] {
        for (std::size_t m : sizes) {
            for (std::size_t n : sizes) {
                for (std::size_t k : {std::size_t{1}, std::size_t{17}, std::size_t{257}}) {
                    INFO("m=" << m << " n=" << n << " k=" << k);
                    ds::tensor<TestType, M, K> a(M{m}, K{k});
                    ds::tensor<TestType, N, K> b_rows(N{n}, K{k});  // B transposed in memory
                    ds::tensor<TestType, K, N> b(K{k}, N{n});
                    ds::fill_uniform(a, m * 7 + k);
                    ds::fill_uniform(b, n * 5 + k);
                    ds::fill_uniform(b_rows, n * 3 + k);
                    double tol = tolerance<TestType>;
                    require_parity(ds::matmul(a, b), tol, tol);
                    require_parity(ds::matmul(a, ds::transpose(b_rows)), tol, tol);
                    ds::tensor<TestType, K, M> a_columns(K{k}, M{m});
                    ds::fill_uniform(a_columns, m + k);
                    require_parity(ds::matmul(ds::transpose(a_columns), ds::transpose(b_rows)), tol, tol);
                }
            }
        }
    });
}

TEST_CASE("gemm of strided operands, written into a transposed destination") {
    with_one_and_two_threads([] {
        // a (batch, m, k) read at one batch index: rows 3 k apart; b every other column of a wider tensor
        ds::tensor<float, Batch, M, K> a(Batch{3}, M{65}, K{70});
        ds::tensor<float, K, N> wide(K{70}, N{2 * 33});
        ds::fill_uniform(a, 1);
        ds::fill_uniform(wide, 2);
        auto a1 = ds::select<Batch>(a, 1);                                   // (m, k), strided batch
        auto b = ds::view<K, ds::axis<"n2", 33>, ds::axis<"two", 2>>(wide);  // (k, 33, 2)
        auto b_even = ds::select<ds::axis<"two">>(b, 0);                     // (k, 33), column stride 2
        require_parity(ds::matmul(a1, b_even), 2e-5, 2e-5);

        ds::tensor<float, ds::axis<"n2", 33>, M> out_t(M{65});
        ds::assign(ds::transpose(out_t), ds::matmul(a1, b_even));  // C with column stride 65
        auto want = ds::eval(ds::matmul(a1, b_even), ds::backend::reference::evaluator{});
        test::require_close(ds::transpose(out_t), test::to_xt(want), 2e-5, 2e-5);
    });
}

TEST_CASE("an empty contraction gives zeros, through the epilogue too") {
    ds::tensor<float, M, K> a(M{5}, K{0});
    ds::tensor<float, K, N> b(K{0}, N{7});
    ds::tensor<float, N> bias(N{7});
    ds::fill_uniform(bias, 3);
    require_parity(ds::matmul(a, b), 0, 0);
    require_parity(ds::matmul(a, b) + bias, 0, 0);
}

TEST_CASE("batched gemm: many small products, few large ones, broadcast batch axes") {
    with_one_and_two_threads([] {
        double tol = 2e-5;
        // 96 products of 128 x 128 x 64 with B transposed: whole products per thread
        ds::tensor<float, Batch, M, K> q(Batch{96}, M{128}, K{64});
        ds::tensor<float, Batch, N, K> keys(Batch{96}, N{128}, K{64});
        ds::fill_uniform(q, 4);
        ds::fill_uniform(keys, 5);
        require_parity(ds::matmul(q, ds::transpose(keys)), tol, tol);
        // 3 products of 131 x 129 x 130 (4.4 MFLOP each): each shared by the threads
        ds::tensor<float, Batch, M, K> a(Batch{3}, M{131}, K{130});
        ds::tensor<float, Batch, K, N> b(Batch{3}, K{130}, N{129});
        ds::fill_uniform(a, 6);
        ds::fill_uniform(b, 7);
        require_parity(ds::matmul(a, b), tol, tol);
        // one tall product shared by the threads: 601 rows as 4 blocks of whole micro-panels
        // (12 x 12, 13 x 12, 13 x 12, 13 x 12 - 11), the depth in two blocks, a bias after
        ds::tensor<float, M, K> tall(M{601}, K{300});
        ds::tensor<float, K, N> narrow(K{300}, N{70});
        ds::tensor<float, N> narrow_bias(N{70});
        ds::fill_uniform(tall, 12);
        ds::fill_uniform(narrow, 13);
        ds::fill_uniform(narrow_bias, 14);
        require_parity(ds::matmul(tall, narrow) + narrow_bias, tol, tol);
        require_parity(ds::matmul(ds::transpose(narrow), ds::transpose(tall)), tol, tol);  // wider than tall
        // (batch, heads, m, k) x (k, n): the weight broadcasts over both batch axes
        ds::tensor<float, Batch, Heads, M, K> x(Batch{2}, Heads{3}, M{17}, K{65});
        ds::tensor<float, K, N> w(K{65}, N{7});
        ds::fill_uniform(x, 8);
        ds::fill_uniform(w, 9);
        require_parity(ds::matmul(x, w), tol, tol);
        // (batch=1, m, k) x (batch=5, k, n): a run-time extent of 1 broadcasts
        ds::tensor<float, Batch, M, K> y(Batch{1}, M{3}, K{17});
        ds::tensor<float, Batch, K, N> z(Batch{5}, K{17}, N{19});
        ds::fill_uniform(y, 10);
        ds::fill_uniform(z, 11);
        require_parity(ds::matmul(y, z), tol, tol);
    });
}

TEST_CASE("gemm epilogues: scale, bias, activation, residual, and two products") {
    with_one_and_two_threads([] {
        for (std::size_t m : {std::size_t{1}, std::size_t{65}, std::size_t{257}}) {
            std::size_t n = 257 - m / 2, k = 300;
            INFO("m=" << m << " n=" << n);
            ds::tensor<float, M, K> a(M{m}, K{k});
            ds::tensor<float, K, N> b(K{k}, N{n});
            ds::tensor<float, N> bias(N{n});
            ds::tensor<float, N, M> residual_t(N{n}, M{m});  // read transposed
            ds::fill_uniform(a, 12);
            ds::fill_uniform(b, 13);
            ds::fill_uniform(bias, 14);
            ds::fill_uniform(residual_t, 15);
            auto product = ds::matmul(a, b);
            double tol = 5e-5;
            require_parity(product * 0.125f, tol, tol);
            require_parity(product / 8.0f + bias, tol, tol);
            require_parity(ds::tanh(product + bias), tol, tol);
            require_parity(ds::max(product + bias, 0.0f), tol, tol);
            require_parity(product + ds::transpose(residual_t), tol, tol);
            require_parity(2.0f * product + ds::matmul(a, b), tol, tol);
            // the product is an operand of the elementwise formula, not its shape: no epilogue
            require_parity(ds::sum<N>(product * bias), 1e-4, 1e-4);
        }
    });
}


TEST_CASE("a batch that B does not change runs as one taller product, unless something breaks the rows' run") {
    // x (batch, m, k) W (k, n): folded into one (batch m, k) x (k, n) product when the items'
    // rows follow one another in A, C and every epilogue input; kept batched otherwise.
    with_one_and_two_threads([] {
        for (std::size_t m : {1, 7, 65, 300}) {
            INFO("m=" << m);
            ds::tensor<float, Batch, M, K> x(Batch{5}, M{m}, K{33});
            ds::tensor<float, K, N> w(K{33}, N{40});
            ds::tensor<float, N> bias(N{40});
            ds::tensor<float, Batch, M, N> residual(Batch{5}, M{m}, N{40});
            ds::tensor<float, Batch, N, M> residual_t(Batch{5}, N{40}, M{m});
            ds::tensor<float, M, Batch, K> x_by_rows(M{m}, Batch{5}, K{33});  // items' rows interleaved
            ds::fill_uniform(x, 1);
            ds::fill_uniform(w, 2);
            ds::fill_uniform(bias, 3);
            ds::fill_uniform(residual, 4);
            ds::fill_uniform(residual_t, 5);
            ds::fill_uniform(x_by_rows, 6);
            require_parity(ds::matmul(x, w), 2e-5, 2e-5);
            require_parity(ds::matmul(x, w) + bias + residual, 2e-5, 2e-5);
            require_parity(ds::matmul(x, w) + bias + ds::transpose(residual_t), 2e-5, 2e-5);  // not folded
            require_parity(ds::matmul(ds::transpose<M, Batch>(x_by_rows), w) * 0.5f, 2e-5, 2e-5);  // not folded
            // into a destination whose items' rows do not follow one another
            ds::tensor<float, M, Batch, N> out(M{m}, Batch{5}, N{40});
            ds::transpose<M, Batch>(out) = ds::matmul(x, w) + bias;
            auto want = ds::eval(ds::transpose<Batch, M>(ds::matmul(x, w) + bias), ds::backend::reference::evaluator{});
            test::require_close(out, test::to_xt(want), 2e-5, 2e-5);
        }
    });
}

TEST_CASE("a few rows times a large row-major B (decoding): shared by the threads, with an epilogue, NaN kept") {
    with_one_and_two_threads([] {
        // 1 to 5 rows (5: the general kernel) x B of 601 x 1003 floats (2.4 MB: a team shares its columns)
        for (std::size_t m : {1, 2, 3, 4, 5}) {
            for (std::size_t k : {std::size_t{1}, std::size_t{6}, std::size_t{601}}) {
                INFO("m=" << m << " k=" << k);
                ds::tensor<float, M, K> a(M{m}, K{k});
                ds::tensor<float, K, N> b(K{k}, N{1003});
                ds::tensor<float, N> bias(N{1003});
                ds::fill_uniform(a, m + k);
                ds::fill_uniform(b, k);
                ds::fill_uniform(bias, 3);
                require_parity(ds::matmul(a, b), 2e-5, 2e-5);
                require_parity(ds::max(ds::matmul(a, b) + bias, 0.0f), 2e-5, 2e-5);
                // a NaN in B reaches its column only, an infinity in A its row only
                b(k - 1, 500) = std::numeric_limits<float>::quiet_NaN();
                a(m - 1, k / 2) = std::numeric_limits<float>::infinity();
                require_parity(ds::matmul(a, b), 2e-5, 2e-5);
            }
        }
    });
}

// ds::prepack: B packed once, read by every path of the product (the paths that read B in
// place are not taken then), across the blocks of depth (kc = 256) and columns (nc: 4096
// floats, 2048 doubles), with batches folded into rows, a transposed A, a transposed B, an
// epilogue, and a NaN and an infinity.
TEMPLATE_TEST_CASE("a right operand packed once (ds::prepack) on every path of the product", "", float, double) {
    with_one_and_two_threads([] {
        const double tol = tolerance<TestType>;
        for (std::size_t m : {std::size_t{1}, std::size_t{3}, std::size_t{65}, std::size_t{257}}) {
            for (std::size_t k : {std::size_t{1}, std::size_t{17}, std::size_t{300}}) {
                for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{65}}) {
                    INFO("m=" << m << " k=" << k << " n=" << n);
                    ds::tensor<TestType, Batch, M, K> a(Batch{2}, M{m}, K{k});
                    ds::tensor<TestType, K, N> b(K{k}, N{n});
                    ds::tensor<TestType, N, K> b_rows(N{n}, K{k});
                    ds::tensor<TestType, N> bias(N{n});
                    ds::fill_uniform(a, m + k);
                    ds::fill_uniform(b, k + n);
                    ds::fill_uniform(b_rows, k * n);
                    ds::fill_uniform(bias, n);
                    b(k - 1, n / 2) = std::numeric_limits<TestType>::quiet_NaN();
                    a(1, m - 1, k / 2) = std::numeric_limits<TestType>::infinity();
                    const auto packed = ds::prepack(b);
                    const auto packed_transposed = ds::prepack(ds::transpose(b_rows));
                    require_parity(ds::matmul(a, packed), tol, tol);
                    require_parity(ds::max(ds::matmul(a, packed_transposed) + bias, TestType(0)), tol, tol);
                    ds::tensor<TestType, K, M> a_columns(K{k}, M{m});  // A transposed in memory
                    ds::fill_uniform(a_columns, m * k);
                    require_parity(ds::matmul(ds::transpose(a_columns), packed), tol, tol);
                }
            }
        }
        ds::tensor<TestType, M, K> a(M{65}, K{300});
        ds::tensor<TestType, K, N> wide(K{300}, N{4100});  // two blocks of columns
        ds::fill_uniform(a, 1);
        ds::fill_uniform(wide, 2);
        require_parity(ds::matmul(a, ds::prepack(wide)), tol, tol);
        // a few rows (decoding): the panels streamed once, shared by the threads (B of 2.4 MB),
        // into a transposed destination too
        ds::tensor<TestType, K, N> large(K{601}, N{1003});
        ds::fill_uniform(large, 3);
        large(600, 500) = std::numeric_limits<TestType>::quiet_NaN();
        const auto packed_large = ds::prepack(large);
        for (std::size_t m : {1, 2, 3, 4, 5}) {
            INFO("m=" << m);
            ds::tensor<TestType, M, K> rows(M{m}, K{601});
            ds::fill_uniform(rows, m);
            require_parity(ds::matmul(rows, packed_large), tol, tol);
            ds::tensor<TestType, N, M> out_t(N{1003}, M{m});
            ds::assign(ds::transpose(out_t), ds::matmul(rows, packed_large));
            test::require_close(ds::transpose(out_t),
                                test::to_xt(ds::eval(ds::matmul(rows, large), ds::backend::reference::evaluator{})), tol, tol);
        }
    });
}

// bf16 weights packed into float panels, never widened into a temporary: the reference
// reads the bf16 values in double. Each result is rounded to bf16 (relative 2^-8) after a
// float sum of k = 300 products of values below 1 (absolute 300 * 2^-24 * 300, far below).
TEST_CASE("a bf16 right operand packed once (ds::prepack), against the bf16 values in double") {
    with_one_and_two_threads([] {
        for (std::size_t m : {std::size_t{1}, std::size_t{65}, std::size_t{257}}) {
            INFO("m=" << m);
            ds::tensor<ds::bf16, M, K> a(M{m}, K{300});
            ds::tensor<ds::bf16, K, N> b(K{300}, N{33});
            ds::fill_uniform(a, m);
            ds::fill_uniform(b, 2);
            b(7, 5) = std::numeric_limits<ds::bf16>::quiet_NaN();
            require_parity(ds::matmul(a, ds::prepack(b)), 1.0 / 256, 1e-3);
            require_parity(ds::cast<float>(ds::matmul(a, ds::prepack(b))), tolerance<float>, tolerance<float>);
        }
    });
}

// bf16 operands read where they lie, widened as the product packs or loads them (gemm.hpp):
// a few rows, odd sizes, transposed, one operand of each type; this file is also built for
// AVX2 and SSE2, whose widening loads differ. The reference reads the same bf16 values in
// double; in float, the sums are those of the exact widened values: float's tolerance.
TEST_CASE("bf16 operands read where they lie, against the bf16 values in double") {
    with_one_and_two_threads([] {
        for (std::size_t m : {std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{65}}) {
            for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{33}, std::size_t{65}}) {
                for (std::size_t k : {std::size_t{1}, std::size_t{17}, std::size_t{257}}) {
                    INFO("m=" << m << " n=" << n << " k=" << k);
                    ds::tensor<ds::bf16, M, K> a(M{m}, K{k});
                    ds::tensor<ds::bf16, K, M> a_columns(K{k}, M{m});
                    ds::tensor<ds::bf16, K, N> b(K{k}, N{n});
                    ds::tensor<ds::bf16, N, K> b_rows(N{n}, K{k});  // B transposed in memory
                    ds::tensor<float, K, N> b_float(K{k}, N{n});
                    ds::fill_uniform(a, m * 7 + k);
                    ds::fill_uniform(a_columns, m + k);
                    ds::fill_uniform(b, n * 5 + k);
                    ds::fill_uniform(b_rows, n * 3 + k);
                    ds::fill_uniform(b_float, n + k);
                    a(m / 2, k / 2) = std::numeric_limits<ds::bf16>::quiet_NaN();
                    b_rows(n - 1, k - 1) = std::numeric_limits<ds::bf16>::infinity();
                    const double tol = tolerance<float>;
                    require_parity(ds::cast<float>(ds::matmul(a, b)), tol, tol);
                    require_parity(ds::cast<float>(ds::matmul(ds::transpose(a_columns), ds::transpose(b_rows))), tol, tol);
                    require_parity(ds::matmul(ds::cast<float>(a), b_float), tol, tol);
                    require_parity(ds::matmul(ds::transpose(b_float), ds::cast<float>(ds::transpose(a))), tol, tol);
                }
            }
        }
    });
}
