#pragma once
// Kernels along one axis: softmax, layer_norm and the reductions. Each works on lines (the
// values along the axis, for one index of every other axis), in parallel over lines. A line
// that is not contiguous is gathered into a contiguous buffer first, so the vector code sees
// only contiguous lines.

#include <algorithm>
#include <array>
#include <utility>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/backend/cpu/workspace.hpp"
#include "dimsum/evaluation/strided.hpp"
#include "dimsum/core/functors.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

namespace detail {

// How far ahead of the line being computed its successors are prefetched (at least one
// line): far enough to cover the memory's latency at its bandwidth, near enough to stay in
// L2. Rows of 128 floats: 10 -> 11 GB/s.
inline constexpr std::uintptr_t prefetch_distance = 8192;

// The largest lane of v (no NaN among them). xsimd 8.1 has no such reduction; AVX-512 has a
// short sequence for it, which matters on short rows, where this runs once per 8 vectors.
template <class T>
T lanes_max(const simd<T>& v) {
#if defined(__AVX512F__)
    if constexpr (simd<T>::size * sizeof(T) == 64) {
        if constexpr (sizeof(T) == 4) return _mm512_reduce_max_ps(v);
        else return _mm512_reduce_max_pd(v);
    }
#endif
    alignas(64) T lanes[simd<T>::size];
    v.store_aligned(lanes);
    T result = lanes[0];
    for (std::size_t l = 1; l < simd<T>::size; ++l) result = std::max(result, lanes[l]);
    return result;
}

// A wider type for a line's sums: double for float, long double for double.
template <class T>
using wide_t = std::conditional_t<sizeof(T) == 4, double, long double>;

// Values per block of a blocked sum: a float running sum in a vector lane loses a rounding
// step per addition relative to its own size, so no chain is longer than this / width.
inline constexpr std::size_t sum_block = 256;

// The sums of terms(x[i], more[i]...) over contiguous lines of n values, for each of the Count
// sums terms gives (a std::array of batches for batches, of values for values): summed in
// vector lanes in blocks of sum_block values, the blocks' sums added in the wider type.
// Accurate to a few units of rounding of the sum of magnitudes for any length, where one
// running sum per lane drifts with the length (4099 floats on SSE2: 1e-5 relative).
template <std::size_t Count, class T, class Terms, class... More>
std::array<wide_t<T>, Count> blocked_sums(const T* x, std::size_t n, Terms terms, const More*... more) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    std::array<wide_t<T>, Count> total{};
    std::size_t i = 0;
    while (i + width <= n) {
        std::array<batch, Count> part;
        part.fill(batch(T(0)));
        for (const std::size_t end = std::min(n, i + sum_block); i + width <= end; i += width) {
            const std::array<batch, Count> t = terms(batch::load_unaligned(x + i), batch::load_unaligned(more + i)...);
            for (std::size_t k = 0; k < Count; ++k) part[k] += t[k];
        }
        for (std::size_t k = 0; k < Count; ++k) total[k] += xsimd::hadd(part[k]);
    }
    for (; i < n; ++i) {
        const std::array<T, Count> t = terms(x[i], more[i]...);
        for (std::size_t k = 0; k < Count; ++k) total[k] += t[k];
    }
    return total;
}

// The largest magnitude of a contiguous line (NaN if it holds one), and the sum of x[i] - shift
// summed in the same blocks and order as blocked_sums sums it, so that layer_norm's unscaled
// line gets the bits of its scaled twin. A loop of its own: folding the maximum into
// blocked_sums' terms (a lambda updating captured accumulators) measured 10 to 20% slower.
template <class T>
std::pair<T, wide_t<T>> magnitude_and_sum(const T* x, std::size_t n, T shift) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    const batch shift_v(shift);
    batch top(T(0));
    auto nan = xsimd::isnan(top);
    wide_t<T> total = 0;
    std::size_t i = 0;
    while (i + width <= n) {
        batch part(T(0));
        for (const std::size_t end = std::min(n, i + sum_block); i + width <= end; i += width) {
            const batch v = batch::load_unaligned(x + i);
            nan = nan || xsimd::isnan(v);
            top = xsimd::max(top, xsimd::abs(v));
            part += v - shift_v;
        }
        total += xsimd::hadd(part);
    }
    T largest = lanes_max(top);
    for (; i < n; ++i) {
        largest = fn::maximum{}(largest, std::abs(x[i]));
        total += x[i] - shift;
    }
    return {xsimd::any(nan) ? std::numeric_limits<T>::quiet_NaN() : largest, total};
}

