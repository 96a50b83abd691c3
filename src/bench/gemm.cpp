// dimsum_bench's matrix product cases: plain products of a transformer's sizes and the two
// batched products of attention, against OpenBLAS, oneDNN and the FMA peak.

#include <dimsum/dimsum.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "bench.hpp"

namespace dimsum_bench {

namespace ds = dimsum;

namespace {

using M = ds::axis<"m">;
using N = ds::axis<"n">;
using K = ds::axis<"k">;
using B = ds::axis<"batch">;

// The worst error of 64 sampled entries of c against a double-precision product, relative
// to the sum of |a_ik b_kj|: float accumulation in any order stays far below 1e-4.
double gemm_error(const gemm_case& g, const float* a, const float* b, const float* c) {
    sampler pick;
    double worst = 0;
    for (int s = 0; s < 64; ++s) {
        std::size_t item = pick.below(g.batch), i = pick.below(g.m), j = pick.below(g.n);
        const float* a_row = a + (item * g.m + i) * g.k;  // a (batch, m, k)
        double exact = 0, scale = 0;
        for (std::size_t p = 0; p < g.k; ++p) {
            double y = g.b_transposed ? b[(item * g.n + j) * g.k + p]   // b (batch, n, k)
                                      : b[(item * g.k + p) * g.n + j];  // b (batch, k, n)
            exact += double(a_row[p]) * y;
            scale += std::abs(double(a_row[p]) * y);
        }
        double error = std::abs(double(c[(item * g.m + i) * g.n + j]) - exact) / (scale + 1e-30);
        if (!(error <= worst)) worst = error;  // NaN sticks
    }
    return worst;
}

constexpr double gemm_tolerance = 1e-4;

// A baseline at its best. For a batch with several threads, both the library threading each
// product and an OpenMP loop over the batch with one library thread each; the faster wins.
template <class Library>
std::pair<double, std::string> library_seconds(const options& opt, const Library& lib, const gemm_case& g,
                                               int threads, const float* a, const float* b, float* c) {
    std::size_t a_step = g.m * g.k, b_step = g.k * g.n, c_step = g.m * g.n;
    auto product = [&](std::size_t item) {
        lib.gemm(g.b_transposed, g.m, g.n, g.k, a + item * a_step, b + item * b_step, c + item * c_step);
    };
    settle(opt);
    lib.set_threads(threads);
    double best = best_seconds(opt, [&] {
        for (std::size_t item = 0; item < g.batch; ++item) product(item);
    });
    std::string how = "library threads";
    if (g.batch > 1 && threads > 1) {
        settle(opt);
        lib.set_threads(1);
        double looped = best_seconds(opt, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
            for (std::ptrdiff_t item = 0; item < std::ptrdiff_t(g.batch); ++item) product(std::size_t(item));
        });
        if (looped < best) {
            best = looped;
            how = "omp loop over batch";
        }
    }
    return {best, how};
}

// One GEMM case: `run` evaluates the dimsum formula into c; a, b and c are dimsum tensors
// whose memory the baselines read and compare against.
template <class TA, class TB, class TC, class Run>
void bench_gemm(bench& s, const gemm_case& g, const TA& a, const TB& b, TC& c, Run run) {
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    TC c_baseline = c;  // touched, like every buffer, before timing
    for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
        int threads = s.opt.threads[t];
        std::string label = g.name + " (" + std::to_string(threads) + " threads)";
        fastest mine, blas, dnnl;
        // Each result is checked: a result left unwritten (NaN) or wrong fails the run.
        auto baseline = [&](const auto& lib, fastest& best) {
            c_baseline.fill(nan);
            auto [seconds, how] = library_seconds(s.opt, lib, g, threads, a.data(), b.data(), c_baseline.data());
            best.keep(seconds, how);
            s.out.check(label + ": " + lib.name, gemm_error(g, a.data(), b.data(), c_baseline.data()), gemm_tolerance);
        };
        for (int round = 0; round < rounds(s.opt); ++round) {
            ds::set_num_threads(threads);
            c.fill(nan);
            settle(s.opt);
            mine.keep(best_seconds(s.opt, run), "");
            s.out.check(label + ": dimsum", gemm_error(g, a.data(), b.data(), c.data()), gemm_tolerance);
            if (s.blas) baseline(*s.blas, blas);
            if (s.dnnl) baseline(*s.dnnl, dnnl);
        }
        double gflops = g.flops() / mine.seconds * 1e-9;
        if (s.blas) s.out.add({g.name, threads, gflops, openblas::name, g.flops() / blas.seconds * 1e-9, "GFLOP/s", blas.how});
        if (s.dnnl) s.out.add({g.name, threads, gflops, onednn::name, g.flops() / dnnl.seconds * 1e-9, "GFLOP/s", dnnl.how});
        s.out.add({g.name, threads, gflops, "fma_peak", s.limits.fma_peak[t], "GFLOP/s", "xsimd fma chains"});
    }
}

