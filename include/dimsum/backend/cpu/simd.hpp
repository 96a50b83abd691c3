#pragma once
// The SIMD vocabulary of the CPU kernels: xsimd batches of the widest instruction set the
// compiler was told it may use (-march), chosen by xsimd at compile time.

// The intrinsics and xsimd are read under the same silence as the kernels (see
// DIMSUM_SIMD_CODE_BEGIN below): an xsimd function the compiler does not inline, such as exp
// for double, is checked at its own location, inside these headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <xsimd/xsimd.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dimsum/backend/cpu/kernels.hpp"

namespace dimsum::backend::cpu {

// xsimd's default: the widest instruction set enabled, with one exception. xsimd 8.1's
// AVX512BW code does not compile with g++ at -O0 (it casts its batch classes in intrinsics
// that are macros there, e.g. in log); the kernels need nothing of AVX512BW (byte and word
// integers), so they use AVX512DQ, the same 512-bit registers.
#if defined(__AVX512DQ__)
using simd_arch = std::conditional_t<std::is_same_v<xsimd::default_arch, xsimd::avx512bw>, xsimd::avx512dq,
                                     xsimd::default_arch>;
#else
using simd_arch = xsimd::default_arch;
#endif

template <class T>
using simd = xsimd::batch<T, simd_arch>;

template <class>
const char* instruction_set() {
    return simd_arch::name();
}

// simd<T>::size values from `from`, as T: loaded as they are, or widened from bf16 (the upper
// half of a float's bits: widening is a shift, exact).
template <class T, class U>
simd<T> load_widened(const U* from) {
    if constexpr (std::is_same_v<T, U>) {
        return simd<T>::load_unaligned(from);
    } else {
        static_assert(std::is_same_v<U, bf16>, "dimsum: load_widened widens bf16");
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, float> && simd<T>::size == 16) {
            const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
        }
#endif
#if defined(__AVX2__)
        if constexpr (std::is_same_v<T, float> && simd<T>::size == 8) {
            const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
            return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
        }
#endif
        alignas(64) T wide[simd<T>::size];
        for (std::size_t i = 0; i < simd<T>::size; ++i) wide[i] = static_cast<T>(from[i]);
        return simd<T>::load_aligned(wide);
    }
}

// e^x for the softmaxes' exponentials (attention's online softmax, the row-wise softmax). On
// AVX-512, for float, in about two thirds of xsimd::exp's instructions, which weigh in bf16
// attention (its online softmax was a tenth of a causal layer's time): x = k ln 2 + r with k an
// integer and |r| <= ln(2) / 2 (ln 2 in two parts, the first exact in k ln 2), e^r by
// Cephes's degree-7 polynomial for expf, and e^r 2^k by vscalefps, which gives 0 and infinity
// past float's range with no compare. x is first held to [-110, 89], past which e^x is 0 or
// infinite in float anyway, so that k ln 2 stays finite; max and min with x second keep a
// NaN. Within 2 ulp of e^x, denormal results within one of their ulp (test_softmax_reduce).
// (g++ 12 at -O1 reports the undefined pass-through operand inside its own _mm512_max_ps and
// _mm512_min_ps as used uninitialized, a fault of its intrinsics header that g++ 13 fixes.)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
template <class T>
simd<T> exponential(const simd<T>& x) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float> && simd<T>::size == 16) {
        const __m512 held = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(held, _mm512_set1_ps(1.44269504088896341f)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), held);
        r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
        __m512 p = _mm512_set1_ps(1.9875691500e-4f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
        p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));  // 1 + r + r^2 p
        return _mm512_scalef_ps(p, k);
    }
#endif
    return xsimd::exp(x);
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif

// Outputs larger than this go around the caches (non-temporal stores): a normal store first
// reads the line it writes, which costs a third of the bandwidth of a copy, and a result this
// large would not stay in cache anyway.
inline constexpr std::size_t streaming_bytes = std::size_t(8) << 20;

