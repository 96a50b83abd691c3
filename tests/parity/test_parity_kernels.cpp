// Parity: the CPU backend's fused elementwise pass, softmax, layer_norm, reductions and views
// against the reference backend: every SIMD tail, broadcasts, strides, NaN and infinities.
#include "parity.hpp"

#include <dimsum/backend/cpu/threads.hpp>  // split_range, tested here with the kernels

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace parity;

TEMPLATE_TEST_CASE("fused elementwise chains: every tail, broadcasts, strides", "", float, double) {
    with_one_and_two_threads([] {
        double tol = tolerance<TestType>;
        for (std::size_t n = 1; n <= 40; ++n) {
            for (std::size_t rows : {std::size_t{1}, std::size_t{3}}) {
                INFO("rows=" << rows << " n=" << n);
                ds::tensor<TestType, M, N> x(M{rows}, N{n}), y(M{rows}, N{n});
                ds::tensor<TestType, N> row(N{n});
                ds::tensor<TestType, M, ds::dim<1>> column(M{rows});
                ds::tensor<TestType, N, M> x_t(N{n}, M{rows});
                ds::fill_uniform(x, n);
                ds::fill_uniform(y, n + 100, 0.5, 2.0);
                ds::fill_uniform(row, n + 200);
                ds::fill_uniform(column, n + 300);
                ds::fill_uniform(x_t, n + 400);
                require_parity(x * y + row, tol, tol);
                require_parity(ds::exp(x) / y - ds::log(y) * column, tol, tol);
                require_parity(ds::sqrt(y) + ds::tanh(x) - ds::abs(x) + (-x), tol, tol);
                require_parity(ds::erf(x * TestType(3)), tol, tol);
                require_parity(ds::max(x, ds::transpose(x_t)) * ds::min(x, TestType(0.25)), tol, tol);
                require_parity(ds::transpose(x_t) + TestType(1), tol, tol);  // a strided copy
            }
        }
        // long enough to run in parallel, with a strided operand
        ds::tensor<TestType, M, N> big(M{257}, N{1031}), other(M{257}, N{1031});
        ds::tensor<TestType, N, M> big_t(N{1031}, M{257});
        ds::fill_uniform(big, 16);
        ds::fill_uniform(other, 17);
        ds::fill_uniform(big_t, 18);
        require_parity(ds::exp(big) * other + ds::transpose(big_t), tol, tol);
    });
}

TEST_CASE("fused elementwise: NaN, infinities, where and masks") {
    constexpr float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    ds::tensor<float, M, N> x(M{3}, N{19}), y(M{3}, N{19});
    ds::fill_uniform(x, 19);
    ds::fill_uniform(y, 20);
    x(0, 0) = nan;
    y(1, 5) = nan;
    x(2, 3) = inf;
    y(2, 17) = -inf;
    require_parity(ds::max(x, y) + ds::min(y, x), 0, 0);
    require_parity(ds::where(ds::causal_mask(M{3}, N{19}), x, y), 0, 0);
    require_parity(ds::masked_fill(x, ds::causal_mask(M{3}, N{19}), -inf), 0, 0);
}

TEMPLATE_TEST_CASE("softmax and layer_norm along any axis, contiguous or not", "", float, double) {
    with_one_and_two_threads([] {
        double tol = std::is_same_v<TestType, float> ? 1e-5 : 1e-12;
        for (std::size_t n : {1, 3, 7, 17, 65, 257, 4099}) {
            for (std::size_t rows : {1, 3, 65}) {
                INFO("rows=" << rows << " n=" << n);
                ds::tensor<TestType, M, N> x(M{rows}, N{n});
                ds::fill_normal(x, n + rows, 0.0, 3.0);
                require_parity(ds::softmax(x), tol, tol);
                require_parity(ds::softmax<M>(x), tol, tol);
                require_parity(ds::softmax(ds::transpose(x)), tol, tol);
                require_parity(ds::layer_norm(x), 10 * tol, 10 * tol);
                require_parity(ds::layer_norm<M>(x + TestType(100)), 100 * tol, 100 * tol);
                require_parity(ds::softmax(x * TestType(1000)), tol, tol);  // logits of 1e3 and more
            }
        }
    });
}

