#pragma once
// Products of two bf16 operands on the CPU's bf16 dot-product instructions, which multiply
// pairs of bf16 and add both products to a float sum:
//   tile_kernel   Intel's AMX: tdpbf16ps, C (16 x 16 floats) += A (16 x 32) B (32 x 16)
//   pair_kernel   AVX512-BF16 (AMD Zen 4 and 5, Intel since Cooper Lake): vdpbf16ps,
//                 16 float sums each += one pair of A times one pair of a B column
// gemm (gemm.hpp) comes here when both operands are stored as bf16 and the path in use
// (bf16_paths.hpp) is one of these. The sums are float, in the instructions' order: not the
// widen path's bits, within float's bound of the exact product.
//
// Each kernel takes its instructions as a template parameter: amx_tiles and avx512_pairs
// below issue them; the tests give stand-ins that compute each instruction's definition in
// plain C++, so that the packing, blocking, edges and epilogue here run on every CPU.
//
// Layouts (bf16 elements; dp is a block's depth rounded up to 32, and every row, column and
// depth past the operand's is zero, so that the kernels need no edge cases but C's):
//   A panel  (R rows, dp)               row r at r * dp (R: the kernel's rows)
//   B panel  (2 halves, dp / 2, 16, 2)  half h holds columns [16 h, 16 h + 16) with their
//            depths in pairs: element (pair q, column n, e) = B(2q + e, n). Both kernels read
//            it: an AMX tile is 16 pairs of one half, a vdpbf16ps operand one pair.
//
// Blocking. A B panel of the kernel's kc depths (32 columns: 32 KiB on pairs, 16 KiB on
// tiles) stays in L1 while every A panel of the block passes it; the A block (mc x kc) and C's
// partial sums of mc rows (at most mc x nc floats, 512 KiB) stay in L2 (bf16_task). Each
// micro-tile sends its sums to C and back once per kc depths. On an AMD Zen 5 (48 KiB L1d,
// 1 MiB L2) the pair kernel spends about 95% of a product in its micro-tiles, and mc 192 or
// 384, nc 1024 measured no better (docs/performance.md). Not yet tuned for AMX, which has not
// run.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dimsum/backend/cpu/bf16_paths.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/backend/cpu/workspace.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

struct bf16_blocking {
    static constexpr std::size_t cols = 32;        // of a micro-tile of C, and of a B panel
    static constexpr std::size_t depth_step = 32;  // depths are padded to this (an AMX tile of A)
    static constexpr std::size_t mc = 256;         // rounded down to the kernel's rows
    static constexpr std::size_t nc = 512;
    // Depths whose B a task packs at once (bf16_task), a whole number of every kernel's kc, so
    // that a thread's packing of B stays within nc x 4096 bf16 (4 MiB) however deep the product.
    static constexpr std::size_t k_span = 4096;
};

// ---- the instructions

// The AMX tile unit's configuration (palette 1): eight tiles of 16 rows x 64 bytes.
struct alignas(64) tile_config {
    std::uint8_t palette = 1;
    std::uint8_t start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(tile_config) == 64 && offsetof(tile_config, bytes_per_row) == 16 && offsetof(tile_config, rows) == 48);

#if defined(__x86_64__)
// VCVTNE2PS2BF16 (AVX512-BF16): the 32 floats at `from` rounded to bf16 at `to`, to nearest
// even, NaN made quiet, a denormal (in or out) zero with its sign. Attention rounds its P with
// it on both kernels (round_row), where bf16's own conversion (core/bf16.hpp) takes a dozen
// integer instructions for 16 values: the products that read P take a denormal bf16 as zero
// in any case, so both conversions give them the same sums. On memory and a named register,
// so that it assembles where the compiler was not told of AVX-512 (amx_tiles).
inline void round_pairs_on_instruction(const float* from, bf16* to) {
    asm volatile(
        "vmovups {64(%1), %%zmm0|zmm0, zmmword ptr [%1+64]}\n\t"
        "vcvtne2ps2bf16 {(%1), %%zmm0, %%zmm0|zmm0, zmm0, zmmword ptr [%1]}\n\t"
        "vmovups {%%zmm0, (%0)|zmmword ptr [%0], zmm0}" ::"r"(to),
        "r"(from)
        : "xmm0", "memory");
}

// The AMX instructions, on tiles named at compile time. Written as assembly rather than with
// the compiler's intrinsics, which g++ and clang declare under different target requirements;
// the bytes are the intrinsics' (compared with objdump, g++ 12 and clang 14). Each template
// reads {AT&T|Intel}, so that a user's -masm=intel assembles the same bytes (the test
// bf16.assembly_dialects compares them).
struct amx_tiles {
    void configure() {
        static const tile_config config{};
        asm volatile("ldtilecfg %0" ::"m"(config));
    }
    void release() { asm volatile("tilerelease" ::); }
    template <int t>
    void zero() {
        asm volatile("tilezero {%%tmm%c0|tmm%c0}" ::"i"(t));
    }
    template <int t>
    void load(const void* base, std::ptrdiff_t stride) {
        asm volatile("tileloadd {(%0,%1,1), %%tmm%c2|tmm%c2, [%0+%1*1]}" ::"r"(base), "r"(stride), "i"(t) : "memory");
    }
    template <int t>
    void store(void* base, std::ptrdiff_t stride) {
        asm volatile("tilestored {%%tmm%c2, (%0,%1,1)|[%0+%1*1], tmm%c2}" ::"r"(base), "r"(stride), "i"(t) : "memory");
    }
    // 32 floats rounded to bf16 for the tiles (every CPU with AMX-BF16 so far has AVX512-BF16:
    // the path requires it, bf16_paths.hpp)
    static void round_pairs(const float* from, bf16* to) { round_pairs_on_instruction(from, to); }
    // tile c += tile a (16 rows x 16 pairs) times tile b (16 pairs x 16 columns)
    template <int c, int a, int b>
    void dot() {
        asm volatile("tdpbf16ps {%%tmm%c2, %%tmm%c1, %%tmm%c0|tmm%c0, tmm%c1, tmm%c2}" ::"i"(c), "i"(a), "i"(b));
    }
};
#endif