// Stores v at `to`, which is aligned to the batch's size, without reading the line first
// where the instruction set has such a store (xsimd has none); a normal store elsewhere.
template <class T>
void store_streaming(T* to, const simd<T>& v) {
    [[maybe_unused]] constexpr std::size_t bytes = simd<T>::size * sizeof(T);
#if defined(__AVX512F__)
    if constexpr (bytes == 64) {
        if constexpr (sizeof(T) == 4) _mm512_stream_ps(to, v);
        else _mm512_stream_pd(to, v);
        return;
    }
#endif
#if defined(__AVX__)
    if constexpr (bytes == 32) {
        if constexpr (sizeof(T) == 4) _mm256_stream_ps(to, v);
        else _mm256_stream_pd(to, v);
        return;
    }
#endif
    v.store_aligned(to);
}

// Makes the streaming stores of this thread visible before what follows.
inline void streaming_fence() {
#if defined(__SSE__) && (defined(__x86_64__) || defined(__i386__))
    _mm_sfence();
#endif
}

// x[0, n) *= factor, in place.
template <class T>
void scale_line(T* x, std::size_t n, T factor) {
    using batch = simd<T>;
    std::size_t i = 0;
    for (; i + batch::size <= n; i += batch::size) (batch::load_unaligned(x + i) * batch(factor)).store_unaligned(x + i);
    for (; i < n; ++i) x[i] *= factor;
}

// to[0, n) = from[0, n) * scale (or a plain copy without scale), streaming the aligned
// middle part.
template <class T, bool scaled = true>
void scale_streaming(const T* from, T* to, std::size_t n, T scale = T(1)) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    std::size_t i = 0;
    while (i < n && reinterpret_cast<std::uintptr_t>(to + i) % (width * sizeof(T)) != 0) {
        to[i] = scaled ? from[i] * scale : from[i];
        ++i;
    }
    for (; i + width <= n; i += width) {
        batch v = batch::load_unaligned(from + i);
        store_streaming(to + i, scaled ? v * batch(scale) : v);
    }
    for (; i < n; ++i) to[i] = scaled ? from[i] * scale : from[i];
}
template <class T>
void copy_streaming(const T* from, T* to, std::size_t n) {
    scale_streaming<T, false>(from, to, n);
}

// to[0, n) = from[0, n) * scale (or from itself, without scale) rounded to bf16 as round_line
// rounds, 16 values at a time on AVX2; with `stream`, the aligned middle part goes around the
// caches, as copy_streaming writes a large result of T.
template <class T, bool scaled = true>
void scale_rounded(const T* from, bf16* to, std::size_t n, T scale, [[maybe_unused]] bool stream) {
    std::size_t i = 0;
    auto one = [&](std::size_t at) { to[at] = bf16(scaled ? from[at] * scale : from[at]); };
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
        while (stream && i < n && reinterpret_cast<std::uintptr_t>(to + i) % 32 != 0) one(i++);
        const __m256 factor = _mm256_set1_ps(scale);
        // bf16_bits_of on 8 floats: each 32-bit lane holds its bf16's bits
        auto round8 = [&](const float* p) {
            const __m256 v = scaled ? _mm256_mul_ps(_mm256_loadu_ps(p), factor) : _mm256_loadu_ps(p);
            const __m256i u = _mm256_castps_si256(v);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            const __m256i nearest = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
            const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
            return _mm256_blendv_epi8(nearest, quiet, nan);
        };
        for (; i + 16 <= n; i += 16) {  // packus pairs 128-bit halves: the permute puts them in order
            const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(round8(from + i), round8(from + i + 8)), 0xd8);
            auto* at = reinterpret_cast<__m256i*>(to + i);
            if (stream) _mm256_stream_si256(at, packed);
            else _mm256_storeu_si256(at, packed);
        }
    }
#endif
    for (; i < n; ++i) one(i);
}
template <class T>
void round_streaming(const T* from, bf16* to, std::size_t n) {
    scale_rounded<T, false>(from, to, n, T(1), true);
}
// n contiguous values rounded into `to`, `at` elements from its start and `stride` apart;
// with `stream` (and stride 1), around the caches where the stored type has a way to.
template <class T>
void round_values(const T* from, const rounded_memory<T>& to, std::ptrdiff_t at, std::ptrdiff_t stride, std::size_t n, bool stream) {
    if (stream && stride == 1 && to.type == element_type::bf16) return round_streaming(from, to.template as<bf16>() + at, n);
    round_line(from, 1, to, at, stride, n);
}

