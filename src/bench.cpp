// dimsum_bench: dimsum against OpenBLAS, oneDNN and the machine's own limits (the FMA peak
// and the copy bandwidth, measured here in the same run), with 1 and with 2 threads.
// `dimsum_bench --help` lists the options; docs/performance.md holds the figures.
//
// The baselines are not linked but dlopen()ed once this program has chosen OpenBLAS's
// kernels: OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE once, when it loads; a core
// type forced for another purpose can halve it, and its own detection falls back to SSE3
// kernels on CPUs newer than it knows (see load_openblas_at_best). The environment is put
// back as it was as soon as it has loaded.

#include <dlfcn.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xsimd/xsimd.hpp>

#include <dimsum/dimsum.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ds = dimsum;

namespace {

using M = ds::axis<"m">;
using N = ds::axis<"n">;
using K = ds::axis<"k">;
using B = ds::axis<"batch">;
using Row = ds::axis<"row">;
using Col = ds::axis<"col">;

// ---------------------------------------------------------------------------------------
// Options and output

struct options {
    bool quick = false;                  // few repetitions: a smoke test, not a measurement
    bool small = false;                  // reduced sizes, for the ctest smoke test
    std::string openblas_core = "auto";  // auto, detect, keep or a core type; see the usage
    bool csv = false;
    std::string csv_path = "-";          // "-": the CSV on stdout, the table on stderr
    std::string filter;                  // only the cases whose name contains this
    std::vector<int> threads{1, 2};
    int rounds = 3;                      // turns each contender takes; see rounds()
    std::string attention_memory;        // hidden: measure this attention case's memory, only
};

const char* usage =
    "usage: dimsum_bench [--quick] [--small] [--csv[=FILE]] [--threads=1,2] [--filter=TEXT]\n"
    "                    [--rounds=N] [--openblas-core=auto|detect|keep|NAME]\n"
    "  --quick              one timed call per case after the warm-up: a smoke test, not a measurement\n"
    "  --small              small sizes (with --quick, for ctest)\n"
    "  --csv                CSV on stdout (the table goes to stderr); --csv=FILE writes FILE\n"
    "  --threads=LIST       thread counts to run, default 1,2\n"
    "  --filter=TEXT        only the cases whose name contains TEXT\n"
    "  --rounds=N           turns each contender takes, keeping its best (default 3; more on a noisy machine)\n"
    "  --openblas-core=...  the OpenBLAS kernels. auto (default): OpenBLAS's own detection, unless\n"
    "                       it picks kernels narrower than the CPU supports (it falls back to SSE3\n"
    "                       on CPUs newer than it knows), then SkylakeX or Haswell; detect: its own\n"
    "                       detection; keep: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE as in the\n"
    "                       environment (otherwise ignored); NAME: that core type, e.g. Haswell\n";

std::optional<options> parse_options(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        auto value_of = [&](std::string_view prefix) { return arg.substr(prefix.size()); };
        if (arg == "--quick") {
            o.quick = true;
        } else if (arg == "--small") {
            o.small = true;
        } else if (arg.starts_with("--openblas-core=")) {
            o.openblas_core = value_of("--openblas-core=");
        } else if (arg == "--csv") {
            o.csv = true;
        } else if (arg.starts_with("--csv=")) {
            o.csv = true;
            o.csv_path = value_of("--csv=");
        } else if (arg.starts_with("--rounds=")) {
            o.rounds = std::atoi(value_of("--rounds=").c_str());
            if (o.rounds < 1) {
                std::fprintf(stderr, "dimsum_bench: bad count in %s\n%s", arg.c_str(), usage);
                return std::nullopt;
            }
        } else if (arg.starts_with("--attention-memory=")) {
            o.attention_memory = value_of("--attention-memory=");
        } else if (arg.starts_with("--filter=")) {
            o.filter = value_of("--filter=");
        } else if (arg.starts_with("--threads=")) {
            o.threads.clear();
            std::string list = value_of("--threads=");
            for (std::size_t at = 0; at < list.size();) {
                std::size_t comma = std::min(list.find(',', at), list.size());
                int n = std::atoi(list.substr(at, comma - at).c_str());
                if (n < 1) {
                    std::fprintf(stderr, "dimsum_bench: bad thread count in %s\n%s", arg.c_str(), usage);
                    return std::nullopt;
                }
                o.threads.push_back(n);
                at = comma + 1;
            }
        } else {
            std::fprintf(stderr, "%s", usage);
            if (arg == "--help" || arg == "-h") std::exit(0);
            return std::nullopt;
        }
    }
    return o;
}

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

    explicit report(const options& o) : opt(o) {
        if (!o.csv) return;
        if (o.csv_path == "-") {
            csv = stdout;
            table = stderr;
        } else if (!(csv = std::fopen(o.csv_path.c_str(), "w"))) {
            throw std::runtime_error("cannot write " + o.csv_path);
        }
        std::fprintf(csv, "name,threads,dimsum,baseline_name,baseline,ratio,unit,baseline_how\n");
    }
    ~report() {
        if (csv && csv != stdout) std::fclose(csv);
    }
    report(const report&) = delete;
    report& operator=(const report&) = delete;

    void table_header() const {
        std::fprintf(table, "\n%-28s %7s %10s  %-14s %10s %-7s %7s  %s\n", "case", "threads", "dimsum", "baseline",
                     "value", "unit", "ratio", "baseline ran as");
    }
    void add(const row& r) const {
        double ratio = r.dimsum / r.baseline;
        std::fprintf(table, "%-28s %7d %10.2f  %-14s %10.2f %-7s %7.3f  %s\n", r.name.c_str(), r.threads, r.dimsum,
                     r.baseline_name.c_str(), r.baseline, r.unit, ratio, r.how.c_str());
        if (csv) {
            std::fprintf(csv, "%s,%d,%.6g,%s,%.6g,%.6g,%s,%s\n", r.name.c_str(), r.threads, r.dimsum,
                         r.baseline_name.c_str(), r.baseline, ratio, r.unit, r.how.c_str());
        }
        std::fflush(table);
    }
    // A wrong result makes the run fail: a fast wrong kernel, or a baseline called wrongly,
    // would otherwise give figures that mean nothing.
    void check(const std::string& what, double error, double tolerance) {
        if (error <= tolerance) return;  // false for NaN too
        std::fprintf(stderr, "dimsum_bench: WRONG RESULT: %s: error %.3g, tolerance %.3g\n", what.c_str(), error,
                     tolerance);
        failed = true;
    }
};

