#pragma once
// How a formula node holds its operands.

#include <type_traits>
#include <utility>

#include "dimsum/core/concepts.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum {

namespace expr {

// A node holds a tensor the user named by a read-only view (the user keeps it alive), a
// temporary tensor by value (the node keeps it alive), and anything else by value; tensors
// on a GPU alike.
template <class E>
auto hold(E&& e) {
    using plain = std::remove_cvref_t<E>;
    if constexpr (is_tensor<plain>::value && std::is_lvalue_reference_v<E>) return std::as_const(e).view();
    else if constexpr (device_leaf<plain> && requires { e.view_of(); } && std::is_lvalue_reference_v<E>) {
        return std::as_const(e).view_of();  // a named device tensor (backend/cuda/tensor.hpp), likewise
    }
    else if constexpr (is_tensor_view<plain>::value) return view_of_shape_t<const typename plain::value_type, typename plain::shape_type>(e);
    else return plain(std::forward<E>(e));
}

template <class E>
using held_t = decltype(hold(std::declval<E>()));

}  // namespace expr
}  // namespace dimsum