#if defined(__AVX512F__)
// 16 columns of rows 2q and 2q + 1 of a row-major B as one half's pairs q of a B panel (the
// layout below): each word widened to 32 bits, the odd row's shifted into the upper halves.
inline __m512i pair_half_of_b(const bf16* even, const bf16* odd) {
    const __m512i low = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)));
    const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd)));
    return _mm512_or_si512(low, _mm512_slli_epi32(high, 16));
}

// Rows 2q and 2q + 1 of 32 columns of a row-major B as a B panel's pairs q of its two halves
// (the layout below): columns [0, 16) in `left`, [16, 32) in `right`, each column's two depths
// in one 32-bit lane. With AVX512BW, two word permutes of the two rows' 64 bytes each: a 128 x
// 768 x 768 product, whose packing of B is a tenth of it, took 3 to 4% less time than with
// each half's 16 words widened and one row shifted into the upper halves (Zen 5).
inline void pair_rows_of_b(const bf16* even, const bf16* odd, __m512i& left, __m512i& right) {
#if defined(__AVX512BW__)
    alignas(64) static constexpr std::array<std::int16_t, 64> order = [] {
        std::array<std::int16_t, 64> o{};  // word i of a result: e's word o[i] (o[i] < 32), else o's word o[i] - 32
        for (std::int16_t n = 0; n < 16; ++n) {
            o[2 * n] = n, o[2 * n + 1] = std::int16_t(32 + n);                            // left
            o[32 + 2 * n] = std::int16_t(16 + n), o[33 + 2 * n] = std::int16_t(48 + n);  // right
        }
        return o;
    }();
    const __m512i e = _mm512_loadu_si512(even), o = _mm512_loadu_si512(odd);
    left = _mm512_permutex2var_epi16(e, _mm512_load_si512(order.data()), o);
    right = _mm512_permutex2var_epi16(e, _mm512_load_si512(order.data() + 32), o);
#else
    left = pair_half_of_b(even, odd);
    right = pair_half_of_b(even + 16, odd + 16);
#endif
}

// vdpbf16ps on 512-bit registers (assembly, as amx_tiles: the intrinsic needs a target the
// kernels are not compiled for, and the CPU is asked at run time).
struct avx512_pairs {
    using sums = __m512;    // 16 floats
    using pairs = __m512i;  // 16 pairs of bf16
    static sums zero() { return _mm512_setzero_ps(); }
    static sums load_sums(const float* from) { return _mm512_loadu_ps(from); }
    static void store_sums(float* to, sums s) { _mm512_storeu_ps(to, s); }
    static sums add(sums s, sums t) { return _mm512_add_ps(s, t); }
    static pairs load_pairs(const bf16* from) { return _mm512_loadu_si512(from); }
    static void store_pairs(bf16* to, pairs p) { _mm512_storeu_si512(to, p); }
    static void pair_rows(const bf16* even, const bf16* odd, pairs& left, pairs& right) { pair_rows_of_b(even, odd, left, right); }
    static pairs broadcast_pair(const bf16* from) {
        std::int32_t pair;
        std::memcpy(&pair, from, sizeof(pair));
        return _mm512_set1_epi32(pair);
    }
    static void round_pairs(const float* from, bf16* to) { round_pairs_on_instruction(from, to); }
    // s[n] += a[n].first * b[n].first + a[n].second * b[n].second
    static sums dot(sums s, pairs a, pairs b) {
        asm("vdpbf16ps {%2, %1, %0|%0, %1, %2}" : "+v"(s) : "v"(a), "v"(b));
        return s;
    }
};
#endif

// ---- the kernels: C micro-tile (its live part c, at most rows x 32) = or += A panel x B panel
// over dp depths, the panel's rows `a_stride` elements apart: dp where A was packed, A's own
// row stride where it is read in place (bf16_task). A full micro-tile of a C with unit column
// stride is read and written in place; any other goes through a buffer.

namespace detail {

// The buffer of an edge micro-tile (rows x 32) that adds to C: C's live part, zero elsewhere.
inline void fill_edge(float* buffer, std::size_t rows, const matrix<float>& c) {
    constexpr std::size_t cols = bf16_blocking::cols;
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t n = 0; n < cols; ++n) {
            const bool live = r < c.rows && n < c.cols;
            buffer[r * cols + n] = live ? c.data[c.at(r, n)] : 0.0f;
        }
    }
}
inline void write_edge(const float* buffer, const matrix<float>& c) {
    for (std::size_t r = 0; r < c.rows; ++r) {
        for (std::size_t n = 0; n < c.cols; ++n) {
            c.data[c.at(r, n)] = buffer[r * bf16_blocking::cols + n];
        }
    }
}

// n floats (a multiple of 32) rounded to bf16 by the units' round_pairs: a kernel's round_row.
template <class Units>
void round_row(const float* from, bf16* to, std::size_t n) {
    for (std::size_t j = 0; j < n; j += bf16_blocking::cols) Units::round_pairs(from + j, to + j);
}

}  // namespace detail

// 32 x 32 of C in four accumulator tiles (tmm0-3), fed by two A tiles (tmm4-5) and two B
// tiles (tmm6-7) per 32 depths.
template <class Tiles>
struct tile_kernel {
    static constexpr std::size_t rows = 32;
    // depths per block: B's panel (16 KiB) and A's (32 rows, 16 KiB) within a 48 KiB L1 (Sapphire
    // and Emerald Rapids); not measured, as AMX has not run
    static constexpr std::size_t kc = 256;
    static constexpr bool packs_row_major_b = false;  // B's panels packed before their first block
    Tiles unit;