// ---------------------------------------------------------------------------------------
// Timing

using clock_type = std::chrono::steady_clock;

// How long to time a contender: calls until `budget` seconds are spent, and at least
// `enough_calls` of them unless they take ten budgets.
struct timing {
    double budget;
    int enough_calls;
};
timing case_timing(const options& opt) { return opt.quick ? timing{0.0, 1} : timing{0.2, 5}; }
// The yardsticks are cheap and every ratio divides by one: a few calls even with --quick.
timing yardstick_timing(const options& opt) { return opt.quick ? timing{0.02, 5} : timing{0.2, 5}; }

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
int rounds(const options& opt) { return opt.quick ? 1 : opt.rounds; }

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

// Lets the thread pools of whatever ran before go to sleep. OpenBLAS's idle threads spin
// for about 0.1 s after a call (sched_yield, then sleep) and OpenMP's spin briefly; on 2
// cores a spinning pool slows whoever runs next.
void settle(const options& opt) {
    if (!opt.quick) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

// ---------------------------------------------------------------------------------------
// The baselines, loaded at run time

template <class F>
bool find_symbol(void* handle, const char* symbol, F& f) {
    f = reinterpret_cast<F>(dlsym(handle, symbol));
    return f != nullptr;
}

// The first library of the list that loads, with its name; else why each failed.
std::pair<void*, std::string> open_first(std::initializer_list<const char*> names) {
    std::string errors;
    for (const char* name : names) {
        if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return {handle, name};
        const char* error = dlerror();
        if (!errors.empty()) errors += "; ";
        errors += error ? error : name;
    }
    return {nullptr, errors};
}

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

// Loads OpenBLAS, or says in `why` why not.
std::optional<openblas> load_openblas(std::string& why) {
    auto [handle, file] = open_first({"libopenblas.so.0", "libopenblas.so"});
    if (!handle) {
        why = "not loadable (" + file + ")";
        return std::nullopt;
    }
    openblas lib;
    lib.file = file;
    if (!find_symbol(handle, "cblas_sgemm", lib.sgemm) ||
        !find_symbol(handle, "openblas_set_num_threads", lib.set_num_threads)) {
        why = file + " lacks cblas_sgemm or openblas_set_num_threads";
        return std::nullopt;
    }
    find_symbol(handle, "openblas_get_corename", lib.get_corename);
    find_symbol(handle, "openblas_get_config", lib.get_config);
    return lib;
}

std::optional<onednn> load_onednn(std::string& why) {
    auto [handle, file] = open_first({"libdnnl.so.2", "libdnnl.so"});
    if (!handle) {
        why = "not loadable (" + file + ")";
        return std::nullopt;
    }
    onednn lib;
    lib.file = file;
    if (!find_symbol(handle, "dnnl_sgemm", lib.sgemm)) {
        why = file + " lacks dnnl_sgemm";
        return std::nullopt;
    }
    find_symbol(handle, "dnnl_version", lib.version);
    find_symbol(handle, "dnnl_get_effective_cpu_isa", lib.effective_isa);
    return lib;
}

// OpenBLAS's kernel families for sgemm, by the widest vectors they use: 1 SSE, 2 AVX2 and
// FMA, 3 AVX-512.
int openblas_core_level(std::string core) {
    std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"})
        if (core == name) return 3;
    for (const char* name : {"haswell", "zen", "excavator"})
        if (core == name) return 2;
    return 1;
}

int cpu_level() {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return 3;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
    return 1;
}

// The core type OpenBLAS's own detection picks on this machine, with the variables unset,
// asked of a child process: a library loads once per process, and here it must load only
// with the final choice. Empty if it cannot tell. Called before any thread exists.
std::string detected_openblas_core() {
    int ends[2];
    if (pipe(ends) != 0) return {};
    pid_t child = fork();
    if (child < 0) {
        close(ends[0]);
        close(ends[1]);
        return {};
    }
    if (child == 0) {
        close(ends[0]);
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("OPENBLAS_L2_SIZE");
        std::string why;
        std::optional<openblas> lib = load_openblas(why);
        if (lib && lib->get_corename) {
            const char* core = lib->get_corename();
            if (write(ends[1], core, std::strlen(core)) < 0) _exit(1);
        }
        _exit(0);  // no destructors, no flush of the parent's buffers
    }
    close(ends[1]);
    std::string core;
    char buffer[64];
    for (ssize_t n; (n = read(ends[0], buffer, sizeof buffer)) > 0;) core.append(buffer, std::size_t(n));
    close(ends[0]);
    waitpid(child, nullptr, 0);
    return core;
}

// Loads OpenBLAS at its best, changing OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for the
// moment it loads (it reads them then) and putting them back after, so that nothing else
// sees the change. A core type set in the environment for another purpose is ignored, and
// so is OpenBLAS's own choice when its detection does not know the CPU: 0.3.21 falls back
// to Prescott (SSE3) on CPUs newer than it, e.g. family 6 model 207, at a sixth of the
// speed of its AVX-512 kernels.
std::optional<openblas> load_openblas_at_best(const report& out) {
    const char* variables[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"};
    std::optional<std::string> saved[2];
    for (int i = 0; i < 2; ++i) {
        if (const char* value = std::getenv(variables[i])) saved[i] = value;
    }
    const std::string& choice = out.opt.openblas_core;
    std::string core;  // empty: OpenBLAS detects
    if (choice == "keep") {
        core = saved[0].value_or("");
    } else if (choice == "auto") {
        std::string detected = detected_openblas_core();
        int level = cpu_level();
        if (!detected.empty() && openblas_core_level(detected) < level) {
            core = level == 3 ? "SkylakeX" : "Haswell";
            std::fprintf(out.table,
                         "openblas: its own detection picks %s, below what this CPU supports: using %s "
                         "(--openblas-core=detect keeps its choice)\n",
                         detected.c_str(), core.c_str());
        }
    } else if (choice != "detect") {
        core = choice;
    }
    for (int i = 0; i < 2; ++i) {
        if (!saved[i] || choice == "keep") continue;
        std::fprintf(out.table, "openblas: %s=%s in the environment, not used here (--openblas-core=keep uses it)\n",
                     variables[i], saved[i]->c_str());
    }
    if (choice != "keep") unsetenv("OPENBLAS_L2_SIZE");
    if (core.empty()) unsetenv("OPENBLAS_CORETYPE");
    else setenv("OPENBLAS_CORETYPE", core.c_str(), 1);

    std::string why;
    std::optional<openblas> lib = load_openblas(why);
    if (!lib) std::fprintf(out.table, "skipped: openblas: %s; its rows are left out\n", why.c_str());

    for (int i = 0; i < 2; ++i) {
        if (saved[i]) setenv(variables[i], saved[i]->c_str(), 1);
        else unsetenv(variables[i]);
    }
    return lib;
}

// ---------------------------------------------------------------------------------------
// The yardsticks: what this machine can do at best, measured in this run

using simd = xsimd::batch<float>;

// Independent accumulator chains: two FMA ports with a 4-cycle latency need 8 in flight,
// 16 leaves room and still fits the registers.
constexpr int fma_chains = 16;

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

double fma_peak_gflops(const options& opt, int threads) {
    std::int64_t iterations = opt.quick ? 400'000 : 4'000'000;  // 4M: about 10 ms a call
    std::vector<float> results(threads);
    double seconds = best_seconds(yardstick_timing(opt), [&] {
#pragma omp parallel num_threads(threads)
        results[omp_get_thread_num()] = fma_chains_run(iterations, 1.0f + float(omp_get_thread_num()));
    });
    for (float r : results) fma_sink = r;
    return 2.0 * fma_chains * double(simd::size) * double(iterations) * threads / seconds * 1e-9;
}

// memcpy, each thread its own contiguous part; bytes read plus bytes written.
double copy_gbps(const options& opt, int threads, std::vector<float>& src, std::vector<float>& dst) {
    std::size_t count = src.size();
    double seconds = best_seconds(yardstick_timing(opt), [&] {
#pragma omp parallel num_threads(threads)
        {
            std::size_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            std::size_t begin = count * t / nt, end = count * (t + 1) / nt;
            std::memcpy(dst.data() + begin, src.data() + begin, (end - begin) * sizeof(float));
        }
    });
    return 2.0 * double(count * sizeof(float)) / seconds * 1e-9;
}

struct yardsticks {
    std::vector<double> fma_peak;  // GFLOP/s, one per thread count of the options
    std::vector<double> copy;      // GB/s
};

// ---------------------------------------------------------------------------------------
// The cases

struct bench {
    report& out;
    const options& opt;
    const std::optional<openblas>& blas;
    const std::optional<onednn>& dnnl;
    yardsticks limits;

    bool selected(const std::string& name) const { return name.find(opt.filter) != std::string::npos; }
};

struct gemm_case {
    std::string name;
    std::size_t batch;  // 1: a plain product, no batch axis
    std::size_t m, n, k;
    bool b_transposed;

    double flops() const { return 2.0 * double(batch) * double(m) * double(n) * double(k); }
};

// A tiny deterministic generator for choosing which entries to check.
struct sampler {
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    std::size_t below(std::size_t n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return std::size_t(state >> 33) % n;
    }
};

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

void bench_gemm_case(bench& s, const gemm_case& g) {
    if (!s.selected(g.name)) return;
    if (g.batch == 1) {
        ds::tensor<float, M, K> a(M{g.m}, K{g.k});  // (m, k)
        ds::tensor<float, K, N> b(K{g.k}, N{g.n});  // (k, n)
        ds::tensor<float, M, N> c(M{g.m}, N{g.n});  // (m, n)
        ds::fill_uniform(a, 1);
        ds::fill_uniform(b, 2);
        bench_gemm(s, g, a, b, c, [&] { ds::assign(c, ds::matmul(a, b)); });
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

// Memory-bound formulas: `run` evaluates into y; `error` checks y; `bytes` is what the
// formula must at least move (every input read once, the output written once).
template <class Run, class Error>
void bench_streaming(bench& s, const std::string& name, double bytes, double tolerance, Run run, Error error) {
    for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
        int threads = s.opt.threads[t];
        fastest mine;
        for (int round = 0; round < rounds(s.opt); ++round) {
            ds::set_num_threads(threads);
            settle(s.opt);
            mine.keep(best_seconds(s.opt, run), "");
        }
        double gbps = bytes / mine.seconds * 1e-9;
        s.out.check(name + " (" + std::to_string(threads) + " threads): dimsum", error(), tolerance);
        s.out.add({name, threads, gbps, "copy_bandwidth", s.limits.copy[t], "GB/s", "memcpy"});
    }
}

// The largest error of 8 sampled rows of y = f(x) along rows, against `exact`, which writes f
// of one row in double; relative (softmax's weights) or absolute (layer_norm's outputs are of
// size 1).
template <class Exact>
double worst_row_error(const ds::tensor<float, Row, Col>& x, const ds::tensor<float, Row, Col>& y, bool relative,
                       Exact exact) {
    const std::size_t rows = x.extent(0), cols = x.extent(1);
    std::vector<double> want(cols);
    sampler pick;
    double worst = 0;
    for (int sample = 0; sample < 8; ++sample) {
        std::size_t r = pick.below(rows);
        exact(x.data() + r * cols, want.data());
        for (std::size_t j = 0; j < cols; ++j) {
            double e = std::abs(double(y.data()[r * cols + j]) - want[j]) / (relative ? want[j] : 1.0);
            if (!(e <= worst)) worst = e;
        }
    }
    return worst;
}

void bench_softmax(bench& s, std::size_t rows, std::size_t cols) {
    std::string name = "softmax_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    ds::tensor<float, Row, Col> x(Row{rows}, Col{cols});  // (row, col)
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});  // (row, col)
    ds::fill_normal(x, 7, 0.0, 2.0);
    auto error = [&] {
        return worst_row_error(x, y, true, [cols](const float* in, double* out) {
            double top = *std::max_element(in, in + cols), sum = 0;
            for (std::size_t j = 0; j < cols; ++j) sum += std::exp(double(in[j]) - top);
            for (std::size_t j = 0; j < cols; ++j) out[j] = std::exp(double(in[j]) - top) / sum;
        });
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    bench_streaming(s, name, 2.0 * double(x.size() * sizeof(float)), 1e-4, [&] { ds::assign(y, ds::softmax(x)); },
                    error);
}

// layer_norm along rows of a transformer's widths.
void bench_layer_norm(bench& s, std::size_t rows, std::size_t cols) {
    std::string name = "layer_norm_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    ds::tensor<float, Row, Col> x(Row{rows}, Col{cols});  // (row, col)
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});  // (row, col)
    ds::fill_normal(x, 11, 3.0, 2.0);
    auto error = [&] {
        return worst_row_error(x, y, false, [cols](const float* in, double* out) {
            double mean = 0, variance = 0;
            for (std::size_t j = 0; j < cols; ++j) mean += in[j];
            mean /= double(cols);
            for (std::size_t j = 0; j < cols; ++j) variance += (in[j] - mean) * (in[j] - mean);
            variance /= double(cols);
            for (std::size_t j = 0; j < cols; ++j) out[j] = (in[j] - mean) / std::sqrt(variance + 1e-5);
        });
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    bench_streaming(s, name, 2.0 * double(x.size() * sizeof(float)), 1e-5, [&] { ds::assign(y, ds::layer_norm(x)); },
                    error);
}

// A transformer-style epilogue: scale, bias, ReLU, residual.
void bench_elementwise(bench& s, std::size_t rows, std::size_t cols) {
    std::string name = "eltwise_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    ds::tensor<float, Row, Col> x(Row{rows}, Col{cols});  // (row, col)
    ds::tensor<float, Col> bias(Col{cols});               // (col)
    ds::tensor<float, Row, Col> r(Row{rows}, Col{cols});  // (row, col) the residual
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});  // (row, col)
    ds::fill_uniform(x, 8);
    ds::fill_uniform(bias, 9);
    ds::fill_uniform(r, 10);
    auto error = [&] {
        sampler pick;
        double worst = 0;
        for (int sample = 0; sample < 256; ++sample) {
            std::size_t i = pick.below(rows), j = pick.below(cols), at = i * cols + j;
            double exact = std::max(double(x.data()[at]) * 0.5 + double(bias.data()[j]), 0.0) + double(r.data()[at]);
            double e = std::abs(double(y.data()[at]) - exact);
            if (!(e <= worst)) worst = e;
        }
        return worst;
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    double bytes = double((3 * x.size() + bias.size()) * sizeof(float));
    bench_streaming(s, name, bytes, 1e-5, [&] { ds::assign(y, ds::max(x * 0.5f + bias, 0.0f) + r); }, error);
}

