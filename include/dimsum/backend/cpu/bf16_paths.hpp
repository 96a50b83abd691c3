#pragma once
// Which kernels multiply bf16 operands on this CPU, chosen at run time: the builds run on
// machines whose instruction sets differ (an AMD Zen 5 without AMX, an Intel Xeon with it,
// the same Xeon in a VM that hides it), so nothing is assumed at compile time.
//
//   amx          Intel's tile unit, tdpbf16ps          (bf16_gemm.hpp: pairs of bf16
//   avx512_bf16  vdpbf16ps on 512-bit registers         multiplied, their sums in float)
//                (AMD Zen 4 and 5, Intel since Cooper Lake)
//   widen        the float kernels, which widen bf16 as they load it: C is then the float
//                product of the widened values, bit for bit
//
// The path in use is the best this process may run, unless DIMSUM_BF16_PATH (read at the
// first bf16 product) or set_bf16_path names another. A path this CPU cannot run is an
// error with the reason, never a silent fallback. Tests force each path in turn.

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "dimsum/backend/cpu/kernels.hpp"

namespace dimsum::backend::cpu {

enum class bf16_path { widen, avx512_bf16, amx };
inline constexpr std::array<bf16_path, 3> bf16_paths{bf16_path::widen, bf16_path::avx512_bf16, bf16_path::amx};

constexpr std::string_view name(bf16_path path) {
    switch (path) {
        case bf16_path::widen: return "widen";
        case bf16_path::avx512_bf16: return "avx512_bf16";
        case bf16_path::amx: return "amx";
    }
    return "?";
}

inline std::optional<bf16_path> parse_bf16_path(std::string_view text) {
    for (bf16_path path : bf16_paths) {
        if (text == name(path)) return path;
    }
    return std::nullopt;
}

// Whether this process can run a path, and if not, why not.
struct bf16_path_support {
    bool usable = false;
    std::string reason;  // empty when usable
};

namespace detail {

#if defined(__x86_64__) && defined(__linux__)
// XCR0: the register state the operating system saves and restores (0 without XSAVE).
inline unsigned enabled_state() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return 0;  // OSXSAVE
    unsigned low = 0, high = 0;
    asm volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    return low;
}
#endif

#if defined(__x86_64__) && defined(__linux__)
// Why this process may not run AVX512-BF16's instructions (the CPU's word, CPUID, and the
// operating system's, XCR0 holding the 512-bit registers), or nothing where it may.
inline std::string_view avx512_bf16_refused() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || (a & (1u << 5)) == 0) return "this CPU reports no avx512_bf16 (CPUID leaf 7, subleaf 1)";
    constexpr unsigned vector_state = 0xe6;  // SSE, AVX, opmask and both halves of the 512-bit registers
    if ((enabled_state() & vector_state) != vector_state) return "the operating system has not enabled the AVX-512 state (XCR0)";
    return {};
}
#endif

// AMX needs the CPU's word (CPUID), the operating system's (XCR0 holds the tile state) and,
// on Linux, the kernel's permission for this process (arch_prctl, once: it holds for every
// thread of the process); and AVX512-BF16, whose conversion rounds attention's P for the
// tiles (every CPU with AMX-BF16 so far has it).
inline bf16_path_support probe_amx() {
#if defined(__x86_64__) && defined(__linux__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return {false, "this CPU has no CPUID leaf 7"};
    constexpr unsigned amx_bf16 = 1u << 22, amx_tile = 1u << 24;  // leaf 7, subleaf 0, EDX
    if ((d & amx_bf16) == 0 || (d & amx_tile) == 0) return {false, "this CPU reports no amx_bf16 and amx_tile (CPUID leaf 7)"};
    // The kernels configure palette 1 as eight tiles of 16 rows x 64 bytes and multiply 16
    // pairs deep (bf16_gemm.hpp): what every AMX CPU so far has, read here rather than assumed,
    // since a configuration beyond the CPU's limits faults. Leaf 0x1d: the palettes, subleaf
    // 1: palette 1's bytes per row and tile names (EBX), rows (ECX); leaf 0x1e: the multiply
    // unit's largest K (rows, EBX 7:0) and N (bytes, EBX 23:8).
    if (!__get_cpuid_count(0x1d, 0, &a, &b, &c, &d) || a < 1) return {false, "this CPU reports no tile palette 1 (CPUID leaf 0x1d)"};
    __get_cpuid_count(0x1d, 1, &a, &b, &c, &d);
    const bool palette_fits = (b & 0xffffu) >= 64 && (b >> 16) >= 8 && (c & 0xffffu) >= 16;
    unsigned ka = 0, kb = 0, kc = 0, kd = 0;
    const bool unit_fits = __get_cpuid_count(0x1e, 0, &ka, &kb, &kc, &kd) && (kb & 0xffu) >= 16 && ((kb >> 8) & 0xffffu) >= 64;
    if (!palette_fits || !unit_fits) {
        return {false, "this CPU's tiles are smaller than the kernels' 8 tiles of 16 rows x 64 bytes (CPUID leaves 0x1d, 0x1e)"};
    }
    if (const std::string_view refused = avx512_bf16_refused(); !refused.empty()) {
        return {false, std::string(refused) + ", which the tile path needs beside AMX"};
    }
    constexpr unsigned tile_state = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
    if ((enabled_state() & tile_state) != tile_state) return {false, "the operating system has not enabled the tile state (XCR0 bits 17, 18)"};
    // Granted to the whole process, for good: Linux refuses (ENOSPC) while a thread's
    // alternate signal stack is too small for the tiles' larger signal frame.
    constexpr long request_permission = 0x1023, tile_data = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    if (syscall(SYS_arch_prctl, request_permission, tile_data) != 0) {
        const int error = errno;
        return {false, std::string("Linux refused this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
                           std::strerror(error) + ")"};
    }
    return {true, {}};
#else
    return {false, "AMX is used on x86-64 Linux only"};
#endif
}

// The AVX512-BF16 path needs the CPU's and the operating system's word (avx512_bf16_refused)
// and kernels compiled for AVX-512 (their instruction set, not this header's).
inline bf16_path_support probe_avx512_bf16() {
#if defined(__x86_64__) && defined(__linux__)
    if (!std::string_view(instruction_set()).starts_with("avx512")) {
        return {false, std::string("the kernels were compiled for ") + instruction_set() + ", without AVX-512"};
    }
    if (const std::string_view refused = avx512_bf16_refused(); !refused.empty()) return {false, std::string(refused)};
    return {true, {}};
#else
    return {false, "AVX512-BF16 is used on x86-64 Linux only"};
#endif
}

inline const bf16_path_support& avx512_bf16_support() {
    static const bf16_path_support support = probe_avx512_bf16();
    return support;
}

inline const bf16_path_support& amx_support() {
    static const bf16_path_support support = probe_amx();
    return support;
}

inline constexpr int path_unset = -1;
inline std::atomic<int>& chosen_path() {
    static std::atomic<int> path{path_unset};
    return path;
}

}  // namespace detail