    void configure() { unit.configure(); }
    void release() { unit.release(); }
    // P for the products, as the CPU with these units rounds it (round_pairs_on_instruction)
    static void round_row(const float* from, bf16* to, std::size_t n) { detail::round_row<Tiles>(from, to, n); }
    // C's micro-tile = or += the A panel times the B panel at b; a micro-tile of at most 16 rows
    // (a short last panel) on the upper tiles only
    void block(const bf16* a, std::ptrdiff_t a_stride, const bf16* b, std::size_t dp, const matrix<float>& c, bool accumulate) {
        constexpr std::size_t half = 16;
        const bool lower_too = c.rows > half;
        alignas(64) float buffer[rows * bf16_blocking::cols];
        const bool in_place = c.rows == (lower_too ? rows : half) && c.cols == bf16_blocking::cols && c.col_stride == 1;
        if (!in_place && accumulate) detail::fill_edge(buffer, rows, c);
        float* out = in_place ? c.data : buffer;
        const std::ptrdiff_t ld = in_place ? c.row_stride : static_cast<std::ptrdiff_t>(bf16_blocking::cols);  // floats
        const std::ptrdiff_t ld_bytes = ld * static_cast<std::ptrdiff_t>(sizeof(float));
        float* const lower = out + static_cast<std::ptrdiff_t>(half) * ld;  // rows [16, 32)
        if (accumulate) {
            unit.template load<0>(out, ld_bytes);
            unit.template load<1>(out + half, ld_bytes);
            if (lower_too) {
                unit.template load<2>(lower, ld_bytes);
                unit.template load<3>(lower + half, ld_bytes);
            }
        } else {
            unit.template zero<0>();
            unit.template zero<1>();
            if (lower_too) {
                unit.template zero<2>();
                unit.template zero<3>();
            }
        }
        const std::ptrdiff_t a_ld_bytes = a_stride * static_cast<std::ptrdiff_t>(sizeof(bf16)), b_ld_bytes = 64;
        const bf16* const b_right = b + dp * half;  // the second half: columns [16, 32)
        for (std::size_t p = 0; p < dp; p += bf16_blocking::depth_step) {
            unit.template load<4>(a + p, a_ld_bytes);
            unit.template load<6>(b + p * half, b_ld_bytes);  // p / 2 pairs of 16 columns in
            unit.template load<7>(b_right + p * half, b_ld_bytes);
            unit.template dot<0, 4, 6>();
            unit.template dot<1, 4, 7>();
            if (lower_too) {
                unit.template load<5>(a + static_cast<std::ptrdiff_t>(half) * a_stride + p, a_ld_bytes);
                unit.template dot<2, 5, 6>();
                unit.template dot<3, 5, 7>();
            }
        }
        unit.template store<0>(out, ld_bytes);
        unit.template store<1>(out + half, ld_bytes);
        if (lower_too) {
            unit.template store<2>(lower, ld_bytes);
            unit.template store<3>(lower + half, ld_bytes);
        }
        if (!in_place) detail::write_edge(buffer, c);
    }
};

// 12 x 32 of C in 24 registers of 16 sums; per pair of depths, two B registers (the panel's
// halves) and one A pair broadcast per row: 27 of the 32 registers. A short last panel takes 8
// or 4 rows' registers and work (with_rows).
template <class Pairs>
struct pair_kernel {
    static constexpr std::size_t rows = 12;
    // depths per block: B's panel (32 KiB) and A's (12 rows, 12 KiB) within a 48 KiB L1. Half as
    // many round trips of C's sums as at 256, whose cost was 3% of a 1024 x 1024 x 1024 product:
    // 1 to 4% faster at 1024 x 768 x 768, 1024 x 1024 x 1024 and 2048 x 1024 x 3072 (Zen 5)
    static constexpr std::size_t kc = 512;
    static constexpr bool packs_row_major_b = true;  // block_packing_b

    void configure() {}
    void release() {}
    static void round_row(const float* from, bf16* to, std::size_t n) { detail::round_row<Pairs>(from, to, n); }
    // C's micro-tile = or += the A panel times the B panel at b. Out of line: inlined into
    // bf16_task, g++ 12 no longer kept the 24 sums and two B pairs in registers across the
    // depth loop (a vmovaps between registers for every few vdpbf16ps).
    [[gnu::noinline]] void block(const bf16* a, std::ptrdiff_t a_stride, const bf16* b, std::size_t dp, const matrix<float>& c,
                                 bool accumulate) {
        const std::ptrdiff_t right_half = static_cast<std::ptrdiff_t>(dp * half);
        with_rows(c.rows, [&]<std::size_t R>() {
            multiply<R>(a, a_stride, dp, c, accumulate, [b, right_half](pairs& left, pairs& right) mutable {
                left = Pairs::load_pairs(b);
                right = Pairs::load_pairs(b + right_half);
                b += cols;
            });
        });
    }
    // The same, with B's 32 columns read where they lie, row-major (dp rows, `b_stride`
    // apart), and the B panel they make written to `panel` as they are read: the first
    // micro-tile of each panel packs it, the loads of B's rows from L3 or memory then waiting
    // behind the products instead of in a pass of their own (that pass was 11% of a 128 x 768 x
    // 768 product, where B serves few rows; Zen 5).
    [[gnu::noinline]] void block_packing_b(const bf16* a, std::ptrdiff_t a_stride, const bf16* b_rows, std::ptrdiff_t b_stride,
                                           bf16* panel, std::size_t dp, const matrix<float>& c, bool accumulate) {
        const std::ptrdiff_t right_half = static_cast<std::ptrdiff_t>(dp * half);
        with_rows(c.rows, [&]<std::size_t R>() {
            multiply<R>(a, a_stride, dp, c, accumulate, [b_rows, b_stride, panel, right_half](pairs& left, pairs& right) mutable {
                Pairs::pair_rows(b_rows, b_rows + b_stride, left, right);
                Pairs::store_pairs(panel, left);
                Pairs::store_pairs(panel + right_half, right);
                b_rows += 2 * b_stride;
                panel += cols;
            });
        });
    }

private:
    static constexpr std::size_t half = 16, cols = bf16_blocking::cols;
    using sums = typename Pairs::sums;
    using pairs = typename Pairs::pairs;