// ---------------------------------------------------------------------------------------
// Attention: one multi-head attention layer forward (fused QKV projection with biases,
// attention, output projection with bias) against PyTorch at its best: the faster of
// torch.nn.MultiheadAttention and a hand-written version, of 1 and 2 threads
// (scripts/attention_torch.py, run by /usr/bin/python3).

struct attention_case {
    std::string name;
    std::size_t batch, seq, model, heads;
    enum class kind { plain, causal, decode } what = kind::plain;  // decode: one query, `seq` cached keys

    std::size_t head() const { return model / heads; }
    // "batch,seq,model,heads[,causal|decode]", as attention_torch.py and --attention-memory read it
    std::string spec() const {
        std::string s = std::to_string(batch) + "," + std::to_string(seq) + "," + std::to_string(model) + "," +
                        std::to_string(heads);
        if (what == kind::causal) s += ",causal";
        if (what == kind::decode) s += ",decode";
        return s;
    }
    // The work that must be done: the projections, then Q K^T and P V, of which a causal
    // mask leaves half.
    double flops() const {
        double b = double(batch), s = double(seq), m = double(model), products = 4.0 * b * double(heads) * double(head());
        if (what == kind::decode) return 2.0 * b * m * m * 2.0 + products * s;  // q and output projections of one token
        return 2.0 * b * s * m * m * 4.0 + products * s * s * (what == kind::causal ? 0.5 : 1.0);
    }
};

