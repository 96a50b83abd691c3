#pragma once
// How the CPU kernels run in parallel (runtime/threads.hpp says on how many threads,
// runtime/thread_team.hpp how): a range of work cut into chunks that the threads claim one
// at a time, each thread allocating what it needs before it writes anything.

#include <algorithm>
#include <cstddef>

#include "dimsum/runtime/thread_team.hpp"
#include "dimsum/runtime/threads.hpp"

namespace dimsum::backend::cpu {

// Below this many values a pass over memory runs on one thread: starting a team costs more.
inline constexpr std::size_t parallel_elements = std::size_t(1) << 15;

// Chunks per thread: enough that a thread the scheduler takes away leaves little for the
// others to wait for, few enough that claiming one (an atomic on a shared line) stays cheap.
inline constexpr std::size_t chunks_per_thread = 8;

// Calls body(first, last) on contiguous ranges that cover [0, count) exactly once, on up to
// `threads` threads; a thread may be given several ranges, in any order. Each thread calls
// prepare() once before its first range, to take whatever memory it will need, so that a
// failed allocation on the calling thread throws before anything is written, and one on a
// helper only leaves its ranges to the others (thread_team::run). With one thread (or one
// item), prepare() then body(0, count) on the caller. The first exception a body throws is
// rethrown here, once every range already started has ended.
template <class Prepare, class Body>
void split_range(int threads, std::size_t count, Prepare&& prepare, Body&& body) {
    if (threads > 1 && count > 1) {
        const std::size_t chunks = std::min(count, std::size_t(threads) * chunks_per_thread);
        auto prepare_member = [&](std::size_t) { prepare(); };
        auto chunk = [&](std::size_t c) { body(count * c / chunks, count * (c + 1) / chunks); };
        if (runtime::thread_team::instance().run(std::size_t(threads) - 1, chunks, prepare_member, chunk)) return;
    }
    prepare();
    body(std::size_t(0), count);
}

// As split_range, one item at a time: body(i) for each i in [0, count).
template <class Prepare, class Body>
void for_each_index(int threads, std::size_t count, Prepare&& prepare, Body&& body) {
    split_range(threads, count, prepare, [&](std::size_t first, std::size_t last) {
        for (std::size_t i = first; i < last; ++i) body(i);
    });
}

}  // namespace dimsum::backend::cpu
