#pragma once
// What counts as an expression, and how a node holds its operands.

#include <type_traits>
#include <utility>

#include "dimsum/tensor/tensor.hpp"

namespace dimsum {

// Anything with a shape type, an element type and a run-time shape: tensors, views and
// formula nodes.
template <class E>
concept expression = requires(const std::remove_cvref_t<E>& e) {
    typename std::remove_cvref_t<E>::shape_type;
    typename std::remove_cvref_t<E>::value_type;
    { e.shape() };
};

template <class E>
using shape_of = typename std::remove_cvref_t<E>::shape_type;
template <class E>
using value_type_of = typename std::remove_cvref_t<E>::value_type;

// What the user-facing functions accept: an expression, or the result of an earlier shape
// mistake (passed on silently, so that one mistake gives one error).
template <class E>
concept operand = expression<E> || is_invalid<E>;

namespace expr {

// A node holds a tensor the user named by a read-only view (the user keeps it alive), a
// temporary tensor by value (the node keeps it alive), and anything else by value.
template <class E>
auto hold(E&& e) {
    using plain = std::remove_cvref_t<E>;
    if constexpr (is_tensor<plain>::value && std::is_lvalue_reference_v<E>) return std::as_const(e).view();
    else if constexpr (is_tensor_view<plain>::value) return view_of_shape_t<const typename plain::value_type, typename plain::shape_type>(e);
    else return plain(std::forward<E>(e));
}

template <class E>
using held_t = decltype(hold(std::declval<E>()));

}  // namespace expr
}  // namespace dimsum
