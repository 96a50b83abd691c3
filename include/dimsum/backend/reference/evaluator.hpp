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

// What each kind of node becomes: one overload per node type.
template <class T, class... A>
void describe(step<T>& s, const tensor<T, A...>& t) {
    s.kind = step_kind::tensor;
    s.tensor = to_strided(t.view());
}
template <class T, class U, class... A>
void describe(step<T>& s, const tensor_view<U, A...>& v) {
    s.kind = step_kind::tensor;
    s.tensor = to_strided(tensor_view<const T, A...>(v));
}
template <class T>
void describe(step<T>& s, const expr::scalar<T>& number) {
    s.kind = step_kind::number;
    s.number = number.value;
}
template <class T, class Q, class K>
void describe(step<T>& s, const expr::causal_mask<Q, K>&) {
    s.kind = step_kind::causal_mask;
}
template <class T, class S, class F, class... X>
void describe(step<T>& s, const expr::elementwise<S, F, X...>&) {
    s.kind = step_kind::elementwise;
    s.function = &apply_to<F, T, sizeof...(X)>;
}
template <class T, class S, auto Order, class X>
void describe(step<T>& s, const expr::permute<S, Order, X>&) {
    s.kind = step_kind::permute;
    for (std::size_t i = 0; i < Order.size(); ++i) s.order[i] = Order[i];
}
template <class T, class S, class X>
void describe(step<T>& s, const expr::reshape<S, X>&) {
    s.kind = step_kind::reshape;
}
template <class T, class S, std::size_t Axis, class X>
void describe(step<T>& s, const expr::select<S, Axis, X>& node) {
    s.kind = step_kind::select;
    s.axis = Axis;
    s.index = node.index;
}
template <class T, class S, class L, class R>
void describe(step<T>& s, const expr::matmul<S, L, R>&) {
    s.kind = step_kind::matmul;
}
template <class T, std::size_t Axis, class X>
void describe(step<T>& s, const expr::softmax<Axis, X>&) {
    s.kind = step_kind::softmax;
    s.axis = Axis;
}
template <class T, std::size_t Axis, class X>
void describe(step<T>& s, const expr::layer_norm<Axis, X>& node) {
    s.kind = step_kind::layer_norm;
    s.axis = Axis;
    s.number = static_cast<T>(node.epsilon);
}
template <class T, class S, class F, std::size_t Axis, class X>
void describe(step<T>& s, const expr::reduce<S, F, Axis, X>&) {
    s.kind = std::is_same_v<F, fn::sum> ? step_kind::sum : std::is_same_v<F, fn::max> ? step_kind::max : step_kind::mean;
    s.axis = Axis;
}

template <class T>
void link(program<T>& p, std::size_t id, std::size_t operand) {
    p[id].operands[p[id].operand_count++] = operand;
}

// Appends the steps of e to p, operands after it; returns the index of e's step.
template <class T, class E>
std::size_t lower(const E& e, program<T>& p) {
    step<T> s{};
    auto extents = e.shape().extents();
    s.rank = extents.size();
    for (std::size_t i = 0; i < s.rank; ++i) s.extents[i] = extents[i];
    describe(s, e);
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
