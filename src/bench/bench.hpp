#pragma once
// What the files of dimsum_bench share (main.cpp says what the tool does):
//   common.cpp     the options, the report (table and CSV), the timing rules
//   baselines.cpp  OpenBLAS and oneDNN, loaded at run time
//   machine.cpp    the machine's facts and its limits, measured in the run (the yardsticks)
//   gemm.cpp       the matrix product cases
//   streaming.cpp  the memory-bound cases: softmax, layer_norm, an elementwise epilogue
//   attention.cpp  the attention layer cases, their memory, and the PyTorch side
//   decoder.cpp    a decoding step of examples/decoder.hpp's decoder
//   training.cpp   a training step of the BERT-base layer
//   main.cpp       the run
// Everything here is internal to the tool; what a single file needs stays in that file.

#include <omp.h>

#include <dimsum/backend/cpu/bf16_paths.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dimsum_bench {

// ---------------------------------------------------------------------------------------
// Options and output (common.cpp)

struct options {
    bool quick = false;                  // few repetitions: a smoke test, not a measurement
    bool small = false;                  // reduced sizes, for the ctest smoke test
    std::string openblas_core = "auto";  // auto, detect, keep or a core type; see the usage
    bool csv = false;
    std::string csv_path = "-";          // "-": the CSV on stdout, the table on stderr
    std::string filter;                  // only the cases whose name contains this (or one of its comma-separated parts)
    std::vector<int> threads{1, 2};
    int rounds = 3;                      // turns each contender takes; see rounds()
    std::string attention_memory;        // hidden: measure this attention case's memory, only
    int load = 0;                        // busy threads running beside every timed call (--load)
};

// The options of the command line; none, after saying why, if they are wrong (--help
// prints the usage and exits).
std::optional<options> parse_options(int argc, char** argv);

struct row {
    std::string name;
    int threads;
    double dimsum;
    std::string baseline_name;
    double baseline;
    const char* unit;
    std::string how;  // how the baseline ran, where it had a choice
};

// The table (stdout, or stderr when the CSV takes stdout), the CSV, and whether any result
// was wrong. Rows are printed as they come: a full run takes minutes.
struct report {
    options opt;
    std::FILE* table = stdout;
    std::FILE* csv = nullptr;
    bool failed = false;

    explicit report(const options& o);
    ~report();
    report(const report&) = delete;
    report& operator=(const report&) = delete;

    void table_header() const;
    // A row's name as printed: with --load=N, NAME_load=N.
    std::string row_name(const std::string& name) const;
    void add(const row& r) const;
    // A wrong result makes the run fail: a fast wrong kernel, or a baseline called wrongly,
    // would otherwise give figures that mean nothing.
    void check(const std::string& what, double error, double tolerance);
};

// ---------------------------------------------------------------------------------------
// Timing (common.cpp)

using clock_type = std::chrono::steady_clock;

// How long to time a contender: calls until `budget` seconds are spent, and at least
// `enough_calls` of them unless they take ten budgets.
struct timing {
    double budget;
    int enough_calls;
};
timing case_timing(const options& opt);
// The yardsticks are cheap and every ratio divides by one: a few calls even with --quick.
timing yardstick_timing(const options& opt);

// The best time of one call, after a warm-up call (thread pools start, JIT kernels
// compile). The best, not the mean: on a shared machine noise only ever adds time. Every
// buffer is allocated and touched before this.
template <class F>
double best_seconds(timing how, F&& f) {
    f();
    double best = std::numeric_limits<double>::infinity(), spent = 0;
    for (int calls = 0; calls == 0 || spent < how.budget || (calls < how.enough_calls && spent < 10 * how.budget);
         ++calls) {
        auto start = clock_type::now();
        f();
        double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        best = std::min(best, seconds);
        spent += seconds;
    }
    return best;
}

template <class F>
double best_seconds(const options& opt, F&& f) {
    return best_seconds(case_timing(opt), f);
}

// Each contender is timed in this many rounds, taking turns, and keeps its best: the
// machine is shared, and a neighbour's load comes and goes over seconds, so one block of
// 0.2 s per contender could put one of them in a slow spell and the other not.
int rounds(const options& opt);

// The best time of a contender over the rounds, and how it was obtained.
struct fastest {
    double seconds = std::numeric_limits<double>::infinity();
    std::string how;
    void keep(double s, const std::string& h) {
        if (s < seconds) {
            seconds = s;
            how = h;
        }
    }
};

