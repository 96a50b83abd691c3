#pragma once
// view<Axes...>(x): split, merge or rename axes (shape/reshape.hpp); select and slice along a
// named axis; chunk and split into slices. Of a tensor or view each is a tensor_view over the
// same memory (writable when the tensor is); of anything else, a lazy node that the evaluator
// makes copy-free wherever the strides allow.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <utility>

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
auto view(E&& e, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
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
auto select(E&& e, std::size_t index, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
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
                return detail::view_through<result_shape>(v, extents, evaluation::select(detail::layout_of_view(v), axis, index));
            } else {
                return expr::select<result_shape, axis, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, extents, index};
            }
        }
    }
}

namespace detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_slice(axis_desc a, std::size_t extent, std::size_t begin,
                                                               std::size_t end, std::size_t spacing) {
    message m;
    m << "dimsum: slice: ";
    if (spacing == 0) m << "a step of 0 along ";
    else m << "[" << begin << ", " << end << ") does not lie within ";
    write_axis(m, a, extent);
    throw shape_error(m);
}

// Empty, or what is wrong with bounds known at compile time.
constexpr message static_slice_error(std::size_t begin, std::size_t end, std::size_t step, axis_desc a) {
    message m;
    if (step == 0) m << "dimsum: slice: a step of 0 along " << a;
    else if (begin > end || (a.is_static() && end > a.extent))
        m << "dimsum: slice: [" << begin << ", " << end << ") does not lie within " << a;
    return m;
}

// The positions begin, begin + spacing, ... (count of them) along operand axis Axis, as a
// value of shape R: a view of a tensor or view, else a node.
template <class R, std::size_t Axis, class E>
auto slice_to(E&& e, std::size_t begin, std::size_t count, std::size_t spacing) {
    auto all = e.shape().extents();
    all[Axis] = count;
    R extents = R::from_extents(all, "slice");
    if constexpr (is_strided_leaf<E>) {
        auto v = leaf_view(std::forward<E>(e));
        return view_through<R>(v, extents, evaluation::slice(layout_of_view(v), Axis, begin, count, spacing));
    } else {
        return expr::slice<R, Axis, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, extents, begin, spacing};
    }
}

// The operand's shape with axis Position of extent N (`dynamic`: known at run time).
template <class S, std::size_t Position, std::size_t N>
using sliced_shape_t =
    typename replace_axis<S, Position, axis<S::template axis_at<Position>::name, N>>::type;

}  // namespace detail

// slice<Axis>(x, begin, end, step = 1): the positions begin, begin + step, ... before end
// along the named axis, which keeps its name and gets a run-time extent, as x[begin:end:step]
// in NumPy (no negative bounds). Of a tensor or view it is a view, writable when the tensor
// is. A range outside the axis, or a step of 0, is a shape_error.
template <axis_type Axis, operand E>
auto slice(E&& e, std::size_t begin, std::size_t end, std::size_t step = 1, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr detail::axis_lookup found = detail::find_axis<S>("slice", describe_axis<Axis>);
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            constexpr std::size_t axis = found.position;
            const std::size_t extent = e.shape().extent(axis);
            if (step == 0 || begin > end || end > extent) detail::throw_slice(S::axes[axis], extent, begin, end, step);
            return detail::slice_to<detail::sliced_shape_t<S, axis, dynamic>, axis>(std::forward<E>(e), begin,
                                                                                  (end - begin + step - 1) / step, step);
        }
    }
}

// slice<Axis, Begin, End, Step = 1>(x): the same with bounds known at compile time, so that the
// axis keeps a static extent, (End - Begin) / Step rounded up; bounds outside a static axis
// are a compile error.
template <axis_type Axis, std::size_t Begin, std::size_t End, std::size_t Step = 1, operand E>
auto slice(E&& e) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr detail::axis_lookup found = detail::find_axis<S>("slice", describe_axis<Axis>);
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            constexpr std::size_t axis = found.position;
            constexpr message error = detail::static_slice_error(Begin, End, Step, S::axes[axis]);
            if constexpr (error.length != 0) {
                return fail<error>();
            } else {
                const std::size_t extent = e.shape().extent(axis);
                if (End > extent) detail::throw_slice(S::axes[axis], extent, Begin, End, Step);
                constexpr std::size_t count = (End - Begin + Step - 1) / Step;
                return detail::slice_to<detail::sliced_shape_t<S, axis, count>, axis>(std::forward<E>(e), Begin, count,
                                                                                     Step);
            }
        }
    }
}

namespace detail {
template <class>
inline constexpr fixed_string split_needs_memory{
    "dimsum: split and chunk give views of a tensor or view: evaluate the formula into a tensor first"};
}  // namespace detail

// split<Axis>(x, n0, n1, ...): consecutive slices of n0, n1, ... positions along the axis,
// which must add up to its extent (else a shape_error), as views of the tensor or view x.
template <axis_type Axis, operand E, std::integral... N>
    requires(sizeof...(N) > 0)