// The sum of a contiguous line.
template <class T>
T line_sum(const T* x, std::size_t n) {
    return static_cast<T>(blocked_sums<1>(x, n, [](auto v) { return std::array{v}; })[0]);
}
// The type a line of In is computed in: float for bf16, else In itself.
template <class In>
using compute_t = std::conditional_t<std::is_same_v<In, bf16>, float, In>;

// The maximum of a contiguous line, widened from bf16 as it is read; NaN if the line holds
// one (as fn::maximum).
template <class In, class T = compute_t<In>>
T line_max(const In* x, std::size_t n) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    batch top(-std::numeric_limits<T>::infinity());
    auto nan = xsimd::isnan(top);  // not `v != v`: an ordered compare on AVX (elementwise.hpp)
    std::size_t i = 0;
    for (; i + width <= n; i += width) {
        batch v = load_widened<T>(x + i);
        nan = nan || xsimd::isnan(v);
        top = xsimd::max(top, v);
    }
    T result = lanes_max(top);
    for (; i < n; ++i) result = fn::maximum{}(result, static_cast<T>(x[i]));
    return xsimd::any(nan) ? std::numeric_limits<T>::quiet_NaN() : result;
}

// Lines of n values: x's along `axis`, and out's (whose stride along axis may be 0, for a
// reduction). Calls kernel(line of x, line of out, n, work, ahead, stream) for every line, in
// parallel when there is enough work: both lines contiguous, `work` n values of scratch,
// `ahead` where x's values will be needed next, to prefetch n of them (else null): a fixed
// distance ahead when the lines follow each other in memory, else the next line; and
// `stream` when the kernel writes a large result in place, which then goes around the
// caches (simd.hpp; a kernel may ignore it). A line that is strided goes through a
// contiguous line buffer of T. A line stored narrower (x's, or the rounded result's) is
// handed to the kernel where it lies if the kernel takes bf16 and the line is contiguous
// (softmax: it widens as it reads and rounds as it writes); else it goes through the buffer
// too, widened into it or rounded out of it.
template <class T, class Kernel>
void for_each_line(const source_array<T>& x, const strided<T>& out, std::size_t axis, const rounded_memory<T>& rounded,
                   Kernel kernel) {
    const std::size_t n = x.where.extents[axis];
    std::size_t lines = 1;
    for (std::size_t i = 0; i < x.where.rank; ++i) lines *= i == axis ? 1 : x.where.extents[i];
    if (lines == 0) return;
    const std::ptrdiff_t x_step = x.where.strides[axis], out_step = out.where.strides[axis];
    const bool out_is_one = out_step == 0;  // a reduction writes one value per line
    constexpr bool takes_bf16 =
        std::is_same_v<T, float> && std::is_invocable_v<Kernel, const bf16*, bf16*, std::size_t, T*, const bf16*, bool>;
    const bool in_place_bf16 = takes_bf16 && x.type == element_type::bf16 && x_step == 1;
    const bool out_place_bf16 = takes_bf16 && rounded && rounded.type == element_type::bf16 && out_step == 1;
    const bool widens = !x.holds_own();

    auto start_of = [&](std::size_t line, std::ptrdiff_t& x_at, std::ptrdiff_t& out_at) {
        x_at = out_at = 0;
        for (std::size_t i = x.where.rank, rest = line; i-- > 0;) {
            if (i == axis) continue;
            auto index = static_cast<std::ptrdiff_t>(rest % x.where.extents[i]);
            rest /= x.where.extents[i];
            x_at += index * x.where.strides[i];
            out_at += index * out.where.strides[i];
        }
    };
    // a large result in contiguous lines is written around the caches (simd.hpp): by the
    // kernel where it writes the lines in place, else by the rounding out of the buffer
    const std::size_t out_bytes = lines * n * (rounded ? evaluation::size_of(rounded.type) : sizeof(T));
    const bool stream = !out_is_one && out_step == 1 && out_bytes >= streaming_bytes;
    const std::size_t buffer_size = 3 * std::max<std::size_t>(n, 1);
    auto prepare = [&] { scratch<T>(scratch_use::rows, buffer_size); };
    auto sweep = [&](std::size_t first, std::size_t last) {
        T* buffer = scratch<T>(scratch_use::rows, buffer_size);  // taken by prepare: no allocation
        T* work = buffer + 2 * std::max<std::size_t>(n, 1);
        std::ptrdiff_t x_at, out_at, next_x_at, next_out_at;
        start_of(first, next_x_at, next_out_at);
        // where a contiguous line of x that starts at `base` + x_at will be read next (see above)
        auto ahead_of = [&](auto* base, std::size_t line) -> decltype(base) {
            if (line + 1 >= last) return nullptr;
            const bool consecutive = next_x_at == x_at + static_cast<std::ptrdiff_t>(n);
            // an address to prefetch, not to read: computed as an integer, it may lie past x's end
            const std::uintptr_t distance = std::max<std::uintptr_t>(prefetch_distance, n * sizeof(*base));
            return consecutive ? reinterpret_cast<decltype(base)>(reinterpret_cast<std::uintptr_t>(base + x_at) + distance)
                               : base + next_x_at;
        };
        // the kernel on this line, read from `in`, written where the line of out lies
        auto run = [&](const auto* in, decltype(in) ahead) {
            if constexpr (takes_bf16) {
                if (out_place_bf16) return kernel(in, rounded.template as<bf16>() + out_at, n, work, ahead, stream);
            }
            if (rounded) {  // the line in the buffer, then rounded: one value for a reduction
                kernel(in, buffer + n, n, work, ahead, false);
                round_values(buffer + n, rounded, out_at, out_step, out_is_one ? 1 : n, stream);
                return;
            }
            T* target = out.data + out_at;
            const bool direct = out_is_one || out_step == 1 || n <= 1;
            if (direct) kernel(in, target, n, work, ahead, stream);
            else kernel(in, buffer + n, n, work, ahead, false);
            if (!direct) {
                for (std::size_t j = 0; j < n; ++j) target[static_cast<std::ptrdiff_t>(j) * out_step] = buffer[n + j];
            }
        };
        for (std::size_t line = first; line < last; ++line) {
            x_at = next_x_at;
            out_at = next_out_at;
            if (line + 1 < last) start_of(line + 1, next_x_at, next_out_at);
            if constexpr (takes_bf16) {
                if (in_place_bf16) {
                    const bf16* stored = static_cast<const bf16*>(x.data);
                    run(stored + x_at, ahead_of(stored, line));
                    continue;
                }
            }
            if (widens) {
                x.visit([&](const auto& stored) { widen_block(stored.data + x_at, x_step, n, buffer); });
                run(static_cast<const T*>(buffer), nullptr);
            } else if (x_step != 1 && n > 1) {
                const T* own = static_cast<const T*>(x.data);
                for (std::size_t j = 0; j < n; ++j) buffer[j] = own[x_at + static_cast<std::ptrdiff_t>(j) * x_step];
                run(static_cast<const T*>(buffer), nullptr);
            } else {
                const T* own = static_cast<const T*>(x.data);
                run(own + x_at, x_step == 1 ? ahead_of(own, line) : nullptr);
            }
        }
        streaming_fence();
    };
    split_range(lines * n >= parallel_elements ? num_threads() : 1, lines, prepare, sweep);
}

