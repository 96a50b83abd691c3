#pragma once
// transpose and permute. Of a tensor or view they give a view with permuted strides (no
// copy); of anything else, a lazy node.

#include "dimsum/ops/common.hpp"
#include "dimsum/shape/permute.hpp"

namespace dimsum {

namespace detail {

template <auto Plan, class E>
auto apply_permutation(E&& e) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else if constexpr (Plan.error.length != 0) {
        return fail<Plan.error>();
    } else {
        using result_shape = permute_t<shape_of<E>, Plan.order>;
        auto extents = permute_extents<result_shape>(e.shape(), Plan.order);
        if constexpr (is_strided_leaf<E>) {
            auto v = leaf_view(std::forward<E>(e));
            evaluation::order_t order{};
            for (std::size_t i = 0; i < result_shape::rank; ++i) order[i] = Plan.order[i];
            return view_through<result_shape>(v, extents, evaluation::permute(layout_of_view(v), order));
        } else {
            return expr::permute<result_shape, Plan.order, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, extents};
        }
    }
}

template <class E>
using shape_or_empty = std::conditional_t<is_invalid<E>, shape<>, shape_of<E>>;

}  // namespace detail

// Swap the last two axes.
template <operand E>
auto transpose(E&& e) {
    return detail::apply_permutation<detail::swap_last_two<detail::shape_or_empty<E>>()>(std::forward<E>(e));
}

// Swap the two axes named like A and B.
template <axis_type A, axis_type B, operand E>
auto transpose(E&& e) {
    return detail::apply_permutation<detail::swap_named<detail::shape_or_empty<E>, A, B>()>(std::forward<E>(e));
}

// permute<2, 0, 1>(x): result axis i is axis Order[i] of x.
template <std::size_t... Order, operand E>
auto permute(E&& e) {
    using S = detail::shape_or_empty<E>;
    return detail::apply_permutation<detail::check_permutation<S, sizeof...(Order)>(
        "permute", std::array<std::size_t, sizeof...(Order)>{Order...})>(std::forward<E>(e));
}

// permute<Heads, Seq, Head>(x): the axes of x, by name, in this order.
template <axis_type... Axes, operand E>
    requires(sizeof...(Axes) > 0)
auto permute(E&& e) {
    return detail::apply_permutation<detail::order_by_name<detail::shape_or_empty<E>, Axes...>()>(std::forward<E>(e));
}

}  // namespace dimsum