    // body.template operator()<R>() with R the fewest rows of 4, 8 or 12 that hold C's `live`:
    // a last panel of 8 rows (a product of 128) then takes 8 rows' work, not 12
    template <class Body>
    [[gnu::always_inline]] static inline void with_rows(std::size_t live, Body&& body) {
        if (live <= 4) body.template operator()<4>();
        else if (live <= 8) body.template operator()<8>();
        else body.template operator()<rows>();
    }

    // C's R rows (at most) of the micro-tile; pairs_of(left, right): the B panel's next pairs of
    // its halves (columns [0, 16), [16, 32)), depth by depth. (A callable that moves its own
    // pointers: given q, g++ 12 took another register for each and spilled two to the stack.)
    template <std::size_t R, class PairsOf>
    [[gnu::always_inline]] inline void multiply(const bf16* a, std::ptrdiff_t a_stride, std::size_t dp, const matrix<float>& c,
                                                bool accumulate, PairsOf pairs_of) {
        alignas(64) float buffer[R * cols];
        const bool in_place = c.rows == R && c.cols == cols && c.col_stride == 1;
        if (!in_place && accumulate) detail::fill_edge(buffer, R, c);
        float* const out = in_place ? c.data : buffer;
        const std::ptrdiff_t ld = in_place ? c.row_stride : static_cast<std::ptrdiff_t>(cols);
        // C's rows lie far apart, where no hardware prefetcher follows them: asked for now,
        // they arrive while this block's sums are formed from zero, and are added after (as
        // gemm.hpp's micro_kernel does). Loaded first, they stalled the kernel: 13% of its samples
        // outside the depth loop in a causal layer's products (Zen 5).
        sums left[R], right[R];
#pragma GCC unroll 12
        for (std::size_t r = 0; r < R; ++r) {
            const float* row = out + static_cast<std::ptrdiff_t>(r) * ld;
            if (accumulate) {
                __builtin_prefetch(row, 1);
                __builtin_prefetch(row + cols - 1, 1);
            }
            left[r] = right[r] = Pairs::zero();
        }
        for (std::size_t q = 0; q < dp / 2; ++q) {
            pairs b0, b1;
            pairs_of(b0, b1);
#pragma GCC unroll 12
            for (std::size_t r = 0; r < R; ++r) {
                const auto ar = Pairs::broadcast_pair(a + static_cast<std::ptrdiff_t>(r) * a_stride + 2 * q);
                left[r] = Pairs::dot(left[r], ar, b0);
                right[r] = Pairs::dot(right[r], ar, b1);
            }
        }
#pragma GCC unroll 12
        for (std::size_t r = 0; r < R; ++r) {
            float* row = out + static_cast<std::ptrdiff_t>(r) * ld;
            if (accumulate) {
                left[r] = Pairs::add(Pairs::load_sums(row), left[r]);
                right[r] = Pairs::add(Pairs::load_sums(row + half), right[r]);
            }
            Pairs::store_sums(row, left[r]);
            Pairs::store_sums(row + half, right[r]);
        }
        if (!in_place) detail::write_edge(buffer, c);
    }
};

// A kernel configured from construction to destruction (AMX: the calling thread's tiles),
// released however the work in between ends.
template <class Kernel>
struct configured_kernel {
    Kernel kernel;
    configured_kernel() { kernel.configure(); }
    ~configured_kernel() { kernel.release(); }
    configured_kernel(const configured_kernel&) = delete;
    configured_kernel& operator=(const configured_kernel&) = delete;
};

namespace detail {

#if defined(__AVX512F__)
// Rows [0, 16) and depths [0, 32) of a column-major A (each depth's rows side by side,
// depths `col_stride` apart) into rows dp apart from `out`, each row's 32 depths in order:
// each pair of depths widened into one 32-bit word per row (the even depth in its low half,
// as it lies first in memory), then the 16 x 16 words transposed in registers.
inline void pack_column_major_16x32(const bf16* a, std::ptrdiff_t col_stride, bf16* out, std::size_t dp) {
    __m512 words[16];
    for (int j = 0; j < 16; ++j) {
        const bf16* even = a + 2 * j * col_stride;
        const __m512i low = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)));
        const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + col_stride)));
        words[j] = _mm512_castsi512_ps(_mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
    }
    transpose_16x16(words);
    for (std::size_t r = 0; r < 16; ++r) _mm512_storeu_ps(reinterpret_cast<float*>(out + r * dp), words[r]);
}
#endif

// Packs rows [0, rows) and depths [0, depth) of a into panels of R rows, dp depths each.
// A column-major A (the transpose of a row-major matrix: a weight's gradient X^T dY reads its
// activations so) goes a depth block at a time, each depth's rows read where they lie side by
// side: with AVX-512, 16 rows x 32 depths at once, turned in registers; the rest as tiles of
// R rows turned in L1. Row by row, each element would be a row of the stored matrix away from
// the last, a cache line and often a page of its own (3072 x 1024 x 768 on a Zen 5: 1.7 times
// the time of a row-major A; 1.2 to 1.4 times with the tiles alone; about the same time with
// the registers).
template <std::size_t R>
void pack_bf16_a(const matrix<const bf16>& a, std::size_t rows, std::size_t depth, std::size_t dp, bf16* out) {
    if (a.row_stride == 1 && a.col_stride != 1) {
        // tiles of R rows x 32 depths turned in L1 (tile), each row of it written whole: the
        // rows of a panel lie dp apart, so that writing each depth straight to its R rows
        // would send R lines through the same few sets of L1 at once
        constexpr std::size_t step = bf16_blocking::depth_step;
        const std::size_t padded_rows = (rows + R - 1) / R * R;
        bf16 tile[R][step];
        for (std::size_t p0 = 0; p0 < dp; p0 += step) {
            const std::size_t live = p0 < depth ? std::min(step, depth - p0) : 0;
            std::size_t first = 0;  // the rows the registers turned
#if defined(__AVX512F__)
            if (live == step) {
                for (; first + 16 <= rows; first += 16) {
                    pack_column_major_16x32(a.data + static_cast<std::ptrdiff_t>(p0) * a.col_stride + first, a.col_stride,
                                            out + first * dp + p0, dp);
                }
            }
#endif
            for (std::size_t from = first; from < padded_rows; from += R) {
                const std::size_t count = std::min(R, padded_rows - from), live_rows = from < rows ? std::min(count, rows - from) : 0;
                for (std::size_t q = 0; q < live; ++q) {
                    const bf16* const column = a.data + static_cast<std::ptrdiff_t>(p0 + q) * a.col_stride + from;
                    for (std::size_t r = 0; r < live_rows; ++r) tile[r][q] = column[r];
                }
                for (std::size_t r = 0; r < count; ++r) {
                    bf16* const to = out + (from + r) * dp + p0;
                    if (r < live_rows) {
                        std::copy(tile[r], tile[r] + live, to);
                        std::fill(to + live, to + step, bf16{});
                    } else {
                        std::fill(to, to + step, bf16{});
                    }
                }
            }
        }
        return;
    }
    for (std::size_t panel = 0; panel < rows; panel += R) {
        for (std::size_t r = 0; r < R; ++r, out += dp) {
            std::size_t p = 0;
            if (panel + r < rows) {
                const bf16* row = a.data + static_cast<std::ptrdiff_t>(panel + r) * a.row_stride;
                if (a.col_stride == 1) {
                    std::copy(row, row + depth, out);
                    p = depth;
                } else {
                    for (; p < depth; ++p) out[p] = row[static_cast<std::ptrdiff_t>(p) * a.col_stride];
                }
            }
            std::fill(out + p, out + dp, bf16{});
        }
    }
}

