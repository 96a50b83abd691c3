#pragma once
// Elementwise arithmetic and functions, between expressions and with scalars, broadcasting
// as in shape/broadcast.hpp.

#include "dimsum/core/functors.hpp"
#include "dimsum/ops/common.hpp"
#include "dimsum/shape/broadcast.hpp"

namespace dimsum {

// A number a formula may meet: a C++ arithmetic value, or a bf16.
template <class T>
concept arithmetic = std::is_arithmetic_v<std::remove_cvref_t<T>> || std::is_same_v<std::remove_cvref_t<T>, bf16>;

namespace detail {

// A scalar argument becomes a rank-0 expression of the element type `T`.
template <class T, class A>
auto as_operand(A&& a) {
    if constexpr (arithmetic<A>) return expr::scalar<T>{static_cast<decltype(expr::scalar<T>::value)>(a), {}};
    else return expr::hold(std::forward<A>(a));
}

template <class S, class... Rest>
struct broadcast_all {
    using type = S;
    static constexpr message error(std::string_view) { return {}; }
};
template <class S, class Next, class... Rest>
struct broadcast_all<S, Next, Rest...> {
    using pair = broadcast<S, Next>;
    using type = typename broadcast_all<typename pair::type, Rest...>::type;
    static constexpr message error(std::string_view op) {
        message m = pair::error(op);
        return m.length ? m : broadcast_all<typename pair::type, Rest...>::error(op);
    }
};

template <class S>
S broadcast_extents(std::string_view, const S& s) {
    return s;
}
template <class S, class Next, class... Rest>
auto broadcast_extents(std::string_view op, const S& s, const Next& next, const Rest&... rest) {
    return broadcast_extents(op, broadcast<S, Next>::extents(s, next, op), rest...);
}

// The one place an elementwise node is built: checks, then holds the operands.
template <class F, class... Operands>
auto make_elementwise(Operands&&... operands) {
    using all = broadcast_all<shape_of<Operands>...>;
    constexpr message error = all::error(F::name);
    if constexpr (error.length != 0) {
        return fail<error>();
    } else {
        using node = expr::elementwise<typename all::type, F, std::remove_cvref_t<Operands>...>;
        auto extents = broadcast_extents(F::name, operands.shape()...);
        return node{{std::forward<Operands>(operands)...}, extents};
    }
}

template <class A, class B>
auto common_element() {
    if constexpr (arithmetic<A> && arithmetic<B>) return std::common_type_t<std::remove_cvref_t<A>, std::remove_cvref_t<B>>{};
    else if constexpr (arithmetic<A>) return value_type_of<B>{};
    else return value_type_of<A>{};
}
// The element type of an operation between A and B, one of which may be a number.
template <class A, class B>
using common_element_t = decltype(common_element<A, B>());

template <class T, class A>
auto element_of() {
    if constexpr (arithmetic<A>) return T{};
    else return value_type_of<A>{};
}

template <class F, class A, class B>
auto binary(A&& a, B&& b) {
    if constexpr (any_invalid<A, B>) {
        return invalid_expression{};
    } else {
        using T = common_element_t<A, B>;
        using TA = decltype(element_of<T, A>());
        using TB = decltype(element_of<T, B>());
        constexpr message error = element_type_error<TA, TB>(F::name);
        if constexpr (error.length != 0) return fail<error>();
        else return make_elementwise<F>(as_operand<T>(std::forward<A>(a)), as_operand<T>(std::forward<B>(b)));
    }
}

template <class F, class A>
auto unary(A&& a) {
    if constexpr (is_invalid<A>) return invalid_expression{};
    else return make_elementwise<F>(expr::hold(std::forward<A>(a)));
}

// Empty, or why an operand of mask logic is not a mask.
template <class... V>
constexpr message mask_operand_error(std::string_view op) {
    message m;
    if constexpr (!(std::is_same_v<V, bool> && ...)) {
        m << "dimsum: " << op << ": takes masks (bool), not";
        ((std::is_same_v<V, bool> ? void() : void(m << ' ' << type_name<V>())), ...);
        m << "; compare first, e.g. x > 0";
    }
    return m;
}

template <class F, class... A>
auto logical(A&&... a) {
    if constexpr (any_invalid<A...>) {
        return invalid_expression{};
    } else {
        constexpr message error = mask_operand_error<value_type_of<A>...>(F::name);
        if constexpr (error.length != 0) return fail<error>();
        else return make_elementwise<F>(expr::hold(std::forward<A>(a))...);
    }
}

}  // namespace detail

// At least one side is an expression; the other may be a number.
template <class A, class B>
concept binary_operands = (operand<A> && operand<B>) || (operand<A> && arithmetic<B>) || (arithmetic<A> && operand<B>);

template <class A, class B> requires binary_operands<A, B>
auto operator+(A&& a, B&& b) { return detail::binary<fn::add>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator-(A&& a, B&& b) { return detail::binary<fn::subtract>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator*(A&& a, B&& b) { return detail::binary<fn::multiply>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator/(A&& a, B&& b) { return detail::binary<fn::divide>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto max(A&& a, B&& b, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    return detail::binary<fn::maximum>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B> requires binary_operands<A, B>
auto min(A&& a, B&& b, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    return detail::binary<fn::minimum>(std::forward<A>(a), std::forward<B>(b));
}
// a to the power b (either may be a number), as std::pow
template <class A, class B> requires binary_operands<A, B>
auto pow(A&& a, B&& b, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    return detail::binary<fn::pow>(std::forward<A>(a), std::forward<B>(b));
}

// Comparisons: masks (bool), true where the comparison holds; false for NaN, but for !=.
template <class A, class B> requires binary_operands<A, B>
auto operator<(A&& a, B&& b) { return detail::binary<fn::less>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator<=(A&& a, B&& b) { return detail::binary<fn::less_equal>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator>(A&& a, B&& b) { return detail::binary<fn::greater>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator>=(A&& a, B&& b) { return detail::binary<fn::greater_equal>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator==(A&& a, B&& b) { return detail::binary<fn::equal>(std::forward<A>(a), std::forward<B>(b)); }
template <class A, class B> requires binary_operands<A, B>
auto operator!=(A&& a, B&& b) { return detail::binary<fn::not_equal>(std::forward<A>(a), std::forward<B>(b)); }

// Logic of masks: both operands masks (bool), e.g. causal_mask(q, k) || padding.
template <operand A, operand B>
auto operator&&(A&& a, B&& b) { return detail::logical<fn::logical_and>(std::forward<A>(a), std::forward<B>(b)); }
template <operand A, operand B>
auto operator||(A&& a, B&& b) { return detail::logical<fn::logical_or>(std::forward<A>(a), std::forward<B>(b)); }
template <operand A>
auto operator!(A&& a) { return detail::logical<fn::logical_not>(std::forward<A>(a)); }

template <operand A> auto operator-(A&& a) { return detail::unary<fn::negate>(std::forward<A>(a)); }
template <operand A> auto exp(A&& a) { return detail::unary<fn::exp>(std::forward<A>(a)); }
template <operand A> auto log(A&& a) { return detail::unary<fn::log>(std::forward<A>(a)); }
template <operand A> auto sqrt(A&& a) { return detail::unary<fn::sqrt>(std::forward<A>(a)); }
template <operand A> auto tanh(A&& a) { return detail::unary<fn::tanh>(std::forward<A>(a)); }
template <operand A> auto abs(A&& a) { return detail::unary<fn::abs>(std::forward<A>(a)); }
template <operand A> auto erf(A&& a) { return detail::unary<fn::erf>(std::forward<A>(a)); }
template <operand A> auto sigmoid(A&& a) { return detail::unary<fn::sigmoid>(std::forward<A>(a)); }
template <operand A> auto silu(A&& a) { return detail::unary<fn::silu>(std::forward<A>(a)); }
template <operand A> auto gelu(A&& a) { return detail::unary<fn::gelu>(std::forward<A>(a)); }
template <operand A> auto sin(A&& a) { return detail::unary<fn::sin>(std::forward<A>(a)); }
template <operand A> auto cos(A&& a) { return detail::unary<fn::cos>(std::forward<A>(a)); }
template <operand A> auto rsqrt(A&& a) { return detail::unary<fn::rsqrt>(std::forward<A>(a)); }

// where(condition, a, b): a where the boolean condition holds, else b; a and b may be numbers.
template <operand C, class A, class B>
    requires (operand<A> || arithmetic<A>) && (operand<B> || arithmetic<B>)
auto where(C&& condition, A&& a, B&& b, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    if constexpr (any_invalid<C, A, B>) {
        return invalid_expression{};
    } else {
        using T = detail::common_element_t<A, B>;
        using TA = decltype(detail::element_of<T, A>());
        using TB = decltype(detail::element_of<T, B>());
        constexpr message error = detail::mask_operand_error<value_type_of<C>>("where condition").length
                                      ? detail::mask_operand_error<value_type_of<C>>("where condition")
                                      : detail::element_type_error<TA, TB>("where");
        if constexpr (error.length != 0) return fail<error>();
        else
            return detail::make_elementwise<fn::where>(expr::hold(std::forward<C>(condition)),
                                                        detail::as_operand<T>(std::forward<A>(a)),
                                                        detail::as_operand<T>(std::forward<B>(b)));
    }
}

// x with `value` wherever the boolean mask holds, e.g. -infinity above a causal diagonal.
template <operand E, operand M, arithmetic V>
auto masked_fill(E&& x, M&& mask, V value, call_site caller = call_site::current()) {
    return dimsum::where(std::forward<M>(mask), value, std::forward<E>(x), caller);
}

}  // namespace dimsum