TEST_CASE("softmax of masked rows: -inf entries, a fully masked row gets weights 0") {
    constexpr float inf = std::numeric_limits<float>::infinity();
    ds::tensor<float, M, N> scores(M{5}, N{37});
    ds::fill_normal(scores, 21);
    require_parity(ds::softmax(ds::masked_fill(scores, ds::causal_mask(M{5}, N{37}), -inf)), 1e-6, 1e-7);
    for (std::size_t j = 0; j < 37; ++j) scores(2, j) = -inf;
    require_parity(ds::softmax(scores), 1e-6, 1e-7);
    auto weights = ds::eval(ds::softmax(scores));
    for (std::size_t j = 0; j < 37; ++j) REQUIRE(weights(2, j) == 0.0f);
}

TEMPLATE_TEST_CASE("reductions along every axis", "", float, double) {
    double tol = std::is_same_v<TestType, float> ? 1e-5 : 1e-12;
    for (std::size_t n : {1, 17, 65, 4099}) {
        ds::tensor<TestType, Batch, M, N> x(Batch{3}, M{7}, N{n});
        ds::fill_uniform(x, n);
        require_parity(ds::sum<N>(x), tol, tol);
        require_parity(ds::mean<M>(x), tol, tol);
        require_parity(ds::max<Batch>(x), 0, 0);
        require_parity(ds::max<N>(ds::transpose(x)), 0, 0);
    }
}

TEST_CASE("views of computed values: permuted, reshaped and selected") {
    with_one_and_two_threads([] {
        using Seq = ds::axis<"seq">;
        using Head = ds::axis<"head", 8>;
        using Model = ds::axis<"model", 24>;
        ds::tensor<float, Seq, Model> x(Seq{37});
        ds::tensor<float, Model, Model> w;
        ds::fill_uniform(x, 22);
        ds::fill_uniform(w, 23);
        // split heads of a product, transposed: a view of a temporary
        auto heads = ds::transpose<Seq, Heads>(ds::view<Seq, Heads, Head>(ds::matmul(x, w)));  // (heads, seq, head)
        require_parity(heads, 1e-5, 1e-6);
        require_parity(ds::softmax(ds::matmul(heads, ds::transpose(heads))), 1e-5, 1e-6);
        // merging transposed axes needs a copy first
        require_parity(ds::view<Seq, Model>(ds::transpose<Heads, Seq>(heads)), 1e-5, 1e-6);
        require_parity(ds::select<Heads>(ds::softmax(heads), 2), 1e-6, 1e-7);
        // a product whose operand is itself a formula
        require_parity(ds::matmul(ds::tanh(x) + 1.0f, w), 1e-5, 1e-5);
    });
}

TEST_CASE("a call from inside the caller's parallel region runs on its own thread") {
    ds::tensor<float, Batch, M, K> a(Batch{4}, M{33}, K{65});
    ds::tensor<float, K, N> b(K{65}, N{47});
    ds::fill_uniform(a, 24);
    ds::fill_uniform(b, 25);
    auto want = ds::eval(ds::tanh(ds::matmul(a, b)));
    std::vector<ds::tensor<float, Batch, M, N>> got;
    for (int i = 0; i < 2; ++i) got.emplace_back(Batch{4}, M{33}, N{47});
    int inner_threads[2] = {0, 0};
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 2; ++i) {
        inner_threads[i] = ds::num_threads();
        ds::assign(got[std::size_t(i)], ds::tanh(ds::matmul(a, b)));
    }
    for (int i = 0; i < 2; ++i) {
        REQUIRE(std::equal(want.data(), want.data() + want.size(), got[std::size_t(i)].data()));
    }
    REQUIRE(inner_threads[0] == 1);
    REQUIRE(inner_threads[1] == 1);
}

TEST_CASE("an exception in one chunk of a parallel loop reaches the caller, after the chunks started have ended") {
    std::atomic<std::size_t> started{0}, finished{0};
    auto body = [&](std::size_t first, std::size_t) {
        ++started;
        if (first == 0) throw std::runtime_error("the first chunk failed");
        ++finished;
    };
    REQUIRE_THROWS_WITH(ds::backend::cpu::split_range(2, 64, [] {}, body), "the first chunk failed");
    REQUIRE(finished.load() + 1 == started.load());  // every chunk started has ended
}

