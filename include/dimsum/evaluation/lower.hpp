#pragma once
// Lowering: a formula (expr/ nodes, known only to the user's translation unit) becomes a
// program (program.hpp) of plain steps and the bindings of its tensors, the one part of
// evaluation compiled per formula type. Every backend executes programs; none sees a
// formula's type.

#include <type_traits>
#include <utility>

#include "dimsum/core/element_type.hpp"
#include "dimsum/core/functors.hpp"
#include "dimsum/evaluation/differentiate.hpp"
#include "dimsum/evaluation/program.hpp"
#include "dimsum/evaluation/strided.hpp"
#include "dimsum/expr/nodes.hpp"

namespace dimsum::evaluation {

namespace lowering {

// What each kind of node becomes: one overload per node type, T the program's type.
// A tensor's memory becomes a binding: the same one wherever the formula reads it again. Its
// step holds the tensor's own type U (an integer tensor is read converted, or by gather).
template <class U>
void add_binding(step& s, std::vector<binding>& bindings, const strided<const U>& memory, const void* packed = nullptr,
                 bool on_device = false) {
    const binding b{memory.data, element_type_of<U>(), memory.where, packed, on_device};
    s.kind = step_kind::tensor;
    s.type = b.type;
    for (s.binding = 0; s.binding < bindings.size(); ++s.binding) {
        binding& same = bindings[s.binding];
        if (same.data == b.data && same.type == b.type && same.where == b.where && same.on_device == b.on_device) {
            if (!same.packed) same.packed = packed;  // the same values: either reader may use the packing
            return;
        }
    }
    bindings.push_back(b);
}

template <class T, class U, class... A>
void describe(step& s, std::vector<binding>& bindings, const tensor<U, A...>& t) {
    lowering::add_binding<U>(s, bindings, to_strided(t.view()));
}
template <class T, class U, class... A>
void describe(step& s, std::vector<binding>& bindings, const tensor_view<U, A...>& v) {
    using V = std::remove_const_t<U>;
    lowering::add_binding<V>(s, bindings, to_strided(tensor_view<const V, A...>(v)));
}
// Its panels, of V's compute type, serve only a program of that type: a formula over double
// that reads a bf16 weight packed once (into float panels) reads its values.
template <class T, packed_leaf P>
void describe(step& s, std::vector<binding>& bindings, const P& leaf) {
    using V = value_type_of<P>;
    const void* panels = std::is_same_v<compute_type_t<V>, T> ? static_cast<const void*>(leaf.packed()) : nullptr;
    lowering::add_binding<V>(s, bindings, to_strided(leaf.values()), panels);
}
template <class T, device_leaf D>
void describe(step& s, std::vector<binding>& bindings, const D& leaf) {
    using V = value_type_of<D>;
    const auto memory = to_strided(leaf.device_memory());
    lowering::add_binding<V>(s, bindings, strided<const V>{memory.data, memory.where}, nullptr, true);
}
template <class T, class U>
void describe(step& s, std::vector<binding>&, const expr::scalar<U>& number) {
    s.kind = step_kind::number;
    s.number = static_cast<double>(number.value);
}
template <class T, class Q, class K>
void describe(step& s, std::vector<binding>&, const expr::causal_mask<Q, K>&) {
    s.kind = step_kind::causal_mask;
}
template <class T, class A, class U>
void describe(step& s, std::vector<binding>&, const expr::arange<A, U>&) {
    s.kind = step_kind::arange;
}
template <class T, class S, class F, class... X>
void describe(step& s, std::vector<binding>&, const expr::elementwise<S, F, X...>&) {
    s.kind = step_kind::elementwise;
    s.op = F::code;
}
// A cast to bf16 rounds (the value stays in T); a cast to float or double is no step at all
// (lower_step).
template <class T, class To, class X>
void describe(step& s, std::vector<binding>&, const expr::cast<To, X>&) {
    static_assert(std::is_same_v<To, bf16>, "dimsum: a cast to float or double is no step (lower_step)");
    s.kind = step_kind::elementwise;
    s.op = op_code::round_bf16;
}
template <class T, class S, class F, class... X>
void describe(step& s, std::vector<binding>&, const expr::map<S, F, X...>&) {
    s.kind = step_kind::elementwise;
    s.op = op_code::map;
}
template <class T, class S, auto Order, class X>
void describe(step& s, std::vector<binding>&, const expr::permute<S, Order, X>&) {
    s.kind = step_kind::permute;
    for (std::size_t i = 0; i < Order.size(); ++i) s.order[i] = Order[i];
}
template <class T, class S, class X>
void describe(step& s, std::vector<binding>&, const expr::reshape<S, X>&) {
    s.kind = step_kind::reshape;
}
template <class T, class S, std::size_t Axis, class X>
void describe(step& s, std::vector<binding>&, const expr::select<S, Axis, X>& node) {
    s.kind = step_kind::select;
    s.axis = Axis;
    s.index = node.index;
}
template <class T, class S, std::size_t Axis, class X>
void describe(step& s, std::vector<binding>&, const expr::slice<S, Axis, X>& node) {
    s.kind = step_kind::slice;
    s.axis = Axis;
    s.index = node.begin;
    s.spacing = node.spacing;
}
template <class T, class S, std::size_t Axis, class A, class B>
void describe(step& s, std::vector<binding>&, const expr::concat<S, Axis, A, B>&) {
    s.kind = step_kind::concat;
    s.axis = Axis;
}
template <class T, class S, std::size_t Axis, class Table, class Ids>
void describe(step& s, std::vector<binding>&, const expr::gather<S, Axis, Table, Ids>&) {
    s.kind = step_kind::gather;
    s.axis = Axis;
}
template <class T, class S, class L, class R>
void describe(step& s, std::vector<binding>&, const expr::matmul<S, L, R>&) {
    s.kind = step_kind::matmul;
}
template <class T, std::size_t Axis, class X>
void describe(step& s, std::vector<binding>&, const expr::softmax<Axis, X>&) {
    s.kind = step_kind::softmax;
    s.axis = Axis;
}
template <class T, std::size_t Axis, class X>
void describe(step& s, std::vector<binding>&, const expr::layer_norm<Axis, X>& node) {
    s.kind = step_kind::layer_norm;
    s.axis = Axis;
    s.number = static_cast<double>(static_cast<T>(node.epsilon));  // as the kernels will see it
}
template <class T, class S, class F, std::size_t Axis, class X>
void describe(step& s, std::vector<binding>&, const expr::reduce<S, F, Axis, X>&) {
    s.kind = std::is_same_v<F, fn::sum> ? step_kind::sum : std::is_same_v<F, fn::max> ? step_kind::max : step_kind::mean;
    s.axis = Axis;
}

// A map node's function for a program over T: the loop over a block, compiled here, in the
// user's translation unit, where f is known (and may be inlined and vectorised). Each operand's
// values are passed as its own element type (a mask as bool, ids as integers).
template <class T, class F, class... X, std::size_t... I>
void map_block(const F& f, std::size_t n, const T* const* in, T* out, std::index_sequence<I...>) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(f(static_cast<value_type_of<X>>(in[I][i])...));
}
template <class T, class S, class F, class... X>
host_function function_of(const expr::map<S, F, X...>& node) {
    host_function h;
    h.callable = &node.function;
    auto apply = [](const void* callable, std::size_t n, const T* const* in, T* out) {
        map_block<T, F, X...>(*static_cast<const F*>(callable), n, in, out, std::index_sequence_for<X...>{});
    };
    if constexpr (std::is_same_v<T, float>) h.on_floats = apply;
    else h.on_doubles = apply;
    return h;
}
template <class E>
inline constexpr bool is_map = false;
template <class S, class F, class... X>
inline constexpr bool is_map<expr::map<S, F, X...>> = true;

// A cast to float or double: the operand lowered in the formula's type, its tensors read
// converted by the planner where they hold another (bf16, integers, float in a formula of
// double, or double in one of float: ops/cast.hpp lets only a tensor or view of double narrow).
template <class E>
inline constexpr bool is_read_converted = false;
template <class To, class X>
inline constexpr bool is_read_converted<expr::cast<To, X>> = !std::is_same_v<To, bf16>;
template <class E>
inline constexpr bool is_gradient = false;
template <class S, class F, class C, class L>
inline constexpr bool is_gradient<expr::gradient<S, F, C, L>> = true;

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_not_read(const step& leaf) {
    message m;
    m << "dimsum: grad: the formula does not read this tensor " << shape_ref{leaf.axes, leaf.extents.data(), leaf.rank}
      << ": a gradient is with respect to a tensor or view the formula reads, the same memory seen the same way";
    throw std::invalid_argument(m.str());
}

template <class E>
inline constexpr bool is_rounding = false;  // cast<bf16>
template <class X>
inline constexpr bool is_rounding<expr::cast<bf16, X>> = true;

}  // namespace lowering

