// dimsum_gpu_bench: the CUDA backend on device tensors (no staging), each case against the
// ceiling that bounds it, measured in the same run: the copy bandwidth for memory-bound
// cases (cudaMemcpy from device to device, counting bytes read and written), cuBLAS through
// dimsum for products. Each evaluation waits for the device, so a
// case's time is wall time per evaluation: the median of 5 batches, each repeated until it
// lasts 50 ms, after 3 warm-up evaluations (fewer for calls slower than 0.2 s).
// scripts/gpu_check.sh runs it, and scripts/gpu_torch.py runs PyTorch on the same cases.
//
// --parity DIR writes, instead, cases too large for the reference backend (attention at seq 4096
// and 16384, large logits, a 2048 x 4096 x 2048 product with its epilogue, softmax rows with
// -infinity and logits of 1e3): their inputs and the CUDA backend's outputs as .npy files, one
// line per case in DIR/cases.txt. scripts/gpu_torch.py --parity DIR recomputes them in float64
// with PyTorch on the device and compares.
//
//   dimsum_gpu_bench [--smoke] [--parity DIR]    (--smoke: tiny sizes, a check that every case runs)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <dimsum/dimsum.hpp>
#include <dimsum/backend/cuda/tensor.hpp>
#include <dimsum/interop/npy.hpp>

#include "multi_head_attention.hpp"  // examples/: the README's attention formulas

namespace {

namespace ds = dimsum;
namespace cuda = ds::backend::cuda;

using Elements = ds::axis<"elements">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using M = ds::axis<"m">;
using K = ds::axis<"k">;
using N = ds::axis<"n">;
using Batch = ds::axis<"batch">;
using Heads = ds::axis<"heads">;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using D = ds::axis<"d">;

bool smoke = false;

// Seconds per call of f: the median of 5 batches, each of enough calls to last 50 ms, after 3
// warm-ups. A call slower than 0.2 s (a first kernel on a large case) gets one warm-up and 3
// single calls instead, so that the whole bench stays within gpu_check.sh's limit.
template <class F>
double seconds_per_call(F&& f) {
    const auto seconds_since = [](std::chrono::steady_clock::time_point start) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    const auto first = std::chrono::steady_clock::now();
    f();
    const bool slow = seconds_since(first) > 0.2;
    for (int i = 1; i < (smoke || slow ? 1 : 3); ++i) f();
    const double batch_seconds = smoke || slow ? 0.0 : 0.05;
    std::vector<double> batches;
    for (int b = 0; b < (smoke ? 1 : slow ? 3 : 5); ++b) {
        std::size_t calls = 0;
        const auto start = std::chrono::steady_clock::now();
        double elapsed = 0;
        do {
            f();
            ++calls;
            elapsed = seconds_since(start);
        } while (elapsed < batch_seconds);
        batches.push_back(elapsed / static_cast<double>(calls));
    }
    std::sort(batches.begin(), batches.end());
    return batches[batches.size() / 2];
}

void row(const std::string& name, double value, const char* unit, double ceiling, const char* ceiling_name) {
    std::printf("%-40s %12.4g %-8s %8.3f of %s\n", name.c_str(), value, unit, ceiling > 0 ? value / ceiling : 0.0, ceiling_name);
    std::fflush(stdout);
}

template <class T, class... A>
cuda::tensor<T, A...> random_on_device(std::uint64_t seed, A... extents) {
    ds::tensor<T, A...> host(extents...);
    ds::fill_uniform(host, seed);
    return cuda::to_device(host);
}

// The --parity cases. Inputs are made on the host, saved, and copied to the device; outputs are
// evaluated there, copied back and saved: DIR/<case>.<name>.npy.
class parity_cases {
public:
    explicit parity_cases(std::string dir) : dir_(std::move(dir)), list_(dir_ + "/cases.txt") {
        if (!list_) throw std::runtime_error("dimsum_gpu_bench: cannot write " + dir_ + "/cases.txt");
    }

