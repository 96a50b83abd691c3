#pragma once
// Element types: what a tensor may hold, and messages about them. Formulas compute in float
// or double; int32 and int64 tensors are inputs (token ids, lengths, positions), read
// converted to the formula's type, or as indices by gather.

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "dimsum/core/message.hpp"

namespace dimsum {

template <class T>
concept floating_element = std::is_same_v<T, float> || std::is_same_v<T, double>;
template <class T>
concept integer_element = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;
// What a tensor may hold.
template <class T>
concept tensor_element = floating_element<T> || integer_element<T>;

}  // namespace dimsum

namespace dimsum::detail {

template <class T>
constexpr std::string_view type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
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
    }
    return m;
}

}  // namespace dimsum::detail
