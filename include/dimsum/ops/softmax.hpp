#pragma once
// softmax and layer_norm along the last axis, or along a named one; and the reductions sum, max and mean
// along a named axis, which the result drops.

#include "dimsum/core/functors.hpp"
#include "dimsum/ops/common.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/shape/find_axis.hpp"
#include "dimsum/shape/pick.hpp"

namespace dimsum {

namespace detail {

template <class S>
constexpr axis_lookup last_axis(std::string_view op) {
    axis_lookup found;
    if constexpr (S::rank == 0) found.error << "dimsum: " << op << ": a scalar has no axis";
    else found.position = S::rank - 1;
    return found;
}

template <axis_lookup Found, class E>
auto make_softmax(E&& e) {
    if constexpr (Found.error.length != 0) return fail<Found.error>();
    else return expr::softmax<Found.position, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, e.shape()};
}

template <axis_lookup Found, class E>
auto make_layer_norm(E&& e, double epsilon) {
    if constexpr (Found.error.length != 0) return fail<Found.error>();
    else return expr::layer_norm<Found.position, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}, e.shape(), epsilon};
}

// The reduction along Axis; with KeepAxis, the reduced axis put back at extent 1 under its name.
template <class Reduction, class Axis, bool KeepAxis, class E>
auto make_reduce(E&& e) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        using S = shape_of<E>;
        constexpr axis_lookup found = find_axis<S>(Reduction::name, describe_axis<Axis>);
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else {
            using result_shape = remove_t<S, found.position>;
            constexpr auto kept = positions_without<S::rank>(found.position);
            auto extents = gather_extents<result_shape>(e.shape(), kept, Reduction::name);
            auto reduced = expr::reduce<result_shape, Reduction, found.position, expr::held_t<E>>{
                {expr::hold(std::forward<E>(e))}, extents};
            if constexpr (!KeepAxis) return reduced;
            else return unsqueeze<axis<S::template axis_at<found.position>::name, 1>, found.position>(std::move(reduced));
        }
    }
}

}  // namespace detail

// Numerically stable: exp(x - max) / sum(exp(x - max)). A line of -infinity only (every
// value masked) gets weights 0.
template <operand E>
auto softmax(E&& e) {
    if constexpr (is_invalid<E>) return invalid_expression{};
    else return detail::make_softmax<detail::last_axis<shape_of<E>>("softmax")>(std::forward<E>(e));
}

template <axis_type Axis, operand E>
auto softmax(E&& e) {
    if constexpr (is_invalid<E>) return invalid_expression{};
    else return detail::make_softmax<detail::find_axis<shape_of<E>>("softmax", describe_axis<Axis>)>(std::forward<E>(e));
}

// (x - mean) / sqrt(variance + epsilon) along the last axis, as torch.nn.LayerNorm without its
// scale and shift (multiply and add those as formulas: layer_norm(x) * gamma + beta).
template <operand E>
auto layer_norm(E&& e, double epsilon = 1e-5) {
    if constexpr (is_invalid<E>) return invalid_expression{};
    else return detail::make_layer_norm<detail::last_axis<shape_of<E>>("layer_norm")>(std::forward<E>(e), epsilon);
}

template <axis_type Axis, operand E>
auto layer_norm(E&& e, double epsilon = 1e-5) {
    if constexpr (is_invalid<E>) return invalid_expression{};
    else return detail::make_layer_norm<detail::find_axis<shape_of<E>>("layer_norm", describe_axis<Axis>)>(std::forward<E>(e), epsilon);
}

template <axis_type Axis, operand E>
auto sum(E&& e) { return detail::make_reduce<fn::sum, Axis, false>(std::forward<E>(e)); }
template <axis_type Axis, operand E>
auto max(E&& e) { return detail::make_reduce<fn::max, Axis, false>(std::forward<E>(e)); }
template <axis_type Axis, operand E>
auto mean(E&& e) { return detail::make_reduce<fn::mean, Axis, false>(std::forward<E>(e)); }

// Passed to a reduction, it keeps the reduced axis with extent 1 (keepdims in NumPy), so that
// the result broadcasts against its operand: x - mean<Model>(x, ds::keep_axis).
struct keep_axis_t {
    explicit keep_axis_t() = default;
};
inline constexpr keep_axis_t keep_axis{};

template <axis_type Axis, operand E>
auto sum(E&& e, keep_axis_t) { return detail::make_reduce<fn::sum, Axis, true>(std::forward<E>(e)); }
template <axis_type Axis, operand E>
auto max(E&& e, keep_axis_t) { return detail::make_reduce<fn::max, Axis, true>(std::forward<E>(e)); }
template <axis_type Axis, operand E>
auto mean(E&& e, keep_axis_t) { return detail::make_reduce<fn::mean, Axis, true>(std::forward<E>(e)); }

}  // namespace dimsum
