#pragma once
// Owning, zeroed storage from allocate_host (core/host_memory.hpp): 64-byte aligned, and
// on huge pages when large.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "dimsum/core/checked_math.hpp"
#include "dimsum/core/host_memory.hpp"

namespace dimsum::detail {

template <class T>
class aligned_buffer {
public:
    aligned_buffer() = default;
    explicit aligned_buffer(std::size_t count) : size_(count) {
        if (count == 0) return;
        std::size_t bytes = checked_multiply(count, sizeof(T), "allocate");
        // no object may be larger than the largest pointer difference: a size error, not a bad_alloc
        if (bytes > static_cast<std::size_t>(PTRDIFF_MAX)) throw_overflow(count, sizeof(T), "allocate");
        data_ = std::unique_ptr<T, release>(static_cast<T*>(allocate_host(bytes)), release{bytes});
        std::memset(static_cast<void*>(data_.get()), 0, bytes);
    }
    aligned_buffer(const aligned_buffer& other) : aligned_buffer(other.size_) {
        if (size_) std::memcpy(static_cast<void*>(data_.get()), other.data_.get(), size_ * sizeof(T));
    }
    aligned_buffer(aligned_buffer&&) noexcept = default;
    aligned_buffer& operator=(aligned_buffer other) noexcept {
        data_ = std::move(other.data_);
        size_ = other.size_;
        return *this;
    }

    T* data() const { return data_.get(); }
    std::size_t size() const { return size_; }

private:
    struct release {
        std::size_t bytes = 0;
        void operator()(T* p) const { release_host(p, bytes); }
    };
    std::unique_ptr<T, release> data_;
    std::size_t size_ = 0;
};

}  // namespace dimsum::detail
