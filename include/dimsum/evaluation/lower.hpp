#pragma once
// Lowering: a formula (expr/ nodes, known only to the user's translation unit) becomes a
// program (program.hpp) of plain steps, the one part of evaluation compiled per formula
// type. Every backend executes programs; none sees a formula's type.

#include <type_traits>

#include "dimsum/core/functors.hpp"
#include "dimsum/evaluation/program.hpp"
#include "dimsum/expr/nodes.hpp"

namespace dimsum::evaluation {

namespace lowering {

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
    s.op = F::code;
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

}  // namespace lowering

// Appends the steps of e to p, operands after it; returns the index of e's step.
template <class T, class E>
std::size_t lower(const E& e, program<T>& p) {
    step<T> s{};
    auto extents = e.shape().extents();
    s.rank = extents.size();
    for (std::size_t i = 0; i < s.rank; ++i) s.extents[i] = extents[i];
    lowering::describe(s, e);
    std::size_t id = p.size();
    p.push_back(s);
    if constexpr (requires { e.operands; }) {
        static_assert(decltype(e.operands)::size <= max_operands, "dimsum: a step holds at most max_operands operands");
    }
    expr::for_each_operand(e, [&p, id](const auto& operand) { lowering::link(p, id, lower<T>(operand, p)); });
    return id;
}

}  // namespace dimsum::evaluation
