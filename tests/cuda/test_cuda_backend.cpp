// The CUDA backend against the reference backend: every kind of plan entry on odd sizes,
// strided, transposed and broadcast operands, NaN and infinities, bf16 and integer inputs,
// the gradients of formulas (the reverse sweep's entries, a gather's scatter-add), and a
// model's training step (ds::backward, a tape) run on this backend.
// Built twice (tests/CMakeLists.txt): linked with the host stand-in of the device
// (host_device.cpp), where it runs in every CI build, and linked with dimsum::cuda, where it
// runs on a GPU and is skipped without one (gpu_main.cpp).
#include "../parity/parity.hpp"

#include <dimsum/backend/cuda/tensor.hpp>
#include <dimsum/interop/parameters.hpp>

#include <boost/hana/define_struct.hpp>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>

using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using D = ds::axis<"d">;
using Vocab = ds::axis<"vocab">;

namespace {

namespace cuda = ds::backend::cuda;

// Math functions on the device (exp, erf, tanh...) may differ from the host's in the last
// bits: float gets a few ulps more than the CPU parity tests' 2e-5.
template <class T>
constexpr double tol = std::is_same_v<T, float> ? 5e-5 : 1e-12;

template <class E>
void require_cuda_parity(const E& formula, double rtol, double atol, const cuda::evaluator& gpu = {}) {
    auto got = ds::eval(formula, gpu);
    auto want = ds::eval(formula, ds::backend::reference::evaluator{});
    test::require_close(got, test::to_xt(want), rtol, atol);
}

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float not_a_number = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEMPLATE_TEST_CASE("cuda: elementwise passes with broadcasts, strides and every function", "", float, double) {
    for (std::size_t n : parity::sizes) {
        for (std::size_t rows : {std::size_t{1}, std::size_t{3}}) {
            INFO("rows=" << rows << " n=" << n);
            ds::tensor<TestType, M, N> x(M{rows}, N{n}), y(M{rows}, N{n});
            ds::tensor<TestType, N> row(N{n});
            ds::tensor<TestType, N, M> x_t(N{n}, M{rows});
            ds::fill_uniform(x, n);
            ds::fill_uniform(y, n + 100, 0.5, 2.0);
            ds::fill_uniform(row, n + 200);
            ds::fill_uniform(x_t, n + 400);
            const double t = tol<TestType>;
            require_cuda_parity(x * y + row, t, t);
            require_cuda_parity(ds::exp(x) / y - ds::log(y) * row, t, t);
            require_cuda_parity(ds::sqrt(y) + ds::tanh(x) - ds::abs(x) + (-x), t, t);
            require_cuda_parity(ds::erf(x * TestType(3)) + ds::gelu(x) + ds::sigmoid(x) * ds::silu(y), t, t);
            require_cuda_parity(ds::sin(x) * ds::cos(y) + ds::rsqrt(y) + ds::pow(y, TestType(1.5)), t, t);
            require_cuda_parity(ds::max(x, ds::transpose(x_t)) * ds::min(x, TestType(0.25)), t, t);
            require_cuda_parity(ds::transpose(x_t) + TestType(1), t, t);  // a strided copy
            require_cuda_parity(ds::where(x > y, x, y * TestType(2)), t, t);
            require_cuda_parity(ds::where((x < TestType(0)) && !(y >= TestType(1)), x, TestType(-1)), t, t);
            auto h = ds::tanh(x);
            require_cuda_parity(h * h + h, t, t);  // a sub-formula read three times: one node
        }
    }
}

TEST_CASE("cuda: NaN and infinities in every position, masks, causal_mask, arange") {
    for (std::size_t n : {1, 5, 19, 33}) {
        ds::tensor<float, M, N> x(M{3}, N{n}), y(M{3}, N{n});
        ds::fill_uniform(x, n);
        ds::fill_uniform(y, n + 1);
        for (std::size_t j = 0; j < n; j += 3) {
            x(0, j) = not_a_number;
            y(1, j) = not_a_number;
            x(2, j) = j % 2 ? inf : -inf;
        }
        require_cuda_parity(ds::max(x, y) + ds::min(y, x), 0, 0);
        require_cuda_parity(ds::exp(x) - ds::tanh(y) * ds::sigmoid(x), 5e-6, 5e-6);  // CUDA's exp and tanh: 2 ulp
        require_cuda_parity(ds::where(ds::causal_mask(M{3}, N{n}), x, y), 0, 0);
        require_cuda_parity(ds::masked_fill(x, ds::causal_mask(M{3}, N{n}), -inf), 0, 0);
        require_cuda_parity(ds::where(x != x, 1.0f, 0.0f), 0, 0);  // NaN is unequal to itself
        require_cuda_parity(ds::arange(N{n}) * 2.0f + x, 0, 0);
    }
}

TEMPLATE_TEST_CASE("cuda: products through cuBLAS: odd sizes, transposed, strided, batched, broadcast", "", float, double) {
    const double t = std::is_same_v<TestType, float> ? 1e-4 : 1e-11;
    for (std::size_t m : {1, 3, 17, 65}) {
        for (std::size_t k : {1, 7, 65}) {
            for (std::size_t n : {1, 3, 17}) {
                INFO("m=" << m << " k=" << k << " n=" << n);
                ds::tensor<TestType, M, K> a(M{m}, K{k});
                ds::tensor<TestType, K, N> b(K{k}, N{n});
                ds::tensor<TestType, K, M> a_t(K{k}, M{m});
                ds::tensor<TestType, N, K> b_t(N{n}, K{k});
                ds::fill_uniform(a, m + k);
                ds::fill_uniform(b, k + n + 1);
                ds::fill_uniform(a_t, m + 2);
                ds::fill_uniform(b_t, n + 3);
                require_cuda_parity(ds::matmul(a, b), t, t);
                require_cuda_parity(ds::matmul(ds::transpose(a_t), b), t, t);
                require_cuda_parity(ds::matmul(a, ds::transpose(b_t)), t, t);
                require_cuda_parity(ds::matmul(ds::transpose(a_t), ds::transpose(b_t)), t, t);
                // every other column of a wider A: no unit stride, copied row-major first
                ds::tensor<TestType, M, K> wide(M{m}, K{2 * k});
                ds::fill_uniform(wide, m * k + 5);
                require_cuda_parity(ds::matmul(ds::slice<K>(wide, 0, 2 * k, 2), b), t, t);
            }
        }
    }
    // batches: B shared (folded into rows), B per item (cuBLAS's batch), two batch axes (a loop)
    ds::tensor<TestType, Batch, M, K> x(Batch{3}, M{5}, K{7});
    ds::tensor<TestType, K, N> w(K{7}, N{9});
    ds::tensor<TestType, Batch, K, N> per_item(Batch{3}, K{7}, N{9});
    ds::tensor<TestType, Batch, Heads, M, K> q(Batch{2}, Heads{3}, M{5}, K{7});
    ds::tensor<TestType, Batch, Heads, K, N> kt(Batch{2}, Heads{3}, K{7}, N{4});
    ds::tensor<TestType, N> bias(N{9});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    ds::fill_uniform(per_item, 3);
    ds::fill_uniform(q, 4);
    ds::fill_uniform(kt, 5);
    ds::fill_uniform(bias, 6);
    require_cuda_parity(ds::matmul(x, w), t, t);
    require_cuda_parity(ds::matmul(x, per_item), t, t);
    // an A copied row-major first (every other column) and shared by every item of B
    ds::tensor<TestType, M, K> wide_a(M{5}, K{14});
    ds::fill_uniform(wide_a, 12);
    require_cuda_parity(ds::matmul(ds::slice<K>(wide_a, 0, 14, 2), per_item), t, t);
    require_cuda_parity(ds::matmul(q, kt), t, t);
    require_cuda_parity(ds::matmul(ds::transpose<M, K>(ds::transpose<M, K>(q)), kt), t, t);
    // epilogues: the rest of the formula after the product, in place
    require_cuda_parity(ds::tanh(ds::matmul(x, w) + bias) * TestType(0.5), t, t);
    require_cuda_parity(ds::gelu(ds::matmul(x, w) + bias) + ds::matmul(x, w), t, t);
    // an empty sum: zeros
    ds::tensor<TestType, M, K> empty_a(M{3}, K{0});
    ds::tensor<TestType, K, N> empty_b(K{0}, N{4});
    require_cuda_parity(ds::matmul(empty_a, empty_b) + TestType(1), 0, 0);
}

TEST_CASE("cuda: a product written into a transposed or strided destination") {
    ds::tensor<float, M, K> a(M{17}, K{9});
    ds::tensor<float, K, N> b(K{9}, N{5});
    ds::fill_uniform(a, 7);
    ds::fill_uniform(b, 8);
    const auto want = test::to_xt(ds::eval(ds::matmul(a, b), ds::backend::reference::evaluator{}));
    // (n, m) memory written as (m, n): column-major C, cuBLAS's own form
    cuda::evaluator gpu;
    ds::tensor<float, N, M> c_t(N{5}, M{17});
    ds::fill_uniform(c_t, 9);
    ds::evaluation::assign_with(gpu, ds::transpose(c_t.view()), ds::matmul(a, b));
    test::require_close(ds::transpose(c_t.view()), want, 1e-5, 1e-5);
    // every other column of a wider tensor: a temporary, then a copy; the columns between untouched
    ds::tensor<float, M, N> wide(M{17}, N{10});
    std::fill(wide.data(), wide.data() + wide.size(), -7.0f);
    ds::evaluation::assign_with(gpu, ds::slice<N>(wide.view(), 0, 10, 2), ds::matmul(a, b));
    test::require_close(ds::slice<N>(wide.view(), 0, 10, 2), want, 1e-5, 1e-5);
    for (std::size_t i = 0; i < 17; ++i) {
        for (std::size_t j = 1; j < 10; j += 2) REQUIRE(wide(i, j) == -7.0f);
    }
    // the same destination, and an A that must be copied first too
    ds::tensor<float, M, K> wide_a(M{17}, K{18});
    ds::fill_uniform(wide_a, 10);
    ds::evaluation::assign_with(gpu, ds::slice<N>(wide.view(), 0, 10, 2), ds::matmul(ds::slice<K>(wide_a.view(), 0, 18, 2), b));
    test::require_close(ds::slice<N>(wide.view(), 0, 10, 2),
                        test::to_xt(ds::eval(ds::matmul(ds::slice<K>(wide_a.view(), 0, 18, 2), b), ds::backend::reference::evaluator{})),
                        1e-5, 1e-5);
}

TEMPLATE_TEST_CASE("cuda: softmax, layer_norm and reductions along any axis", "", float, double) {
    const double t = std::is_same_v<TestType, float> ? 2e-5 : 1e-12;
    for (std::size_t n : {1, 3, 17, 257}) {
        for (std::size_t rows : {1, 7}) {
            INFO("rows=" << rows << " n=" << n);
            ds::tensor<TestType, M, N> x(M{rows}, N{n});
            ds::fill_normal(x, n + rows, 0.0, 3.0);
            require_cuda_parity(ds::softmax(x), t, t);
            require_cuda_parity(ds::softmax<M>(x), t, t);
            require_cuda_parity(ds::softmax(ds::transpose(x)), t, t);
            require_cuda_parity(ds::softmax(x * TestType(1000)), t, t);
            require_cuda_parity(ds::layer_norm(x), 10 * t, 10 * t);
            require_cuda_parity(ds::layer_norm<M>(x + TestType(100)), 100 * t, 100 * t);
            require_cuda_parity(ds::sum<N>(x), 10 * t, 10 * t);
            require_cuda_parity(ds::sum<M>(x), 10 * t, 10 * t);
            require_cuda_parity(ds::max<N>(x), 0, 0);
            require_cuda_parity(ds::mean<M>(ds::transpose(x)), 10 * t, 10 * t);
            require_cuda_parity(ds::mean<N>(x, ds::keep_axis) + x, 10 * t, 10 * t);
        }
    }
    // a fully masked row gets weights 0; NaN propagates
    ds::tensor<TestType, M, N> scores(M{3}, N{37});
    ds::fill_uniform(scores, 11);
    for (std::size_t j = 0; j < 37; ++j) scores(0, j) = -std::numeric_limits<TestType>::infinity();
    scores(1, 5) = std::numeric_limits<TestType>::quiet_NaN();
    scores(2, 36) = -std::numeric_limits<TestType>::infinity();
    require_cuda_parity(ds::softmax(scores), t, t);
    require_cuda_parity(ds::max<N>(scores), 0, 0);
}

// Fused attention with its keys whole (key_splits 1), split in 3 ranges (or fewer where there
// are fewer key blocks), and as attention_key_splits chooses.
constexpr std::size_t key_split_choices[] = {1, 3, 0};

TEST_CASE("cuda: attention as the paper writes it, causal and padded, strided operands") {
    // on the GPU, more than one tile of 64 queries and 64 keys (src/cuda/attention.cu) each way
    for (std::size_t queries : {1, 7, 65, 130}) {
        for (std::size_t keys : {1, 17, 65, 200}) {
            ds::tensor<float, Batch, Heads, Query, D> q(Batch{2}, Heads{3}, Query{queries}, D{16});
            ds::tensor<float, Batch, Heads, Key, D> k(Batch{2}, Heads{3}, Key{keys}, D{16});
            ds::tensor<float, Batch, Heads, Key, D> v(Batch{2}, Heads{3}, Key{keys}, D{16});
            ds::fill_normal(q, queries);
            ds::fill_normal(k, keys + 1);
            ds::fill_normal(v, keys + 2);
            auto scores = ds::matmul(q, ds::transpose<Key, D>(k)) / 4.0f;
            auto causal = ds::masked_fill(scores, ds::causal_mask(Query{queries}, Key{keys}), -inf);
            for (std::size_t splits : key_split_choices) {
                INFO("queries=" << queries << " keys=" << keys << " key_splits=" << splits);
                const cuda::evaluator gpu{.key_splits = splits};
                require_cuda_parity(ds::matmul(ds::softmax<Key>(scores), v), 1e-4, 1e-5, gpu);
                require_cuda_parity(ds::matmul(ds::softmax<Key>(causal), v), 1e-4, 1e-5, gpu);
            }
        }
    }
}

TEST_CASE("cuda: fused attention: scales, score functions, broadcast heads, wide heads, masked rows") {
    using DV = ds::axis<"dv">;
    for (std::size_t dv : {1, 64, 65, 150}) {
        for (std::size_t queries : {1, 9, 40}) {
            for (std::size_t keys : {3, 17, 40}) {
                INFO("dv=" << dv << " queries=" << queries << " keys=" << keys);
                ds::tensor<float, Batch, Heads, Query, D> q(Batch{2}, Heads{3}, Query{queries}, D{5});
                ds::tensor<float, Batch, Key, D> k(Batch{2}, Key{keys}, D{5});  // one key head for every query head
                ds::tensor<float, Batch, Key, DV> v(Batch{2}, Key{keys}, DV{dv});
                ds::tensor<float, Query, Key> bias(Query{queries}, Key{keys});
                ds::tensor<std::int64_t, Batch> lengths(Batch{2});
                lengths(0) = static_cast<std::int64_t>(keys);
                lengths(1) = static_cast<std::int64_t>(keys / 2);  // the second item's last keys are padding
                ds::fill_normal(q, queries + dv);
                ds::fill_normal(k, keys + 1);
                ds::fill_normal(v, keys + 2);
                ds::fill_normal(bias, keys + 3);
                auto k4 = ds::unsqueeze<Heads, 1>(k);  // (batch, 1, keys, d): broadcast over heads
                auto v4 = ds::unsqueeze<Heads, 1>(v);
                auto scores = ds::matmul(q, ds::transpose<Key, D>(k4));
                auto causal = ds::causal_mask(Query{queries}, Key{keys});
                auto padded = ds::where(ds::unsqueeze<Query, 2>(ds::unsqueeze<Heads, 1>(ds::sequence_mask(lengths, Key{keys}))),
                                        scores, -inf);
                for (std::size_t splits : key_split_choices) {
                    INFO("key_splits=" << splits);
                    const cuda::evaluator gpu{.key_splits = splits};
                    require_cuda_parity(ds::matmul(ds::softmax<Key>(scores * 0.5f), v4), 1e-4, 1e-5, gpu);
                    require_cuda_parity(ds::matmul(ds::softmax<Key>(scores / 3.0f), v4), 1e-4, 1e-5, gpu);
                    require_cuda_parity(ds::matmul(ds::softmax<Key>(ds::masked_fill(scores / 3.0f, causal, -inf)), v4), 1e-4, 1e-5, gpu);
                    require_cuda_parity(ds::matmul(ds::softmax<Key>(ds::tanh(scores * 0.1f) * 5.0f + bias), v4), 1e-4, 1e-5, gpu);
                    require_cuda_parity(ds::matmul(ds::softmax<Key>(padded), v4), 1e-4, 1e-5, gpu);
                }
            }
        }
    }
    // the plan: one attention entry, no queries x keys matrix
    ds::tensor<float, Batch, Heads, Query, D> q(Batch{1}, Heads{2}, Query{8}, D{4});
    ds::tensor<float, Batch, Heads, Key, D> k(Batch{1}, Heads{2}, Key{8}, D{4});
    const std::string plan = ds::explain(ds::matmul(ds::softmax<Key>(ds::matmul(q, ds::transpose<Key, D>(k)) * 0.5f), k),
                                         cuda::evaluator{});
    INFO(plan);
    REQUIRE(plan.find("no (queries, keys) matrix") != std::string::npos);
    // NaN and infinities in the scores: NaN propagates, a row of -infinity only gets 0; with the
    // keys split, NaN or +infinity in the middle range and -infinity in a whole range
    ds::tensor<float, Batch, Heads, Query, D> qn(Batch{1}, Heads{1}, Query{6}, D{3});
    ds::tensor<float, Batch, Heads, Key, D> kn(Batch{1}, Heads{1}, Key{40}, D{3});
    ds::fill_normal(qn, 1);
    ds::fill_normal(kn, 2);
    qn(0, 0, 1, 2) = not_a_number;
    ds::tensor<float, Query, Key> mask(Query{6}, Key{40});
    for (std::size_t j = 0; j < 40; ++j) mask(2, j) = -inf;
    mask(3, 20) = inf;
    mask(4, 21) = not_a_number;
    for (std::size_t j = 16; j < 32; ++j) mask(5, j) = -inf;
    for (std::size_t splits : key_split_choices) {
        INFO("key_splits=" << splits);
        require_cuda_parity(ds::matmul(ds::softmax<Key>(ds::matmul(qn, ds::transpose<Key, D>(kn)) + mask), kn), 1e-4, 1e-5,
                            cuda::evaluator{.key_splits = splits});
    }
}

TEST_CASE("cuda: decoding: one or two queries against many keys, the keys split") {
    // the rule: as many ranges as give the device its threads, each of two key blocks or more
    STATIC_REQUIRE(cuda::attention_key_splits(8, 1, 700) == 21);
    STATIC_REQUIRE(cuda::attention_key_splits(8, 1, 40) == 1);
    STATIC_REQUIRE(cuda::attention_key_splits(std::size_t(1) << 15, 1, 1 << 20) == 1);
    STATIC_REQUIRE(cuda::attention_key_splits(std::size_t(1) << 14, 2, 1 << 20) == 2);
    STATIC_REQUIRE(cuda::attention_key_splits(8 * 16, 16, 1 << 20) == 1);  // 16 queries: the tiles
    for (std::size_t queries : {1, 2}) {
        for (std::size_t keys : {33, 700, 1031}) {
            ds::tensor<float, Batch, Heads, Query, D> q(Batch{2}, Heads{4}, Query{queries}, D{24});
            ds::tensor<float, Batch, Heads, Key, D> k(Batch{2}, Heads{4}, Key{keys}, D{24});
            ds::tensor<float, Batch, Heads, Key, D> v(Batch{2}, Heads{4}, Key{keys}, D{24});
            ds::tensor<std::int64_t, Batch> lengths(Batch{2});
            lengths(0) = static_cast<std::int64_t>(keys);
            lengths(1) = static_cast<std::int64_t>(keys / 3);
            ds::fill_normal(q, queries + keys);
            ds::fill_normal(k, keys + 1);
            ds::fill_normal(v, keys + 2);
            auto scores = ds::matmul(q, ds::transpose<Key, D>(k)) * 0.2f;  // (batch, heads, query, key)
            auto causal = ds::masked_fill(scores, ds::causal_mask(Query{queries}, Key{keys}), -inf);
            auto padded = ds::where(ds::unsqueeze<Query, 2>(ds::unsqueeze<Heads, 1>(ds::sequence_mask(lengths, Key{keys}))),
                                    scores, -inf);
            for (std::size_t splits : {std::size_t(0), std::size_t(5), std::size_t(1000)}) {
                INFO("queries=" << queries << " keys=" << keys << " key_splits=" << splits);
                const cuda::evaluator gpu{.key_splits = splits};
                require_cuda_parity(ds::matmul(ds::softmax<Key>(scores), v), 1e-4, 1e-5, gpu);
                require_cuda_parity(ds::matmul(ds::softmax<Key>(causal), v), 1e-4, 1e-5, gpu);
                require_cuda_parity(ds::matmul(ds::softmax<Key>(padded), v), 1e-4, 1e-5, gpu);
            }
        }
    }
}

TEST_CASE("cuda: bf16 tensors read widened and written rounded, integer ids gathered") {
    cuda::evaluator gpu_evaluator;
    ds::tensor<ds::bf16, M, K> a(M{7}, K{33});
    ds::tensor<ds::bf16, K, N> b(K{33}, N{5});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(b, 2);
    require_cuda_parity(ds::matmul(a, b), 1e-5, 1e-5);  // widened exactly, computed in float
    require_cuda_parity(ds::exp(ds::cast<float>(a)) * 2.0f, 1e-5, 1e-5);
    // a bf16 destination: rounded once from the float value, so the same bits within an ulp
    const ds::tensor<ds::bf16, M, N> got = ds::eval(ds::matmul(a, b), cuda::evaluator{});
    const ds::tensor<ds::bf16, M, N> want = ds::eval(ds::matmul(a, b), ds::backend::reference::evaluator{});
    test::require_close(got, test::to_xt(want), 1.0 / 128, 1e-6);
    // bf16 on the device both ways: the same bits as the host destination, rounded by one rule
    const auto a_gpu = cuda::to_device(a);
    const auto b_gpu = cuda::to_device(b);
    const cuda::tensor<ds::bf16, M, N> product_gpu = cuda::eval(ds::matmul(a_gpu, b_gpu));
    const ds::tensor<ds::bf16, M, N> product = cuda::to_host(product_gpu);
    for (std::size_t i = 0; i < product.size(); ++i) REQUIRE(product.data()[i].bits == got.data()[i].bits);
    ds::tensor<ds::bf16, N, M> transposed_host(N{5}, M{7});
    ds::evaluation::assign_with(gpu_evaluator, ds::transpose(transposed_host.view()), ds::matmul(a_gpu, b_gpu));  // strided bf16
    for (std::size_t i = 0; i < 7; ++i) {
        for (std::size_t j = 0; j < 5; ++j) REQUIRE(transposed_host(j, i).bits == got(i, j).bits);
    }

    ds::tensor<float, Vocab, N> table(Vocab{11}, N{6});
    ds::fill_uniform(table, 3);
    ds::tensor<std::int32_t, Batch, M> ids(Batch{2}, M{5});
    for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int32_t>((i * 7 + 3) % 11);
    require_cuda_parity(ds::gather<Vocab>(table, ids), 0, 0);
    require_cuda_parity(ds::gather<Vocab>(table * 3.0f, ids) + 1.0f, 1e-6, 1e-6);
    ds::tensor<std::int64_t, M> lengths(M{4});
    for (std::size_t i = 0; i < 4; ++i) lengths(i) = static_cast<std::int64_t>(i * 2);
    ds::tensor<float, M, N> x(M{4}, N{6});
    ds::fill_uniform(x, 4);
    require_cuda_parity(ds::where(ds::sequence_mask(lengths, N{6}), x, -1.0f), 0, 0);
    // an id out of range: the error before anything runs
    ids(1, 2) = 11;
    REQUIRE_THROWS_AS(ds::eval(ds::gather<Vocab>(table, ids), cuda::evaluator{}), ds::index_error);
}

TEMPLATE_TEST_CASE("cuda: gradients are the reference backend's: a weight shared by a batch, layer_norm, gelu, softmax, attention",
                   "", float, double) {
    const double t = std::is_same_v<TestType, float> ? 2e-4 : 1e-10;
    ds::tensor<TestType, Batch, M, K> x(Batch{3}, M{13}, K{16});
    ds::tensor<TestType, K, N> w(K{16}, N{9});
    ds::tensor<TestType, N> b(N{9});
    ds::tensor<TestType, Batch, M, N> r(Batch{3}, M{13}, N{9});
    ds::fill_normal(x, 1);
    ds::fill_normal(w, 2, 0.0, 0.3);
    ds::fill_normal(b, 3);
    ds::fill_normal(r, 4);
    // products whose gradients read transposed operands, sums over the batch (w's and b's),
    // and the line kernels' gradients
    auto loss = ds::sum<Batch>(ds::sum<M>(ds::sum<N>(ds::gelu(ds::layer_norm(ds::matmul(x, w) + b)) * r +
                                                     ds::softmax(ds::matmul(x, w)) * r)));
    require_cuda_parity(ds::grad(loss, w), t, t);
    require_cuda_parity(ds::grad(loss, b), t, t);
    require_cuda_parity(ds::grad(loss, x), t, t);
    // attention, causal, its gradients with respect to Q, K and V (step by step here)
    ds::tensor<TestType, Batch, Heads, Query, D> q(Batch{2}, Heads{3}, Query{7}, D{8}), o(Batch{2}, Heads{3}, Query{7}, D{8});
    ds::tensor<TestType, Batch, Heads, Key, D> k(Batch{2}, Heads{3}, Key{7}, D{8}), v(Batch{2}, Heads{3}, Key{7}, D{8});
    ds::fill_normal(q, 5);
    ds::fill_normal(k, 6);
    ds::fill_normal(v, 7);
    ds::fill_normal(o, 8);
    auto scores = ds::matmul(q, ds::transpose<Key, D>(k)) * TestType(0.35);
    auto attended = ds::matmul(ds::softmax<Key>(ds::masked_fill(scores, ds::causal_mask(Query{7}, Key{7}),
                                                                -std::numeric_limits<TestType>::infinity())),
                               v);
    auto attention_loss = ds::sum<Batch>(ds::sum<Heads>(ds::sum<Query>(ds::sum<D>(attended * o))));
    require_cuda_parity(ds::grad(attention_loss, q), t, t);
    require_cuda_parity(ds::grad(attention_loss, k), t, t);
    require_cuda_parity(ds::grad(attention_loss, v), t, t);
}

TEMPLATE_TEST_CASE("cuda: a gather's gradient (scatter-add) is the reference backend's: repeated ids, strided ids, a middle axis",
                   "", float, double) {
    const double t = tol<TestType>;
    ds::tensor<TestType, Vocab, D> table(Vocab{11}, D{7});
    ds::tensor<TestType, M, Vocab, N> middle(M{3}, Vocab{11}, N{5});
    ds::tensor<std::int64_t, M, N> ids(M{4}, N{6});
    ds::tensor<std::int32_t, N, M> ids_t(N{6}, M{4});
    ds::fill_normal(table, 1);
    ds::fill_normal(middle, 2);
    for (std::size_t i = 0; i < 4; ++i) {
        for (std::size_t j = 0; j < 6; ++j) {
            ids(i, j) = std::int64_t((i * 7 + j * 3) % 5 * 2);  // ids 0, 2, ... 8, each many times; odd ones never
            ids_t(j, i) = std::int32_t((i + 2 * j) % 11);
        }
    }
    ds::tensor<TestType, M, N, D> r(M{4}, N{6}, D{7});
    ds::fill_normal(r, 3);
    // an embedding's gradient, and one through ids read transposed (int32)
    auto loss = ds::sum<M>(ds::sum<N>(ds::sum<D>(ds::tanh(ds::gather<Vocab>(table, ids)) * r)));
    require_cuda_parity(ds::grad(loss, table), t, t);
    auto loss_t = ds::sum<M>(ds::sum<N>(ds::sum<D>(ds::gather<Vocab>(table, ds::transpose(ids_t)) * r)));
    require_cuda_parity(ds::grad(loss_t, table), t, t);
    // the table's axis in the middle: each (m, n) position its own line
    using P = ds::axis<"p">;
    using Q = ds::axis<"q">;
    ds::tensor<std::int64_t, P, Q> few(P{2}, Q{3});
    for (std::size_t i = 0; i < 6; ++i) few.data()[i] = std::int64_t(i % 4 * 3);
    ds::tensor<TestType, M, P, Q, N> s(M{3}, P{2}, Q{3}, N{5});
    ds::fill_normal(s, 4);
    auto loss_m = ds::sum<M>(ds::sum<P>(ds::sum<Q>(ds::sum<N>(ds::gather<Vocab>(middle, few) * s))));
    require_cuda_parity(ds::grad(loss_m, middle), t, t);
}

namespace {
using GModel = ds::axis<"model", 16>;
using GHeads = ds::axis<"heads", 4>;
using GKvHeads = ds::axis<"kv_heads", 2>;
using GHead = ds::axis<"head", 4>;
using GHidden = ds::axis<"hidden", 24>;
using GSeq = ds::axis<"seq">;
using GVocab = ds::axis<"vocab", 13>;
template <class T>
struct tiny_gpt {
    BOOST_HANA_DEFINE_STRUCT(tiny_gpt,
        (ds::tensor<T, GVocab, GModel>, embedding),
        (ds::nn::decoder_layer<T, GModel, GHeads, GKvHeads, GHead, GHidden>, layer),
        (ds::tensor<T, GModel, GVocab>, unembedding));
};
template <class T>
tiny_gpt<T> make_tiny_gpt() {
    tiny_gpt<T> m;
    m.layer.attention.w_q.emplace();
    m.layer.attention.w_k.emplace();
    m.layer.attention.w_v.emplace();
    std::uint64_t seed = 10;
    ds::detail::parameters::for_each_present(m, "", [&](const std::string&, auto& w) { ds::fill_uniform(w, seed++, -0.5, 0.5); });
    return m;
}

// A training step's loss and gradients on `backend`: the embedding, the layer and the
// cross-entropy recorded on a tape, or (no tape) the whole model as one formula, ds::backward.
template <class T, class Backend>
double tiny_gpt_gradients(const tiny_gpt<T>& m, const ds::tensor<std::int64_t, Batch, GSeq>& tokens,
                          const ds::tensor<std::int64_t, Batch, GSeq>& targets, tiny_gpt<T>& g, Backend backend, bool on_a_tape) {
    const ds::nn::rotary<T, GSeq, GHead> rope(16);
    if (!on_a_tape) {
        auto x = ds::gather<GVocab>(m.embedding, tokens);
        auto h = m.layer.formula(x, rope);
        return ds::backward(ds::nn::cross_entropy<GVocab>(ds::matmul(h, m.unembedding), targets), m, g, backend);
    }
    ds::tape<T, Backend> tape(backend);
    const auto x = tape.eval(ds::gather<GVocab>(m.embedding, tokens));
    const auto h = tape.eval(m.layer.formula(x, rope));
    return tape.backward(ds::nn::cross_entropy<GVocab>(ds::matmul(h, m.unembedding), targets), m, g);
}
}  // namespace

TEMPLATE_TEST_CASE("cuda: ds::backward and a tape train a model on the GPU: the reference backend's loss and gradients",
                   "", float, double) {
    const double t = std::is_same_v<TestType, float> ? 1e-4 : 1e-11;
    const tiny_gpt<TestType> m = make_tiny_gpt<TestType>();
    ds::tensor<std::int64_t, Batch, GSeq> tokens(Batch{2}, GSeq{7}), targets(Batch{2}, GSeq{7});
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens.data()[i] = std::int64_t(i * 5 % 13);
        targets.data()[i] = i == 3 ? -100 : std::int64_t(i * 3 % 13);  // one target ignored
    }
    for (bool on_a_tape : {false, true}) {
        INFO((on_a_tape ? "a tape" : "ds::backward"));
        tiny_gpt<TestType> got = m, want = m;
        // twice on the GPU: the second step reuses the first's device memory
        double loss = 0;
        for (int step = 0; step < 2; ++step) loss = tiny_gpt_gradients(m, tokens, targets, got, cuda::evaluator{}, on_a_tape);
        const double expected = tiny_gpt_gradients(m, tokens, targets, want, ds::backend::reference::evaluator{}, on_a_tape);
        CHECK(std::abs(loss - expected) <= t * std::abs(expected));
        std::vector<const TestType*> wanted;
        ds::detail::for_each_tensor(want, [&](const std::string&, const auto& w) { wanted.push_back(w.data()); });
        std::size_t k = 0;
        ds::detail::for_each_tensor(got, [&](const std::string& name, const auto& w) {
            INFO(name);
            double worst = 0, scale = 0;
            for (std::size_t i = 0; i < w.size(); ++i) {
                worst = std::max(worst, std::abs(double(w.data()[i]) - double(wanted[k][i])));
                scale = std::max(scale, std::abs(double(wanted[k][i])));
            }
            CHECK(scale > 0);  // every parameter has a gradient here
            CHECK(worst <= t * scale);
            ++k;
        });
        CHECK(k == wanted.size());
    }
}