std::optional<attention_case> parse_attention_case(const std::string& spec) {
    attention_case c;
    char mode[16] = "";
    int fields = std::sscanf(spec.c_str(), "%zu,%zu,%zu,%zu,%15s", &c.batch, &c.seq, &c.model, &c.heads, mode);
    if (fields < 4 || c.heads == 0 || c.model % c.heads != 0) return std::nullopt;
    std::string m = fields == 5 ? mode : "";
    if (m == "causal") c.what = attention_case::kind::causal;
    else if (m == "decode") c.what = attention_case::kind::decode;
    else if (!m.empty()) return std::nullopt;
    // the name: no commas (a CSV field), e.g. attention_causal_1x2048x1024x16
    c.name = "attention_" + (m.empty() ? std::string() : m + "_") + std::to_string(c.batch) + "x" + std::to_string(c.seq) +
             "x" + std::to_string(c.model) + "x" + std::to_string(c.heads);
    return c;
}

// The layer of one case, at one of the two sizes the cases use (model and heads are static
// extents: one instantiation each).
template <std::size_t ModelExtent, std::size_t HeadsExtent>
struct attention_layer {
    using Model = ds::axis<"model", ModelExtent>;
    using Heads = ds::axis<"heads", HeadsExtent>;
    using Head = ds::axis<"head", ModelExtent / HeadsExtent>;
    using Seq = ds::axis<"seq">;
    using Cached = ds::axis<"cached">;
    using layer_type = ds::nn::multi_head_attention<float, Model, Heads, Head>;
    using Inner = typename layer_type::Inner;
    using Part = typename layer_type::Part;