    template <class... A>
    ds::tensor<float, A...> input(const std::string& name, std::uint64_t seed, double low, double high, A... extents) {
        ds::tensor<float, A...> host(extents...);
        ds::fill_uniform(host, seed, low, high);
        save(name, host);
        return host;
    }
    template <class T, class... A>
    void save(const std::string& name, const ds::tensor<T, A...>& t) {
        ds::save_npy(dir_ + "/" + name + ".npy", t);
    }
    // One line of cases.txt: the case's name, its kind and its options, for gpu_torch.py.
    void done(const std::string& line) {
        list_ << line << "\n";
        list_.flush();
        std::printf("parity case %s written\n", line.c_str());
        std::fflush(stdout);
    }

private:
    std::string dir_;
    std::ofstream list_;
};

void write_parity_cases(const std::string& dir) {
    parity_cases cases(dir);
    cuda::evaluator exact;

    // attention: (batch, heads, seq, d); "scale" multiplies the scores
    struct attention_case {
        std::size_t heads, queries, seq, d;  // queries 1: decoding, the keys split
        bool causal;
        double bound;  // inputs uniform in [-bound, bound]; 3 with scale 1 gives logits near 100
        bool unit_scale;
    };
    const attention_case attention_cases[] = {
        {8, 4096, 4096, 64, false, 1, false}, {8, 4096, 4096, 64, true, 1, false}, {4, 16384, 16384, 128, true, 1, false},
        {8, 2048, 2048, 64, false, 3, true},  {32, 1, 16384, 128, true, 1, false},
    };
    for (const attention_case& a : attention_cases) {
        const std::size_t heads = smoke ? 2 : a.heads, seq = smoke ? a.seq / 128 + 5 : a.seq, d = smoke ? a.d / 8 + 1 : a.d;
        const std::size_t queries = a.queries == 1 ? 1 : seq;
        const float scale = a.unit_scale ? 1.0f : 1.0f / std::sqrt(static_cast<float>(d));
        const std::string name = std::string("attention_") + (queries == 1 ? "decode_" : "") + (a.causal ? "causal_" : "") +
                                 (a.unit_scale ? "large_logits_" : "") + std::to_string(heads) + "x" +
                                 std::to_string(queries) + "x" + std::to_string(seq) + "x" + std::to_string(d);
        const auto q = cases.input(name + ".q", 21, -a.bound, a.bound, Batch{1}, Heads{heads}, Query{queries}, D{d});
        const auto k = cases.input(name + ".k", 22, -a.bound, a.bound, Batch{1}, Heads{heads}, Key{seq}, D{d});
        const auto v = cases.input(name + ".v", 23, -1, 1, Batch{1}, Heads{heads}, Key{seq}, D{d});
        const auto q_gpu = cuda::to_device(q);
        const auto k_gpu = cuda::to_device(k);
        const auto v_gpu = cuda::to_device(v);
        auto scores = ds::matmul(q_gpu, ds::transpose<Key, D>(k_gpu)) * scale;  // (batch, heads, query, key)
        auto o = a.causal ? cuda::eval(ds::matmul(ds::softmax<Key>(ds::masked_fill(scores, ds::causal_mask(Query{queries}, Key{seq}),
                                                                                    -INFINITY)),
                                                  v_gpu),
                                       exact)
                          : cuda::eval(ds::matmul(ds::softmax<Key>(scores), v_gpu), exact);
        cases.save(name + ".o", cuda::to_host(o));
        char options[64];
        std::snprintf(options, sizeof options, " attention causal=%d scale=%.9g", a.causal ? 1 : 0, double(scale));
        cases.done(name + options);
    }

    // gelu(a b + bias): a product with its epilogue, (m, k) x (k, n) + (n)
    {
        const std::size_t m = smoke ? 19 : 2048, k = smoke ? 33 : 4096, n = smoke ? 17 : 2048;
        const std::string name = "gemm_bias_gelu_" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
        const auto a = cases.input(name + ".a", 24, -1, 1, M{m}, K{k});
        const auto b = cases.input(name + ".b", 25, -1, 1, K{k}, N{n});
        const auto bias = cases.input(name + ".bias", 26, -1, 1, N{n});
        const auto a_gpu = cuda::to_device(a);
        const auto b_gpu = cuda::to_device(b);
        const auto bias_gpu = cuda::to_device(bias);
        cases.save(name + ".o", cuda::to_host(cuda::eval(ds::gelu(ds::matmul(a_gpu, b_gpu) + bias_gpu), exact)));
        cases.done(name + " gemm_bias_gelu");
    }

    // softmax over rows of logits up to 1e3, every seventh -infinity, and one row of -infinity only
    {
        const std::size_t rows = smoke ? 5 : 4096, cols = smoke ? 23 : 4096;
        const std::string name = "softmax_" + std::to_string(rows) + "x" + std::to_string(cols);
        ds::tensor<float, Rows, Cols> x(Rows{rows}, Cols{cols});
        ds::fill_uniform(x, 27, -1e3, 1e3);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = (i % 7); j < cols; j += 7) x(i, j) = -INFINITY;
        for (std::size_t j = 0; j < cols; ++j) x(rows / 2, j) = -INFINITY;
        cases.save(name + ".x", x);
        const auto x_gpu = cuda::to_device(x);
        cases.save(name + ".o", cuda::to_host(cuda::eval(ds::softmax<Cols>(x_gpu), exact)));
        cases.done(name + " softmax");
    }
    std::printf("dimsum_gpu_bench: parity cases written to %s\n", dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    std::string parity_dir;
    for (int i = 1; i < argc; ++i) {
        smoke = smoke || std::strcmp(argv[i], "--smoke") == 0;
        if (std::strcmp(argv[i], "--parity") == 0 && i + 1 < argc) parity_dir = argv[++i];
    }
    const cuda::device_status status = cuda::query_devices();
    if (status.count == 0) {
        std::printf("no CUDA device (%s)\n", status.reason.c_str());
        return 1;
    }
    std::printf("dimsum_gpu_bench on %s (runtime %d, driver %d)%s\n", status.name.c_str(), status.runtime_version,
                status.driver_version, smoke ? ", smoke sizes" : "");
    if (!parity_dir.empty()) {
        try {
            write_parity_cases(parity_dir);
            return 0;
        } catch (const std::exception& e) {
            std::printf("dimsum_gpu_bench: %s\n", e.what());
            return 1;
        }
    }
    cuda::evaluator exact, tf32{.precision = cuda::gemm_precision::tf32};

    // the ceiling of memory-bound passes: cudaMemcpy of 512 MiB, counting bytes read and written;
    // then the same copy as a formula (dimsum's fused pass)
    const std::size_t count = smoke ? 4096 : std::size_t(1) << 27;
    auto x = random_on_device<float>(1, Elements{count});
    auto r = random_on_device<float>(2, Elements{count});
    cuda::tensor<float, Elements> y(Elements{count});
    const double bytes = 2.0 * static_cast<double>(count) * sizeof(float);
    cuda::context& device = cuda::this_thread_context();
    const double copy = bytes / seconds_per_call([&] {
        cuda::copy_on_device(device, y.data(), x.data(), count * sizeof(float));
        cuda::finish(device);
    }) / 1e9;
    row("copy_" + std::to_string(count), copy, "GB/s", copy, "copy");
    const double copy_pass = bytes / seconds_per_call([&] { cuda::assign(y, x, exact); }) / 1e9;
    row("copy_pass_" + std::to_string(count), copy_pass, "GB/s", copy, "copy");

    // elementwise: max(x * 0.5 + bias, 0) + r over rows of 4096
    {
        const std::size_t cols = smoke ? 64 : 4096, rows = count / cols;
        auto xm = random_on_device<float>(3, Rows{rows}, Cols{cols});
        auto rm = random_on_device<float>(4, Rows{rows}, Cols{cols});
        auto bias = random_on_device<float>(5, Cols{cols});
        cuda::tensor<float, Rows, Cols> out(Rows{rows}, Cols{cols});
        const double moved = 3.0 * static_cast<double>(rows * cols) * sizeof(float);
        const double s = seconds_per_call([&] { cuda::assign(out, ds::max(xm * 0.5f + bias, 0.0f) + rm, exact); });
        row("eltwise_" + std::to_string(rows) + "x" + std::to_string(cols), moved / s / 1e9, "GB/s", copy, "copy");
        for (std::size_t width : {std::size_t(128), std::size_t(512), std::size_t(4096)}) {
            const std::size_t w = smoke ? 16 : width, n = count / w;
            auto scores = random_on_device<float>(6, Rows{n}, Cols{w});
            cuda::tensor<float, Rows, Cols> weights(Rows{n}, Cols{w});
            const double t = seconds_per_call([&] { cuda::assign(weights, ds::softmax(scores), exact); });
            row("softmax_" + std::to_string(n) + "x" + std::to_string(w), 2.0 * static_cast<double>(n * w) * sizeof(float) / t / 1e9,
                "GB/s", copy, "copy");
        }
    }

    // products: fp32 and tf32 through cuBLAS, in TFLOP/s
    struct product_speed {
        double fp32, tf32;
    };
    const auto time_product = [&](std::size_t m, std::size_t k, std::size_t n) {
        auto a = random_on_device<float>(7, M{m}, K{k});
        auto b = random_on_device<float>(8, K{k}, N{n});
        cuda::tensor<float, M, N> c(M{m}, N{n});
        const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
        return product_speed{flops / seconds_per_call([&] { cuda::assign(c, ds::matmul(a, b), exact); }) / 1e12,
                             flops / seconds_per_call([&] { cuda::assign(c, ds::matmul(a, b), tf32); }) / 1e12};
    };
    double best_fp32 = 0;  // the ceiling of exact float arithmetic, as cuBLAS reaches it
    for (std::size_t size : {std::size_t(1024), std::size_t(4096), std::size_t(8192)}) {
        const std::size_t n = smoke ? 8 : size;
        const product_speed speed = time_product(n, n, n);
        row("gemm_fp32_" + std::to_string(n) + "^3", speed.fp32, "TFLOP/s", speed.fp32, "itself");
        row("gemm_tf32_" + std::to_string(n) + "^3", speed.tf32, "TFLOP/s", speed.fp32, "fp32");
        best_fp32 = std::max(best_fp32, speed.fp32);
    }
    // the products of a BERT-base layer at batch x seq = 1024: QKV, output, feed-forward
    struct product {
        std::size_t m, k, n;
    };
    for (const product& p : {product{1024, 768, 2304}, product{1024, 768, 768}, product{1024, 768, 3072}, product{1024, 3072, 768}}) {
        const std::size_t m = smoke ? 4 : p.m, k = smoke ? p.k / 256 : p.k, n = smoke ? p.n / 256 : p.n;
        const product_speed speed = time_product(m, k, n);
        const std::string shape = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
        row("gemm_fp32_" + shape, speed.fp32, "TFLOP/s", best_fp32, "gemm_fp32");
        row("gemm_tf32_" + shape, speed.tf32, "TFLOP/s", best_fp32, "gemm_fp32");
    }

    // attention: batch x seq = 16k, heads x d = 2048 (FlashAttention's convention), causal and not
    for (std::size_t d : {std::size_t(64), std::size_t(128)}) {
        for (std::size_t seq : {std::size_t(512), std::size_t(2048), std::size_t(8192)}) {
            const std::size_t s = smoke ? 16 : seq, batch = smoke ? 1 : 16384 / seq, heads = smoke ? 2 : 2048 / d, dd = smoke ? 8 : d;
            auto q = random_on_device<float>(9, Batch{batch}, Heads{heads}, Query{s}, D{dd});
            auto k = random_on_device<float>(10, Batch{batch}, Heads{heads}, Key{s}, D{dd});
            auto v = random_on_device<float>(11, Batch{batch}, Heads{heads}, Key{s}, D{dd});
            cuda::tensor<float, Batch, Heads, Query, D> o(Batch{batch}, Heads{heads}, Query{s}, D{dd});
            const float scale = 1.0f / std::sqrt(static_cast<float>(dd));
            for (bool causal : {false, true}) {
                auto scores = ds::matmul(q, ds::transpose<Key, D>(k)) * scale;
                const double pairs = static_cast<double>(batch * heads) * static_cast<double>(s) * static_cast<double>(s) *
                                     (causal ? 0.5 : 1.0);
                const double flops = 4.0 * pairs * static_cast<double>(dd);
                const double t = causal ? seconds_per_call([&] {
                    cuda::assign(o, ds::matmul(ds::softmax<Key>(ds::masked_fill(scores, ds::causal_mask(Query{s}, Key{s}), -INFINITY)), v), exact);
                })
                                        : seconds_per_call([&] { cuda::assign(o, ds::matmul(ds::softmax<Key>(scores), v), exact); });
                row(std::string("attention_") + (causal ? "causal_" : "") + std::to_string(batch) + "x" + std::to_string(heads) + "x" +
                        std::to_string(s) + "x" + std::to_string(dd),
                    flops / t / 1e12, "TFLOP/s", best_fp32, "gemm_fp32");
            }
        }
    }
    // the multi-head attention layer of BERT-base (batch 8, seq 128; examples/multi_head_attention.hpp)
    // as torch.nn.MultiheadAttention computes it: one fused QKV projection with its bias, the
    // fused attention, the output projection with its bias
    {
        using mha::Fused, mha::Model, mha::Part, mha::Seq;
        const std::size_t batch = smoke ? 1 : 8, seq = smoke ? 4 : 128;
        auto x = random_on_device<float>(17, Batch{batch}, Seq{seq}, Model{});
        auto w_qkv = random_on_device<float>(18, Model{}, Fused{});
        auto b_qkv = random_on_device<float>(19, Fused{});
        auto w_o = random_on_device<float>(20, Model{}, Model{});
        auto b_o = random_on_device<float>(21, Model{});
        cuda::tensor<float, Batch, Seq, Fused> qkv(Batch{batch}, Seq{seq});
        cuda::tensor<float, Batch, Seq, Model> y(Batch{batch}, Seq{seq});
        const double t = seconds_per_call([&] {
            cuda::assign(qkv, ds::matmul(x, w_qkv) + b_qkv, exact);
            auto parts = ds::view<Batch, Seq, Part, Model>(cuda::view_of(qkv));  // (batch, seq, part, model)
            auto q = mha::split_heads(ds::select<Part>(parts, 0));                // (batch, heads, seq, head)
            auto k = mha::split_heads(ds::select<Part>(parts, 1));
            auto v = mha::split_heads(ds::select<Part>(parts, 2));
            cuda::assign(y, ds::matmul(mha::merge_heads(mha::attention(q, k, v)), w_o) + b_o, exact);
        });
        // projections 2 x tokens x 768 x (2304 + 768); scores and P V 4 x batch x seq^2 x 768
        const double tokens = static_cast<double>(batch * seq), model = 768;
        const double flops = 8.0 * tokens * model * model + 4.0 * tokens * static_cast<double>(seq) * model;
        row("mha_bert_" + std::to_string(batch) + "x" + std::to_string(seq), flops / t / 1e12, "TFLOP/s", best_fp32, "gemm_fp32");
    }

    // decoding: one query per (batch, head) against a long KV cache, the keys split; bounded
    // by reading K and V, so against the copy bandwidth
    for (std::size_t keys : {std::size_t(4096), std::size_t(16384)}) {
        const std::size_t batch = smoke ? 1 : 8, heads = smoke ? 2 : 32, s = smoke ? 40 : keys, dd = smoke ? 8 : 128;
        auto q = random_on_device<float>(12, Batch{batch}, Heads{heads}, Query{1}, D{dd});
        auto k = random_on_device<float>(13, Batch{batch}, Heads{heads}, Key{s}, D{dd});
        auto v = random_on_device<float>(14, Batch{batch}, Heads{heads}, Key{s}, D{dd});
        cuda::tensor<float, Batch, Heads, Query, D> o(Batch{batch}, Heads{heads}, Query{1}, D{dd});
        const float scale = 1.0f / std::sqrt(static_cast<float>(dd));
        const double t = seconds_per_call(
            [&] { cuda::assign(o, ds::matmul(ds::softmax<Key>(ds::matmul(q, ds::transpose<Key, D>(k)) * scale), v), exact); });
        const double read = 2.0 * static_cast<double>(batch * heads * s * dd) * sizeof(float);
        row("attention_decode_" + std::to_string(batch) + "x" + std::to_string(heads) + "x1x" + std::to_string(s) + "x" +
                std::to_string(dd),
            read / t / 1e9, "GB/s", copy, "copy");
    }
    std::printf("dimsum_gpu_bench: done\n");
    return 0;
}