TEST_CASE("cuda: concat, slices and views are places in the plan, not copies") {
    ds::tensor<float, M, N> x(M{5}, N{7}), y(M{5}, N{3});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(y, 2);
    require_cuda_parity(ds::concat<N>(x * 2.0f, ds::exp(y), x), 1e-6, 1e-6);
    require_cuda_parity(ds::slice<N>(x, 1, 6, 2) + ds::slice<N>(x, 0, 3), 0, 0);
    require_cuda_parity(ds::view<N, M>(ds::transpose(x) + 1.0f), 0, 0);
}

TEST_CASE("cuda: what this backend refuses, and what it says about its plan") {
    ds::tensor<float, M, N> x(M{2}, N{3});
    ds::fill_uniform(x, 1);
    REQUIRE_THROWS_AS(ds::eval(ds::map([](float v) { return v * 2.0f; }, x), cuda::evaluator{}), std::invalid_argument);
    const std::string plan = ds::explain(ds::exp(x) + 1.0f, cuda::evaluator{});
    INFO(plan);
    REQUIRE(plan.find("cuda") != std::string::npos);
}

TEST_CASE("cuda: a formula evaluated in a loop allocates no device memory after its first evaluation") {
    ds::tensor<float, Batch, M, K> x(Batch{4}, M{33}, K{16});
    ds::tensor<float, K, N> w(K{16}, N{24});
    ds::tensor<float, N> bias(N{24});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    ds::fill_uniform(bias, 3);
    ds::tensor<float, Batch, M, N> y(Batch{4}, M{33}, N{24});
    cuda::evaluator gpu;
    auto layer = [&] { ds::evaluation::assign_with(gpu, y.view(), ds::softmax(ds::matmul(x, w) + bias)); };
    layer();
    layer();  // the arena, merged into one block if the first needed more
    cuda::context& c = cuda::this_thread_context();
    const std::size_t before = cuda::device_allocations(c);
    for (int i = 0; i < 5; ++i) layer();
    REQUIRE(cuda::device_allocations(c) == before);
    test::require_close(y, test::to_xt(ds::eval(ds::softmax(ds::matmul(x, w) + bias), ds::backend::reference::evaluator{})),
                        2e-5, 2e-5);
    // decoding, its keys split: the partials come from the arena too
    ds::tensor<float, Batch, Heads, Query, D> q(Batch{2}, Heads{3}, Query{1}, D{8});
    ds::tensor<float, Batch, Heads, Key, D> k(Batch{2}, Heads{3}, Key{500}, D{8});
    ds::fill_uniform(q, 4);
    ds::fill_uniform(k, 5);
    REQUIRE(cuda::attention_key_splits(6, 1, 500) > 1);
    ds::tensor<float, Batch, Heads, Query, D> o(Batch{2}, Heads{3}, Query{1}, D{8});
    auto decode = [&] { ds::evaluation::assign_with(gpu, o.view(), ds::matmul(ds::softmax<Key>(ds::matmul(q, ds::transpose<Key, D>(k))), k)); };
    decode();
    decode();
    const std::size_t settled = cuda::device_allocations(c);
    for (int i = 0; i < 5; ++i) decode();
    REQUIRE(cuda::device_allocations(c) == settled);
}