// y = exp(x - max) / sum(exp(x - max)) on one contiguous line, x and y of T or of bf16 (each
// value widened as it is read, rounded as it is written: the same sums as on the widened
// line, so the float result rounded, bit for bit). With `stream`, y is written once, around
// the caches, from the exponentials kept in `work` (where a y of bf16 always keeps them);
// what comes `ahead` is fetched while the exponentials are computed, so memory and arithmetic
// overlap.
template <class In, class Out, class T>
void softmax_line(const In* x, Out* y, std::size_t n, T* work, const In* ahead, bool stream) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size, line = 64 / sizeof(In);
    constexpr bool rounds = std::is_same_v<Out, bf16>;
    // pass 1: the maximum, so that exp never overflows
    const T largest = line_max(x, n);
    if (largest == -std::numeric_limits<T>::infinity()) {  // every value masked: no weight anywhere
        std::fill(y, y + n, Out(T(0)));
        return;
    }
    const batch top(largest);
    // pass 2: the exponentials, and their sum
    T* e_out = nullptr;
    if constexpr (rounds) e_out = work;
    else e_out = stream ? work : y;
    batch total(T(0));
    std::size_t i = 0;
    for (; i + width <= n; i += width) {
        if (ahead && i % line == 0) __builtin_prefetch(ahead + i);
        batch e = exponential<T>(load_widened<T>(x + i) - top);
        e.store_unaligned(e_out + i);
        total += e;
    }
    if (i < n) {  // the tail, padded with -infinity, whose exponential adds nothing
        alignas(64) T tail[width];
        std::fill(std::transform(x + i, x + n, tail, [](In v) { return static_cast<T>(v); }), tail + width,
                  -std::numeric_limits<T>::infinity());
        batch e = exponential<T>(batch::load_aligned(tail) - top);
        e.store_aligned(tail);
        std::copy(tail, tail + (n - i), e_out + i);
        total += e;
    }
    // pass 3: normalise
    const T inverse = T(1) / xsimd::hadd(total);
    if constexpr (rounds) return scale_rounded(work, y, n, inverse, stream);
    else if (stream) return scale_streaming(work, y, n, inverse);
    else scale_line(y, n, inverse);
}