// --load=N: N threads that keep a core each busy, as another program would (a build, a
// browser, another rank), from construction to destruction; each stops by itself after
// `limit_seconds` should the run never end. Every contender, dimsum's and the baselines'
// (PyTorch runs in a child process meanwhile), is timed beside them.
class background_load {
public:
    background_load(int threads, double limit_seconds);
    ~background_load();
    background_load(const background_load&) = delete;
    background_load& operator=(const background_load&) = delete;

private:
    std::atomic<bool> stop_{false};
    std::vector<std::thread> threads_;
};

// Lets the thread pools of whatever ran before go to sleep. OpenBLAS's idle threads spin
// for about 0.1 s after a call (sched_yield, then sleep) and OpenMP's spin briefly; on 2
// cores a spinning pool slows whoever runs next.
void settle(const options& opt);

// The thread counts to run, "1,2", as the PyTorch scripts take them.
std::string thread_list(const options& opt);

// The row of a bf16 case on one bf16 path: BASE on the widen path, BASE_PATH on the others.
std::string bf16_path_row(const std::string& base, dimsum::backend::cpu::bf16_path path);

// Runs a PyTorch baseline, `/usr/bin/python3 SCRIPT_AND_ARGUMENTS` (or $DIMSUM_PYTHON), and hands `each` every
// line it prints. Sets `why` where it gives no figures: python3 missing, the script not
// started, a line `TAG_unavailable,REASON` (torch missing), or the script failing.
void read_torch_script(const std::string& script_and_arguments, const std::string& tag, std::string& why,
                       const std::function<void(const char* line)>& each);

// A tiny deterministic generator for choosing which entries to check.
struct sampler {
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    std::size_t below(std::size_t n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return std::size_t(state >> 33) % n;
    }
};

// ---------------------------------------------------------------------------------------
// The baselines, loaded at run time (baselines.cpp)

// OpenBLAS's CBLAS interface. Debian's libopenblas0 takes int indices (not ILP64), and the
// CBLAS enums are ints.
struct openblas {
    enum : int { row_major = 101, no_trans = 111, trans = 112 };
    using sgemm_fn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                              int lda, const float* b, int ldb, float beta, float* c, int ldc);

    static constexpr const char* name = "openblas";
    std::string file;
    sgemm_fn sgemm = nullptr;
    void (*set_num_threads)(int) = nullptr;
    char* (*get_corename)() = nullptr;
    char* (*get_config)() = nullptr;

    void set_threads(int n) const { set_num_threads(n); }
    // c = a b or a b^T; a (m, k), b (k, n) or (n, k), c (m, n); row-major, contiguous.
    void gemm(bool b_transposed, std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b,
              float* c) const {
        sgemm(row_major, no_trans, b_transposed ? trans : no_trans, int(m), int(n), int(k), 1.0f, a, int(k), b,
              int(b_transposed ? k : n), 0.0f, c, int(n));
    }
};

// oneDNN's row-major sgemm; it threads with OpenMP.
struct onednn {
    using sgemm_fn = int (*)(char trans_a, char trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                             std::int64_t ldc);
    struct version_info {  // dnnl_version_t
        int major, minor, patch;
        const char* hash;
        unsigned cpu_runtime, gpu_runtime;
    };

    static constexpr const char* name = "onednn";
    std::string file;
    void* handle = nullptr;  // dlopen()ed, never closed: the bf16 matmul below finds its functions here
    sgemm_fn sgemm = nullptr;
    const version_info* (*version)() = nullptr;
    int (*effective_isa)() = nullptr;  // a dnnl_cpu_isa_t

    void set_threads(int n) const { omp_set_num_threads(n); }
    void gemm(bool b_transposed, std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b,
              float* c) const {
        int status = sgemm('N', b_transposed ? 'T' : 'N', std::int64_t(m), std::int64_t(n), std::int64_t(k), 1.0f, a,
                           std::int64_t(k), b, std::int64_t(b_transposed ? k : n), 0.0f, c, std::int64_t(n));
        if (status != 0) throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(status));
    }
};

// oneDNN's matmul primitive in bf16 (its C API, found in the library loaded above): C (m, n)
// in bf16 = A (m, k) B, with B (k, n) or, b_transposed, (n, k); row-major, contiguous.
// Created for one shape at the thread count of the moment (oneDNN chooses its blocking
// then), so that run() times the product alone.
class onednn_bf16_matmul {
public:
    onednn_bf16_matmul(const onednn& lib, bool b_transposed, std::size_t m, std::size_t n, std::size_t k,
                       const void* a, const void* b, void* c);  // bf16 data; throws std::runtime_error
    ~onednn_bf16_matmul();
    onednn_bf16_matmul(const onednn_bf16_matmul&) = delete;
    onednn_bf16_matmul& operator=(const onednn_bf16_matmul&) = delete;
    void run() const;
    // The kernel oneDNN chose, e.g. "brg:avx512_core_bf16".
    const std::string& implementation() const { return implementation_; }

private:
    struct api;
    void destroy() noexcept;
    const api* api_ = nullptr;
    void* engine_ = nullptr;
    void* stream_ = nullptr;
    void* primitive_desc_ = nullptr;
    void* primitive_ = nullptr;
    void* memory_[3] = {};
    std::string implementation_;
};

