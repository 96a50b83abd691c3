#pragma once
// How many threads dimsum's kernels use: by default, what OpenMP would use
// (OMP_NUM_THREADS, else one per core); set_num_threads(n) overrides it for this process,
// set_num_threads(0) returns to the default. A call made from inside the caller's own
// parallel region runs on that one thread, so nesting never oversubscribes the cores.

#include <omp.h>

#include <atomic>

namespace dimsum {

namespace detail {
inline std::atomic<int>& requested_threads() {
    static std::atomic<int> count{0};  // 0: follow OpenMP
    return count;
}
}  // namespace detail

inline void set_num_threads(int count) { detail::requested_threads().store(count < 0 ? 0 : count); }

// The number of threads a kernel started here would use.
inline int num_threads() {
    if (omp_in_parallel()) return 1;
    int requested = detail::requested_threads().load();
    return requested > 0 ? requested : omp_get_max_threads();
}

}  // namespace dimsum