// y = (x - mean) / sqrt(variance + epsilon) on one contiguous line (the biased variance, as
// torch.nn.LayerNorm); y may be x. Float's 24 bits and its range fail the textbook two passes
// in three ways, each met here:
// - squares of values past 1.8e19 overflow (and of values below 1e-19 lose bits): a line
//   whose largest magnitude lies beyond 2^+-60 is scaled by a power of two (exact) to bring it
//   into [0.5, 1);
// - a mean rounded to the nearest float leaves a constant line of 12345.678 with deviations of
//   1e-3, i.e. outputs near 1: values are taken about x[0] (shifted), so a constant line's
//   deviations are exactly 0 and a large mean costs no bits of the spread, and the variance
//   subtracts the residual sum of the deviations (the corrected two-pass algorithm);
// - epsilon against a scaled variance: the line's factor is computed in a wider type.
// A line with NaN or an infinity gives NaN everywhere, as (x - mean) does in real arithmetic.
// Returns the factor dy/dx = 1 / sqrt(variance + epsilon) of x (NaN for such a line), which the
// gradient reads (layer_norm_gradient_line).
template <class T>
T layer_norm_line(const T* x, T* y, std::size_t n, T epsilon) {
    using batch = simd<T>;
    using wide = wide_t<T>;
    constexpr std::size_t width = batch::size;
    if (n == 0) return T(0);
    // pass 1: the largest magnitude, which sets the scale, and the unscaled sum about x[0]
    const auto [largest, unscaled_sum] = magnitude_and_sum(x, n, x[0]);
    if (!(largest <= std::numeric_limits<T>::max())) {  // NaN or an infinity in the line
        std::fill(y, y + n, std::numeric_limits<T>::quiet_NaN());
        return std::numeric_limits<T>::quiet_NaN();
    }
    int exponent = 0;
    std::frexp(largest, &exponent);  // largest = f 2^exponent, f in [0.5, 1); 0 for a line of zeros
    // A line within 2^+-60 needs no scaling: its squared deviations stay normal numbers. Since
    // scaling by a power of two changes no rounding, both ways give the same bits, and the
    // unscaled line saves pass 2.
    constexpr int unscaled = 60, normal = std::numeric_limits<T>::max_exponent - 2;  // 2^-e stays normal
    const bool scaled = exponent < -unscaled || exponent > unscaled;
    const T down = scaled ? std::ldexp(T(1), -std::clamp(exponent, -normal, normal)) : T(1);
    // pass 2: the mean of the scaled line, as its first value plus the mean of the rest about it;
    // the two are never added, since rounding their sum loses the spread's low bits
    const T shift = x[0] * down;
    const batch down_v(down), shift_v(shift);
    auto about_shift = [&](auto v) {  // x' - shift, for a value or a batch
        using V = decltype(v);
        if constexpr (std::is_same_v<V, T>) return v * down - shift;
        else return xsimd::fms(v, down_v, shift_v);
    };
    const wide sum = scaled ? blocked_sums<1>(x, n, [&](auto v) { return std::array{about_shift(v)}; })[0] : unscaled_sum;
    const T mean = static_cast<T>(sum / wide(n));  // of x' - shift
    // pass 3: the variance about the mean, less the square of the deviations' residual sum
    auto deviation = [&](auto v) { return about_shift(v) - decltype(v)(mean); };
    const auto [c, q] = blocked_sums<2>(x, n, [&](auto v) {
        const auto d = deviation(v);
        return std::array{d, d * d};
    });
    const wide variance = std::max(wide(0), (q - c * c / wide(n)) / wide(n));  // of the scaled line
    // (x - mean) / sqrt(var + eps) = (x' - mean') / sqrt(var' + eps down^2), x' = x down
    // A finite factor beyond T's range means deviations below the line's resolution, which are
    // exactly 0 here: clamped, it gives them 0 rather than 0 x infinity. (An infinite one, a
    // constant line with epsilon 0, gives 0 / 0 = NaN, as in real arithmetic.)
    const wide exact_factor = wide(1) / std::sqrt(variance + wide(epsilon) * wide(down) * wide(down));
    const T factor = std::isinf(exact_factor) ? std::numeric_limits<T>::infinity()
                                              : static_cast<T>(std::min(exact_factor, wide(std::numeric_limits<T>::max())));
    // pass 4: the output
    std::size_t i = 0;
    for (; i + width <= n; i += width) (deviation(batch::load_unaligned(x + i)) * batch(factor)).store_unaligned(y + i);
    for (; i < n; ++i) y[i] = deviation(x[i]) * factor;
    return static_cast<T>(exact_factor * wide(down));
}