// Appends the steps of e to p, operands first, and the memory of its tensors to `bindings`;
// returns the index of e's step. Every step holds T, but a tensor's, which holds the tensor's
// own type: T is the type the formula computes in (float for a formula of bf16). A sub-formula
// used more than once (the same computation over the same operands: steps are pure) is one
// step, so that the planner computes it once.
template <class T, class E>
std::size_t lower_step(const E& e, program& p, std::vector<binding>& bindings) {
    if constexpr (lowering::is_read_converted<E>) {
        return lower_step<T>(e.operands.first, p, bindings);
    } else if constexpr (lowering::is_gradient<E>) {
        // the leaf, the formula (in which a view of the leaf is views of its step), the
        // cotangent, then the reverse sweep
        const std::size_t leaf = lower_step<T>(e.operands.third, p, bindings);
        p.differentiated.push_back(leaf);
        const std::size_t output = lower_step<T>(e.operands.first, p, bindings);
        p.differentiated.pop_back();
        const std::size_t cotangent = lower_step<T>(e.operands.second, p, bindings);
        const std::size_t gradient = differentiate(p, output, cotangent, p.steps[leaf].binding, e.options);
        if (gradient == no_step) lowering::throw_not_read(p.steps[leaf]);
        return gradient;
    } else {
        step s{};
        s.type = s.computes_in = element_type_of<T>();
        auto extents = e.shape().extents();
        s.rank = extents.size();
        for (std::size_t i = 0; i < s.rank; ++i) s.extents[i] = extents[i];
        s.axes = shape_of<E>::axes.data();
        lowering::describe<T>(s, bindings, e);
        if constexpr (lowering::is_rounding<E>) p.has_casts_to_bf16 = true;
        if constexpr (lowering::is_map<E>) {  // never merged: each map holds its own f
            s.index = p.functions.size();
            p.functions.push_back(lowering::function_of<T>(e));
        }
        if constexpr (requires { e.operands; }) {
            static_assert(decltype(e.operands)::size <= max_operands, "dimsum: a step holds at most max_operands operands");
        }
        expr::for_each_operand(e, [&p, &bindings, &s](const auto& operand) {
            s.operands[s.operand_count++] = lower_step<T>(operand, p, bindings);
        });
        if (s.kind == step_kind::tensor) {  // a view of a tensor a gradient is taken with respect to?
            for (const std::size_t whole : p.differentiated) {
                const std::size_t of = p.steps[whole].binding;
                if (s.binding == of) break;
                const std::size_t view = differentiation::builder(p, s.computes_in).view_within(whole, bindings[of], bindings[s.binding], s);
                if (view != no_step) return view;
            }
        }
        return add_step(p, s);
    }
}

// The program of formula e over T, and its tensors' memory: p and bindings are cleared first
// (and keep their capacity, for a caller that lowers in a loop).
template <class T, class E>
void lower(const E& e, program& p, std::vector<binding>& bindings) {
    p.clear();
    bindings.clear();
    p.root = lower_step<T>(e, p, bindings);
    p.binding_count = bindings.size();
}

}  // namespace dimsum::evaluation
