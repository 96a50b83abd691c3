#pragma once
// Conversions between a program's type and the element types its memory may hold, for the
// executors on the host: a `convert` entry widens a binding of bf16, integers (or float, in a
// program over double) into the program's type; a formula of bf16 is computed in float (or
// double, by the reference backend) and rounded into its bf16 destination at the end.

#include <cstddef>
#include <cstdint>

#include "dimsum/core/bf16.hpp"
#include "dimsum/evaluation/plan.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::evaluation {

// Whether a program over `to` may read a binding of `from`: its own type, or one that widens
// exactly (bf16, float into double) or that it reads as numbers or ids (int32, int64).
constexpr bool readable(element_type from, element_type to) {
    return from == to || from == element_type::bf16 || from == element_type::int32 || from == element_type::int64 ||
           (from == element_type::float32 && to == element_type::float64);
}

// A convert entry: the values of binding b written as T into dst, of b's extents.
template <class T>
void convert_binding(const binding& b, const strided<T>& dst) {
    auto widen = [&]<class U>(const U*) {
        const strided<const U> from = strided_at(static_cast<const U*>(b.data), b.where);
        for_each_index(dst.extents, dst.rank, [&](const std::size_t* index) { dst.at(index) = static_cast<T>(from.at(index)); });
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
    for_each_index(dst.extents, dst.rank, [&](const std::size_t* index) { dst.at(index) = bf16(from.at(index)); });
}

}  // namespace dimsum::evaluation