// The operands of a plain case rounded to bf16, and those same values in float.
struct bf16_operands {
    ds::tensor<ds::bf16, M, K> a16;
    ds::tensor<ds::bf16, K, N> b16;
    ds::tensor<float, M, K> a_wide;
    ds::tensor<float, K, N> b_wide;
};
bf16_operands rounded_to_bf16(const ds::tensor<float, M, K>& a, const ds::tensor<float, K, N>& b) {
    bf16_operands r{ds::cast<ds::bf16>(a), ds::cast<ds::bf16>(b), {}, {}};
    r.a_wide = ds::cast<float>(r.a16);
    r.b_wide = ds::cast<float>(r.b16);
    return r;
}

// The row of a bf16 product on one bf16 path: bf16_NAME on the widen path (the float GEMM),
// bf16_NAME_PATH on the others.
std::string bf16_row(const gemm_case& g, ds::backend::cpu::bf16_path path) { return bf16_path_row("bf16_" + g.name, path); }
bool bf16_selected(const bench& s, const gemm_case& g) {
    for (const auto path : ds::backend::cpu::bf16_paths) {
        if (s.selected(bf16_row(g, path))) return true;
    }
    return false;
}

// PyTorch's torch.matmul in bf16 on the same extents (scripts/matmul_torch.py, each thread
// count in a fresh process), by thread count: seconds per call, and its largest error against
// float64 in units of float's bound (more than 1: its sums are not float's); empty, with
// `why`, when it cannot run.
struct torch_matmul_result {
    double seconds = 0, error = 0;
};
std::map<int, torch_matmul_result> torch_bf16_matmul(const options& opt, const gemm_case& g, std::string& why) {
    std::map<int, torch_matmul_result> seconds;
    const std::string arguments = std::string("'" DIMSUM_MATMUL_TORCH_SCRIPT "' --shape ") + std::to_string(g.m) + "," +
                                  std::to_string(g.k) + "," + std::to_string(g.n) + " --threads " + thread_list(opt) +
                                  (opt.quick ? " --quick" : "");
    read_torch_script(arguments, "torch_matmul", why, [&](const char* line) {
        int t = 0;
        torch_matmul_result r;
        if (std::sscanf(line, "torch_matmul,%d,%lf,%lf", &t, &r.seconds, &r.error) == 3) seconds[t] = r;
    });
    if (seconds.empty() && why.empty()) why = "matmul_torch.py gave no result";
    return seconds;
}

