#pragma once
// concat<Axis>(a, b, ...) and stack<Axis, Position>(a, b, ...): any number of operands joined
// along a named axis. A join is a node of two operands (a longer one nests), which the planner
// evaluates by writing each operand straight into its slice of the result: no operand is
// copied on its own first.

#include <cstddef>
#include <utility>

#include "dimsum/core/element_type.hpp"
#include "dimsum/ops/common.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/shape/find_axis.hpp"

namespace dimsum {

namespace detail {

// Empty, or why A and B cannot be joined along their axis at `position`: they must have the
// same axes, by name, in the same order, and the same extents but along the joined axis.
template <class SA, class SB>
constexpr message join_error(std::size_t position) {
    message m;
    bool same = SA::rank == SB::rank;
    for (std::size_t i = 0; same && i < SA::rank; ++i) {
        const axis_desc a = SA::axes[i], b = SB::axes[i];
        same = a.name == b.name && (i == position || !a.is_static() || !b.is_static() || a.extent == b.extent);
    }
    if (!same) {
        m << "dimsum: concat along " << SA::axes[position].name << ": the other axes of the operands differ: ";
        write_static_shape<SA>(m) << " and ";
        write_static_shape<SB>(m);
    }
    return m;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_join(shape_ref a, shape_ref b, std::size_t position) {
    message m;
    m << "dimsum: concat along " << a.axes[position].name << ": the other axes of the operands differ: " << a << " and " << b;
    throw shape_error(m);
}

// The axis of the join at a position: the sum along the joined axis, else the one extent
// (static where either operand knows it).
template <class A, class B, bool Joined>
struct joined_axis {
    using type = axis<A::name, A::is_static && B::is_static ? A::static_extent + B::static_extent : dynamic>;
};
template <class A, class B>
struct joined_axis<A, B, false> {
    using type = std::conditional_t<A::is_static, A, B>;
};

template <class SA, class SB, std::size_t Position, class = std::make_index_sequence<SA::rank>>
struct joined_shape;
template <class SA, class SB, std::size_t Position, std::size_t... I>
struct joined_shape<SA, SB, Position, std::index_sequence<I...>> {
    using type = shape<typename joined_axis<typename SA::template axis_at<I>, typename SB::template axis_at<I>,
                                            I == Position>::type...>;
};

template <axis_type Axis, class A, class B>
auto join(A&& a, B&& b) {
    if constexpr (any_invalid<A, B>) {
        return invalid_expression{};
    } else {
        using SA = shape_of<A>;
        using SB = shape_of<B>;
        // by name alone: the operands' extents along the axis differ
        constexpr axis_lookup found = find_axis<SA>("concat", axis_desc{describe_axis<Axis>.name, dynamic});
        constexpr message types = element_type_error<value_type_of<A>, value_type_of<B>>("concat");
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else if constexpr (types.length != 0) {
            return fail<types>();
        } else if constexpr (constexpr message error = join_error<SA, SB>(found.position); error.length != 0) {
            return fail<error>();
        } else {
            constexpr std::size_t position = found.position;
            using S = typename joined_shape<SA, SB, position>::type;
            const auto ea = a.shape().extents(), eb = b.shape().extents();
            std::array<std::size_t, S::rank> all{};
            for (std::size_t i = 0; i < S::rank; ++i) {
                if (i != position && ea[i] != eb[i]) throw_join({SA::axes.data(), ea.data(), SA::rank}, {SB::axes.data(), eb.data(), SB::rank}, position);
                all[i] = i == position ? checked_add(ea[i], eb[i], "concat") : ea[i];
            }
            return expr::concat<S, position, expr::held_t<A>, expr::held_t<B>>{
                {expr::hold(std::forward<A>(a)), expr::hold(std::forward<B>(b))}, S::from_extents(all, "concat")};
        }
    }
}

template <axis_type Axis, class A>
auto join_all(A&& a) {
    return expr::hold(std::forward<A>(a));
}
template <axis_type Axis, class A, class B, class... Rest>
auto join_all(A&& a, B&& b, Rest&&... rest) {
    return join_all<Axis>(join<Axis>(std::forward<A>(a), std::forward<B>(b)), std::forward<Rest>(rest)...);
}

constexpr message stack_error(axis_desc a, std::size_t count) {
    message m;
    if (a.is_static() && a.extent != count) m << "dimsum: stack: " << count << " operands along " << a;
    return m;
}

}  // namespace detail

// concat<Axis>(a, b, ...): the operands one after the other along the axis named like Axis,
// as torch.cat. Every operand has the same axes, by name and in order, with the same extents
// but along Axis (a compile error where static, else a shape_error); the result's extent
// along Axis is their sum, static where all are. A formula: evaluating it writes each operand
// into its part of the result.
template <axis_type Axis, operand... E>
    requires(sizeof...(E) >= 2)
auto concat(E&&... operands) {
    return detail::join_all<Axis>(std::forward<E>(operands)...);
}

// stack<Axis, Position>(a, b, ...): the operands, all of one shape, along a new axis named
// like Axis inserted before the axis at Position (as torch.stack(dim=Position)), of extent
// the number of operands.
template <axis_type Axis, std::size_t Position, operand... E>
    requires(sizeof...(E) >= 2)
auto stack(E&&... operands) {
    constexpr message error = detail::stack_error(describe_axis<Axis>, sizeof...(E));
    if constexpr (error.length != 0) return fail<error>();
    else return concat<Axis>(unsqueeze<axis<Axis::name, 1>, Position>(std::forward<E>(operands))...);
}

}  // namespace dimsum