TEST_CASE("cuda: device tensors: copies both ways, formulas over them, results left on the device") {
    ds::tensor<float, Batch, M, K> x(Batch{3}, M{17}, K{9});
    ds::tensor<float, K, N> w(K{9}, N{5});
    ds::tensor<float, N> bias(N{5});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    ds::fill_uniform(bias, 3);
    // copies: row-major and strided host views, and back
    const auto x_gpu = cuda::to_device(x);
    const auto w_t_gpu = cuda::to_device(ds::transpose(w.view()));  // (n, k) row-major on the device
    REQUIRE(x_gpu.shape().extents() == x.shape().extents());
    test::require_close(cuda::to_host(x_gpu), test::to_xt(x), 0, 0);
    test::require_close(cuda::to_host(w_t_gpu), test::to_xt(ds::transpose(w.view())), 0, 0);
    // a formula of device and host tensors, its value on the device
    const auto y_gpu = cuda::eval(ds::tanh(ds::matmul(x_gpu, ds::transpose(w_t_gpu)) + bias));
    const auto want = test::to_xt(ds::eval(ds::tanh(ds::matmul(x, w) + bias), ds::backend::reference::evaluator{}));
    test::require_close(cuda::to_host(y_gpu), want, 2e-5, 2e-5);
    // the same into a host tensor
    test::require_close(ds::eval(ds::tanh(ds::matmul(x_gpu, ds::transpose(w_t_gpu)) + bias), cuda::evaluator{}), want, 2e-5,
                        2e-5);
    // into a strided view of a device tensor: every other column of a wider one
    ds::tensor<float, Batch, M, N> sevens(Batch{3}, M{17}, N{10});
    std::fill(sevens.data(), sevens.data() + sevens.size(), -7.0f);
    auto wide = cuda::to_device(sevens);
    cuda::assign(ds::slice<N>(cuda::view_of(wide), 0, 10, 2), ds::tanh(ds::matmul(x_gpu, ds::transpose(w_t_gpu)) + bias));
    const ds::tensor<float, Batch, M, N> back = cuda::to_host(wide);
    test::require_close(ds::slice<N>(back.view(), 0, 10, 2), want, 2e-5, 2e-5);
    for (std::size_t i = 1; i < back.size(); i += 2) REQUIRE(back.data()[i] == -7.0f);  // the columns between untouched
}