namespace detail {

#if defined(__AVX512F__)
// Transposes the 16 x 16 floats (or any 32-bit words) held in r[0..15] (r[i] = row i) in 4
// rounds of shuffles: transpose_tile_16 below, and the packing of a bf16 GEMM's column-major
// A, a pair of bf16 per word (bf16_gemm.hpp).
// Always inlined: called, its 16 registers would go through memory both ways.
[[gnu::always_inline]] inline void transpose_16x16(__m512 r[16]) {
    __m512 t[16], u[16], v[16];
    for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // then pairs of pairs
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int h = 0; h < 2; ++h) {  // then 128-bit lanes, twice
        for (int j = 0; j < 4; ++j) {
            v[8 * h + j] = _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0x88);
            v[8 * h + 4 + j] = _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0xDD);
        }
    }
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0xDD);
    }
}

// One tile of a transposition, through registers: to[j * ld_dst + i] = src[i * ld_src + j]
// for i < rows and j < cols (at most 16 each), src of float or bf16 (widened), and 0 for i in
// [rows, out_rows). The packing of a float GEMM's row-major A or transposed B (gemm.hpp) and
// the fused attention backward's transposed copies (attention_gradient.hpp) go through it.
// Always inlined, as transpose_16x16; whole tiles take loops of constant bounds, which keep
// the 16 rows in registers.
template <class U>
[[gnu::always_inline]] inline void transpose_tile_16(const U* src, std::ptrdiff_t ld_src, std::size_t rows, std::size_t cols,
                                                     float* to, std::ptrdiff_t ld_dst, std::size_t out_rows) {
    const auto mask = [](std::size_t n) { return __mmask16(n >= 16 ? 0xFFFFu : (1u << n) - 1); };
    __m512 r[16];
    if (cols == 16) {
        for (std::size_t i = 0; i < 16; ++i) {
            r[i] = i < rows ? __m512(load_widened<float>(src + static_cast<std::ptrdiff_t>(i) * ld_src)) : _mm512_setzero_ps();
        }
    } else {
        for (std::size_t i = 0; i < 16; ++i) {
            const U* row = src + static_cast<std::ptrdiff_t>(i) * ld_src;
            if (i >= rows) {
                r[i] = _mm512_setzero_ps();
            } else if constexpr (std::is_same_v<U, float>) {
                r[i] = _mm512_maskz_loadu_ps(mask(cols), row);
            } else {  // a last, partial tile of bf16
                alignas(64) float wide[16] = {};
                for (std::size_t j = 0; j < cols; ++j) wide[j] = widened<float>(row[j]);
                r[i] = _mm512_load_ps(wide);
            }
        }
    }
    transpose_16x16(r);
    const __mmask16 live = mask(out_rows);
    if (cols == 16) {
        for (std::size_t j = 0; j < 16; ++j) _mm512_mask_storeu_ps(to + static_cast<std::ptrdiff_t>(j) * ld_dst, live, r[j]);
    } else {
        for (std::size_t j = 0; j < cols; ++j) _mm512_mask_storeu_ps(to + static_cast<std::ptrdiff_t>(j) * ld_dst, live, r[j]);
    }
}
#endif

}  // namespace detail

}  // namespace dimsum::backend::cpu

// g++ 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics (they start from a
// deliberately undefined register) wherever xsimd inlines them; code between these two
// markers does not pass those false reports on to the user's build.
#if defined(__GNUC__) && !defined(__clang__)
#define DIMSUM_SIMD_CODE_BEGIN                                       \
    _Pragma("GCC diagnostic push")                                   \
    _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")      \
    _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define DIMSUM_SIMD_CODE_END _Pragma("GCC diagnostic pop")
#else
#define DIMSUM_SIMD_CODE_BEGIN
#define DIMSUM_SIMD_CODE_END
#endif
