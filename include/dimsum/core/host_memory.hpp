#pragma once
// The one way dimsum allocates host memory, for tensors and for scratch: 64-byte aligned (a
// cache line, the widest SIMD register); a block of 2 MiB or more aligned to 2 MiB and advised
// to use transparent huge pages, where Linux offers them. Page faults on fresh memory are slow
// on virtual machines (one per 2 MiB instead of one per 4 KiB), and a kernel reading rows at
// random places of a large table (gather) misses the TLB far less.

#include <cstddef>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace dimsum::detail {

inline constexpr std::size_t huge_page = std::size_t(2) << 20;
inline constexpr std::size_t cache_line = 64;

// The alignment of a block of `bytes`, which release_host needs again.
constexpr std::size_t host_alignment(std::size_t bytes) { return bytes >= huge_page ? huge_page : cache_line; }

// `bytes` (not 0) of uninitialised memory; std::bad_alloc when there is none.
inline void* allocate_host(std::size_t bytes) {
    const std::size_t alignment = host_alignment(bytes);
    void* data = ::operator new(bytes, std::align_val_t{alignment});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (alignment == huge_page) madvise(data, bytes, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
    return data;
}

// Releases what allocate_host(bytes) returned.
inline void release_host(void* data, std::size_t bytes) noexcept {
    ::operator delete(data, std::align_val_t{host_alignment(bytes)});
}

}  // namespace dimsum::detail