auto split(E&& e, N... counts) {
    if constexpr (!detail::is_strided_leaf<E>) {
        (void)sizeof(static_shape_error<detail::split_needs_memory<E>>);
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr detail::axis_lookup found = detail::find_axis<S>("split", describe_axis<Axis>);
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            const std::array<std::size_t, sizeof...(N)> sizes{static_cast<std::size_t>(counts)...};
            std::array<std::size_t, sizeof...(N)> begins{};
            std::size_t total = 0;
            for (std::size_t i = 0; i < sizes.size(); ++i) {
                begins[i] = total;
                if (__builtin_add_overflow(total, sizes[i], &total)) total = SIZE_MAX;
            }
            if (total != e.shape().extent(found.position)) {
                message m;
                m << "dimsum: split: the sizes add up to " << total << ", not to ";
                write_axis(m, S::axes[found.position], e.shape().extent(found.position));
                throw shape_error(m);
            }
            // built in place: assigning to a view writes its elements, it never rebinds
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
                return std::array{slice<Axis>(e, begins[I], begins[I] + sizes[I])...};
            }(std::make_index_sequence<sizeof...(N)>{});
        }
    }
}

// chunk<Axis, N>(x): N slices along the axis, as torch.chunk: each ceil(extent / N) positions
// but the last ones, which take what remains (and may be empty). Views of the tensor or view
// x; static extents where the axis has a static extent that N divides.
template <axis_type Axis, std::size_t N, operand E>
    requires(N > 0)
auto chunk(E&& e) {
    if constexpr (!detail::is_strided_leaf<E>) {
        (void)sizeof(static_shape_error<detail::split_needs_memory<E>>);
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr detail::axis_lookup found = detail::find_axis<S>("chunk", describe_axis<Axis>);
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            constexpr axis_desc a = S::axes[found.position];
            if constexpr (a.is_static() && a.extent % N == 0) {
                constexpr std::size_t size = a.extent / N;
                return [&]<std::size_t... I>(std::index_sequence<I...>) {
                    return std::array{slice<Axis, I * size, (I + 1) * size>(e)...};
                }(std::make_index_sequence<N>{});
            } else {
                const std::size_t extent = e.shape().extent(found.position), size = (extent + N - 1) / N;
                return [&]<std::size_t... I>(std::index_sequence<I...>) {
                    return std::array{slice<Axis>(e, std::min(extent, I * size), std::min(extent, (I + 1) * size))...};
                }(std::make_index_sequence<N>{});
            }
        }
    }
}

namespace detail {

// Empty, or why axis A cannot be inserted at `position` of a shape of `rank` axes.
constexpr message unsqueeze_error(std::size_t position, std::size_t rank, axis_desc a) {
    message m;
    if (position > rank) m << "dimsum: unsqueeze: position " << position << " is past the " << rank << " axes";
    else if (a.is_static() && a.extent != 1) m << "dimsum: unsqueeze: the axis inserted has extent 1, not " << a;
    return m;
}

constexpr message squeeze_error(axis_desc a) {
    message m;
    if (a.is_static() && a.extent != 1) m << "dimsum: squeeze: " << a << " is not of extent 1";
    return m;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_squeeze(axis_desc a, std::size_t extent) {
    message m;
    m << "dimsum: squeeze: ";
    write_axis(m, a, extent) << " is not of extent 1";
    throw shape_error(m);
}

}  // namespace detail

// unsqueeze<Axis, Position>(x): x with an axis of extent 1, named like Axis, inserted before
// the axis at Position (Position = rank: after the last). It broadcasts against an axis of
// the same name: mean<Model>(x) unsqueezed back where model was meets x. Of a tensor or view
// it is a view.
template <axis_type Axis, std::size_t Position, operand E>
auto unsqueeze(E&& e) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr message error = detail::unsqueeze_error(Position, S::rank, describe_axis<Axis>);
        if constexpr (error.length != 0) {
            return fail<error>();
        } else {
            using Target = detail::concat_t<detail::concat_t<detail::slice_t<S, 0, Position>, shape<axis<Axis::name, 1>>>,
                                            detail::slice_t<S, Position, S::rank - Position>>;
            std::array<std::size_t, S::rank + 1> all{};
            for (std::size_t i = 0, from = 0; i <= S::rank; ++i) all[i] = i == Position ? 1 : e.shape().extent(from++);
            Target extents = Target::from_extents(all, "unsqueeze");
            if constexpr (detail::is_strided_leaf<E>) {
                auto v = detail::leaf_view(std::forward<E>(e));
                return detail::view_through<Target>(v, extents, evaluation::unsqueeze(detail::layout_of_view(v), Position));
            } else {
                return expr::reshape<Target, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, extents};
            }
        }
    }
}

// squeeze<Axis>(x): x without the axis named like Axis (whatever Axis's extent), which must
// have extent 1 (at compile time where it is static, else a shape_error).
template <axis_type Axis, operand E>
auto squeeze(E&& e, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        // by name alone: squeeze<Model> finds the model=1 that mean<Model>(x, keep_axis) left
        constexpr detail::axis_lookup found = detail::find_axis<S>("squeeze", axis_desc{describe_axis<Axis>.name, dynamic});
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            constexpr message error = detail::squeeze_error(S::axes[found.position]);
            if constexpr (error.length != 0) {
                return fail<error>();
            } else {
                if (e.shape().extent(found.position) != 1) {
                    detail::throw_squeeze(S::axes[found.position], e.shape().extent(found.position));
                }
                return select<typename S::template axis_at<found.position>>(std::forward<E>(e), 0);
            }
        }
    }
}

}  // namespace dimsum
