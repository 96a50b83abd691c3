#pragma once
// Gradients: ds::grad(f, x), the gradient of a scalar formula f with respect to a tensor or view
// x that it reads, and ds::vjp(f, x, cotangent), the vector-Jacobian product of any formula.
// Each is a formula of x's shape, evaluated, assigned and fused like any other; lowering
// differentiates (evaluation/differentiate.hpp), so that a gradient is planned with the
// forward values it reads, and every backend runs it.

#include <type_traits>
#include <utility>

#include "dimsum/core/element_type.hpp"
#include "dimsum/core/gradient_options.hpp"
#include "dimsum/ops/common.hpp"
#include "dimsum/shape/conform.hpp"

namespace dimsum {

namespace detail {

// Whether formula E reads a tensor or view of elements V: x itself, or an eager view of it
// (a transpose, a slice), whose shape the compiler cannot tie to x's. Which memory it is, the
// evaluation checks.
template <class V, class E>
constexpr bool reads_elements();
template <class V, class... X>
constexpr bool any_reads_elements(const expr::operands<X...>*) {
    return (reads_elements<V, X>() || ... || false);
}
template <class V, class E>
constexpr bool reads_elements() {
    using P = std::remove_cvref_t<E>;
    if constexpr (is_tensor_view<P>::value) return std::is_same_v<std::remove_const_t<typename P::value_type>, V>;
    else if constexpr (requires { &P::operands; }) return any_reads_elements<V>(static_cast<const decltype(P::operands)*>(nullptr));
    else return false;
}
// ... or a ds::map (which has no derivative).
template <class E>
inline constexpr bool is_map_node = false;
template <class S, class F, class... X>
inline constexpr bool is_map_node<expr::map<S, F, X...>> = true;
template <class E>
constexpr bool reads_map();
template <class... X>
constexpr bool any_reads_map(const expr::operands<X...>*) {
    return (reads_map<X>() || ... || false);
}
template <class E>
constexpr bool reads_map() {
    using P = std::remove_cvref_t<E>;
    if constexpr (is_map_node<P>) return true;
    else if constexpr (requires { &P::operands; }) return any_reads_map(static_cast<const decltype(P::operands)*>(nullptr));
    else return false;
}

// Empty, or why formula F has no gradient with respect to X (op: grad or vjp).
template <class F, class X>
constexpr message gradient_error(std::string_view op) {
    message m;
    if constexpr (!(is_tensor<std::remove_cvref_t<X>>::value && std::is_lvalue_reference_v<X>) &&
                  !is_tensor_view<std::remove_cvref_t<X>>::value) {
        m << "dimsum: " << op << ": with respect to a named tensor or a view of one that the formula reads, not a "
          << "formula or a temporary";
    } else if constexpr (!evaluable_element<value_type_of<F>>) {
        m << "dimsum: " << op << ": the formula computes " << type_name<value_type_of<F>>()
          << " values; only a formula of float, double or bf16 has a gradient";
    } else if constexpr (!evaluable_element<std::remove_const_t<value_type_of<X>>>) {
        m << "dimsum: " << op << ": with respect to " << type_name<std::remove_const_t<value_type_of<X>>>()
          << " values: integers and masks carry no gradient";
    } else if constexpr (!reads_elements<std::remove_const_t<value_type_of<X>>, F>()) {
        m << "dimsum: " << op << ": the formula reads no tensor of " << type_name<std::remove_const_t<value_type_of<X>>>()
          << ", so it has no gradient with respect to x " ;
        write_static_shape<shape_of<X>>(m);
    } else if constexpr (reads_map<F>()) {
        m << "dimsum: " << op << ": the formula applies ds::map, which has no derivative: write the function as a "
          << "formula instead";
    }
    return m;
}

template <class F, class X, class C>
auto make_gradient(F&& f, X&& x, C&& cotangent, gradient_options options) {
    using node = expr::gradient<shape_of<X>, expr::held_t<F>, expr::held_t<C>, expr::held_t<X>>;
    auto extents = x.shape();
    return node{{expr::hold(std::forward<F>(f)), expr::hold(std::forward<C>(cotangent)), expr::hold(std::forward<X>(x))},
                extents, options};
}

}  // namespace detail

// The gradient of f, a formula of no axes (a loss), with respect to x, a tensor or view that f
// reads: a formula of x's shape whose value at each position is d f / d x there. Where f reads
// x only through masks and comparisons, zeros. Matched when evaluated: the same memory seen
// the same way as f reads it (a std::invalid_argument if f reads another tensor of x's type).
// `options` (gradient_options): as ds::backward's.
template <operand F, class X>
auto grad(F&& f, X&& x, gradient_options options = {}) {
    if constexpr (any_invalid<F, X>) {
        return invalid_expression{};
    } else {
        constexpr message error = detail::gradient_error<F, X>("grad");
        if constexpr (error.length != 0) {
            return fail<error>();
        } else if constexpr (shape_of<F>::rank != 0) {
            constexpr message not_scalar = [] {
                message m;
                m << "dimsum: grad: the formula is of ";
                write_static_shape<shape_of<F>>(m) << ", not a scalar: sum it, or give ds::vjp a cotangent of its shape";
                return m;
            }();
            return fail<not_scalar>();
        } else {
            return detail::make_gradient(std::forward<F>(f), std::forward<X>(x), expr::scalar<value_type_of<F>>{1, {}}, options);
        }
    }
}

// The vector-Jacobian product of f with respect to x: sum over f's positions of
// cotangent * d f / d x, a formula of x's shape. The cotangent is any formula of f's shape
// and element type. grad(f, x) is vjp(f, x, 1) for f of no axes. `options` as grad's.
template <operand F, class X, operand C>
auto vjp(F&& f, X&& x, C&& cotangent, gradient_options options = {}, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    if constexpr (any_invalid<F, X, C>) {
        return invalid_expression{};
    } else {
        constexpr message error = detail::gradient_error<F, X>("vjp");
        constexpr message shapes = detail::conform_error<shape_of<F>, shape_of<C>>("vjp");
        if constexpr (error.length != 0) {
            return fail<error>();
        } else if constexpr (shapes.length != 0) {
            return fail<shapes>();
        } else if constexpr (!std::is_same_v<value_type_of<F>, value_type_of<C>>) {
            return fail<detail::element_type_error<value_type_of<F>, value_type_of<C>>("vjp")>();
        } else {
            auto extents = cotangent.shape().extents();
            if (f.shape().extents() != extents) {
                auto formula_extents = f.shape().extents();
                detail::throw_cannot_store("vjp", {shape_of<C>::axes.data(), extents.data(), shape_of<C>::rank},
                                           {shape_of<F>::axes.data(), formula_extents.data(), shape_of<F>::rank});
            }
            return detail::make_gradient(std::forward<F>(f), std::forward<X>(x), std::forward<C>(cotangent), options);
        }
    }
}

}  // namespace dimsum