// dx = (g - mean(g) - y mean(g y)) / sqrt(variance + epsilon) on one contiguous line: the
// gradient of y = layer_norm(x) for the cotangent g, y computed again into `y` (n values of
// scratch) as the forward computed it. The two means are blocked_sums, as layer_norm_line's
// sums. NaN or an infinity in x gives NaN everywhere, as in the forward; one in g spreads
// through its means, as in the formula.
template <class T>
void layer_norm_gradient_line(const T* x, const T* g, T* dx, std::size_t n, T epsilon, T* y) {
    using batch = simd<T>;
    using wide = wide_t<T>;
    constexpr std::size_t width = batch::size;
    if (n == 0) return;
    const T inverse_deviation = layer_norm_line(x, y, n, epsilon);
    const auto [sum_g, sum_gy] = blocked_sums<2>(g, n, [](auto gv, auto yv) { return std::array{gv, gv * yv}; }, y);
    const T mean_g = static_cast<T>(sum_g / wide(n)), mean_gy = static_cast<T>(sum_gy / wide(n));
    const batch mean_g_v(mean_g), mean_gy_v(mean_gy), factor_v(inverse_deviation);
    std::size_t i = 0;
    for (; i + width <= n; i += width) {
        const batch inner = xsimd::fnma(batch::load_unaligned(y + i), mean_gy_v, batch::load_unaligned(g + i) - mean_g_v);
        (inner * factor_v).store_unaligned(dx + i);
    }
    for (; i < n; ++i) dx[i] = (g[i] - mean_g - y[i] * mean_gy) * inverse_deviation;
}

}  // namespace detail

// (kernels.hpp)
template <class T>
void softmax(const source_array<T>& x, const strided<T>& out, std::size_t axis, const rounded_memory<T>& rounded) {
    detail::for_each_line<T>(x, out, axis, rounded,
                             [](const auto* in, auto* y, std::size_t n, T* work, decltype(in) ahead, bool stream) {
                                 detail::softmax_line(in, y, n, work, ahead, stream);
                             });
}

// (kernels.hpp)
template <class T>
void layer_norm(const source_array<T>& x, const strided<T>& out, std::size_t axis, T epsilon, const rounded_memory<T>& rounded) {
    detail::for_each_line<T>(x, out, axis, rounded, [epsilon](const T* in, T* y, std::size_t n, T*, const T*, bool) {
        detail::layer_norm_line(in, y, n, epsilon);
    });
}

