#pragma once
// Device memory for one thread's evaluations: blocks handed out one after the other, 256-byte
// aligned, all free again at begin(). An evaluation that needed more than one block gets one
// block of their total at the next begin(), so that a formula evaluated in a loop settles on
// one block and allocates nothing more. How a block is made and freed is the caller's
// (cudaMalloc in src/cuda/runtime.cu, the heap in the tests' host stand-in); plain C++.

#include <cstddef>
#include <vector>

namespace dimsum::backend::cuda {

class arena {
public:
    // Make(bytes) returns a new block's memory; Free(memory) releases it.
    template <class Make, class Free>
    void begin(Make&& make, Free&& free) {
        if (blocks_.size() > 1) {
            release(free);
            add(used_, make);
        }
        current_ = offset_ = used_ = 0;
    }

    template <class Make>
    void* allocate(std::size_t bytes, Make&& make) {
        bytes = (bytes + alignment - 1) / alignment * alignment;
        while (current_ < blocks_.size() && offset_ + bytes > blocks_[current_].bytes) {
            ++current_;
            offset_ = 0;
        }
        if (current_ == blocks_.size()) add(bytes > smallest_block ? bytes : smallest_block, make);
        void* p = static_cast<char*>(blocks_[current_].memory) + offset_;
        offset_ += bytes;
        used_ += bytes;
        return p;
    }

    template <class Free>
    void release(Free&& free) {
        for (const block& b : blocks_) free(b.memory);
        blocks_.clear();
        current_ = offset_ = 0;
    }

    std::size_t allocations() const { return allocations_; }  // blocks made, ever
    std::size_t bytes() const {
        std::size_t total = 0;
        for (const block& b : blocks_) total += b.bytes;
        return total;
    }

    static constexpr std::size_t alignment = 256;  // cudaMalloc's, and enough for vector loads
    static constexpr std::size_t smallest_block = std::size_t(1) << 24;  // 16 MiB: few blocks for small formulas

private:
    struct block {
        void* memory = nullptr;
        std::size_t bytes = 0;
    };
    template <class Make>
    void add(std::size_t bytes, Make& make) {
        blocks_.push_back({make(bytes), bytes});
        ++allocations_;
    }

    std::vector<block> blocks_;
    std::size_t current_ = 0, offset_ = 0;  // where the next allocation starts
    std::size_t used_ = 0;                  // by this evaluation
    std::size_t allocations_ = 0;
};

}  // namespace dimsum::backend::cuda