// Packs columns [0, cols) and depths [0, depth) of b into panels of 32 columns, the depths
// of each column in pairs (the layout at the top). Two layouts have a faster way for full
// columns and both depths of a pair: a row-major B interleaves two rows (AVX-512: a whole
// panel's 32 columns by pair_rows_of_b, a last panel's whole half of 16 by pair_half_of_b),
// and a column-major B (a weight stored (n, k), as nn.Linear's, read transposed) already holds
// each pair as one 32-bit word.
inline void pack_bf16_b(const matrix<const bf16>& b, std::size_t cols, std::size_t depth, std::size_t dp, bf16* out) {
    constexpr std::size_t half = bf16_blocking::cols / 2;
    for (std::size_t panel = 0; panel < cols; panel += bf16_blocking::cols, out += bf16_blocking::cols * dp) {
        std::size_t q_first = 0;  // the pairs of depths that both halves hold already
#if defined(__AVX512F__)
        if (b.col_stride == 1 && panel + bf16_blocking::cols <= cols) {  // both halves at once, from whole rows
            const bf16* row = b.data + static_cast<std::ptrdiff_t>(panel);
            for (; 2 * q_first + 1 < depth; ++q_first, row += 2 * b.row_stride) {
                __m512i left, right;
                pair_rows_of_b(row, row + b.row_stride, left, right);
                _mm512_storeu_si512(out + q_first * 2 * half, left);
                _mm512_storeu_si512(out + dp * half + q_first * 2 * half, right);
            }
        }
#endif
        for (std::size_t h = 0; h < 2; ++h) {
            const std::size_t first = panel + h * half, live = first < cols ? std::min(half, cols - first) : 0;
            for (std::size_t q = q_first; q < dp / 2; ++q) {
                bf16* const to = out + h * dp * half + q * 2 * half;  // pair q of half h
                const bf16* even = b.data + b.at(2 * q, first);
                const bool whole = live == half && 2 * q + 1 < depth;
#if defined(__AVX512F__)
                if (whole && b.col_stride == 1) {  // a whole half of a last panel short of 32 columns
                    _mm512_storeu_si512(to, pair_half_of_b(even, even + b.row_stride));
                    continue;
                }
#endif
                if (whole && b.row_stride == 1) {
                    for (std::size_t n = 0; n < half; ++n) std::memcpy(to + 2 * n, even + static_cast<std::ptrdiff_t>(n) * b.col_stride, 4);
                    continue;
                }
                for (std::size_t e = 0; e < 2; ++e) {
                    const std::size_t p = 2 * q + e, n_live = p < depth ? live : 0;
                    const bf16* row = b.data + b.at(p, first);
                    for (std::size_t n = 0; n < n_live; ++n) to[2 * n + e] = row[static_cast<std::ptrdiff_t>(n) * b.col_stride];
                    for (std::size_t n = n_live; n < half; ++n) to[2 * n + e] = bf16{};
                }
            }
        }
    }
}

template <class Kernel>
inline constexpr std::size_t bf16_mc = bf16_blocking::mc / Kernel::rows * Kernel::rows;

// Where, in a bf16 matrix's pairs (pack_pairs) of `cols` columns, the depth block starting
// at pc (of dp depths, padded) holds column col: the blocks before it hold the kernel's kc
// depths each, a multiple of 32, across all columns rounded up to 32.
inline std::size_t pair_block_offset(std::size_t cols, std::size_t pc, std::size_t col, std::size_t dp) {
    return pc * round_up(cols, bf16_blocking::cols) + col * dp;
}

// rows x cols of a micro-tile's final sums (row i at sums + i * ld), plus the bias of C's
// columns [col, col + cols) where there is one, rounded into `to` (gemm_rounding): the
// epilogue of most bf16 products, done while the tile is in L1. As the fused pass computes
// it (C + bias in float, then bf16's rounding), so the same bits; but where both are NaN,
// which NaN (the compilers take a float + as commutative, either operand's NaN). Its own
// loops, of a whole tile's 32 columns where it can: a copy plus round_line per row, for any
// count and stride, made the 2048 x 1024 x 3072 product with a bias 1% slower (Zen 5).
inline void round_tile(const float* sums, std::size_t ld, std::size_t rows, std::size_t cols, const gemm_rounding& rounding,
                       std::size_t col, const matrix<bf16>& to) {
    constexpr std::size_t width = bf16_blocking::cols;
    alignas(64) float bias[width] = {};
    const bool has_bias = rounding.bias.data != nullptr;
    if (has_bias) {
        with_storage<float>(rounding.bias.type, [&]<class U>() {
            const U* stored = static_cast<const U*>(rounding.bias.data);
            for (std::size_t j = 0; j < cols; ++j) bias[j] = widened<float>(stored[static_cast<std::ptrdiff_t>(col + j) * rounding.bias_stride]);
        });
    }
    auto round_rows = [&](auto value) {
        for (std::size_t i = 0; i < rows; ++i) {
            const float* row = sums + i * ld;
            bf16* out = to.data + static_cast<std::ptrdiff_t>(i) * to.row_stride;
            if (to.col_stride == 1 && cols == width) {
                for (std::size_t j = 0; j < width; ++j) out[j] = bf16(value(row[j], bias[j]));  // vectorized
            } else {
                for (std::size_t j = 0; j < cols; ++j) out[static_cast<std::ptrdiff_t>(j) * to.col_stride] = bf16(value(row[j], bias[j]));
            }
        }
    };
    if (has_bias) round_rows([](float sum, float b) { return sum + b; });
    else round_rows([](float sum, float) { return sum; });  // (+ 0 would make -0 +0)
}