// (kernels.hpp) Lines of x and g read where they lie when contiguous and of T, else gathered
// (and widened) into a line buffer; dx written in place when contiguous and not rounded, else
// through a buffer.
template <class T>
void layer_norm_gradient(const source_array<T>& x, const source_array<T>& g, const strided<T>& out, std::size_t axis, T epsilon,
                         const rounded_memory<T>& rounded) {
    const std::size_t rank = x.where.rank, n = x.where.extents[axis];
    std::size_t lines = 1;
    for (std::size_t i = 0; i < rank; ++i) lines *= i == axis ? 1 : x.where.extents[i];
    if (lines == 0 || n == 0) return;
    const std::size_t buffer_size = 4 * n;  // x, g, y and dx
    auto prepare = [&] { scratch<T>(scratch_use::rows, buffer_size); };
    auto sweep = [&](std::size_t first, std::size_t last) {
        T* const buffer = scratch<T>(scratch_use::rows, buffer_size);  // taken by prepare: no allocation
        T *const x_line = buffer, *const g_line = buffer + n, *const y = buffer + 2 * n, *const dx_line = buffer + 3 * n;
        // a line of `a` starting at `at`: where it lies, or gathered into `into`
        auto line_of = [&](const source_array<T>& a, std::ptrdiff_t at, T* into) -> const T* {
            const std::ptrdiff_t step = a.where.strides[axis];
            if (a.holds_own() && (step == 1 || n == 1)) return static_cast<const T*>(a.data) + at;
            a.visit([&](const auto& stored) { widen_block(stored.data + at, step, n, into); });
            return into;
        };
        for (std::size_t line = first; line < last; ++line) {
            std::ptrdiff_t x_at = 0, g_at = 0, out_at = 0;
            for (std::size_t i = rank, rest = line; i-- > 0;) {
                if (i == axis) continue;
                const auto index = static_cast<std::ptrdiff_t>(rest % x.where.extents[i]);
                rest /= x.where.extents[i];
                x_at += index * x.where.strides[i];
                g_at += index * g.where.strides[i];
                out_at += index * out.where.strides[i];
            }
            const std::ptrdiff_t out_step = out.where.strides[axis];
            const bool in_place = !rounded && (out_step == 1 || n == 1);
            T* const target = in_place ? out.data + out_at : dx_line;
            detail::layer_norm_gradient_line(line_of(x, x_at, x_line), line_of(g, g_at, g_line), target, n, epsilon, y);
            if (rounded) {
                round_values(dx_line, rounded, out_at, out_step, n, false);
            } else if (!in_place) {
                for (std::size_t j = 0; j < n; ++j) out.data[out_at + static_cast<std::ptrdiff_t>(j) * out_step] = dx_line[j];
            }
        }
    };
    split_range(lines * n >= parallel_elements ? num_threads() : 1, lines, prepare, sweep);
}

namespace detail {

// The columns a task of reduce_columns sums: four vectors, four independent sums.
template <class T>
inline constexpr std::size_t column_chunk = 4 * simd<T>::size;

// The rows sum_columns adds in T before adding their sum in the wider type: as short a chain
// as blocked_sums gives each lane of a line (256 values over 8 or 16 lanes).
inline constexpr std::size_t column_block = 32;

// out[j] := the sum of x[i * step + j] over i in [0, n), for j in [0, count), count at most
// column_chunk: rows of a vector of columns added as they are read, in blocks of column_block
// rows whose sums are added in the wider type.
template <class T>
void sum_columns(const T* x, std::ptrdiff_t step, std::size_t n, std::size_t count, T* out) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size, vectors = column_chunk<T> / width;
    std::array<wide_t<T>, column_chunk<T>> total{};
    alignas(64) std::array<T, column_chunk<T>> block;
    for (std::size_t begin = 0; begin < n; begin += column_block) {
        const std::size_t end = std::min(n, begin + column_block);
        std::size_t j = 0;
        if (count == column_chunk<T>) {
            std::array<batch, vectors> part;
            part.fill(batch(T(0)));
            for (std::size_t i = begin; i < end; ++i) {
                const T* row = x + static_cast<std::ptrdiff_t>(i) * step;
                for (std::size_t v = 0; v < vectors; ++v) part[v] += batch::load_unaligned(row + v * width);
            }
            for (std::size_t v = 0; v < vectors; ++v) part[v].store_aligned(block.data() + v * width);
            j = column_chunk<T>;
        }
        for (; j + width <= count; j += width) {
            batch part(T(0));
            for (std::size_t i = begin; i < end; ++i) part += batch::load_unaligned(x + static_cast<std::ptrdiff_t>(i) * step + j);
            part.store_aligned(block.data() + j);
        }
        for (; j < count; ++j) {
            T part = 0;
            for (std::size_t i = begin; i < end; ++i) part += x[static_cast<std::ptrdiff_t>(i) * step + j];
            block[j] = part;
        }
        for (j = 0; j < count; ++j) total[j] += block[j];
    }
    for (std::size_t j = 0; j < count; ++j) out[j] = static_cast<T>(total[j]);
}

