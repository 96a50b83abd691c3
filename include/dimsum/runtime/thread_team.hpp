#pragma once
// The host threads that run the CPU kernels' parallel loops: workers started once and kept,
// to whom a caller lends a loop cut into chunks. The caller works too, every member claims
// one chunk at a time, and the caller waits only for the chunks already claimed.
//
// Why not an OpenMP team per loop: at the end of a parallel region the caller waits for every
// member to arrive, and on a machine shared with other work a member that the scheduler has
// taken off its core arrives a time slice (milliseconds) late. An evaluation is many loops
// (a decoding step is dozens of small ones), so it paid that many times: beside one busy
// process, 2 threads ran 4 to 28 times slower than 1 (issue 41). Here a member that wakes
// late finds nothing left to claim and costs nothing; a member taken off its core in the
// middle of a chunk holds up only that chunk, and the caller waits for it asleep, leaving
// its core free for that member to be moved to.
//
// One loop runs at a time: a caller that finds the team busy (another thread of the user's
// is evaluating) runs its loop alone, as does a caller inside a loop or inside the user's own
// OpenMP parallel region (threads.hpp), so the cores are never oversubscribed.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dimsum/runtime/member_memory.hpp"
#include "dimsum/runtime/threads.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dimsum::runtime {

// A callable passed down without a copy or an allocation: the caller's lambda outlives the loop.
class function_ref {
public:
    template <class F>
    function_ref(F& f) : object_(&f), call_([](void* o, std::size_t i) { (*static_cast<F*>(o))(i); }) {}
    void operator()(std::size_t i) const { call_(object_, i); }

private:
    void* object_;
    void (*call_)(void*, std::size_t);
};

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

class thread_team {
public:
    // The most workers a team keeps: a loop's chunks are counted in 24 bits and its helpers in
    // 12 (the claim word below); far beyond any machine this runs on.
    static constexpr std::size_t max_workers = 1023;
    static constexpr std::size_t max_chunks = (std::size_t(1) << 24) - 1;

    static thread_team& instance() {
        static thread_team team;
        return team;
    }

    // Runs chunk(c) for every c in [0, chunks), on the caller and on up to `helpers` workers.
    // Before any chunk is handed out, the caller calls prepare() as itself and as each helper
    // (as_member, member_memory.hpp), so that every member's memory is taken: if one prepare
    // throws, nothing has run. An exception from a chunk stops the chunks not yet started and
    // is rethrown here once every started one has ended. Returns false, having run nothing,
    // where the loop must run on the caller alone (the team is busy, the caller is inside a
    // loop, no worker could be started, or the chunks are more than the claim word counts).
    bool run(std::size_t helpers, std::size_t chunks, function_ref prepare, function_ref chunk) {
        if (inside_parallel_loop() || chunks < 2 || chunks > max_chunks || helpers == 0) return false;
        std::unique_lock<std::mutex> owner(owner_, std::try_to_lock);
        if (!owner) return false;
        helpers = std::min({helpers, chunks - 1, start_workers(helpers)});
        if (helpers == 0) return false;
        // may throw: nothing is published yet (no worker touches its memory between loops)
        prepare(0);
        for (std::size_t i = 0; i < helpers; ++i) as_member(*workers_[i].memory, [&] { prepare(i + 1); });

        chunk_ = &chunk;
        loops_run_.fetch_add(1, std::memory_order_relaxed);
        done_.store(0, std::memory_order_relaxed);
        failed_.store(false, std::memory_order_relaxed);
        failure_ = nullptr;
        total_ = std::uint32_t(chunks);
        claims_.store(claim_word(helpers, 0, chunks), std::memory_order_release);
        wake_.fetch_add(1, std::memory_order_release);
        wake_.notify_all();

        inside_parallel_loop() = true;
        for (std::size_t c; claim(claims_, c, std::size_t(-1));) run_chunk(c);
        // wait for the chunks the workers claimed
        const auto waiting_since = clock::now();
        for (std::size_t spins = 0;;) {
            const std::uint32_t done = done_.load(std::memory_order_acquire);
            if (done >= chunks) break;
            wait_for_chunks(done, spins, waiting_since);
        }
        inside_parallel_loop() = false;
        if (failure_) std::rethrow_exception(failure_);
        return true;
    }

    // Runs task() on the calling thread as each worker (as_member), between loops: to free
    // what the workers keep.
    void on_each_worker(void (*task)()) {
        std::lock_guard<std::mutex> owner(owner_);
        for (auto& w : workers_) as_member(*w.memory, task);
    }

    // How many loops the team has run (not those run alone): what the tests watch.
    std::uint64_t loops_run() const { return loops_run_.load(std::memory_order_relaxed); }

    thread_team(const thread_team&) = delete;
    thread_team& operator=(const thread_team&) = delete;

    ~thread_team() {
        stop_.store(true, std::memory_order_release);
        wake_.fetch_add(1, std::memory_order_release);
        wake_.notify_all();
        for (auto& w : workers_) w.thread.join();
    }

private:
    thread_team() = default;

    // The claim word: how many workers may help (12 bits), and the chunks not yet handed out,
    // [first, end) (24 bits each). The caller claims from the front, the workers from the
    // back, so that on an idle machine each side works through a contiguous range, as a
    // static split would (two threads streaming their own halves of K and V, not alternate
    // chunks), while a member held up leaves its side's chunks to the others. One
    // compare-and-swap claims a chunk and proves, by its success, that the loop was still open:
    // a worker reads the loop's callables only then.
    static std::uint64_t claim_word(std::size_t helpers, std::size_t first, std::size_t end) {
        return std::uint64_t(helpers) << 48 | std::uint64_t(first) << 24 | std::uint64_t(end);
    }