// One task of bf16_gemm: rows [row_first, row_last) x columns [col_first, col_last) of C,
// every depth. Each block of mc rows takes every depth block of a span of at most k_span
// depths in turn, so that its partial sums in C (mc x the task's columns, at most 256 x 512
// floats: 512 KiB) stay in L2 from one depth block to the next, and the epilogue sees the
// region once its every depth is summed. (Depths outermost instead sent the whole task's C,
// megabytes, through memory once per depth block: 17% of the kernel's time went to loading it
// back, measured on a Zen 5.) The task's columns of B are packed once per span, by its first
// block of rows, panel by panel as it comes to each (or read from B's pairs packed once); a
// kernel that can (packs_row_major_b) packs a row-major panel while it multiplies by it. A is read where it lies when its rows are contiguous and the depth block is a
// whole number of the kernels' 32 depths (every block where K is a multiple of 32, as a
// model's widths are; else all but the last): the kernels read exactly dp depths of a row.
// Else, and for the rows of a last panel short of the kernel's, A is packed, zero past its
// edges.
//
// With `sums` (C unread, and depths of one span), a block of rows sums into that buffer
// instead of C (mc x the task's columns rounded up to whole micro-tiles, so that every
// micro-tile's columns are whole: the kernels write their rows in place), which the epilogue then gets (apply_to_block): C never written, its
// float values never sent to memory only to be rounded to bf16 (a causal layer's products
// wrote 33 MiB of them per call). Where the epilogue is a rounding (`rounded`, this item's
// bf16 result: gemm_rounding), each micro-tile is rounded as soon as its last depth block is
// summed instead, from L1: the fused pass over the whole block, from L2 and beyond, took a
// tenth of a causal layer's products (2048 x 1024 x 3072 with a bias, Zen 5).
template <class Kernel>
void bf16_task(Kernel& kernel, const matrix<const bf16>& a, const matrix<const bf16>& b, const bf16* pairs, const matrix<float>& c,
               std::size_t item, std::size_t row_first, std::size_t row_last, std::size_t col_first, std::size_t col_last,
               const gemm_epilogue& epilogue, bf16* packed_a, bf16* packed_b, float* sums, const matrix<bf16>* rounded) {
    constexpr std::size_t rows_per_tile = Kernel::rows, cols_per_tile = bf16_blocking::cols, mc = bf16_mc<Kernel>;
    const std::size_t k = a.cols, cols = col_last - col_first, sums_ld = round_up(cols, cols_per_tile);
    auto depth_block = [&](std::size_t pc) { return std::min(Kernel::kc, k - pc); };
    if (sums && k > bf16_blocking::k_span) throw std::logic_error("dimsum: bf16_task: a product buffered by blocks has one span of depths");
    for (std::size_t span = 0; span < k; span += bf16_blocking::k_span) {
        const std::size_t span_end = std::min(k, span + bf16_blocking::k_span);
        // where the depth block starting at pc (dp depths) of the task's columns lies: in the
        // task's packing of this span, or in B's pairs packed once (every column of B)
        auto packed_block = [&](std::size_t pc, std::size_t dp) { return packed_b + pair_block_offset(cols, pc - span, 0, dp); };
        auto block_b = [&](std::size_t pc, std::size_t dp) -> const bf16* {
            return pairs ? pairs + pair_block_offset(b.cols, pc, col_first, dp) : packed_block(pc, dp);
        };
        for (std::size_t ic = row_first; ic < row_last; ic += mc) {
            const std::size_t rows = std::min(mc, row_last - ic);
            // the first block of rows packs the task's columns of B, each panel (32 columns of a
            // depth block) where it first multiplies by it; the later blocks read the panels
            const bool packs_b = !pairs && ic == row_first;
            for (std::size_t pc = span; pc < span_end; pc += Kernel::kc) {
                const std::size_t depth = depth_block(pc), dp = round_up(depth, bf16_blocking::depth_step);
                // this block of A, in panels of the kernel's rows: all of them, or only a short
                // last one where A is read in place
                const bool a_in_place = a.col_stride == 1 && depth == dp;
                const std::size_t first_packed = a_in_place ? rows / rows_per_tile * rows_per_tile : 0;
                if (first_packed < rows) {
                    pack_bf16_a<rows_per_tile>(sub(a, ic + first_packed, pc, rows - first_packed, depth), rows - first_packed, depth,
                                               dp, packed_a);
                }
                // micro-tile by micro-tile, each B panel against every A panel
                for (std::size_t jr = 0; jr < cols; jr += cols_per_tile) {
                    const std::size_t panel_cols = std::min(cols_per_tile, cols - jr);
                    const bf16* const b_panel = block_b(pc, dp) + jr * dp;
                    // 32 columns of a row-major B, every depth of the panel its own: the kernel
                    // packs them as its first micro-tile multiplies by them; any other panel is
                    // packed here
                    const bool kernel_packs = packs_b && Kernel::packs_row_major_b && b.col_stride == 1 && depth == dp &&
                                              panel_cols == cols_per_tile;
                    bf16* const panel = packs_b ? packed_block(pc, dp) + jr * dp : nullptr;
                    if (packs_b && !kernel_packs) pack_bf16_b(sub(b, pc, col_first + jr, depth, panel_cols), panel_cols, depth, dp, panel);
                    for (std::size_t ir = 0; ir < rows; ir += rows_per_tile) {
                        const std::size_t live_rows = std::min(rows_per_tile, rows - ir);
                        const matrix<float> tile =
                            sums ? matrix<float>{sums + ir * sums_ld + jr, live_rows, cols_per_tile, static_cast<std::ptrdiff_t>(sums_ld), 1}
                                 : sub(c, ic + ir, col_first + jr, live_rows, panel_cols);
                        const bool in_place = ir < first_packed;
                        const bf16* const a_rows = in_place ? a.data + static_cast<std::ptrdiff_t>(ic + ir) * a.row_stride +
                                                                  static_cast<std::ptrdiff_t>(pc)
                                                            : packed_a + (ir - first_packed) * dp;
                        const std::ptrdiff_t a_stride = in_place ? a.row_stride : static_cast<std::ptrdiff_t>(dp);
                        if constexpr (Kernel::packs_row_major_b) {
                            if (kernel_packs && ir == 0) {
                                const bf16* const b_rows = b.data + static_cast<std::ptrdiff_t>(pc) * b.row_stride +
                                                           static_cast<std::ptrdiff_t>(col_first + jr);
                                kernel.block_packing_b(a_rows, a_stride, b_rows, b.row_stride, panel, dp, tile, pc != 0);
                            } else {
                                kernel.block(a_rows, a_stride, b_panel, dp, tile, pc != 0);
                            }
                        } else {
                            kernel.block(a_rows, a_stride, b_panel, dp, tile, pc != 0);
                        }
                        if (rounded && pc + depth == k) {
                            round_tile(tile.data, sums_ld, live_rows, panel_cols,
                                       epilogue.rounding, col_first + jr, sub(*rounded, ic + ir, col_first + jr));
                        }
                    }
                }
            }
            if (span_end != k || rounded) continue;
            if (sums) epilogue.apply_to_block(epilogue.context, item, ic, col_first, rows, cols, sums, static_cast<std::ptrdiff_t>(sums_ld));
            else epilogue(item, ic, col_first, rows, cols);
        }
    }
}

}  // namespace detail