// A sum or mean along an axis that is not x's last, where x's last axis is contiguous in x
// and in out (`lines`, out at x's rank): the sum over the rows of a bias's gradient, (rows,
// columns) -> (columns). Each task adds whole rows of a few columns (sum_columns), rather than
// gathering each strided column into a line first. False, with nothing done, where it does
// not apply (a maximum, a result rounded, a bf16 x, nothing to sum).
template <class Reduction, class T>
bool reduce_columns(const source_array<T>& x, const strided<T>& lines, std::size_t axis, const rounded_memory<T>& rounded) {
    const std::size_t rank = x.where.rank, last = rank - 1;
    if (std::is_same_v<Reduction, fn::max> || rank < 2 || axis == last || !x.holds_own() || rounded ||
        x.where.strides[last] != 1 || lines.where.strides[last] != 1) {
        return false;
    }
    const std::size_t n = x.where.extents[axis], columns = x.where.extents[last];
    std::size_t outer = 1;  // the lines of columns: every index but axis's and the last's
    for (std::size_t i = 0; i < last; ++i) outer *= i == axis ? 1 : x.where.extents[i];
    if (n == 0 || columns == 0 || outer == 0) return false;
    const std::size_t chunks = (columns + column_chunk<T> - 1) / column_chunk<T>;
    const T* data = static_cast<const T*>(x.data);
    auto sweep = [&](std::size_t first, std::size_t end) {
        for (std::size_t item = first; item < end; ++item) {
            std::ptrdiff_t x_at = 0, out_at = 0;
            for (std::size_t i = last, rest = item / chunks; i-- > 0;) {
                if (i == axis) continue;
                const auto index = static_cast<std::ptrdiff_t>(rest % x.where.extents[i]);
                rest /= x.where.extents[i];
                x_at += index * x.where.strides[i];
                out_at += index * lines.where.strides[i];
            }
            const std::size_t j = item % chunks * column_chunk<T>;
            const std::size_t count = std::min(column_chunk<T>, columns - j);
            T* y = lines.data + out_at + static_cast<std::ptrdiff_t>(j);
            sum_columns(data + x_at + static_cast<std::ptrdiff_t>(j), x.where.strides[axis], n, count, y);
            if constexpr (std::is_same_v<Reduction, fn::mean>) {
                for (std::size_t k = 0; k < count; ++k) y[k] /= static_cast<T>(n);
            }
        }
    };
    split_range(outer * n * columns >= parallel_elements ? num_threads() : 1, outer * chunks, [] {}, sweep);
    return true;
}

}  // namespace detail

// (kernels.hpp)
template <class Reduction, class T>
void reduce(const source_array<T>& x, const strided<T>& out, std::size_t axis, const rounded_memory<T>& rounded) {
    strided<T> lines{out.data, {x.where.rank, x.where.extents, {}, 0}};  // out seen at x's rank: stride 0 along axis
    for (std::size_t i = 0, k = 0; i < x.where.rank; ++i) lines.where.strides[i] = i == axis ? 0 : out.where.strides[k++];
    if (detail::reduce_columns<Reduction>(x, lines, axis, rounded)) return;
    detail::for_each_line<T>(x, lines, axis, rounded, [](const T* in, T* y, std::size_t n, T*, const T*, bool) {
        if constexpr (std::is_same_v<Reduction, fn::max>) *y = detail::line_max(in, n);
        else if constexpr (std::is_same_v<Reduction, fn::mean>) *y = detail::line_sum(in, n) / static_cast<T>(n);
        else *y = detail::line_sum(in, n);
    });
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
