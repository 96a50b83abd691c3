#pragma once
// User-defined elementwise functions: ds::map(f, x, ...) applies f to the operands element by
// element, broadcasting them as elementwise arithmetic does. It fuses like any other function
// (into a pass, a GEMM epilogue or an attention score tile); the host backends call f on
// blocks of values, in a loop compiled in the user's translation unit.

#include <type_traits>
#include <utility>

#include "dimsum/ops/elementwise.hpp"

namespace dimsum {

namespace detail {

inline constexpr std::size_t max_map_operands = 3;

template <class... V>
constexpr message& write_type_list(message& m) {
    bool first = true;
    ((m << (first ? "" : ", ") << type_name<V>(), first = false), ...);
    return m;
}

// Empty, or why f cannot be mapped over operands holding V...: f must take them as they are
// and return a number or a mask; floating operands and a floating result share one type.
template <class F, class... V>
constexpr message map_error() {
    message m;
    if constexpr (sizeof...(V) == 0 || sizeof...(V) > max_map_operands) {
        m << "dimsum: map: takes one to " << max_map_operands << " operands, not " << sizeof...(V);
    } else if constexpr (!std::is_invocable_v<const F&, V...>) {
        m << "dimsum: map: f cannot be called as f(";
        write_type_list<V...>(m) << ") (or is not const-callable)";
    } else {
        using R = std::remove_cvref_t<std::invoke_result_t<const F&, V...>>;
        if constexpr (!floating_element<R> && !std::is_same_v<R, bool>) {
            m << "dimsum: map: f returns " << type_name<R>() << "; it must return float, double or bool";
        } else {
            // the floating types among the operands and the result: at most one
            bool mixed = false;
            std::string_view seen = floating_element<R> ? type_name<R>() : std::string_view{};
            auto check = [&](std::string_view name, bool floating) {
                if (!floating) return;
                if (!seen.empty() && seen != name) mixed = true;
                if (seen.empty()) seen = name;
            };
            (check(type_name<V>(), floating_element<V>), ...);
            if (mixed) {
                m << "dimsum: map: operands and result hold different floating types: (";
                write_type_list<V...>(m) << ") -> " << type_name<R>() << "; cast inside f or evaluate first";
            }
        }
    }
    return m;
}

}  // namespace detail

// f applied to the operands element by element: f(x[i...], y[i...], ...), each operand's
// elements passed as its element type (a mask as bool, an integer tensor as its integers),
// the result float, double or bool (a mask). One to three operands, broadcast as in `x + y`.
// f is held by value in the formula; it is called from several threads at once, on blocks of
// values in an unspecified order, so it must not have side effects. Host backends only.
template <class F, operand... A>
    requires (sizeof...(A) >= 1)
auto map(F&& f, A&&... a) {
    if constexpr (any_invalid<A...>) {
        return invalid_expression{};
    } else {
        constexpr message error = detail::map_error<std::decay_t<F>, value_type_of<A>...>();
        using all = detail::broadcast_all<shape_of<A>...>;
        constexpr message shape_mistake = all::error("map");
        if constexpr (error.length != 0) {
            return fail<error>();
        } else if constexpr (shape_mistake.length != 0) {
            return fail<shape_mistake>();
        } else {
            using node = expr::map<typename all::type, std::decay_t<F>, expr::held_t<A>...>;
            auto extents = detail::broadcast_extents("map", a.shape()...);
            return node{std::forward<F>(f), {expr::hold(std::forward<A>(a))...}, extents};
        }
    }
}

}  // namespace dimsum
