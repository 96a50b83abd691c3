#pragma once
// view<Axes...>(x): split, merge or rename axes (shape/reshape.hpp). A view of a tensor is a
// tensor_view over the same memory; of anything else, a lazy node that the evaluator makes
// copy-free wherever the strides allow.

#include <stdexcept>

#include "dimsum/ops/common.hpp"
#include "dimsum/shape/find_axis.hpp"
#include "dimsum/shape/pick.hpp"
#include "dimsum/shape/reshape.hpp"

namespace dimsum {

namespace detail {

template <class Target, class E>
auto reshape_to(E&& e) {
    using From = shape_of<E>;
    constexpr message error = reshape_error<From, Target>();
    if constexpr (error.length != 0) {
        return fail<error>();
    } else {
        Target extents = reshape_extents<From, Target>(e.shape());
        if constexpr (is_tensor<std::remove_cvref_t<E>>::value && std::is_lvalue_reference_v<E>) {
            auto v = e.view();  // contiguous: same memory, new axes
            return view_of_shape_t<typename decltype(v)::element_type, Target>(v.data(), extents);
        } else {
            return expr::reshape<Target, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, extents};
        }
    }
}

template <class S, std::size_t Position, class To, class = std::make_index_sequence<S::rank>>
struct replace_axis;
template <class S, std::size_t Position, class To, std::size_t... I>
struct replace_axis<S, Position, To, std::index_sequence<I...>> {
    using type = shape<std::conditional_t<I == Position, To, typename S::template axis_at<I>>...>;
};

}  // namespace detail

template <axis_type... Axes, operand E>
auto view(E&& e) {
    if constexpr (is_invalid<E>) return invalid_expression{};
    else return detail::reshape_to<shape<Axes...>>(std::forward<E>(e));
}

// rename<From, To>(x): the axis named like From is called To from now on, e.g. to say that a
// key axis and a query axis are the same before contracting them.
template <axis_type From, axis_type To, operand E>
auto rename(E&& e) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        constexpr detail::axis_lookup found = detail::find_axis<shape_of<E>>("rename", describe_axis<From>);
        if constexpr (found.error.length != 0) return fail<found.error>();
        else
            return detail::reshape_to<typename detail::replace_axis<shape_of<E>, found.position, To>::type>(
                std::forward<E>(e));
    }
}

// select<Axis>(x, i): the slice at index i along the named axis, which the result drops,
// e.g. the query part of a fused QKV projection. Of a tensor or view it is a view.
template <axis_type Axis, operand E>
auto select(E&& e, std::size_t index) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr detail::axis_lookup found = detail::find_axis<S>("select", describe_axis<Axis>);
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            constexpr std::size_t axis = found.position;
            using result_shape = detail::remove_t<S, axis>;
            if (index >= e.shape().extent(axis)) {
                detail::throw_index(static_cast<long long>(index), S::axes[axis], e.shape().extent(axis));
            }
            constexpr auto kept = detail::positions_without<S::rank>(axis);
            auto extents = detail::gather_extents<result_shape>(e.shape(), kept, "select");
            if constexpr (detail::is_strided_leaf<E>) {
                auto v = detail::leaf_view(std::forward<E>(e));
                strides_t<S::rank - 1> strides{};
                for (std::size_t i = 0; i < S::rank - 1; ++i) strides[i] = v.strides()[kept[i]];
                auto* first = v.data() + static_cast<std::ptrdiff_t>(index) * v.strides()[axis];
                return view_of_shape_t<typename decltype(v)::element_type, result_shape>(first, extents, strides);
            } else {
                return expr::select<result_shape, axis, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, extents, index};
            }
        }
    }
}

}  // namespace dimsum