// Loads OpenBLAS with the kernels --openblas-core asks for, leaving the environment as it
// was; none, after saying why in the table, if it cannot.
std::optional<openblas> load_openblas_at_best(const report& out);
// Loads oneDNN, or says in `why` why not.
std::optional<onednn> load_onednn(std::string& why);
// Which files were loaded, their versions and the kernels they chose.
void print_libraries(const report& out, const std::optional<openblas>& blas, const std::optional<onednn>& dnnl);

// ---------------------------------------------------------------------------------------
// The machine (machine.cpp)

// The date, the CPU, the compiler and xsimd; a warning if other work keeps cores busy.
void print_machine(const report& out);

// The yardsticks: what this machine can do at best, measured in this run.
double fma_peak_gflops(const options& opt, int threads);
// tdpbf16ps on tiles that stay loaded; 0 where this process cannot use AMX.
double amx_peak_gflops(const options& opt, int threads);
// vdpbf16ps on independent chains of 16 sums; 0 where this process cannot use AVX512-BF16.
double pair_peak_gflops(const options& opt, int threads);
// memcpy, each thread its own contiguous part; bytes read plus bytes written.
double copy_gbps(const options& opt, int threads, const float* src, float* dst, std::size_t count);

struct yardsticks {
    std::vector<double> fma_peak;  // GFLOP/s, one per thread count of the options
    std::vector<double> amx_peak;  // GFLOP/s of bf16 on the tiles; 0 without AMX
    std::vector<double> pair_peak; // GFLOP/s of bf16 with vdpbf16ps; 0 without AVX512-BF16
    std::vector<double> copy;      // GB/s
};

// The peak a case's row is compared with: the FMA peak, or, for a bf16 case whose products
// run on the path in use's bf16 instructions, those instructions' peak (a bf16 layer on
// vdpbf16ps at 130% of the FMA peak says nothing about how close it is to its own limit).
struct peak_of_case {
    double gflops;
    const char* name;
    const char* how;
};
peak_of_case case_peak(const yardsticks& limits, bool bf16, std::size_t t);

// Floats per array for the bandwidth cases, beyond the caches.
std::size_t streaming_floats(const options& opt);

// ---------------------------------------------------------------------------------------
// The cases (gemm.cpp, streaming.cpp, attention.cpp)

struct bench {
    report& out;
    const options& opt;
    const std::optional<openblas>& blas;
    const std::optional<onednn>& dnnl;
    yardsticks limits;

    // Whether the case's name contains one of the filter's comma-separated texts.
    bool selected(const std::string& name) const {
        for (std::size_t at = 0; at <= opt.filter.size();) {
            const std::size_t comma = std::min(opt.filter.find(',', at), opt.filter.size());
            if (name.find(opt.filter.substr(at, comma - at)) != std::string::npos) return true;
            at = comma + 1;
        }
        return false;
    }
};

struct gemm_case {
    std::string name;
    std::size_t batch;  // 1: a plain product, no batch axis
    std::size_t m, n, k;
    bool b_transposed;

    double flops() const { return 2.0 * double(batch) * double(m) * double(n) * double(k); }
};

void bench_gemm_case(bench& s, const gemm_case& g);

void bench_softmax(bench& s, std::size_t rows, std::size_t cols);
void bench_layer_norm(bench& s, std::size_t rows, std::size_t cols);
void bench_elementwise(bench& s, std::size_t rows, std::size_t cols);
void bench_bf16_streaming(bench& s, std::size_t rows, std::size_t cols);
void bench_concat(bench& s, std::size_t rows, std::size_t cols);
void bench_gather(bench& s, std::size_t rows, std::size_t cols);

void bench_attention(bench& s);
void bench_attention_memory(bench& s);
void bench_attention_backward(bench& s);
void bench_bf16_kv_cache(bench& s);
void bench_bf16_attention_core(bench& s);
void bench_decoder(bench& s);
void bench_training_step(bench& s);
// --attention-memory=[core:]SPEC: run in a fresh process by bench_attention's cases.
int measure_attention_memory(const options& opt, std::string spec);

}  // namespace dimsum_bench