// (kernels.hpp) The pairs of a bf16 matrix (k x n): each block of kc depths after the other,
// each as pack_bf16_b lays out all n columns (detail::pair_block_offset). Their number does not
// depend on kc, a multiple of 32.
template <class>
std::size_t pair_elements(std::size_t rows, std::size_t cols) {
    return detail::round_up(cols, bf16_blocking::cols) * detail::round_up(rows, bf16_blocking::depth_step);
}
namespace detail {
inline void pack_pairs_in_blocks(const matrix<const bf16>& m, bf16* pairs, std::size_t kc) {
    for (std::size_t pc = 0; pc < m.rows; pc += kc) {
        const std::size_t depth = std::min(kc, m.rows - pc);
        const std::size_t dp = round_up(depth, bf16_blocking::depth_step);
        pack_bf16_b(sub(m, pc, 0, depth, m.cols), m.cols, depth, dp, pairs + pair_block_offset(m.cols, pc, 0, dp));
    }
}
}  // namespace detail

// C = A B (gemm's problem with both operands stored as bf16, at any strides; B's
// pairs read where packed once, its float panels never), then the epilogue on each finished
// region. Each thread takes whole tasks (an item's rows x columns), packs its own operands
// and configures its own kernel (AMX: its own tiles).
template <class Kernel>
void bf16_gemm(const gemm_problem<float>& problem, const gemm_epilogue& epilogue) {
    constexpr std::size_t tile_rows = Kernel::rows, tile_cols = bf16_blocking::cols;
    const std::size_t m = problem.c.rows, n = problem.c.cols, k = problem.a.cols, items = problem.batch.count();
    if (m == 0 || n == 0 || items == 0) return;
    const double flops = 2.0 * double(m) * double(n) * double(k) * double(items);
    constexpr double shared_product_flops = 4e6;  // below this a team costs more than it gives (as gemm)
    const int threads = flops < shared_product_flops ? 1 : num_threads();
    // Columns in blocks of at most nc, of about equal widths, each a whole number of
    // micro-tiles, and as many more blocks as make the items' blocks a multiple of the
    // threads, so that no thread waits for another to finish an extra block (each block
    // packs A again where A is not read in place: a small pass beside the product). Rows in
    // as many groups as the threads still need tasks.
    const std::size_t col_tiles = (n + tile_cols - 1) / tile_cols;
    std::size_t col_blocks = (n + bf16_blocking::nc - 1) / bf16_blocking::nc;
    if (items * col_blocks >= std::size_t(threads)) {
        while ((items * col_blocks) % std::size_t(threads) != 0 && col_blocks < col_tiles) ++col_blocks;
    }
    const std::size_t block_cols = (col_tiles + col_blocks - 1) / col_blocks * tile_cols;
    const std::size_t row_tiles = (m + tile_rows - 1) / tile_rows;
    // Tasks a few per thread, claimed as threads come free (threads.hpp), so that a thread
    // another program delays holds up little: four where B's pairs were packed once (more
    // row groups cost nothing), two where each task packs its span of B.
    const std::size_t wanted_tasks = threads == 1 ? 1 : std::size_t(threads) * (problem.packed_b && problem.packed_b->pairs ? 4 : 2);
    const std::size_t wanted_groups = (wanted_tasks + items * col_blocks - 1) / (items * col_blocks);
    const std::size_t row_groups = std::max<std::size_t>(1, std::min(wanted_groups, row_tiles));
    const std::size_t tasks = items * col_blocks * row_groups;
    const std::size_t dp = std::max<std::size_t>(1, std::min(Kernel::kc, detail::round_up(k, bf16_blocking::depth_step)));
    const std::size_t span_pad = std::max<std::size_t>(1, detail::round_up(std::min(k, bf16_blocking::k_span), bf16_blocking::depth_step));
    // B's pairs packed once are the same for every item (gemm's check_packed) and of B's
    // extents. Pairs packed in another kernel's depth blocks (the path changed since the
    // packing) are left alone: B is then packed at each call, as if never packed.
    const packed_operand<float>* const once = problem.packed_b;
    const bf16* const pairs = once && once->pairs && once->pairs_kc == Kernel::kc ? once->pairs : nullptr;
    if (pairs && (once->rows != k || once->cols != n)) {
        throw std::logic_error("dimsum: gemm: an operand packed once does not fit this product");
    }
    if (!pairs && !problem.b.data && k > 0) {
        throw std::logic_error("dimsum: gemm: B's pairs were packed in depth blocks of " + std::to_string(once ? once->pairs_kc : 0) +
                               ", not this kernel's " + std::to_string(Kernel::kc) + ", and B itself is not given");
    }
    const std::size_t packed_a_size = detail::bf16_mc<Kernel> * dp, packed_b_size = pairs ? 0 : block_cols * span_pad;  // a span of a task's columns
    // C unread: each block of rows sums into this buffer instead (bf16_task), where its depths are one span
    const bool buffered = problem.c_unread && (epilogue.apply_to_block || epilogue.rounding.rounded) && k <= bf16_blocking::k_span;
    const std::size_t sums_size = buffered ? detail::bf16_mc<Kernel> * block_cols : 0;
    auto prepare = [&] {
        scratch<bf16>(scratch_use::packed_a, packed_a_size);
        scratch<bf16>(scratch_use::packed_b, packed_b_size);
        scratch<float>(scratch_use::product_block, sums_size);
        epilogue.prepare();
    };
    split_range(int(std::min<std::size_t>(std::size_t(threads), tasks)), tasks, prepare, [&](std::size_t first, std::size_t last) {
        bf16* const packed_a = scratch<bf16>(scratch_use::packed_a, packed_a_size);  // taken by prepare: no allocation
        bf16* const packed_b = scratch<bf16>(scratch_use::packed_b, packed_b_size);
        float* const sums = buffered ? scratch<float>(scratch_use::product_block, sums_size) : nullptr;
        // configured for this thread's tasks, released however they end (an epilogue is a fused
        // elementwise pass: it never multiplies, so never reconfigures the tiles under us)
        configured_kernel<Kernel> configured;
        Kernel& kernel = configured.kernel;
        for (std::size_t task = first; task < last; ++task) {
            const std::size_t group = task % row_groups, block = task / row_groups % col_blocks;
            const std::size_t item = task / row_groups / col_blocks;
            const auto at = problem.batch.offsets(item);  // a, b, c
            const matrix<const bf16> a = problem.a.stored<bf16>(at[0]);
            const matrix<const bf16> b = problem.b.stored<bf16>(at[1]);
            matrix<float> c = problem.c;
            c.data += at[2];
            const std::size_t row_first = std::min(m, row_tiles * group / row_groups * tile_rows);
            const std::size_t row_last = std::min(m, row_tiles * (group + 1) / row_groups * tile_rows);
            const std::size_t col_first = std::min(n, block * block_cols), col_last = std::min(n, col_first + block_cols);
            if (row_first >= row_last || col_first >= col_last) continue;
            if (k == 0) {  // every element an empty sum
                for (std::size_t i = row_first; i < row_last; ++i) {
                    for (std::size_t j = col_first; j < col_last; ++j) {
                        c.data[c.at(i, j)] = 0.0f;
                    }
                }
                epilogue(item, row_first, col_first, row_last - row_first, col_last - col_first);
                continue;
            }
            // the item's bf16 result, where the epilogue is a rounding that bf16_task does itself
            const bool rounds = sums && epilogue.rounding.rounded;
            const matrix<bf16> rounded{rounds ? epilogue.rounding.rounded.as<bf16>() + at[2] : nullptr, m, n, c.row_stride, c.col_stride};
            detail::bf16_task(kernel, a, b, pairs, c, item, row_first, row_last, col_first, col_last, epilogue, packed_a, packed_b, sums,
                              rounds ? &rounded : nullptr);
        }
    });
}

