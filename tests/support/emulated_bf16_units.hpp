// Stand-ins for the bf16 dot-product instructions of backend/cpu/bf16_gemm.hpp (amx_tiles,
// avx512_pairs): each instruction computed from its definition in Intel's manual, in plain
// C++, so that the packing, blocking, edges and epilogue of bf16_gemm, and the blocks of
// attention's bf16 path (attention.hpp), are tested on any CPU. The tiles also check how a
// kernel uses them: no tile instruction before configure() or after release(), and every unit
// released. As the real tiles, the configuration belongs to the thread: a unit configured
// while another is on the same thread is an error (the inner release would leave the outer
// unit's instructions on unconfigured tiles, which fault).
#pragma once

#include <catch2/catch.hpp>
#include <dimsum/backend/cpu/bf16_gemm.hpp>
#include <dimsum/backend/cpu/bf16_paths.hpp>
#include <dimsum/runtime/threads.hpp>

#include <atomic>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace test {

// The float sum of an instruction: inputs and results that are denormal read as zero.
// Always inlined, and on the compiler's builtins rather than std::bit_cast and std::fabs: the
// sanitizer build compiles the tests at -O0, where these calls, once per product, were most
// of the bf16 tests' time.
[[gnu::always_inline]] inline float widened(std::uint16_t bits) {
    if ((bits & 0x7f80u) == 0) bits &= 0x8000u;  // denormal (or zero): zero, with its sign
    return __builtin_bit_cast(float, std::uint32_t(bits) << 16);
}
// (x * 0 is a zero of x's sign; NaN fails both comparisons and stays)
[[gnu::always_inline]] inline float flushed(float x) { return x > -FLT_MIN && x < FLT_MIN ? x * 0.0f : x; }

// VCVTNE2PS2BF16, from its definition: 32 floats to bf16, to nearest even; NaN made quiet;
// zero and denormals to zero with their sign. Both stand-ins round P with it, as both units do.
inline void emulated_round_pairs(const float* from, dimsum::bf16* to) {
    for (int n = 0; n < 32; ++n) {
        const std::uint32_t u = std::bit_cast<std::uint32_t>(from[n]);
        std::uint32_t bits = 0;
        if ((u & 0x7f800000u) == 0) bits = (u >> 16) & 0x8000u;
        else if ((u & 0x7fffffffu) > 0x7f800000u) bits = (u >> 16) | 0x40u;
        else bits = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        to[n] = dimsum::bf16::from_bits(static_cast<std::uint16_t>(bits));
    }
}

struct emulated_tiles {
    // units configured and not yet released, over every thread
    static std::atomic<int>& unreleased() {
        static std::atomic<int> count{0};
        return count;
    }
    static std::atomic<long>& dots() {
        static std::atomic<long> count{0};
        return count;
    }

    void configure() {
        if (configured) throw std::logic_error("emulated tiles: configured twice");
        if (configured_on_this_thread()) throw std::logic_error("emulated tiles: configured while another unit is, on one thread");
        configured = true;
        configured_on_this_thread() = true;
        unreleased().fetch_add(1);
    }
    void release() {
        require_configured();
        configured = false;
        configured_on_this_thread() = false;
        unreleased().fetch_sub(1);
    }
    static void round_pairs(const float* from, dimsum::bf16* to) { emulated_round_pairs(from, to); }
    template <int t>
    void zero() {
        require_configured();
        std::memset(tiles[t], 0, sizeof(tiles[t]));
    }
    template <int t>
    void load(const void* base, std::ptrdiff_t stride) {
        require_configured();
        for (int r = 0; r < 16; ++r) std::memcpy(tiles[t][r], static_cast<const unsigned char*>(base) + r * stride, 64);
    }
    template <int t>
    void store(void* base, std::ptrdiff_t stride) {
        require_configured();
        for (int r = 0; r < 16; ++r) std::memcpy(static_cast<unsigned char*>(base) + r * stride, tiles[t][r], 64);
    }
    // TDPBF16PS: for each row m, pair k and column n, in this order,
    //   c[m][n] += a[m][2k] * b[k][2n];  c[m][n] += a[m][2k + 1] * b[k][2n + 1]
    // in float (a product of two bf16 is exact there), denormal inputs read as zero, denormal
    // sums flushed to zero. That is the Intrinsics Guide's order; the SDM's current text sums
    // the even and the odd products apart over k and adds both to c after, so the unit's last
    // bits may differ from these: the tests hold the tile kernel to float's bound for any order
    // (or to exact small integers), never to the stand-in's bits.
    template <int c, int a, int b>
    void dot() {
        static_assert(c != a && c != b && a != b, "tdpbf16ps takes three different tiles");
        require_configured();
        dots().fetch_add(1, std::memory_order_relaxed);
        // the tiles read once: a and b widened, c's sums
        float a_wide[16][32], b_wide[16][32], sums[16][16];
        widen(a, a_wide);
        widen(b, b_wide);
        std::memcpy(sums, tiles[c], sizeof(sums));
        for (int m = 0; m < 16; ++m) {
            for (int k = 0; k < 16; ++k) {
                for (int n = 0; n < 16; ++n) {
                    float sum = sums[m][n];
                    for (int e = 0; e < 2; ++e) sum = flushed(sum + a_wide[m][2 * k + e] * b_wide[k][2 * n + e]);
                    sums[m][n] = sum;
                }
            }
        }
        std::memcpy(tiles[c], sums, sizeof(sums));
    }

private:
    static bool& configured_on_this_thread() {
        thread_local bool configured = false;
        return configured;
    }
    void require_configured() const {
        if (!configured) throw std::logic_error("emulated tiles: a tile instruction outside configure() ... release()");
    }
    // tile t's 16 rows of 32 bf16, widened
    void widen(int t, float (&to)[16][32]) const {
        std::uint16_t bits[16][32];
        std::memcpy(bits, tiles[t], sizeof(bits));
        for (int row = 0; row < 16; ++row) {
            for (int i = 0; i < 32; ++i) to[row][i] = widened(bits[row][i]);
        }
    }

