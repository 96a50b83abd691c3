#pragma once
// Helpers shared by the user-facing functions in ops/.

#include <string_view>
#include <type_traits>

#include "dimsum/core/element_type.hpp"
#include "dimsum/evaluation/layout.hpp"
#include "dimsum/expr/nodes.hpp"

namespace dimsum::detail {

// A named tensor on a GPU (backend/cuda/tensor.hpp), and a view of GPU memory.
template <class E>
inline constexpr bool is_named_device_tensor =
    device_leaf<E> && requires(E& e) { e.view_of(); } && std::is_lvalue_reference_v<E>;
template <class E>
inline constexpr bool is_device_view = device_leaf<E> && requires(const std::remove_cvref_t<E>& e) { e.strides(); };

// Whether an operand is a tensor or a view (on the host or a GPU), whose view and transpose
// cost no copy.
template <class E>
inline constexpr bool is_strided_leaf =
    (is_tensor<std::remove_cvref_t<E>>::value && std::is_lvalue_reference_v<E>) ||
    is_tensor_view<std::remove_cvref_t<E>>::value || is_named_device_tensor<E> || is_device_view<E>;

// The view of a tensor or view, writable when the tensor is.
template <class E>
auto leaf_view(E&& e) {
    if constexpr (is_tensor<std::remove_cvref_t<E>>::value) return e.view();
    else if constexpr (is_named_device_tensor<E>) return e.view_of();
    else return e;
}

// A view's layout (evaluation/layout.hpp), offsets from its data. Every eager view (permute,
// select, slice, unsqueeze) is one of layout's functions applied to it, as in a plan.
template <class V>
constexpr evaluation::layout layout_of_view(const V& v) {
    evaluation::layout l{V::shape_type::rank, {}, {}, 0};
    for (std::size_t i = 0; i < l.rank; ++i) {
        l.extents[i] = v.shape().extent(i);
        l.strides[i] = v.strides()[i];
    }
    return l;
}

// The view of v's memory laid out as `where`, of shape R (where's extents), of the same kind
// as v: a host view, or a view of GPU memory (which rebuilds itself: rewrap).
template <class R, class V>
auto view_through(const V& v, const R& extents, const evaluation::layout& where) {
    strides_t<R::rank> strides{};
    for (std::size_t i = 0; i < R::rank; ++i) strides[i] = where.strides[i];
    auto* first = v.data() + where.offset;
    if constexpr (device_leaf<V>) return v.template rewrap<R>(first, extents, strides);
    else return view_of_shape_t<typename V::element_type, R>(first, extents, strides);
}

}  // namespace dimsum::detail
