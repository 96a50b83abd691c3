#pragma once
// Helpers shared by the user-facing functions in ops/.

#include <string_view>
#include <type_traits>

#include "dimsum/core/element_type.hpp"
#include "dimsum/expr/nodes.hpp"

namespace dimsum::detail {

// Whether an operand is a tensor or a view, whose view and transpose cost no copy.
template <class E>
inline constexpr bool is_strided_leaf =
    (is_tensor<std::remove_cvref_t<E>>::value && std::is_lvalue_reference_v<E>) ||
    is_tensor_view<std::remove_cvref_t<E>>::value;

// The view of a tensor or view, writable when the tensor is.
template <class E>
auto leaf_view(E&& e) {
    if constexpr (is_tensor<std::remove_cvref_t<E>>::value) return e.view();
    else return e;
}

}  // namespace dimsum::detail