    attention_case c;
    layer_type layer;
    ds::tensor<float, B, Seq, Model> x, y;                     // (batch, seq, model); decoding: seq = 1
    ds::tensor<float, B, Heads, Cached, Head> k_cache, v_cache;  // decoding: the keys and values so far
    ds::nn::attention_options options;

    explicit attention_layer(const attention_case& which) : c(which) {
        const bool decode = c.what == attention_case::kind::decode;
        const double bound = 1.0 / std::sqrt(double(ModelExtent));  // as torch.nn.Linear
        layer.w_qkv.emplace();
        ds::fill_uniform(*layer.w_qkv, 11, -bound, bound);
        ds::fill_uniform(layer.b_qkv, 12, -0.1, 0.1);
        ds::fill_uniform(layer.w_o, 13, -bound, bound);
        ds::fill_uniform(layer.b_o, 14, -0.1, 0.1);
        x = ds::tensor<float, B, Seq, Model>(B{c.batch}, Seq{decode ? 1 : c.seq});
        y = x;
        ds::fill_normal(x, 15);
        if (decode) {
            k_cache = ds::tensor<float, B, Heads, Cached, Head>(B{c.batch}, Heads{}, Cached{c.seq}, Head{});
            v_cache = k_cache;
            ds::fill_normal(k_cache, 16);
            ds::fill_normal(v_cache, 17);
        }
        options.causal = c.what == attention_case::kind::causal;
    }

    // y = the layer of x, on `backend`.
    template <class Backend>
    void run_on(Backend backend) {
        if (c.what != attention_case::kind::decode) return layer.forward_on(backend, x, x, y.view(), options);
        // One new token: its query attends to the cached keys and values.
        auto w = ds::view<Model, Part, Inner>(std::as_const(*layer.w_qkv));  // (model, part, heads x head)
        auto b = ds::view<Part, Inner>(std::as_const(layer.b_qkv));          // (part, heads x head)
        auto q = ds::transpose<Seq, Heads>(
            ds::view<B, Seq, Heads, Head>(ds::matmul(x, ds::select<Part>(w, 0)) + ds::select<Part>(b, 0)));  // (batch, heads, 1, head)
        auto z = ds::nn::attention(q, k_cache, v_cache);  // (batch, heads, 1, head)
        ds::evaluation::assign_with(backend, y.view(),
                                    ds::matmul(ds::view<B, Seq, Inner>(ds::transpose<Heads, Seq>(z)), layer.w_o) + layer.b_o);
    }
    void run() { run_on(ds::backend::cpu::evaluator{}); }

