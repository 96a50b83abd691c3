#pragma once
// How many threads the CPU kernels use. By default, what OpenMP would use
// (OMP_NUM_THREADS, else one per core); set_num_threads(n) overrides it for this process,
// set_num_threads(0) returns to the default. A call made from inside the caller's own
// parallel region runs on that one thread, so nesting never oversubscribes the cores.

#include <omp.h>

#include <atomic>
#include <cstddef>
#include <exception>

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

namespace backend::cpu {

// Runs body(member, team) on a team of `threads` OpenMP threads. An exception must not leave
// a parallel region (it would end the program): the first one thrown is rethrown here, on
// the calling thread, once the team is done.
template <class Body>
void run_parallel(int threads, Body&& body) {
    std::exception_ptr failure;
#pragma omp parallel num_threads(threads)
    {
        try {
            body(std::size_t(omp_get_thread_num()), std::size_t(omp_get_num_threads()));
        } catch (...) {
#pragma omp critical(dimsum_parallel_failure)
            if (!failure) failure = std::current_exception();
        }
    }
    if (failure) std::rethrow_exception(failure);
}

}  // namespace backend::cpu

}  // namespace dimsum
