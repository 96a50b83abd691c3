// dimsum_bench's options, its report (the table and the CSV) and its timing rules.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "bench.hpp"

namespace dimsum_bench {

namespace {

const char* usage =
    "usage: dimsum_bench [--quick] [--small] [--csv[=FILE]] [--threads=1,2] [--filter=TEXT]\n"
    "                    [--rounds=N] [--load=N] [--openblas-core=auto|detect|keep|NAME]\n"
    "  --quick              one timed call per case after the warm-up: a smoke test, not a measurement\n"
    "  --small              small sizes (with --quick, for ctest)\n"
    "  --csv                CSV on stdout (the table goes to stderr); --csv=FILE writes FILE\n"
    "  --threads=LIST       thread counts to run, default 1,2\n"
    "  --filter=TEXT[,...]  only the cases whose name contains TEXT (or one of the TEXTs)\n"
    "  --rounds=N           turns each contender takes, keeping its best (default 3; more on a noisy machine)\n"
    "  --load=N             N busy threads beside every timed call of every contender, as on a shared\n"
    "                       machine; the rows' names end in _load=N\n"
    "  --openblas-core=...  the OpenBLAS kernels. auto (default): OpenBLAS's own detection, unless\n"
    "                       it picks kernels narrower than the CPU supports (it falls back to SSE3\n"
    "                       on CPUs newer than it knows), then SkylakeX or Haswell; detect: its own\n"
    "                       detection; keep: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE as in the\n"
    "                       environment (otherwise ignored); NAME: that core type, e.g. Haswell\n";

}  // namespace

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
        } else if (arg.starts_with("--load=")) {
            o.load = std::atoi(value_of("--load=").c_str());
            if (o.load < 0 || value_of("--load=").empty()) {
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

report::report(const options& o) : opt(o) {
    if (!o.csv) return;
    if (o.csv_path == "-") {
        csv = stdout;
        table = stderr;
    } else if (!(csv = std::fopen(o.csv_path.c_str(), "w"))) {
        throw std::runtime_error("cannot write " + o.csv_path);
    }
    std::fprintf(csv, "name,threads,dimsum,baseline_name,baseline,ratio,unit,baseline_how\n");
}

report::~report() {
    if (csv && csv != stdout) std::fclose(csv);
}

void report::table_header() const {
    std::fprintf(table, "\n%-28s %7s %10s  %-14s %10s %-7s %7s  %s\n", "case", "threads", "dimsum", "baseline",
                 "value", "unit", "ratio", "baseline ran as");
}

std::string report::row_name(const std::string& name) const {
    return opt.load > 0 ? name + "_load=" + std::to_string(opt.load) : name;
}

void report::add(const row& r) const {
    double ratio = r.dimsum / r.baseline;
    const std::string name = row_name(r.name);
    std::fprintf(table, "%-28s %7d %10.2f  %-14s %10.2f %-7s %7.3f  %s\n", name.c_str(), r.threads, r.dimsum,
                 r.baseline_name.c_str(), r.baseline, r.unit, ratio, r.how.c_str());
    if (csv) {
        std::fprintf(csv, "%s,%d,%.6g,%s,%.6g,%.6g,%s,%s\n", name.c_str(), r.threads, r.dimsum,
                     r.baseline_name.c_str(), r.baseline, ratio, r.unit, r.how.c_str());
    }
    std::fflush(table);
}

void report::check(const std::string& what, double error, double tolerance) {
    if (error <= tolerance) return;  // false for NaN too
    std::fprintf(stderr, "dimsum_bench: WRONG RESULT: %s: error %.3g, tolerance %.3g\n", what.c_str(), error,
                 tolerance);
    failed = true;
}

timing case_timing(const options& opt) { return opt.quick ? timing{0.0, 1} : timing{0.2, 5}; }
timing yardstick_timing(const options& opt) { return opt.quick ? timing{0.02, 5} : timing{0.2, 5}; }

int rounds(const options& opt) { return opt.quick ? 1 : opt.rounds; }

std::string thread_list(const options& opt) {
    std::string list;
    for (int t : opt.threads) {  // appended in two steps: g++ 12 warns (-Wrestrict, wrongly) of "," + to_string(t)
        if (!list.empty()) list += ',';
        list += std::to_string(t);
    }
    return list;
}

std::string bf16_path_row(const std::string& base, dimsum::backend::cpu::bf16_path path) {
    return path == dimsum::backend::cpu::bf16_path::widen ? base : base + "_" + std::string(dimsum::backend::cpu::name(path));
}

void read_torch_script(const std::string& script_and_arguments, const std::string& tag, std::string& why,
                       const std::function<void(const char* line)>& each) {
    // DIMSUM_PYTHON: another interpreter, e.g. one whose PyTorch is not Debian's (the GPU
    // machine's, which scripts/gpu_check.sh names)
    const char* chosen = std::getenv("DIMSUM_PYTHON");
    const std::string python = chosen && *chosen ? chosen : "/usr/bin/python3";
    if (access(python.c_str(), X_OK) != 0) {
        why = python + " is missing";
        return;
    }
    const std::string command = python + " " + script_and_arguments;
    std::FILE* child = popen(command.c_str(), "r");
    if (!child) {
        why = "cannot run " + command;
        return;
    }
    const std::string unavailable = tag + "_unavailable,";
    char line[512];
    while (std::fgets(line, sizeof line, child)) {
        const std::string_view text = line;
        if (text.starts_with(unavailable)) why = text.substr(unavailable.size(), text.find('\n') - unavailable.size());
        each(line);
    }
    if (pclose(child) != 0 && why.empty()) why = "the PyTorch script failed: " + command;
}

background_load::background_load(int threads, double limit_seconds) {
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(limit_seconds));
    for (int t = 0; t < threads; ++t) {
        threads_.emplace_back([this, deadline, t] {
            // dependent multiply-adds: a core's worth of work that touches no memory
            volatile double sink = 0;
            double x = 1.0 + 1e-9 * t;
            while (!stop_.load(std::memory_order_relaxed) && clock_type::now() < deadline) {
                for (int i = 0; i < 100000; ++i) x = x * 0.999999999 + 1e-9;
            }
            sink = x;
            (void)sink;
        });
    }
}

background_load::~background_load() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
}

void settle(const options& opt) {
    if (!opt.quick) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

}  // namespace dimsum_bench