    // The largest difference from the same layer evaluated step by step (no fusion),
    // relative to the output's largest value.
    double error() {
        auto fused = y;
        run_on(ds::backend::cpu::evaluator{.fuse_attention = false});
        double worst = 0, scale = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            worst = std::max(worst, std::abs(double(fused.data()[i]) - double(y.data()[i])));
            scale = std::max(scale, std::abs(double(y.data()[i])));
            if (std::isnan(fused.data()[i])) worst = std::numeric_limits<double>::quiet_NaN();
        }
        y = fused;
        return worst / scale;
    }
};

// Calls f(layer) with the layer of case c.
template <class F>
void with_attention_layer(const attention_case& c, F&& f) {
    if (c.model == 768 && c.heads == 12) {
        attention_layer<768, 12> layer(c);
        return f(layer);
    }
    if (c.model == 1024 && c.heads == 16) {
        attention_layer<1024, 16> layer(c);
        return f(layer);
    }
    throw std::runtime_error("attention case " + c.spec() + ": model and heads must be 768,12 or 1024,16");
}

// The time of one call: after two calls to warm up, the mean over a batch of calls lasting
// the time budget (one call with --quick). attention_torch.py measures the same way; each
// side keeps its fastest batch over its turns.
template <class F>
double batch_seconds(const options& opt, F&& f) {
    f();
    f();
    auto start = clock_type::now();
    int calls = 0;
    double spent = 0;
    do {
        f();
        ++calls;
        spent = std::chrono::duration<double>(clock_type::now() - start).count();
    } while (!opt.quick && spent < 0.2);
    return spent / calls;
}

// This process's resident memory now, and its peak since reset_peak_memory(), in bytes.
std::size_t resident_bytes(const char* field) {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.starts_with(field)) return std::stoul(line.substr(std::strlen(field))) * 1024;  // kB
    }
    return 0;
}
void reset_peak_memory() {
    std::ofstream("/proc/self/clear_refs") << "5";  // the peak (VmHWM) starts again from the current size
}

// --attention-memory=[core:]SPEC (in a fresh process, see attention_memory_mb): the memory
// one call of the layer (with core:, of causal attention alone) needs beyond its inputs,
// weights and output, in MB.
int measure_attention_memory(const options& opt, std::string spec) {
    const bool core = spec.starts_with("core:");  // the attention formula only, not the layer
    if (core) spec = spec.substr(5);
    std::optional<attention_case> c = parse_attention_case(spec);
    if (!c) {
        std::fprintf(stderr, "dimsum_bench: bad attention case %s\n", spec.c_str());
        return 2;
    }
    ds::set_num_threads(opt.threads.back());
    auto measure = [](auto&& run) {
        std::size_t before = resident_bytes("VmRSS:");
        reset_peak_memory();
        for (int call = 0; call < 2; ++call) run();
        std::printf("%.2f\n", double(resident_bytes("VmHWM:") - before) * 1e-6);
    };
    if (core) {  // the attention alone: Q, K, V and the output (batch, heads, seq, head) exist already
        using Heads = ds::axis<"heads">;
        using Seq = ds::axis<"seq">;
        using Head = ds::axis<"head">;
        ds::tensor<float, B, Heads, Seq, Head> q(B{c->batch}, Heads{c->heads}, Seq{c->seq}, Head{c->head()});
        auto k = q, v = q, z = q;
        ds::fill_normal(q, 1);
        ds::fill_normal(k, 2);
        ds::fill_normal(v, 3);
        measure([&] { ds::assign(z, ds::nn::causal_attention(q, k, v)); });
        return 0;
    }
    with_attention_layer(*c, [&](auto& layer) { measure([&] { layer.run(); }); });
    return 0;
}

// The extra memory of case c, measured in a fresh copy of this program (a process's peak
// memory only grows, and this one has run other cases); NaN if that failed.
double attention_memory_mb(const options& opt, const attention_case& c, bool core = false) {
    std::string command = "'/proc/" + std::to_string(getpid()) + "/exe' --threads=" + std::to_string(opt.threads.back()) +
                          " --attention-memory=" + (core ? "core:" : "") + c.spec();
    std::FILE* child = popen(command.c_str(), "r");
    if (!child) return std::numeric_limits<double>::quiet_NaN();
    double mb = std::numeric_limits<double>::quiet_NaN();
    if (std::fscanf(child, "%lf", &mb) != 1) mb = std::numeric_limits<double>::quiet_NaN();
    if (pclose(child) != 0) mb = std::numeric_limits<double>::quiet_NaN();
    return mb;
}

struct torch_result {
    double ms = 0, extra_mb = 0;
    std::string how;  // e.g. "module, 2 threads"
};

