// dimsum_bench: dimsum against OpenBLAS, oneDNN and the machine's own limits (the FMA peak
// and the copy bandwidth, measured here in the same run), with 1 and with 2 threads.
// `dimsum_bench --help` lists the options; docs/performance.md holds the figures. The
// baselines are loaded at run time, never linked (baselines.cpp); bench.hpp lists the
// files and what each holds.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <dimsum/dimsum.hpp>

#include "bench.hpp"

namespace dimsum_bench {

namespace ds = dimsum;
namespace {

int run(const options& opt) {
    report out(opt);
    print_machine(out);
    // started after print_machine, whose check of the cores' idleness would see the load
    std::optional<background_load> load;
    if (opt.load > 0) {
        constexpr double load_limit_seconds = 4 * 3600;  // beyond any run: a bound, should this one hang
        load.emplace(opt.load, load_limit_seconds);
        std::fprintf(out.table, "load: %d busy thread%s beside every timed call (--load), rows named _load=%d\n",
                     opt.load, opt.load == 1 ? "" : "s", opt.load);
    }
    std::optional<openblas> blas = load_openblas_at_best(out);
    std::string why;
    std::optional<onednn> dnnl = load_onednn(why);
    if (!dnnl) std::fprintf(out.table, "skipped: onednn: %s; its rows are left out\n", why.c_str());
    print_libraries(out, blas, dnnl);

    bench s{out, opt, blas, dnnl, {}};
    {
        std::size_t count = streaming_floats(opt);
        // tensors, so that the copy reads and writes memory as the cases' tensors are allocated
        using Elements = ds::axis<"elements">;
        ds::tensor<float, Elements> src(Elements{count}), dst(Elements{count});
        src.fill(1.0f);
        s.limits.fma_peak.assign(opt.threads.size(), 0.0);
        s.limits.amx_peak.assign(opt.threads.size(), 0.0);
        s.limits.pair_peak.assign(opt.threads.size(), 0.0);
        s.limits.copy.assign(opt.threads.size(), 0.0);
        for (int round = 0; round < rounds(opt); ++round) {
            for (std::size_t t = 0; t < opt.threads.size(); ++t) {
                settle(opt);
                s.limits.fma_peak[t] = std::max(s.limits.fma_peak[t], fma_peak_gflops(opt, opt.threads[t]));
                s.limits.amx_peak[t] = std::max(s.limits.amx_peak[t], amx_peak_gflops(opt, opt.threads[t]));
                s.limits.pair_peak[t] = std::max(s.limits.pair_peak[t], pair_peak_gflops(opt, opt.threads[t]));
                s.limits.copy[t] = std::max(s.limits.copy[t], copy_gbps(opt, opt.threads[t], src.data(), dst.data(), count));
            }
        }
        for (std::size_t t = 0; t < opt.threads.size(); ++t) {
            std::fprintf(out.table, "threads=%d: FMA peak %.1f GFLOP/s, copy bandwidth %.1f GB/s (memcpy of %zu MiB)\n",
                         opt.threads[t], s.limits.fma_peak[t], s.limits.copy[t], count * sizeof(float) >> 20);
            if (s.limits.amx_peak[t] > 0) {
                std::fprintf(out.table, "threads=%d: AMX peak %.1f GFLOP/s (bf16, tdpbf16ps on 4 accumulator tiles), %.2f x the FMA peak\n",
                             opt.threads[t], s.limits.amx_peak[t], s.limits.amx_peak[t] / s.limits.fma_peak[t]);
            }
            if (s.limits.pair_peak[t] > 0) {
                std::fprintf(out.table, "threads=%d: vdpbf16ps peak %.1f GFLOP/s (bf16, independent chains of 16 sums), %.2f x the FMA peak\n",
                             opt.threads[t], s.limits.pair_peak[t], s.limits.pair_peak[t] / s.limits.fma_peak[t]);
            }
        }
    }
    out.table_header();

    std::size_t d = opt.small ? 8 : 1;       // linear sizes divided by this with --small
    std::size_t batch = opt.small ? 4 : 96;  // 96 = 8 sequences x 12 heads
    auto gemm = [&](std::size_t m, std::size_t n, std::size_t k) {
        return gemm_case{"gemm_" + std::to_string(m / d) + "x" + std::to_string(n / d) + "x" + std::to_string(k / d),
                         1, m / d, n / d, k / d, false};
    };
    auto batched = [&](std::size_t m, std::size_t n, std::size_t k, bool b_transposed) {
        return gemm_case{"bmm_" + std::to_string(batch) + "x" + std::to_string(m / d) + "x" + std::to_string(n / d) +
                             "x" + std::to_string(k / d) + (b_transposed ? "_bt" : ""),
                         batch, m / d, n / d, k / d, b_transposed};
    };
    for (const gemm_case& g : {gemm(1024, 1024, 1024), gemm(1024, 768, 768), gemm(128, 768, 768),
                               gemm(512, 2304, 768), batched(128, 128, 64, true), batched(128, 64, 128, false)}) {
        bench_gemm_case(s, g);
    }
    // decoding one token, and four sequences at once: a few rows times a weight
    if (!opt.small) {
        for (const gemm_case& g : {gemm(1, 2304, 768), gemm(4, 2304, 768)}) bench_gemm_case(s, g);
    }
    std::size_t elements = streaming_floats(opt);  // per array, as the copy
    for (std::size_t cols : {128, 512, 4096}) bench_softmax(s, elements / cols, cols);
    for (std::size_t cols : {768, 4096}) bench_layer_norm(s, elements / cols, cols);
    bench_elementwise(s, elements / 4096, 4096);
    bench_bf16_streaming(s, elements / 4096, 4096);
    bench_concat(s, elements / 4096, 4096);
    bench_gather(s, elements / 768, 768);
    bench_attention(s);
    bench_attention_memory(s);
    bench_attention_backward(s);
    bench_bf16_kv_cache(s);
    bench_bf16_attention_core(s);
    bench_decoder(s);
    bench_training_step(s);
    return out.failed ? 1 : 0;
}

}  // namespace
}  // namespace dimsum_bench

int main(int argc, char** argv) {
    using namespace dimsum_bench;
    std::optional<options> opt = parse_options(argc, argv);
    if (!opt) return 2;
    try {
        if (!opt->attention_memory.empty()) return measure_attention_memory(*opt, opt->attention_memory);
        return run(*opt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dimsum_bench: %s\n", e.what());
        return 1;
    }
}
