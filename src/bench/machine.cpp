// What dimsum_bench says about the machine, and the yardsticks every ratio divides by: the
// FMA peak and the copy bandwidth, measured in the same run as the cases.

#include <omp.h>
#include <unistd.h>

#include <xsimd/xsimd.hpp>

#include <dimsum/backend/cpu/bf16_gemm.hpp>
#include <dimsum/backend/cpu/bf16_paths.hpp>
#include <dimsum/backend/cpu/simd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"

namespace dimsum_bench {

namespace ds = dimsum;

namespace {

using simd = xsimd::batch<float>;

// Independent accumulator chains: two FMA ports with a 4-cycle latency need 8 in flight.
// With the two constants they must fit the vector registers: 32 with AVX-512 (16 chains),
// 16 without (12 chains: 16 spilled to memory there and halved the measured peak).
constexpr int fma_chains = simd::size >= 16 ? 16 : 12;

[[gnu::noinline]] float fma_chains_run(std::int64_t iterations, float seed) {
    simd acc[fma_chains];
    for (int i = 0; i < fma_chains; ++i) acc[i] = simd(seed + float(i));
    simd mul(1.0f - seed * 1e-7f), add(seed * 1e-7f);
    for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < fma_chains; ++i) acc[i] = xsimd::fma(acc[i], mul, add);
    }
    simd sum = acc[0];
    for (int i = 1; i < fma_chains; ++i) sum += acc[i];
    return xsimd::hadd(sum);
}

volatile float fma_sink;  // keeps the chains' results alive

#if defined(__x86_64__)
// tdpbf16ps on four accumulator tiles from two A and two B tiles that stay loaded: the tile
// unit's own limit, as the chains above are the FMA unit's.
[[gnu::noinline]] void amx_chains_run(std::int64_t iterations) {
    alignas(64) static const ds::bf16 operand[16 * 32] = {};
    alignas(64) float result[16 * 16];
    ds::backend::cpu::amx_tiles unit;
    unit.configure();
    unit.zero<0>();
    unit.zero<1>();
    unit.zero<2>();
    unit.zero<3>();
    unit.load<4>(operand, 64);
    unit.load<5>(operand, 64);
    unit.load<6>(operand, 64);
    unit.load<7>(operand, 64);
    for (std::int64_t it = 0; it < iterations; ++it) {
        unit.dot<0, 4, 6>();
        unit.dot<1, 4, 7>();
        unit.dot<2, 5, 6>();
        unit.dot<3, 5, 7>();
    }
    unit.store<0>(result, 64);
    unit.release();
    fma_sink = result[0];
}
#endif

#if defined(__AVX512F__)
// vdpbf16ps on independent chains of 16 sums from two operands that stay in registers: the
// limit of the pair kernel, as the FMA chains are the float kernel's.
[[gnu::noinline]] float pair_chains_run(std::int64_t iterations, float seed) {
    using pairs = ds::backend::cpu::avx512_pairs;
    pairs::sums acc[fma_chains];
    for (int i = 0; i < fma_chains; ++i) acc[i] = _mm512_set1_ps(seed + float(i));
    const pairs::pairs a = _mm512_set1_epi32(0x3f803f80), b = _mm512_setzero_si512();  // (1, 1) and (0, 0)
    for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < fma_chains; ++i) acc[i] = pairs::dot(acc[i], a, b);
    }
    float sum = 0;
    for (int i = 0; i < fma_chains; ++i) {
        alignas(64) float lanes[16];
        pairs::store_sums(lanes, acc[i]);
        for (float lane : lanes) sum += lane;
    }
    return sum;
}
#endif

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
        if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
    }
    return "unknown";
}

// How many cores other processes keep busy, from /proc/stat over a quarter of a second
// while this one sleeps: another build or benchmark makes every figure low and noisy.
double busy_cores() {
    auto sample = [](double& idle, double& total) {
        std::ifstream in("/proc/stat");
        std::string cpu;
        in >> cpu;
        idle = total = 0;
        double value;
        for (int field = 0; field < 8 && in >> value; ++field) {
            total += value;
            if (field == 3 || field == 4) idle += value;  // idle, iowait
        }
    };
    double idle0, total0, idle1, total1;
    sample(idle0, total0);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    sample(idle1, total1);
    if (total1 <= total0) return 0;
    return (1.0 - (idle1 - idle0) / (total1 - total0)) * omp_get_num_procs();
}

// GFLOP/s of `chains_run` (fma_chains_run, pair_chains_run) on every thread, each with its
// own seed, at flops_per_step for each of the fma_chains chains per iteration.
template <class Run>
double chains_gflops(const options& opt, int threads, Run chains_run, double flops_per_step) {
    std::int64_t iterations = opt.quick ? 400'000 : 4'000'000;  // 4M: about 10 ms a call
    std::vector<float> results(threads);
    double seconds = best_seconds(yardstick_timing(opt), [&] {
#pragma omp parallel num_threads(threads)
        results[omp_get_thread_num()] = chains_run(iterations, 1.0f + float(omp_get_thread_num()));
    });
    for (float r : results) fma_sink = r;
    return flops_per_step * fma_chains * double(iterations) * threads / seconds * 1e-9;
}

}  // namespace