// run.template operator()<Kernel>() with the kernel of `path` on the instructions: true for
// amx and avx512_bf16; false for widen, which has none (the float kernels). `who` names the
// caller in the error of a path this build cannot issue (bf16_paths.hpp never picks one).
template <class Run>
bool with_bf16_kernel(bf16_path path, const char* who, Run&& run) {
    // A path this process cannot run would fault at its first instruction: an error instead
    // (bf16_paths.hpp's choice is always runnable; this guards a direct call).
    if (const bf16_path_support support = support_of(path); !support.usable) {
        throw std::runtime_error(std::string("dimsum: ") + who + ": the " + std::string(name(path)) + " path cannot run here: " + support.reason);
    }
    switch (path) {
        case bf16_path::amx:
#if defined(__x86_64__)
            run.template operator()<tile_kernel<amx_tiles>>();
            return true;
#else
            throw std::logic_error(std::string("dimsum: ") + who + ": the amx path needs an x86-64 build");
#endif
        case bf16_path::avx512_bf16:
#if defined(__AVX512F__)
            run.template operator()<pair_kernel<avx512_pairs>>();
            return true;
#else
            throw std::logic_error(std::string("dimsum: ") + who + ": the avx512_bf16 path needs kernels compiled for AVX-512");
#endif
        case bf16_path::widen: return false;
    }
    return false;
}

// (kernels.hpp) m's pairs in the depth blocks of the kernel of `path`, whose kc it returns.
template <class>
std::size_t pack_pairs(const matrix<const bf16>& m, bf16* pairs, bf16_path path) {
    std::size_t kc = 0;
    if (!with_bf16_kernel(path, "prepack", [&]<class Kernel>() { kc = Kernel::kc; })) {
        throw std::logic_error("dimsum: prepack: the widen path has no pairs to pack");
    }
    detail::pack_pairs_in_blocks(m, pairs, kc);
    return kc;
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
