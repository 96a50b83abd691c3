#pragma once
// Conversions between a program's type and the element types its memory may hold, for the
// executors on the host: a `convert` entry widens a binding of bf16, integers (or float, in a
// program over double) into the program's type, or rounds one of double into a program over
// float (cast<float> of a tensor of double); a formula of bf16 is computed in float (or
// double, by the reference backend) and rounded into its bf16 destination at the end.

#include <cstddef>
#include <cstdint>

#include "dimsum/core/bf16.hpp"
#include "dimsum/evaluation/plan.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::evaluation {

// Whether a program over `to` may read a binding of `from`: its own type, one that widens
// exactly (bf16, float into double), one that it reads as numbers or ids (int32, int64), or
// double into float (each value rounded: a cast<float> of a tensor of double).
constexpr bool readable(element_type from, element_type to) {
    return from == to || from == element_type::bf16 || from == element_type::int32 || from == element_type::int64 ||
           (from == element_type::float32 && to == element_type::float64) ||
           (from == element_type::float64 && to == element_type::float32);
}

// Whether s is row-major and contiguous: one flat loop reads or writes it.
template <class U>
bool is_row_major(const strided<U>& s) {
    std::ptrdiff_t expected = 1;
    for (std::size_t i = s.where.rank; i-- > 0;) {
        if (s.where.extents[i] != 1 && s.where.strides[i] != expected) return false;
        expected *= static_cast<std::ptrdiff_t>(s.where.extents[i]);
    }
    return true;
}

// Whether a and b lay their elements out alike and densely: the same extents and strides,
// which are row-major strides of some order of the axes (e.g. a narrow entry's value and its
// bf16 temporary, both seen through a permutation), so one flat loop visits each element once.
template <class U, class V>
bool alike_and_dense(const strided<U>& a, const strided<V>& b) {
    return a.where == b.where && is_dense(a.where);
}

// dst[i] = convert(from[i]) for every index: one flat loop, which the compiler vectorises,
// where both are row-major (the common case: a tensor into a temporary) or laid out alike and
// densely, else index by index.
template <class To, class From, class F>
void convert_each(const strided<From>& from, const strided<To>& dst, F convert) {
    if ((is_row_major(from) && is_row_major(dst)) || alike_and_dense(from, dst)) {
        const std::size_t n = dst.size();
        From* in = from.data;
        To* out = dst.data;
        for (std::size_t i = 0; i < n; ++i) out[i] = convert(in[i]);
        return;
    }
    for_each_index(dst.where.extents, dst.where.rank, [&](const std::size_t* index) { dst.at(index) = convert(from.at(index)); });
}

// A convert entry: the values of binding b written as T into dst, of b's extents.
template <class T>
void convert_binding(const binding& b, const strided<T>& dst) {
    auto widen = [&]<class U>(const U*) {
        const strided<const U> from = strided_at(static_cast<const U*>(b.data), b.where);
        convert_each(from, dst, [](U value) { return static_cast<T>(value); });
    };
    switch (b.type) {
        case element_type::bf16: return widen(static_cast<const bf16*>(nullptr));
        case element_type::int32: return widen(static_cast<const std::int32_t*>(nullptr));
        case element_type::int64: return widen(static_cast<const std::int64_t*>(nullptr));
        case element_type::float32: return widen(static_cast<const float*>(nullptr));
        case element_type::float64: return widen(static_cast<const double*>(nullptr));
    }
}

// A formula's value computed in T, rounded to the nearest bf16 (ties to even) into dst.
template <class T>
void round_into(const strided<const T>& from, const strided<bf16>& dst) {
    convert_each(from, dst, [](T value) { return bf16(value); });
}

}  // namespace dimsum::evaluation