// The same product of bf16 operands (rounded from a and b), written in bf16, next to the float
// product of the same values, on each bf16 path this CPU runs: on widen, its operands read
// where they lie and widened as the float GEMM packs (or, for a few rows, loads) them; on amx
// and avx512_bf16, multiplied in pairs by the bf16 instructions. The result rounded after.
// In the same rounds, oneDNN's bf16 matmul primitive writes the same bf16 result; before
// them, PyTorch's torch.matmul in bf16 is timed once; the rows of amx and avx512_bf16 also
// compare with their instruction's peak.
void bench_bf16_gemm(bench& s, const gemm_case& g, const bf16_operands& operands) {
    namespace cpu = ds::backend::cpu;
    const auto& a16 = operands.a16;  // not a structured binding: clang 14 cannot capture those
    const auto& b16 = operands.b16;
    const auto& a_wide = operands.a_wide;
    const auto& b_wide = operands.b_wide;
    const ds::bf16 nan16(std::numeric_limits<float>::quiet_NaN());
    ds::tensor<ds::bf16, M, N> c16(M{g.m}, N{g.n}), c16_dnnl(M{g.m}, N{g.n});
    ds::tensor<float, M, N> c(M{g.m}, N{g.n}), c_wide(M{g.m}, N{g.n});
    // rounding c to bf16 adds at most 2^-9 |c| <= 2^-9 sum |a b| to float's error
    const double tolerance = gemm_tolerance + std::ldexp(1.0, -9);
    std::string torch_why = s.opt.small ? "--small" : "";
    const std::map<int, torch_matmul_result> torch_seconds =
        s.opt.small ? std::map<int, torch_matmul_result>{} : torch_bf16_matmul(s.opt, g, torch_why);
    if (torch_seconds.empty()) std::fprintf(s.out.table, "skipped: pytorch bf16 for %s: %s\n", g.name.c_str(), torch_why.c_str());
    for (const cpu::bf16_path path : cpu::bf16_paths) {
        const std::string name = bf16_row(g, path);
        if (!s.selected(name) || !cpu::support_of(path).usable) continue;
        const cpu::scoped_bf16_path on_this_path(path);
        const char* note = path == cpu::bf16_path::widen ? "bf16: widened as packed, float GEMM, rounded"
                           : path == cpu::bf16_path::amx ? "bf16: AMX tdpbf16ps, float sums, rounded"
                                                         : "bf16: vdpbf16ps, float sums, rounded";
        for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
            const int threads = s.opt.threads[t];
            const std::string label = name + " (" + std::to_string(threads) + " threads)";
            ds::set_num_threads(threads);
            std::optional<onednn_bf16_matmul> dnnl;
            if (s.dnnl) {
                s.dnnl->set_threads(threads);  // before the primitive is made: oneDNN blocks for it
                try {
                    dnnl.emplace(*s.dnnl, false, g.m, g.n, g.k, a16.data(), b16.data(), c16_dnnl.data());
                } catch (const std::runtime_error& e) {
                    std::fprintf(s.out.table, "skipped: %s: %s\n", label.c_str(), e.what());
                }
            }
            fastest bf16_time, float_time, dnnl_time;
            for (int round = 0; round < rounds(s.opt); ++round) {
                ds::set_num_threads(threads);
                c16.fill(nan16);
                settle(s.opt);
                bf16_time.keep(best_seconds(s.opt, [&] { ds::assign(c16, ds::matmul(a16, b16)); }), "");
                ds::assign(c_wide, ds::cast<float>(c16));
                s.out.check(label + ": dimsum bf16", gemm_error(g, a_wide.data(), b_wide.data(), c_wide.data()), tolerance);
                settle(s.opt);
                float_time.keep(best_seconds(s.opt, [&] { ds::assign(c, ds::matmul(a_wide, b_wide)); }), "");
                if (dnnl) {
                    c16_dnnl.fill(nan16);
                    s.dnnl->set_threads(threads);
                    settle(s.opt);
                    dnnl_time.keep(best_seconds(s.opt, [&] { dnnl->run(); }), dnnl->implementation());
                    ds::assign(c_wide, ds::cast<float>(c16_dnnl));
                    s.out.check(label + ": onednn bf16", gemm_error(g, a_wide.data(), b_wide.data(), c_wide.data()), tolerance);
                }
            }
            const double gflops = g.flops() / bf16_time.seconds * 1e-9;
            s.out.add({name, threads, gflops, "dimsum_float", g.flops() / float_time.seconds * 1e-9, "GFLOP/s", note});
            if (dnnl) {
                s.out.add({name, threads, gflops, "onednn_bf16", g.flops() / dnnl_time.seconds * 1e-9, "GFLOP/s",
                           "matmul primitive, bf16 out: " + dnnl_time.how});
            }
            if (auto torch = torch_seconds.find(threads); torch != torch_seconds.end()) {
                char how[96];
                std::snprintf(how, sizeof how, "torch.matmul in bf16: error %.3g x float's bound", torch->second.error);
                s.out.add({name, threads, gflops, "pytorch_bf16", g.flops() / torch->second.seconds * 1e-9, "GFLOP/s", how});
            }
            if (path == cpu::bf16_path::amx) {
                s.out.add({name, threads, gflops, "amx_peak", s.limits.amx_peak[t], "GFLOP/s", "tdpbf16ps on 4 tiles"});
            } else if (path == cpu::bf16_path::avx512_bf16) {
                s.out.add({name, threads, gflops, "vdpbf16ps_peak", s.limits.pair_peak[t], "GFLOP/s", "vdpbf16ps chains"});
            }
        }
    }
}