double fma_peak_gflops(const options& opt, int threads) {
    return chains_gflops(opt, threads, fma_chains_run, 2.0 * double(simd::size));  // a multiply and an add per lane
}

double amx_peak_gflops(const options& opt, int threads) {
#if defined(__x86_64__)
    if (!ds::backend::cpu::support_of(ds::backend::cpu::bf16_path::amx).usable) return 0;
    std::int64_t iterations = opt.quick ? 40'000 : 400'000;
    double seconds = best_seconds(yardstick_timing(opt), [&] {
#pragma omp parallel num_threads(threads)
        amx_chains_run(iterations);
    });
    constexpr double flops_per_dot = 2.0 * 16 * 16 * 32;  // C (16 x 16) += A (16 x 32) B (32 x 16)
    return 4.0 * flops_per_dot * double(iterations) * threads / seconds * 1e-9;
#else
    (void)opt;
    (void)threads;
    return 0;
#endif
}

double pair_peak_gflops(const options& opt, int threads) {
#if defined(__AVX512F__)
    if (!ds::backend::cpu::support_of(ds::backend::cpu::bf16_path::avx512_bf16).usable) return 0;
    return chains_gflops(opt, threads, pair_chains_run, 2.0 * 16 * 2);  // 16 sums, each += two products
#else
    (void)opt;
    (void)threads;
    return 0;
#endif
}

// memcpy, each thread its own contiguous part; bytes read plus bytes written.
double copy_gbps(const options& opt, int threads, const float* src, float* dst, std::size_t count) {
    double seconds = best_seconds(yardstick_timing(opt), [&] {
#pragma omp parallel num_threads(threads)
        {
            std::size_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            std::size_t begin = count * t / nt, end = count * (t + 1) / nt;
            std::memcpy(dst + begin, src + begin, (end - begin) * sizeof(float));
        }
    });
    return 2.0 * double(count * sizeof(float)) / seconds * 1e-9;
}

void print_machine(const report& out) {
    char date[32];
    std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
    std::fprintf(out.table, "dimsum_bench, %s%s\n", date, out.opt.quick ? ", --quick: a smoke test, not a measurement" : "");
    std::fprintf(out.table, "cpu: %s, %d cores visible\n", cpu_model().c_str(), omp_get_num_procs());
    double busy = busy_cores();
    if (busy > 0.25) {
        std::fprintf(out.table, "warning: %.1f cores busy with other work before the run: the figures will be low\n",
                     busy);
    }
    std::fprintf(out.table, "compiler: g++ %s, xsimd %d.%d.%d (%s, %zu floats)\n", __VERSION__, XSIMD_VERSION_MAJOR,
                 XSIMD_VERSION_MINOR, XSIMD_VERSION_PATCH, ds::backend::cpu::simd_arch::name(), ds::backend::cpu::simd<float>::size);
    namespace cpu = ds::backend::cpu;
    for (const cpu::bf16_path path : cpu::bf16_paths) {
        const cpu::bf16_path_support support = cpu::support_of(path);
        std::fprintf(out.table, "bf16 path %s: %s\n", std::string(cpu::name(path)).c_str(),
                     support.usable ? "runs here (its bf16_ rows follow)" : ("cannot run here, " + support.reason).c_str());
    }
}

// Floats per array for the bandwidth cases: arrays beyond the caches, i.e. twice the
// last-level cache (300 MiB of L3 on the machine of docs/performance.md, so 64 MiB arrays
// would measure the cache), and at least 64 MiB.
std::size_t streaming_floats(const options& opt) {
    if (opt.small) return std::size_t(1) << 20;
    long cache = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (cache <= 0) cache = sysconf(_SC_LEVEL2_CACHE_SIZE);
    std::size_t bytes = std::max<std::size_t>(std::size_t(64) << 20, 2 * static_cast<std::size_t>(std::max(cache, 0L)));
    std::size_t floats = bytes / sizeof(float);
    constexpr std::size_t unit = std::size_t(1) << 16;  // a multiple of every row length used
    return (floats + unit - 1) / unit * unit;
}

peak_of_case case_peak(const yardsticks& limits, bool bf16, std::size_t t) {
    namespace cpu = ds::backend::cpu;
    if (bf16) {
        const cpu::bf16_path path = cpu::current_bf16_path();
        if (path == cpu::bf16_path::amx && limits.amx_peak[t] > 0) return {limits.amx_peak[t], "amx_peak", "tdpbf16ps on 4 tiles"};
        if (path == cpu::bf16_path::avx512_bf16 && limits.pair_peak[t] > 0) {
            return {limits.pair_peak[t], "vdpbf16ps_peak", "vdpbf16ps chains"};
        }
    }
    return {limits.fma_peak[t], "fma_peak", "xsimd fma chains"};
}

}  // namespace dimsum_bench
