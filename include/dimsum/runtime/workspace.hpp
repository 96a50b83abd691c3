#pragma once
// Host memory that is kept and reused, so that a formula evaluated in a loop allocates
// nothing after its first evaluation. Each thread owns its scratch (the thread team keeps its
// workers alive between loops, so their scratch survives too). Page faults on
// fresh memory are slow on virtual machines; large buffers are on huge pages (allocate_host),
// and are never returned until release_workspace() or the thread's end.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <new>

#include "dimsum/runtime/member_memory.hpp"
#include "dimsum/runtime/thread_team.hpp"
#include "dimsum/runtime/threads.hpp"
#include "dimsum/core/checked_math.hpp"
#include "dimsum/core/host_memory.hpp"

namespace dimsum::runtime {

using dimsum::detail::cache_line;

// One growable block of raw memory; growing discards the old contents.
class scratch_block {
public:
    scratch_block() = default;
    scratch_block(const scratch_block&) = delete;
    scratch_block& operator=(const scratch_block&) = delete;
    ~scratch_block() { release(); }

    void* reserve(std::size_t bytes) {
        if (bytes <= bytes_) return data_;
        release();
        const std::size_t alignment = dimsum::detail::host_alignment(bytes);
        const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        data_ = dimsum::detail::allocate_host(rounded);
        bytes_ = rounded;
        return data_;
    }
    void release() noexcept {
        if (data_) dimsum::detail::release_host(data_, bytes_);
        data_ = nullptr;
        bytes_ = 0;
    }
    void* data() const { return data_; }
    std::size_t size() const { return bytes_; }

private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// What the kernels use scratch for; one block each per thread.
enum class scratch_use : std::size_t {
    packed_a,
    packed_b,
    widened,  // a few rows of a bf16 operand, widened
    rows,
    elementwise,
    attention,
    attention_keys,
    attention_partials,
    attention_gradient,  // a task's tiles and copies (attention_gradient.hpp)
    attention_rows,      // the log-sum-exp and D of every query, the partial dQs (attention_gradient.hpp)
    depth_sums,  // a few rows' products over groups of the depth, summed in order (gemm.hpp)
    product_block,  // a block of a product's sums that only its epilogue reads (bf16_gemm.hpp)
    count
};

// The scratch of the member of a parallel loop this thread now is (member_memory.hpp): its own,
// outside loops.
inline std::array<scratch_block, std::size_t(scratch_use::count)>& thread_scratch() {
    return member_local<std::array<scratch_block, std::size_t(scratch_use::count)>>();
}

// At least `count` elements of T of this thread's scratch for `use`, 64-byte aligned.
template <class T>
T* scratch(scratch_use use, std::size_t count) {
    return static_cast<T*>(thread_scratch()[std::size_t(use)].reserve(count * sizeof(T)));
}

// The intermediate values of one evaluation, allocated in order and all released together at
// its end: finish() after an evaluation that succeeded, abandon() after one that threw. After
// a successful evaluation that needed more than one block, the next starts with a single
// block of the total, so a repeated formula settles on one allocation. A failed evaluation
// leaves the blocks as they were before it: a failure never makes later evaluations hold or
// ask for more.
class temporaries {
public:
    template <class T>
    T* allocate(std::size_t count) {
        const std::size_t bytes = round_to_line(dimsum::detail::checked_multiply(count, sizeof(T), "temporaries"));
        if (blocks_.empty() || used_ + bytes > blocks_.back().size()) add_block(bytes);
        void* at = static_cast<char*>(blocks_.back().data()) + used_;
        used_ += bytes;
        return static_cast<T*>(at);
    }

    // Ends an evaluation that succeeded: everything allocated since is free again.
    void finish() noexcept {
        last_total_ = spilled_ + used_;
        if (blocks_.size() > 1) {
            blocks_.clear();  // first, so that the merged block does not come on top of them
            try {
                blocks_.emplace_back().reserve(last_total_);
            } catch (...) {  // the next evaluation will grow as this one did
                blocks_.clear();
            }
        }
        begin();
    }
    // Ends an evaluation that threw: the blocks it added are freed.
    void abandon() noexcept {
        while (blocks_.size() > blocks_at_start_) blocks_.pop_back();
        begin();
    }
    // Frees every block.
    void release() noexcept {
        blocks_.clear();
        begin();
    }

    // The bytes the last successful evaluation held at once (its values are never freed early).
    std::size_t last_total() const { return last_total_; }

private:
    // Blocks beyond the first are at least the request, and as large as what is held already (up
    // to growth_limit), so that many small values take few blocks.
    static constexpr std::size_t growth_limit = std::size_t(64) << 20;

    static std::size_t round_to_line(std::size_t bytes) {
        if (bytes > SIZE_MAX - cache_line) dimsum::detail::throw_overflow(bytes, 1, "temporaries");
        return std::max(cache_line, (bytes + cache_line - 1) / cache_line * cache_line);
    }
    void add_block(std::size_t bytes) {
        std::size_t held = 0;
        for (const auto& block : blocks_) held += block.size();
        std::size_t want = std::max(bytes, std::min(held, growth_limit));
        blocks_.emplace_back();
        try {
            blocks_.back().reserve(want);
        } catch (...) {
            blocks_.pop_back();
            throw;
        }
        if (blocks_.size() > 1) spilled_ += used_;
        used_ = 0;
    }
    void begin() noexcept {
        used_ = 0;
        spilled_ = 0;
        blocks_at_start_ = blocks_.size();
    }

    std::deque<scratch_block> blocks_;  // a deque: blocks never move
    std::size_t used_ = 0, spilled_ = 0, last_total_ = 0, blocks_at_start_ = 0;
};

// The calling thread's temporaries, shared by the evaluations of every element type (one
// evaluation runs on a thread at a time).
inline temporaries& thread_temporaries() {
    thread_local temporaries memory;
    return memory;
}

// Frees the calling thread's scratch.
inline void release_thread_scratch() noexcept {
    for (auto& block : thread_scratch()) block.release();
}

}  // namespace dimsum::runtime

namespace dimsum {

// Frees the memory dimsum keeps between evaluations: the calling thread's temporaries and
// kernel scratch, and the kernel scratch of the workers of dimsum's thread team (kept from one
// loop to the next, and so their scratch). The next evaluation allocates again.
inline void release_workspace() {
    runtime::thread_temporaries().release();
    runtime::release_thread_scratch();
    runtime::thread_team::instance().on_each_worker(runtime::release_thread_scratch);
}

}  // namespace dimsum
