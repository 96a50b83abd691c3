#pragma once
// Messages about element types: operands of one operation hold the same type.

#include <string_view>
#include <type_traits>

#include "dimsum/core/message.hpp"

namespace dimsum::detail {

template <class T>
constexpr std::string_view type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
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
