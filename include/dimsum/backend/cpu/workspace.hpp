#pragma once
// Scratch memory that is kept and reused, so that a formula evaluated in a loop allocates
// nothing after its first evaluation. Each thread owns its scratch (OpenMP keeps its worker
// threads alive between parallel regions, so their scratch survives too). Page faults on
// fresh memory are slow on virtual machines; large buffers therefore ask the kernel for huge
// pages, and are never returned until release_workspace() or the thread's end.

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <new>

namespace dimsum::backend::cpu {

inline constexpr std::size_t huge_page = std::size_t(2) << 20;
inline constexpr std::size_t cache_line = 64;

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
        std::size_t alignment = bytes >= huge_page ? huge_page : cache_line;
        std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        data_ = ::operator new(rounded, std::align_val_t{alignment});
        alignment_ = alignment;
        if (alignment == huge_page) madvise(data_, rounded, MADV_HUGEPAGE);  // a hint: failure is harmless
        bytes_ = rounded;
        return data_;
    }
    void release() {
        if (data_) ::operator delete(data_, std::align_val_t{alignment_});
        data_ = nullptr;
        bytes_ = 0;
    }

private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0, alignment_ = cache_line;
};

// What the kernels use scratch for; one block each per thread.
enum class scratch_use : std::size_t { packed_a, packed_b, rows, elementwise, attention, attention_keys, attention_partials, count };

inline std::array<scratch_block, std::size_t(scratch_use::count)>& thread_scratch() {
    thread_local std::array<scratch_block, std::size_t(scratch_use::count)> blocks;
    return blocks;
}

// At least `count` elements of T of this thread's scratch for `use`, 64-byte aligned.
template <class T>
T* scratch(scratch_use use, std::size_t count) {
    return static_cast<T*>(thread_scratch()[std::size_t(use)].reserve(count * sizeof(T)));
}

// The intermediate values of one evaluation, allocated in order and all released together at
// its end. After an evaluation that needed more than one block, the next one starts with a
// single block of the total size, so a repeated formula settles on one allocation.
class temporaries {
public:
    template <class T>
    T* allocate(std::size_t count) {
        std::size_t bytes = std::max(cache_line, (count * sizeof(T) + cache_line - 1) / cache_line * cache_line);
        if (blocks_.empty() || used_ + bytes > capacity_) {
            if (!blocks_.empty()) spilled_ += used_;
            std::size_t want = std::max(bytes, capacity_ * 2);
            blocks_.emplace_back();
            blocks_.back().reserve(want);
            capacity_ = want;
            used_ = 0;
        }
        void* at = static_cast<char*>(blocks_.back().reserve(capacity_)) + used_;
        used_ += bytes;
        return static_cast<T*>(at);
    }

    // Ends an evaluation: everything allocated since the last reset is free again.
    void reset() {
        last_total_ = spilled_ + used_;
        if (blocks_.size() > 1) {
            std::size_t total = spilled_ + used_;
            blocks_.clear();
            blocks_.emplace_back();
            blocks_.back().reserve(total);
            capacity_ = total;
        }
        used_ = 0;
        spilled_ = 0;
    }

    // The bytes the last evaluation held at once (its values are never freed early).
    std::size_t last_total() const { return last_total_; }

private:
    std::deque<scratch_block> blocks_;  // a deque: blocks never move
    std::size_t capacity_ = 0, used_ = 0, spilled_ = 0, last_total_ = 0;
};

}  // namespace dimsum::backend::cpu

namespace dimsum {

// Frees the calling thread's kernel scratch (OpenMP workers keep theirs).
inline void release_workspace() {
    for (auto& block : backend::cpu::thread_scratch()) block.release();
}

}  // namespace dimsum
