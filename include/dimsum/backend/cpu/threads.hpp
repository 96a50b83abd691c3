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

// Below this many values a pass over memory runs on one thread: starting a team costs more.
inline constexpr std::size_t parallel_elements = std::size_t(1) << 15;

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

// Calls body(first, last) on contiguous ranges that cover [0, count), one per thread of a
// team of `threads`; with one thread (or one item), body(0, count) on the caller.
template <class Body>
void split_range(int threads, std::size_t count, Body&& body) {
    if (threads <= 1 || count <= 1) return body(std::size_t(0), count);
    run_parallel(threads, [&](std::size_t member, std::size_t team) {
        body(count * member / team, count * (member + 1) / team);
    });
}

}  // namespace backend::cpu

}  // namespace dimsum
