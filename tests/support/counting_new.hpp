// The global operator new replaced, for the tests that watch dimsum's allocations: it counts
// them, remembers the largest request, and can make the N-th allocation from now throw
// std::bad_alloc. Include it in exactly one file of a test program. AddressSanitizer's
// allocator does not allow the replacement (it reports the mix as alloc-dealloc mismatches),
// so these tests are built in the main build only.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace counting_new {

inline std::atomic<std::size_t> allocations{0};
inline std::atomic<std::size_t> largest_request{0};  // bytes; reset it to watch a stretch of code
inline std::atomic<long> fail_countdown{0};          // > 0: the allocation that takes it to 0 throws

// The N-th allocation from now (1 is the next) throws std::bad_alloc; 0 disarms.
inline void fail_allocation(long n) { fail_countdown.store(n); }

inline void* allocate(std::size_t bytes, std::size_t alignment) {
    ++allocations;
    std::size_t seen = largest_request.load();
    while (bytes > seen && !largest_request.compare_exchange_weak(seen, bytes)) {
    }
    long left = fail_countdown.load();
    while (left > 0 && !fail_countdown.compare_exchange_weak(left, left - 1)) {
    }
    if (left == 1) throw std::bad_alloc();
    bytes = (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
    if (void* p = std::aligned_alloc(alignment, bytes)) return p;
    throw std::bad_alloc();
}

}  // namespace counting_new

void* operator new(std::size_t bytes) { return counting_new::allocate(bytes, alignof(std::max_align_t)); }
void* operator new[](std::size_t bytes) { return counting_new::allocate(bytes, alignof(std::max_align_t)); }
void* operator new(std::size_t bytes, std::align_val_t a) { return counting_new::allocate(bytes, std::size_t(a)); }
void* operator new[](std::size_t bytes, std::align_val_t a) { return counting_new::allocate(bytes, std::size_t(a)); }
// Memory from this operator new goes back by free(); g++ 12 at -O1, seeing a vector's new and
// delete inlined, takes the pair for a mismatch (-Wmismatched-new-delete): it is not one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