    // Claims a chunk of the open loop into `c`, the first left for the caller (index -1), the
    // last for worker `index`; false once none is left (or, for a worker, when the loop wants
    // fewer helpers).
    static bool claim(std::atomic<std::uint64_t>& claims, std::size_t& c, std::size_t index) {
        const bool caller = index == std::size_t(-1);
        std::uint64_t word = claims.load(std::memory_order_acquire);
        for (;;) {
            const std::size_t helpers = word >> 48, first = (word >> 24) & max_chunks, end = word & max_chunks;
            if (first >= end || (!caller && index >= helpers)) return false;
            const std::uint64_t claimed = caller ? word + (std::uint64_t(1) << 24) : word - 1;
            if (claims.compare_exchange_weak(word, claimed, std::memory_order_acq_rel, std::memory_order_acquire)) {
                c = caller ? first : end - 1;
                return true;
            }
        }
    }

    // Runs a claimed chunk, unless a chunk has failed; either way it counts as done.
    void run_chunk(std::size_t c) {
        if (!failed_.load(std::memory_order_relaxed)) {
            try {
                (*chunk_)(c);
            } catch (...) {
                record_failure();
            }
        }
        // The last chunk wakes the caller, should it sleep in wait_for_chunks (a system call
        // only then). total_ is read first: once the count is complete, the next loop may
        // rewrite it.
        const std::uint32_t total = total_;
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == total) done_.notify_all();
    }

    void record_failure() {
        std::lock_guard<std::mutex> lock(failure_lock_);
        if (!failure_) failure_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
    }

    using clock = std::chrono::steady_clock;

    // A spin that offers the core to whoever else waits for it now and then (sched_yield: at
    // once back where no one does), so that spinning takes nothing from another program.
    static void polite_pause(std::size_t spins) {
        if (spins % 64 == 63) std::this_thread::yield();
        else spin_pause();
    }

    // Waits until done_ moves on from `done`: spinning for `caller_spin` (a chunk usually
    // ends sooner, and waking a sleeping thread costs tens of microseconds on a virtual
    // machine), then asleep. Asleep at last, not spinning: the member whose chunk we wait for
    // may have been taken off its core by another program, and a core that goes idle takes a
    // waiting thread from a busy one at once, where a spinning one never does.
    void wait_for_chunks(std::uint32_t done, std::size_t& spins, clock::time_point since) {
        if (++spins % 64 != 0 || clock::now() - since < caller_spin) return polite_pause(spins);
        done_.wait(done, std::memory_order_acquire);
    }

    // Starts workers until there are `wanted` (or max_workers); how many there are.
    std::size_t start_workers(std::size_t wanted) {
        wanted = std::min(wanted, max_workers);
        while (workers_.size() < wanted) {
            try {
                workers_.reserve(wanted);
                auto memory = std::make_unique<member_memory>();
                member_memory* const own = memory.get();
                const std::size_t index = workers_.size();
                workers_.push_back({std::move(memory), std::thread([this, index, own] { work(index, *own); })});
            } catch (...) {  // no thread or no memory for one: the loop runs with those there are
                break;
            }
        }
        return workers_.size();
    }

    void work(std::size_t index, member_memory& memory) {
        inside_parallel_loop() = true;  // a worker's loops are nested loops: they run alone
        detail::current_member() = &memory;
        std::uint32_t seen = 0;
        for (;;) {
            // Wait for a wake-up: spin (politely) for longer than the gaps between a plan's
            // entries and between evaluations in a loop, then sleep, so that an idle team
            // takes no core from anyone for long.
            std::uint32_t now = wake_.load(std::memory_order_acquire);
            const auto idle_since = clock::now();
            for (std::size_t spins = 1; now == seen; ++spins) {
                if (spins % 64 == 0 && clock::now() - idle_since > idle_spin) break;
                polite_pause(spins);
                now = wake_.load(std::memory_order_acquire);
            }
            if (now == seen) {
                wake_.wait(seen, std::memory_order_acquire);
                continue;
            }
            seen = now;
            if (stop_.load(std::memory_order_acquire)) return;
            for (std::size_t c; claim(claims_, c, index);) run_chunk(c);
        }
    }

    // How long an idle worker spins before it sleeps, and a caller before it sleeps waiting
    // for claimed chunks: measured on the decoding rows of dimsum_bench (a step is many short
    // loops), where sleeping sooner cost up to 40% on an idle 2-core virtual machine.
    static constexpr std::chrono::microseconds idle_spin{1000}, caller_spin{200};

    struct worker {
        std::unique_ptr<member_memory> memory;  // its scratch, taken by the caller (run)
        std::thread thread;
    };

    std::mutex owner_;  // held by the caller lending a loop
    std::vector<worker> workers_;

    // The loop's body: written by its caller before the claim word is published (release),
    // read by a worker only after it has claimed a chunk (acquire), so never while rewritten.
    const function_ref* chunk_ = nullptr;
    std::atomic<std::uint64_t> loops_run_{0};
    std::atomic<std::uint64_t> claims_{0};
    std::atomic<std::uint32_t> done_{0};  // chunks done, of total_; what a waiting caller sleeps on
    std::uint32_t total_ = 0;
    std::atomic<bool> failed_{false};
    std::mutex failure_lock_;
    std::exception_ptr failure_;

    std::atomic<std::uint32_t> wake_{0};  // bumped for each loop and for the stop
    std::atomic<bool> stop_{false};
};

}  // namespace dimsum::runtime