inline bf16_path_support support_of(bf16_path path) {
    switch (path) {
        case bf16_path::widen: return {true, {}};
        case bf16_path::avx512_bf16: return detail::avx512_bf16_support();
        case bf16_path::amx: return detail::amx_support();
    }
    return {false, "unknown path"};
}

// Uses `path` for the bf16 products of this process from now on (every thread), or throws
// std::runtime_error, saying why, if this CPU cannot run it.
inline void set_bf16_path(bf16_path path) {
    const bf16_path_support support = support_of(path);
    if (!support.usable) {
        throw std::runtime_error("dimsum: the bf16 path '" + std::string(name(path)) + "' cannot run here: " + support.reason);
    }
    detail::chosen_path().store(static_cast<int>(path));
}

// The best path this process can run.
inline bf16_path best_bf16_path() {
    for (bf16_path path : {bf16_path::amx, bf16_path::avx512_bf16}) {
        if (support_of(path).usable) return path;
    }
    return bf16_path::widen;
}

// The path in use: set_bf16_path's, else DIMSUM_BF16_PATH's, else the best. A variable that
// names no path, or one this CPU cannot run, is an error (std::invalid_argument,
// std::runtime_error), at every call until it is corrected or set_bf16_path overrides it.
inline bf16_path current_bf16_path() {
    const int chosen = detail::chosen_path().load();
    if (chosen != detail::path_unset) return static_cast<bf16_path>(chosen);
    // the variable first: a process told widen never asks Linux for the tile state (which
    // would grow every thread's minimum signal stack, for good)
    std::optional<bf16_path> path;
    if (const char* variable = std::getenv("DIMSUM_BF16_PATH"); variable && *variable) {
        path = parse_bf16_path(variable);
        if (!path) throw std::invalid_argument(std::string("dimsum: DIMSUM_BF16_PATH=") + variable + ": expected widen, avx512_bf16 or amx");
    }
    if (!path) path = best_bf16_path();
    set_bf16_path(*path);
    return *path;
}

// How many products of two bf16 operands gemm has run on `path` in this process (a product
// of a few rows, which streams B whatever the path, counts as widen), and how many attentions
// of bf16 Q, K and V (one of one or two queries counts as widen): how a test or a user sees
// which kernels ran.
namespace detail {
inline std::atomic<std::size_t>& products_on(bf16_path path) {
    static std::atomic<std::size_t> counts[bf16_paths.size()] = {};
    return counts[static_cast<std::size_t>(path)];
}
inline std::atomic<std::size_t>& attentions_on(bf16_path path) {
    static std::atomic<std::size_t> counts[bf16_paths.size()] = {};
    return counts[static_cast<std::size_t>(path)];
}
}  // namespace detail
inline std::size_t bf16_products(bf16_path path) { return detail::products_on(path).load(); }
inline std::size_t bf16_attentions(bf16_path path) { return detail::attentions_on(path).load(); }

// Forgets set_bf16_path's choice: the next product reads DIMSUM_BF16_PATH again.
inline void reset_bf16_path() { detail::chosen_path().store(detail::path_unset); }

// set_bf16_path(path) for a scope, the previous choice restored at its end.
class scoped_bf16_path {
public:
    explicit scoped_bf16_path(bf16_path path) : previous_(detail::chosen_path().load()) { set_bf16_path(path); }
    ~scoped_bf16_path() { detail::chosen_path().store(previous_); }
    scoped_bf16_path(const scoped_bf16_path&) = delete;
    scoped_bf16_path& operator=(const scoped_bf16_path&) = delete;

private:
    int previous_;
};

}  // namespace dimsum::backend::cpu
