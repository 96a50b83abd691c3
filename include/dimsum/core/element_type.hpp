#pragma once
// Element types: what a tensor may hold, and messages about them. Formulas compute in float
// or double; bf16 tensors hold values that formulas read widened to float and store rounded
// (core/bf16.hpp); int32 and int64 tensors are inputs (token ids, lengths, positions), read
// converted to the formula's type, or as indices by gather.

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "dimsum/core/bf16.hpp"
#include "dimsum/core/message.hpp"

namespace dimsum {

template <class T>
concept floating_element = std::is_same_v<T, float> || std::is_same_v<T, double>;
template <class T>
concept integer_element = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;
// What a tensor may hold.
template <class T>
concept tensor_element = floating_element<T> || std::is_same_v<T, bf16> || integer_element<T>;
// The element types a formula may have as its value: float, double, and bf16 (computed in float).
template <class T>
concept evaluable_element = floating_element<T> || std::is_same_v<T, bf16>;

// What a formula whose elements are T computes in: float for bf16, else T itself.
template <class T>
using compute_type_t = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

}  // namespace dimsum

namespace dimsum::detail {

template <class T>
constexpr std::string_view type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, bf16>) return "bf16";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
    else return "another type";
}

template <class A, class B>
constexpr message element_type_error(std::string_view op) {
    message m;
    if constexpr (!std::is_same_v<A, B>) {
        m << "dimsum: " << op << ": operands hold different element types: " << type_name<A>() << " vs "
          << type_name<B>();
        // the conversion that would make them one, where there is one
        constexpr bool bf16_and_float = (std::is_same_v<A, bf16> && std::is_same_v<B, float>) ||
                                        (std::is_same_v<A, float> && std::is_same_v<B, bf16>);
        if constexpr (bf16_and_float) m << " (convert one: ds::cast<float>(x) or ds::cast<ds::bf16>(x))";
        else if constexpr (integer_element<A> || integer_element<B>) m << " (read integers as values: ds::cast<float>(x))";
        else if constexpr (floating_element<A> && floating_element<B>) {
            m << " (convert one: ds::cast<double>(x) of float, or ds::cast<float>(x) of a tensor of double)";
        }
    }
    return m;
}

}  // namespace dimsum::detail
