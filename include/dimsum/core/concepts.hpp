#pragma once
// What counts as an expression: tensors, views and formula nodes alike.

#include <type_traits>

#include "dimsum/core/static_error.hpp"

namespace dimsum {

// Anything with a shape type, an element type and a run-time shape.
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

// A matrix packed once for a backend's products (ds::prepack): a leaf read as the view
// `values()` everywhere, and by a product that takes it as its right operand from `packed()`
// (a pointer, null where there is no packing).
template <class E>
concept packed_leaf = requires(const std::remove_cvref_t<E>& e) {
    e.values();
    e.packed();
};

// Memory on a GPU (backend/cuda/tensor.hpp): a leaf whose elements only a backend that reads
// device memory may read. `device_memory()` describes it as a view of device addresses, which
// the host never dereferences.
template <class E>
concept device_leaf = requires(const std::remove_cvref_t<E>& e) { e.device_memory(); };

// What the user-facing functions accept: an expression, or the result of an earlier shape
// mistake (passed on silently, so that one mistake gives one error).
template <class E>
concept operand = expression<E> || is_invalid<E>;

}  // namespace dimsum
