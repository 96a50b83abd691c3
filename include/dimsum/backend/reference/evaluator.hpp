#pragma once
// The reference backend: obviously correct, the oracle every fast backend is tested against.
// It stays in the tree.
//
// run(formula, destination) lowers the formula to a program (program.hpp), a tree of steps
// over plain data, and interprets it (interpreter.hpp) with plain loops that accumulate in
// double (long double for double tensors).

#include <type_traits>

#include "dimsum/backend/reference/interpreter.hpp"
#include "dimsum/expr/functors.hpp"
#include "dimsum/expr/nodes.hpp"

namespace dimsum::backend::reference {

namespace detail {

template <class T> inline constexpr bool is_permute = false;
template <class S, auto O, class X> inline constexpr bool is_permute<expr::permute<S, O, X>> = true;
template <class T> inline constexpr bool is_softmax = false;
template <std::size_t I, class X> inline constexpr bool is_softmax<expr::softmax<I, X>> = true;

template <class T> struct node_traits;  // the functor of an elementwise or reduce node
template <class S, class F, class... X> struct node_traits<expr::elementwise<S, F, X...>> { using function = F; };
template <class S, class F, std::size_t I, class X> struct node_traits<expr::reduce<S, F, I, X>> { using function = F; };

// f applied to an array of N values, each passed as f's parameter type (bool for masks).
template <class F, class T, std::size_t... I>
T apply(const T* arguments, std::index_sequence<I...>) {
    if constexpr (std::is_same_v<F, fn::select>) return F{}(arguments[0] != T(0), arguments[1], arguments[2]);
    else return static_cast<T>(F{}(arguments[I]...));
}
template <class F, class T, std::size_t N>
T apply_to(const T* arguments) {
    return apply<F, T>(arguments, std::make_index_sequence<N>{});
}

template <class T, class E>
std::size_t lower(const E& e, program<T>& p);

template <class T>
void link(program<T>& p, std::size_t id, std::size_t operand) {
    p[id].operands[p[id].operand_count++] = operand;
}

// Appends the steps of e to p; returns the index of e's step.
template <class T, class E>
std::size_t lower(const E& e, program<T>& p) {
    step<T> s{};
    auto extents = e.shape().extents();
    s.rank = extents.size();
    for (std::size_t i = 0; i < s.rank; ++i) s.extents[i] = extents[i];
    if constexpr (is_tensor<E>::value || is_tensor_view<E>::value) {
        s.kind = step_kind::tensor;
        if constexpr (is_tensor<E>::value) s.tensor = to_strided(e.view());
        else s.tensor = to_strided(view_of_shape_t<const T, shape_of<E>>(e));
    } else if constexpr (requires { e.value; }) {
        s.kind = step_kind::number;
        s.number = e.value;
    } else if constexpr (std::is_same_v<value_type_of<E>, bool> && decltype(e.operands)::size == 0) {
        s.kind = step_kind::causal_mask;
    } else if constexpr (requires { typename node_traits<E>::function; } && !requires { E::axis; }) {
        s.kind = step_kind::elementwise;
        s.function = &apply_to<typename node_traits<E>::function, T, decltype(e.operands)::size>;
    } else if constexpr (is_permute<E>) {
        s.kind = step_kind::permute;
        for (std::size_t i = 0; i < s.rank; ++i) s.order[i] = E::order[i];
    } else if constexpr (requires { e.index; }) {
        s.kind = step_kind::select;
        s.axis = E::axis;
        s.index = e.index;
    } else if constexpr (is_softmax<E>) {
        s.kind = step_kind::softmax;
        s.axis = E::axis;
    } else if constexpr (requires { E::axis; }) {
        using F = typename node_traits<E>::function;
        s.kind = std::is_same_v<F, fn::sum> ? step_kind::sum : std::is_same_v<F, fn::max> ? step_kind::max : step_kind::mean;
        s.axis = E::axis;
    } else if constexpr (decltype(e.operands)::size == 2) {
        s.kind = step_kind::matmul;
    } else {
        s.kind = step_kind::reshape;
    }
    std::size_t id = p.size();
    p.push_back(s);
    if constexpr (requires { e.operands.first; }) link(p, id, lower<T>(e.operands.first, p));
    if constexpr (requires { e.operands.second; }) link(p, id, lower<T>(e.operands.second, p));
    if constexpr (requires { e.operands.third; }) link(p, id, lower<T>(e.operands.third, p));
    return id;
}

}  // namespace detail

class evaluator {
public:
    // Writes the value of e into dst, a view of e's shape that e does not read.
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        program<T> steps;
        std::size_t root = detail::lower<T>(e, steps);
        interpreter<T>(steps).write(root, to_strided(dst));
    }
};

}  // namespace dimsum::backend::reference
