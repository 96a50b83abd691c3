#pragma once
// How the CPU kernels run teams of threads (runtime/threads.hpp says how many): two phases,
// so that a team allocates before it writes, and exceptions that never leave a parallel region.

#include <omp.h>

#include <atomic>
#include <cstddef>
#include <exception>

#include "dimsum/runtime/threads.hpp"

namespace dimsum {

namespace backend::cpu {

// Below this many values a pass over memory runs on one thread: starting a team costs more.
inline constexpr std::size_t parallel_elements = std::size_t(1) << 15;

// Runs a team of `threads` OpenMP threads in two phases: each member first calls
// prepare(member, team), which takes whatever memory it will need, and only once every member
// has prepared without failing does each call body(member, team). So a failed allocation
// stops the team before any member has written a result, and no member is ever left waiting
// at a barrier of the body for one that failed. An exception must not leave a parallel region
// (it would end the program): the first one thrown is rethrown here, on the calling thread,
// once the team is done.
template <class Prepare, class Body>
void run_parallel(int threads, Prepare&& prepare, Body&& body) {
    std::exception_ptr failure;
    std::atomic<bool> unprepared{false};  // set in the first phase only: a body's failure stops no other body
#pragma omp parallel num_threads(threads)
    {
        const auto member = std::size_t(omp_get_thread_num()), team = std::size_t(omp_get_num_threads());
        auto attempt = [&](auto& phase) {
            try {
                phase(member, team);
                return true;
            } catch (...) {
#pragma omp critical(dimsum_parallel_failure)
                if (!failure) failure = std::current_exception();
                return false;
            }
        };
        if (!attempt(prepare)) unprepared.store(true);
#pragma omp barrier
        if (!unprepared.load()) attempt(body);
    }
    if (failure) std::rethrow_exception(failure);
}
template <class Body>
void run_parallel(int threads, Body&& body) {
    run_parallel(threads, [](std::size_t, std::size_t) {}, body);
}

// Calls body(first, last) on contiguous ranges that cover [0, count), one per thread of a
// team of `threads`, each after prepare() has run on every member (as run_parallel); with one
// thread (or one item), prepare() then body(0, count) on the caller.
template <class Prepare, class Body>
void split_range(int threads, std::size_t count, Prepare&& prepare, Body&& body) {
    if (threads <= 1 || count <= 1) {
        prepare();
        return body(std::size_t(0), count);
    }
    run_parallel(
        threads, [&](std::size_t, std::size_t) { prepare(); },
        [&](std::size_t member, std::size_t team) { body(count * member / team, count * (member + 1) / team); });
}

}  // namespace backend::cpu

}  // namespace dimsum