TEST_CASE("every member of a parallel loop prepares before any chunk runs, and a failed prepare runs nothing") {
    std::atomic<std::size_t> covered{0};
    auto body = [&](std::size_t first, std::size_t last) { covered += last - first; };
    for (int failing = 1; failing <= 2; ++failing) {  // the caller's prepare, then a helper's
        int prepared = 0;
        auto prepare = [&] {
            if (++prepared == failing) throw std::bad_alloc();
        };
        REQUIRE_THROWS_AS(ds::backend::cpu::split_range(2, 64, prepare, body), std::bad_alloc);
        REQUIRE(covered.load() == 0);
    }
    // every member prepares, then the range is covered once
    int prepared = 0;
    ds::backend::cpu::split_range(2, 64, [&] { ++prepared; }, body);
    REQUIRE(prepared == 2);
    REQUIRE(covered.load() == 64);
}

TEST_CASE("layer_norm in float: large means, huge and tiny magnitudes, constant lines, against double") {
    // The reference backend accumulates float lines in double: exact enough to be the truth here.
    with_one_and_two_threads([] {
        for (std::size_t n : {1, 7, 33, 768, 4099}) {
            ds::tensor<float, M, N> x(M{12}, N{n});
            ds::fill_normal(x, n);
            auto row = [&](std::size_t r, auto value) {
                for (std::size_t j = 0; j < n; ++j) x(r, j) = static_cast<float>(value(j));
            };
            row(0, [](std::size_t) { return 12345.678f; });  // constant: every output 0
            row(1, [](std::size_t) { return 3e7f; });
            row(2, [](std::size_t) { return -1e30f; });
            row(3, [&](std::size_t j) { return x(3, j) * 1e30f; });          // squares overflow float
            row(4, [&](std::size_t j) { return x(4, j) > 0 ? 3e38f : -3e38f; });  // so do sums
            row(5, [&](std::size_t j) { return 12345.678f + x(5, j); });     // a large mean
            row(6, [&](std::size_t j) { return 1e6f + x(6, j) * 1e-2f; });   // a larger one, a small spread
            row(7, [&](std::size_t j) { return x(7, j) * 1e-30f; });         // variance far below epsilon
            row(8, [&](std::size_t j) { return x(8, j) * 1e-42f; });         // subnormal values
            row(9, [](std::size_t) { return 0.0f; });
            row(10, [&](std::size_t j) { return j % 2 ? 3.4e38f : 3.0e38f; });
            INFO("n=" << n);
            require_parity(ds::layer_norm(x), 1e-5, 2e-6);
            require_parity(ds::layer_norm(x, 0.0), 1e-5, 2e-6);
            auto y = ds::eval(ds::layer_norm(x));
            for (std::size_t j = 0; j < n; ++j) {
                REQUIRE(y(0, j) == 0.0f);
                REQUIRE(y(1, j) == 0.0f);
                REQUIRE(y(2, j) == 0.0f);
            }
        }
    });
}

TEST_CASE("evaluations on several std::threads at once, each starting teams of its own") {
    ds::tensor<float, Batch, M, K> a(Batch{2}, M{129}, K{65});
    ds::tensor<float, K, N> b(K{65}, N{300});
    ds::fill_uniform(a, 26);
    ds::fill_uniform(b, 27);
    auto formula = [&] { return ds::softmax(ds::tanh(ds::matmul(a, b)) * 3.0f); };
    ds::set_num_threads(2);
    auto want = ds::eval(formula(), ds::backend::reference::evaluator{});
    std::vector<ds::tensor<float, Batch, M, N>> got;
    for (int i = 0; i < 3; ++i) got.emplace_back(Batch{2}, M{129}, N{300});
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < got.size(); ++i) {
        threads.emplace_back([&, i] {
            for (int repeat = 0; repeat < 3; ++repeat) ds::assign(got[i], formula());
        });
    }
    for (auto& t : threads) t.join();
    ds::set_num_threads(0);
    for (const auto& g : got) test::require_close(g, test::to_xt(want), 1e-5, 1e-6);
}