// The product with B packed once (ds::prepack), as weights in a loop, next to the same product
// packing B on each call: in float, and in bf16 (B packed once into float panels, or widened
// as it is packed at each call).
void bench_prepacked_gemm(bench& s, const gemm_case& g, const ds::tensor<float, M, K>& a, const ds::tensor<float, K, N>& b,
                          const bf16_operands& operands) {
    const auto& a16 = operands.a16;  // not a structured binding: clang 14 cannot capture those
    const auto& b16 = operands.b16;
    const auto& a_wide = operands.a_wide;
    const auto& b_wide = operands.b_wide;
    ds::tensor<float, M, N> c(M{g.m}, N{g.n}), c_wide(M{g.m}, N{g.n});
    ds::tensor<ds::bf16, M, N> c16(M{g.m}, N{g.n});
    const auto packed = ds::prepack(b);
    const auto packed16 = ds::prepack(b16);
    for (const bool in_bf16 : {false, true}) {
        const std::string name = std::string(in_bf16 ? "bf16_prepacked_" : "prepacked_") + g.name;
        if (!s.selected(name)) continue;
        for (int threads : s.opt.threads) {
            const std::string label = name + " (" + std::to_string(threads) + " threads)";
            fastest once, each_call;
            for (int round = 0; round < rounds(s.opt); ++round) {
                ds::set_num_threads(threads);
                if (in_bf16) {
                    c16.fill(ds::bf16(std::numeric_limits<float>::quiet_NaN()));
                    settle(s.opt);
                    once.keep(best_seconds(s.opt, [&] { ds::assign(c16, ds::matmul(a16, packed16)); }), "");
                    ds::assign(c_wide, ds::cast<float>(c16));
                    s.out.check(label + ": dimsum", gemm_error(g, a_wide.data(), b_wide.data(), c_wide.data()),
                                gemm_tolerance + std::ldexp(1.0, -9));
                    settle(s.opt);
                    each_call.keep(best_seconds(s.opt, [&] { ds::assign(c16, ds::matmul(a16, b16)); }), "");
                } else {
                    c.fill(std::numeric_limits<float>::quiet_NaN());
                    settle(s.opt);
                    once.keep(best_seconds(s.opt, [&] { ds::assign(c, ds::matmul(a, packed)); }), "");
                    s.out.check(label + ": dimsum", gemm_error(g, a.data(), b.data(), c.data()), gemm_tolerance);
                    settle(s.opt);
                    each_call.keep(best_seconds(s.opt, [&] { ds::assign(c, ds::matmul(a, b)); }), "");
                }
            }
            s.out.add({name, threads, g.flops() / once.seconds * 1e-9, in_bf16 ? "dimsum_bf16" : "dimsum_float",
                       g.flops() / each_call.seconds * 1e-9, "GFLOP/s", "B packed once against B packed per call"});
        }
    }
}

}  // namespace

void bench_gemm_case(bench& s, const gemm_case& g) {
    const bool prepacked = s.selected("prepacked_" + g.name) || s.selected("bf16_prepacked_" + g.name);
    if (!s.selected(g.name) && !(g.batch == 1 && (bf16_selected(s, g) || prepacked))) return;
    if (g.batch == 1) {
        ds::tensor<float, M, K> a(M{g.m}, K{g.k});  // (m, k)
        ds::tensor<float, K, N> b(K{g.k}, N{g.n});  // (k, n)
        ds::tensor<float, M, N> c(M{g.m}, N{g.n});  // (m, n)
        ds::fill_uniform(a, 1);
        ds::fill_uniform(b, 2);
        if (s.selected(g.name)) bench_gemm(s, g, a, b, c, [&] { ds::assign(c, ds::matmul(a, b)); });
        if (bf16_selected(s, g) || prepacked) {
            const bf16_operands operands = rounded_to_bf16(a, b);
            bench_bf16_gemm(s, g, operands);
            if (prepacked) bench_prepacked_gemm(s, g, a, b, operands);
        }
    } else if (g.b_transposed) {
        // Attention scores: q k^T for every batch item.
        ds::tensor<float, B, M, K> q(B{g.batch}, M{g.m}, K{g.k});  // (batch, m, k)
        ds::tensor<float, B, N, K> k(B{g.batch}, N{g.n}, K{g.k});  // (batch, n, k)
        ds::tensor<float, B, M, N> c(B{g.batch}, M{g.m}, N{g.n});  // (batch, m, n)
        ds::fill_uniform(q, 3);
        ds::fill_uniform(k, 4);
        bench_gemm(s, g, q, k, c, [&] { ds::assign(c, ds::matmul(q, ds::transpose(k))); });
    } else {
        // Attention's weighted values: p v for every batch item.
        ds::tensor<float, B, M, K> p(B{g.batch}, M{g.m}, K{g.k});  // (batch, m, k)
        ds::tensor<float, B, K, N> v(B{g.batch}, K{g.k}, N{g.n});  // (batch, k, n)
        ds::tensor<float, B, M, N> c(B{g.batch}, M{g.m}, N{g.n});  // (batch, m, n)
        ds::fill_uniform(p, 5, 0.0, 1.0);
        ds::fill_uniform(v, 6);
        bench_gemm(s, g, p, v, c, [&] { ds::assign(c, ds::matmul(p, v)); });
    }
}

}  // namespace dimsum_bench