TEST_CASE("cuda: a device formula that reads its own destination goes through a temporary") {
    ds::tensor<double, M, K> a(M{7}, K{65});
    ds::fill_uniform(a, 5);
    auto a_gpu = cuda::to_device(a);
    // positions 0..63 from 1..64: in place, threads would race over the overlap
    cuda::assign(ds::slice<K>(cuda::view_of(a_gpu), 0, 64), ds::slice<K>(a_gpu, 1, 65) * 2.0);
    ds::tensor<double, M, K> want = a;
    for (std::size_t i = 0; i < 7; ++i) {
        for (std::size_t j = 0; j < 64; ++j) want(i, j) = a(i, j + 1) * 2.0;
    }
    test::require_close(cuda::to_host(a_gpu), test::to_xt(want), 0, 0);
}

TEST_CASE("cuda: ids on the device are checked before anything runs") {
    ds::tensor<float, Vocab, N> table(Vocab{11}, N{6});
    ds::fill_uniform(table, 3);
    ds::tensor<std::int64_t, M> ids(M{5});
    for (std::size_t i = 0; i < 5; ++i) ids(i) = static_cast<std::int64_t>(i * 2);
    const auto table_gpu = cuda::to_device(table);
    const auto ids_gpu = cuda::to_device(ids);
    test::require_close(cuda::to_host(cuda::eval(ds::gather<Vocab>(table_gpu, ids_gpu) * 2.0f)),
                        test::to_xt(ds::eval(ds::gather<Vocab>(table, ids) * 2.0f, ds::backend::reference::evaluator{})), 0, 0);
    ids(3) = -1;
    const auto bad_gpu = cuda::to_device(ids);
    cuda::tensor<float, M, N> out(M{5}, N{6});
    REQUIRE_THROWS_AS(cuda::assign(out, ds::gather<Vocab>(table_gpu, bad_gpu)), ds::index_error);
    // a gather's gradient (a scatter, with no gather in its plan) reads them too; the table
    // differentiated is the host's (a gradient is with respect to a host tensor)
    ds::tensor<float, M, N> r(M{5}, N{6});
    ds::fill_uniform(r, 4);
    auto loss_of = [&](const auto& i) { return ds::sum<M>(ds::sum<N>(ds::gather<Vocab>(table, i) * r)); };
    ids(3) = 7;
    const auto good_gpu = cuda::to_device(ids);
    test::require_close(ds::eval(ds::grad(loss_of(good_gpu), table), cuda::evaluator{}),
                        test::to_xt(ds::eval(ds::grad(loss_of(ids), table), ds::backend::reference::evaluator{})), 0, 0);
    REQUIRE_THROWS_AS(ds::eval(ds::grad(loss_of(bad_gpu), table), cuda::evaluator{}), ds::index_error);
}

TEST_CASE("cuda: a layer on device tensors in a loop allocates no device memory after its first run") {
    ds::tensor<float, Batch, M, K> x(Batch{4}, M{33}, K{16});
    ds::tensor<float, K, N> w(K{16}, N{24});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    const auto x_gpu = cuda::to_device(x);
    const auto w_gpu = cuda::to_device(w);
    cuda::tensor<float, Batch, M, N> y(Batch{4}, M{33}, N{24});
    auto layer = [&] { cuda::assign(y, ds::softmax(ds::matmul(x_gpu, w_gpu))); };
    layer();
    layer();
    cuda::context& c = cuda::this_thread_context();
    const std::size_t before = cuda::device_allocations(c);
    for (int i = 0; i < 5; ++i) layer();
    REQUIRE(cuda::device_allocations(c) == before);
}
