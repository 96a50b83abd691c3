#pragma once
// Permuting axes, by position or by name. A permutation lists, for each result axis, the
// position of the source axis it takes.

#include <array>

#include "dimsum/shape/find_axis.hpp"
#include "dimsum/shape/pick.hpp"

namespace dimsum::detail {

template <std::size_t R>
struct permutation_plan {
    std::array<std::size_t, R> order{};
    message error;
};

template <class S, std::size_t R>
constexpr permutation_plan<R> check_permutation(std::string_view op, const std::array<std::size_t, R>& order) {
    permutation_plan<R> plan{order, {}};
    std::array<bool, R> seen{};
    bool valid = R == S::rank;
    for (std::size_t i = 0; valid && i < R; ++i) {
        valid = order[i] < R && !seen[order[i]];
        if (valid) seen[order[i]] = true;
    }
    if (!valid) {
        plan.error << "dimsum: " << op << ": (";
        for (std::size_t i = 0; i < R; ++i) plan.error << (i ? ", " : "") << order[i];
        plan.error << ") is not a permutation of the axes of ";
        write_static_shape<S>(plan.error);
    }
    return plan;
}

// Swap the last two axes.
template <class S>
constexpr permutation_plan<S::rank> swap_last_two() {
    permutation_plan<S::rank> plan;
    if constexpr (S::rank < 2) {
        plan.error << "dimsum: transpose: needs two or more axes, in ";
        write_static_shape<S>(plan.error);
    } else {
        for (std::size_t i = 0; i < S::rank; ++i) plan.order[i] = i;
        plan.order[S::rank - 2] = S::rank - 1;
        plan.order[S::rank - 1] = S::rank - 2;
    }
    return plan;
}

// Swap the axes named like A and B.
template <class S, class A, class B>
constexpr permutation_plan<S::rank> swap_named() {
    permutation_plan<S::rank> plan;
    for (std::size_t i = 0; i < S::rank; ++i) plan.order[i] = i;
    axis_lookup a = find_axis<S>("transpose", describe_axis<A>);
    axis_lookup b = find_axis<S>("transpose", describe_axis<B>);
    if (a.error.length) plan.error = a.error;
    else if (b.error.length) plan.error = b.error;
    else {
        plan.order[a.position] = b.position;
        plan.order[b.position] = a.position;
    }
    return plan;
}

// The axes named like Axes..., in that order: every axis of S exactly once.
template <class S, class... Axes>
constexpr permutation_plan<S::rank> order_by_name() {
    permutation_plan<S::rank> plan;
    if constexpr (sizeof...(Axes) != S::rank) {
        plan.error << "dimsum: permute: " << sizeof...(Axes) << " axes named for ";
        write_static_shape<S>(plan.error);
    } else {
        axis_lookup found[] = {find_axis<S>("permute", describe_axis<Axes>)...};
        for (std::size_t i = 0; i < S::rank; ++i) {
            if (found[i].error.length) {
                plan.error = found[i].error;
                return plan;
            }
            plan.order[i] = found[i].position;
        }
        return check_permutation<S>("permute", plan.order);
    }
    return plan;
}

template <class S, auto Order>
using permute_t = pick_array_t<S, Order>;

template <class Result, class S, std::size_t R>
Result permute_extents(const S& s, const std::array<std::size_t, R>& order) {
    return gather_extents<Result>(s, order, "permute");
}

}  // namespace dimsum::detail