    alignas(64) unsigned char tiles[8][16][64] = {};
    bool configured = false;
};

struct emulated_pairs {
    struct sums {
        float v[16];
    };
    struct pairs {
        std::uint16_t v[32];
    };
    static std::atomic<long>& dots() {
        static std::atomic<long> count{0};
        return count;
    }
    static void round_pairs(const float* from, dimsum::bf16* to) { emulated_round_pairs(from, to); }
    static sums zero() { return {}; }
    static sums load_sums(const float* from) {
        sums s;
        std::memcpy(s.v, from, sizeof(s.v));
        return s;
    }
    static void store_sums(float* to, const sums& s) { std::memcpy(to, s.v, sizeof(s.v)); }
    // VADDPS (denormals kept: it honours MXCSR, which dimsum leaves as it is)
    static sums add(sums s, const sums& t) {
        for (int n = 0; n < 16; ++n) s.v[n] += t.v[n];
        return s;
    }
    static pairs load_pairs(const dimsum::bf16* from) {
        pairs p;
        std::memcpy(p.v, from, sizeof(p.v));
        return p;
    }
    static void store_pairs(dimsum::bf16* to, const pairs& p) { std::memcpy(to, p.v, sizeof(p.v)); }
    // rows 2q and 2q + 1 of a row-major B's 32 columns as a panel's pairs q: columns [0, 16) in
    // left, [16, 32) in right, each column's even depth first (the layout of bf16_gemm.hpp)
    static void pair_rows(const dimsum::bf16* even, const dimsum::bf16* odd, pairs& left, pairs& right) {
        for (int n = 0; n < 16; ++n) {
            left.v[2 * n] = even[n].bits, left.v[2 * n + 1] = odd[n].bits;
            right.v[2 * n] = even[16 + n].bits, right.v[2 * n + 1] = odd[16 + n].bits;
        }
    }
    static pairs broadcast_pair(const dimsum::bf16* from) {
        pairs p;
        for (int n = 0; n < 16; ++n) {
            p.v[2 * n] = from[0].bits;
            p.v[2 * n + 1] = from[1].bits;
        }
        return p;
    }
    // VDPBF16PS: for each lane n, the odd elements first, then the even ones,
    //   s[n] += a[2n + 1] * b[2n + 1];  s[n] += a[2n] * b[2n]
    static sums dot(sums s, const pairs& a, const pairs& b) {
        dots().fetch_add(1, std::memory_order_relaxed);
        for (int n = 0; n < 16; ++n) {
            s.v[n] = flushed(s.v[n] + widened(a.v[2 * n + 1]) * widened(b.v[2 * n + 1]));
            s.v[n] = flushed(s.v[n] + widened(a.v[2 * n]) * widened(b.v[2 * n]));
        }
        return s;
    }
};

// body.template operator()<Kernel>(name) for each kernel under test: both on the stand-ins;
// or, built with DIMSUM_TEST_BF16_HARDWARE, each whose instructions this process may use.
template <class Body>
void for_each_kernel(Body&& body) {
    namespace cpu = dimsum::backend::cpu;
#if defined(DIMSUM_TEST_BF16_HARDWARE)
#if defined(__x86_64__)
    if (cpu::support_of(cpu::bf16_path::amx).usable) body.template operator()<cpu::tile_kernel<cpu::amx_tiles>>("amx");
#endif
#if defined(__AVX512F__)
    if (cpu::support_of(cpu::bf16_path::avx512_bf16).usable) {
        body.template operator()<cpu::pair_kernel<cpu::avx512_pairs>>("avx512_bf16");
    }
#endif
#else
    body.template operator()<cpu::tile_kernel<emulated_tiles>>("amx, emulated");
    body.template operator()<cpu::pair_kernel<emulated_pairs>>("avx512_bf16, emulated");
#endif
}

// body.template operator()<Kernel>() for each kernel under test, on 1 and 2 threads.
template <class Body>
void for_kernels_and_threads(Body&& body) {
    for_each_kernel([&]<class Kernel>(const char* name) {
        for (const int threads : {1, 2}) {
            INFO(name << ", " << threads << " threads");
            dimsum::set_num_threads(threads);
            body.template operator()<Kernel>();
        }
        dimsum::set_num_threads(0);
    });
}

}  // namespace test