// PyTorch's best of each case (one timed batch per configuration: one turn), by case name;
// empty, with `why`, when it cannot run. `verify`: check its two versions agree first.
std::map<std::string, torch_result> torch_attention(const options& opt, const std::vector<attention_case>& cases,
                                                    bool verify, std::string& why) {
    std::map<std::string, torch_result> results;
    if (access("/usr/bin/python3", X_OK) != 0) {
        why = "/usr/bin/python3 is missing";
        return results;
    }
    std::string command = std::string("/usr/bin/python3 '" DIMSUM_TORCH_SCRIPT "' --rounds=1") +
                          (opt.quick ? " --quick" : "") + (verify ? "" : " --no-verify");
    for (const attention_case& c : cases) command += " --case " + c.name + ":" + c.spec();
    std::FILE* child = popen(command.c_str(), "r");
    if (!child) {
        why = "cannot run " + command;
        return results;
    }
    char line[512];
    while (std::fgets(line, sizeof line, child)) {
        std::string text = line;
        if (text.starts_with("torch_attention_unavailable,")) why = text.substr(28, text.find('\n') - 28);
        if (!text.starts_with("torch_attention_best,")) continue;
        char name[128], impl[32];
        int threads;
        torch_result r;
        if (std::sscanf(line, "torch_attention_best,%127[^,],%31[^,],%d,%lf,%lf", name, impl, &threads, &r.ms, &r.extra_mb) == 5) {
            r.how = std::string(impl) + " on " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");  // no comma: a CSV field
            results[name] = r;
        }
    }
    if (pclose(child) != 0 && why.empty()) why = "attention_torch.py failed";
    if (results.empty() && why.empty()) why = "attention_torch.py gave no result";
    return results;
}

void bench_attention(bench& s) {
    const bool small = s.opt.small;
    std::vector<attention_case> cases;
    auto add = [&](const std::string& spec) {
        if (auto c = parse_attention_case(spec); c && s.selected(c->name)) cases.push_back(*c);
    };
    if (small) {
        add("2,24,768,12");
        add("1,40,1024,16,causal");
        add("1,300,1024,16,decode");
    } else {
        add("8,128,768,12");
        add("1,512,768,12");
        add("1,2048,1024,16,causal");
        add("1,4096,1024,16,causal");
        add("1,4096,1024,16,decode");
    }
    if (cases.empty()) return;

    std::string why = small ? "--small" : "";
    std::fprintf(s.out.table, "\n%-34s %7s %9s %8s %6s  %9s %-20s %7s  %8s %8s\n", "attention case", "threads", "ms",
                 "GFLOP/s", "peak", "torch ms", "torch ran as", "speedup", "MB", "torch MB");
    for (const attention_case& c : cases) {
        double mb = attention_memory_mb(s.opt, c);
        with_attention_layer(c, [&](auto& layer) {
            layer.y.fill(std::numeric_limits<float>::quiet_NaN());
            layer.run();
            s.out.check(c.name + ": dimsum against its unfused formula", layer.error(), 1e-4);
            // Turns, as for the GEMM: dimsum with each thread count, then PyTorch, and again;
            // each keeps its best. PyTorch's turn runs in fresh processes.
            std::vector<double> seconds(s.opt.threads.size(), std::numeric_limits<double>::infinity());
            std::optional<torch_result> torch_best;
            for (int turn = 0; turn < rounds(s.opt); ++turn) {
                for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
                    ds::set_num_threads(s.opt.threads[t]);
                    settle(s.opt);
                    seconds[t] = std::min(seconds[t], batch_seconds(s.opt, [&] { layer.run(); }));
                }
                if (!small && (turn == 0 || torch_best)) {
                    auto found = torch_attention(s.opt, {c}, turn == 0, why);
                    if (auto r = found.find(c.name); r != found.end() && (!torch_best || r->second.ms < torch_best->ms)) {
                        torch_best = r->second;
                    }
                }
            }
            if (!torch_best) std::fprintf(s.out.table, "skipped: pytorch: %s; %s is compared with the FMA peak only\n",
                                          why.c_str(), c.name.c_str());
            for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
                const int threads = s.opt.threads[t];
                const double gflops = c.flops() / seconds[t] * 1e-9;
                const torch_result* t_best = torch_best ? &*torch_best : nullptr;
                std::fprintf(s.out.table, "%-34s %7d %9.2f %8.1f %5.0f%%  %9.2f %-20s %7.2f  %8.1f %8.1f\n", c.name.c_str(),
                             threads, seconds[t] * 1e3, gflops, 100.0 * gflops / s.limits.fma_peak[t], t_best ? t_best->ms : NAN,
                             t_best ? t_best->how.c_str() : "-", t_best ? t_best->ms * 1e-3 / seconds[t] : NAN, mb,
                             t_best ? t_best->extra_mb : NAN);
                if (s.out.csv) {
                    auto csv_row = [&](const char* baseline, double mine, double theirs, const char* unit, const std::string& how) {
                        std::fprintf(s.out.csv, "%s,%d,%.6g,%s,%.6g,%.6g,%s,%s\n", c.name.c_str(), threads, mine, baseline,
                                     theirs, mine / theirs, unit, how.c_str());
                    };
                    if (t_best) csv_row("pytorch", gflops, c.flops() / t_best->ms * 1e-6, "GFLOP/s", t_best->how);
                    csv_row("fma_peak", gflops, s.limits.fma_peak[t], "GFLOP/s", "xsimd fma chains");
                    if (t_best && t == s.opt.threads.size() - 1) {
                        csv_row("pytorch_memory", mb, t_best->extra_mb, "MB", "peak memory beyond inputs and weights");
                    }
                }
            }
        });
        std::fflush(s.out.table);
    }
}

