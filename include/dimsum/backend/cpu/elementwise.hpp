#pragma once
// The elementwise functions (core/functors.hpp) applied to blocks of values with xsimd. A
// block function computes out[i] = f(in[0][i], ..., in[N-1][i]) for i < n; it is the only
// code compiled per function, and the fused pass (fused.hpp) chains them block by block.
// And the index arrays a formula reads (causal_mask, arange).

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/core/functors.hpp"
#include "dimsum/evaluation/codes.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

namespace detail {

// f on SIMD batches. The generic functors work on batches as they are; those written with
// the conditional operator need xsimd::select instead. Booleans (masks) arrive as 1 or 0.
// NaN tests use xsimd::isnan, never `a != a`: xsimd 8.1 compiles != to an ordered compare on
// AVX and AVX-512 (_CMP_NEQ_OQ), which is false for NaN.
template <class F>
struct on_batches {
    template <class... B>
    auto operator()(B... b) const { return F{}(b...); }
};
template <>
struct on_batches<fn::maximum> {
    template <class B>
    B operator()(B a, B b) const {  // NaN from either side wins, as in fn::maximum
        return xsimd::select(xsimd::isnan(a), a, xsimd::select(xsimd::isnan(b), b, xsimd::select(a < b, b, a)));
    }
};
template <>
struct on_batches<fn::minimum> {
    template <class B>
    B operator()(B a, B b) const {
        return xsimd::select(xsimd::isnan(a), a, xsimd::select(xsimd::isnan(b), b, xsimd::select(b < a, b, a)));
    }
};
// Lane by lane with std::pow: xsimd 8.1's pow gives 0 for 0^0 and 0^-1, NaN for NaN^0,
// 1^NaN and (-1)^inf, and the wrong sign for large even exponents of negative bases.
template <>
struct on_batches<fn::pow> {
    template <class B>
    B operator()(B a, B b) const {
        alignas(64) typename B::value_type x[B::size], y[B::size];
        a.store_aligned(x);
        b.store_aligned(y);
        for (std::size_t i = 0; i < B::size; ++i) x[i] = fn::pow{}(x[i], y[i]);
        return B::load_aligned(x);
    }
};
// Lane by lane: a cast to bf16 inside a formula is rare, and the scalar rounding is the
// reference one (stores into bf16 memory use the conversion kernels instead).
template <>
struct on_batches<fn::round_bf16> {
    template <class B>
    B operator()(B a) const {
        alignas(64) typename B::value_type x[B::size];
        a.store_aligned(x);
        for (std::size_t i = 0; i < B::size; ++i) x[i] = fn::round_bf16{}(x[i]);
        return B::load_aligned(x);
    }
};
// Comparisons and mask logic give 1 or 0. not_equal is the negation of ==, which is false for
// NaN (xsimd's own != is ordered, see above).
template <class F>
concept comparison = std::is_same_v<F, fn::less> || std::is_same_v<F, fn::less_equal> || std::is_same_v<F, fn::greater> ||
                     std::is_same_v<F, fn::greater_equal> || std::is_same_v<F, fn::equal>;
template <comparison F>
struct on_batches<F> {
    template <class B>
    B operator()(B a, B b) const { return xsimd::select(F{}(a, b), B(1), B(0)); }
};
template <>
struct on_batches<fn::not_equal> {
    template <class B>
    B operator()(B a, B b) const { return xsimd::select(a == b, B(0), B(1)); }
};
template <>
struct on_batches<fn::logical_and> {
    template <class B>
    B operator()(B a, B b) const { return xsimd::select(a == B(0) || b == B(0), B(0), B(1)); }
};
template <>
struct on_batches<fn::logical_or> {
    template <class B>
    B operator()(B a, B b) const { return xsimd::select(a == B(0) && b == B(0), B(0), B(1)); }
};
template <>
struct on_batches<fn::logical_not> {
    template <class B>
    B operator()(B a) const { return xsimd::select(a == B(0), B(1), B(0)); }
};
template <>
struct on_batches<fn::where> {
    template <class B>
    B operator()(B condition, B a, B b) const {  // as the scalar bool(condition): NaN counts as true
        return xsimd::select(condition == B(0), b, a);
    }
};

template <class F, class T, std::size_t... I>
void apply_block(std::size_t n, const T* const* in, T* out, std::index_sequence<I...>) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    on_batches<F> f;
    std::size_t i = 0;
    for (; i + width <= n; i += width) f(batch::load_unaligned(in[I] + i)...).store_unaligned(out + i);
    if (i == n) return;
    // the tail: one more batch, padded with ones (a harmless argument for every function)
    alignas(64) T tail[sizeof...(I) + 1][width];
    std::size_t live = n - i;
    ((std::fill(std::copy(in[I] + i, in[I] + n, tail[I]), tail[I] + width, T(1))), ...);
    f(batch::load_aligned(tail[I])...).store_aligned(tail[sizeof...(I)]);
    std::copy(tail[sizeof...(I)], tail[sizeof...(I)] + live, out + i);
}

}  // namespace detail

template <class F, class T, std::size_t N>
void apply_to_block(std::size_t n, const T* const* in, T* out) {
    detail::apply_block<F, T>(n, in, out, std::make_index_sequence<N>{});
}

namespace detail {
template <class T, class... F>
block_table<T> blocks_of(fn::function_list<F...>) {
    block_table<T> table{};
    ((table[std::size_t(F::code)] = &apply_to_block<F, T, fn::arity<F>>), ...);
    return table;
}
}  // namespace detail

template <class T>
block_table<T> every_block() {
    return detail::blocks_of<T>(fn::elementwise_functions{});
}

// dst = causal_mask (1 where a key lies in its query's future; dst (queries, keys)) or arange
// (dst (n): 0, 1, ...): small, and read broadcast, so a plain loop.
template <class T>
void indices(bool causal, const strided<T>& dst) {
    if (!causal) {
        for (std::size_t i = 0; i < dst.where.extents[0]; ++i) dst.data[static_cast<std::ptrdiff_t>(i) * dst.where.strides[0]] = T(i);
        return;
    }
    const std::size_t queries = dst.where.extents[0], keys = dst.where.extents[1];
    for (std::size_t q = 0; q < queries; ++q) {
        for (std::size_t k = 0; k < keys; ++k) {
            const auto at = static_cast<std::ptrdiff_t>(q) * dst.where.strides[0] + static_cast<std::ptrdiff_t>(k) * dst.where.strides[1];
            dst.data[at] = evaluation::in_future(q, k, queries, keys) ? T(1) : T(0);
        }
    }
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
