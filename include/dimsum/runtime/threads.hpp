#pragma once
// How many threads dimsum's kernels use. In order, the first that says:
//   1. set_num_threads(n), n > 0 (set_num_threads(0) returns to what follows);
//   2. OMP_NUM_THREADS (its first value), as OpenMP programs expect;
//   3. the CPUs this process may use: those of its affinity mask (taskset, numactl, a
//      launcher's binding), at most its cgroup's CPU quota rounded up (a container's
//      `--cpus`), and, where several MPI ranks of one node share the same CPUs, their share.
// A call made from inside the caller's own OpenMP parallel region, or from inside one of
// dimsum's own parallel loops, runs on that one thread, so nesting never oversubscribes.

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace dimsum {

namespace runtime {

// What the default count is read from, gathered in one value so that tests can fake each.
struct cpu_sources {
    int affinity = 0;  // CPUs in the affinity mask (0: unknown)
    int online = 0;    // CPUs the machine has online (0: unknown)
    // The CPU quotas of this process's cgroup and of its ancestors, each as its file says:
    // cgroup v2's cpu.max ("max 100000", "150000 100000"), or v1's "QUOTA PERIOD" from
    // cpu.cfs_quota_us and cpu.cfs_period_us ("-1 100000" for none).
    std::vector<std::string> quotas;
    std::string omp_num_threads;  // the environment variable, "" when unset
    std::string local_ranks;      // MPI ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS), "" if none
};

namespace detail {

inline std::optional<long> leading_number(std::string_view text) {
    const std::size_t start = text.find_first_not_of(" \t");
    if (start == std::string_view::npos) return std::nullopt;
    long value = 0;
    auto [end, error] = std::from_chars(text.data() + start, text.data() + text.size(), value);
    if (error != std::errc{}) return std::nullopt;
    return value;
}

// CPUs a quota grants, rounded up: "150000 100000" -> 2; nullopt for "max" or a malformed one.
inline std::optional<int> cpus_of_quota(const std::string& quota) {
    std::istringstream in(quota);
    std::string limit, period;
    if (!(in >> limit >> period)) return std::nullopt;
    const auto q = leading_number(limit), p = leading_number(period);
    if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
    return int(std::max<long>(1, (*q + *p - 1) / *p));
}

inline std::string file_text(const std::string& path) {
    std::ifstream in(path);
    std::string text;
    std::getline(in, text);
    return text;
}

}  // namespace detail

// The default number of threads from its sources (see the top of this file).
inline int default_thread_count(const cpu_sources& s) {
    if (const auto omp = detail::leading_number(s.omp_num_threads); omp && *omp > 0) return int(*omp);
    int cpus = s.affinity > 0 ? s.affinity : s.online > 0 ? s.online : 1;
    for (const std::string& quota : s.quotas) {
        if (const auto granted = detail::cpus_of_quota(quota)) cpus = std::min(cpus, *granted);
    }
    // Ranks bound to their own CPUs by the launcher see only those in their mask; ranks that
    // all see the whole machine share it.
    const auto ranks = detail::leading_number(s.local_ranks);
    const bool whole_machine = s.affinity <= 0 || s.online <= 0 || s.affinity >= s.online;
    if (ranks && *ranks > 1 && whole_machine) cpus = std::max(1, cpus / int(*ranks));
    return std::max(1, cpus);
}

// The sources of this process.
inline cpu_sources this_process_cpu_sources() {
    cpu_sources s;
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) s.affinity = CPU_COUNT(&mask);
    s.online = int(std::thread::hardware_concurrency());
    // cgroup v2: "0::/a/b" in /proc/self/cgroup; the quotas of /a/b, /a and the root.
    // cgroup v1: the cpu controller's line, "N:cpu,cpuacct:/a/b", and its two files.
    std::ifstream groups("/proc/self/cgroup");
    for (std::string line; std::getline(groups, line);) {
        const std::size_t first = line.find(':'), second = line.find(':', first + 1);
        if (first == std::string::npos || second == std::string::npos) continue;
        const std::string controllers = line.substr(first + 1, second - first - 1);
        std::string path = line.substr(second + 1);
        const bool v2 = controllers.empty();
        bool v1_cpu = false;
        std::istringstream names(controllers);
        for (std::string name; std::getline(names, name, ',');) v1_cpu = v1_cpu || name == "cpu";
        if (!v2 && !v1_cpu) continue;
        for (;;) {
            if (v2) {
                const std::string max = detail::file_text("/sys/fs/cgroup" + path + "/cpu.max");
                if (!max.empty()) s.quotas.push_back(max);
            } else {
                const std::string dir = "/sys/fs/cgroup/cpu" + path;
                const std::string quota = detail::file_text(dir + "/cpu.cfs_quota_us");
                if (!quota.empty()) s.quotas.push_back(quota + " " + detail::file_text(dir + "/cpu.cfs_period_us"));
            }
            if (path.empty() || path == "/") break;
            path = path.substr(0, path.rfind('/'));
        }
    }
    auto env = [](const char* name) {
        const char* value = std::getenv(name);
        return std::string(value ? value : "");
    };
    s.omp_num_threads = env("OMP_NUM_THREADS");
    s.local_ranks = env("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (s.local_ranks.empty()) s.local_ranks = env("MPI_LOCALNRANKS");
    return s;
}

}  // namespace runtime

namespace detail {
inline std::atomic<int>& requested_threads() {
    static std::atomic<int> count{0};  // 0: the default
    return count;
}
}  // namespace detail

inline void set_num_threads(int count) { detail::requested_threads().store(count < 0 ? 0 : count); }

// The count when set_num_threads has not set one: read once per process.
inline int default_num_threads() {
    static const int count = runtime::default_thread_count(runtime::this_process_cpu_sources());
    return count;
}

namespace runtime {
// Whether the calling thread is inside one of dimsum's parallel loops (thread_team.hpp).
inline bool& inside_parallel_loop() {
    thread_local bool inside = false;
    return inside;
}
}  // namespace runtime

// The number of threads a kernel started here would use.
inline int num_threads() {
    if (runtime::inside_parallel_loop() || omp_in_parallel()) return 1;
    int requested = detail::requested_threads().load();
    return requested > 0 ? requested : default_num_threads();
}

}  // namespace dimsum