// Memory against sequence length (causal, model 1024, 16 heads): it grows like seq, where
// the scores alone would grow like seq^2.
void bench_attention_memory(bench& s) {
    std::fprintf(s.out.table, "\n%-38s %7s %9s %14s %14s\n", "attention memory (causal, 1024, 16)", "seq", "layer MB",
                 "attention MB", "seq x seq MB");
    for (std::size_t seq : s.opt.small ? std::vector<std::size_t>{256, 512} : std::vector<std::size_t>{1024, 2048, 4096, 8192, 16384}) {
        attention_case c = *parse_attention_case("1," + std::to_string(seq) + ",1024,16,causal");
        c.name = "attention_memory_seq" + std::to_string(seq);
        if (!s.selected(c.name)) continue;
        double mb = attention_memory_mb(s.opt, c), core_mb = attention_memory_mb(s.opt, c, true);
        double scores_mb = 16.0 * double(seq) * double(seq) * sizeof(float) * 1e-6;
        std::fprintf(s.out.table, "%-38s %7zu %9.1f %14.1f %14.1f\n", c.name.c_str(), seq, mb, core_mb, scores_mb);
        if (s.out.csv) {
            std::fprintf(s.out.csv, "%s,%d,%.6g,seq_x_seq_scores,%.6g,%.6g,MB,the scores of all heads in float\n",
                         c.name.c_str(), s.opt.threads.back(), mb, scores_mb, mb / scores_mb);
            std::fprintf(s.out.csv, "%s_core,%d,%.6g,seq_x_seq_scores,%.6g,%.6g,MB,causal attention of given Q K V\n",
                         c.name.c_str(), s.opt.threads.back(), core_mb, scores_mb, core_mb / scores_mb);
        }
        if (!(mb < 1e9) || !(core_mb < 1e9)) {  // NaN: a child failed
            s.out.check(c.name + ": memory measurement", std::numeric_limits<double>::infinity(), 0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The run

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

// dnnl_cpu_isa_t values of oneDNN 2.x.
const char* onednn_isa_name(int isa) {
    switch (isa) {
        case 0x1: return "sse41";
        case 0x3: return "avx";
        case 0x7: return "avx2";
        case 0x27: return "avx512_core";
        case 0x67: return "avx512_core_vnni";
        case 0xe7: return "avx512_core_bf16";
        case 0x3e7: return "avx512_core_amx";
        case 0x407: return "avx2_vnni";
        default: return "other";
    }
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
}

void print_libraries(const report& out, const std::optional<openblas>& blas, const std::optional<onednn>& dnnl) {
    if (blas) {
        std::fprintf(out.table, "openblas: %s, core %s, config %s\n", blas->file.c_str(),
                     blas->get_corename ? blas->get_corename() : "?", blas->get_config ? blas->get_config() : "?");
    }
    if (dnnl) {
        const onednn::version_info* v = dnnl->version ? dnnl->version() : nullptr;
        std::fprintf(out.table, "onednn: %s", dnnl->file.c_str());
        if (v) std::fprintf(out.table, ", %d.%d.%d", v->major, v->minor, v->patch);
        if (dnnl->effective_isa) std::fprintf(out.table, ", isa %s", onednn_isa_name(dnnl->effective_isa()));
        std::fprintf(out.table, "\n");
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

int run(const options& opt) {
    report out(opt);
    print_machine(out);
    std::optional<openblas> blas = load_openblas_at_best(out);
    std::string why;
    std::optional<onednn> dnnl = load_onednn(why);
    if (!dnnl) std::fprintf(out.table, "skipped: onednn: %s; its rows are left out\n", why.c_str());
    print_libraries(out, blas, dnnl);

    bench s{out, opt, blas, dnnl, {}};
    {
        std::size_t count = streaming_floats(opt);
        std::vector<float> src(count, 1.0f), dst(count, 0.0f);
        s.limits.fma_peak.assign(opt.threads.size(), 0.0);
        s.limits.copy.assign(opt.threads.size(), 0.0);
        for (int round = 0; round < rounds(opt); ++round) {
            for (std::size_t t = 0; t < opt.threads.size(); ++t) {
                settle(opt);
                s.limits.fma_peak[t] = std::max(s.limits.fma_peak[t], fma_peak_gflops(opt, opt.threads[t]));
                s.limits.copy[t] = std::max(s.limits.copy[t], copy_gbps(opt, opt.threads[t], src, dst));
            }
        }
        for (std::size_t t = 0; t < opt.threads.size(); ++t) {
            std::fprintf(out.table, "threads=%d: FMA peak %.1f GFLOP/s, copy bandwidth %.1f GB/s (memcpy of %zu MiB)\n",
                         opt.threads[t], s.limits.fma_peak[t], s.limits.copy[t], count * sizeof(float) >> 20);
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
    std::size_t elements = streaming_floats(opt);  // per array, as the copy
    for (std::size_t cols : {128, 512, 4096}) bench_softmax(s, elements / cols, cols);
    for (std::size_t cols : {768, 4096}) bench_layer_norm(s, elements / cols, cols);
    bench_elementwise(s, elements / 4096, 4096);
    bench_attention(s);
    bench_attention_memory(s);
    return out.failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
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
