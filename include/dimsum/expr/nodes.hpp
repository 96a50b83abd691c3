#pragma once
// The formula nodes: plain data, each an operation, its operands and the run-time shape
// computed (and checked) once when the node was built by ops/. Evaluation lives in the
// backends; nothing here loops over elements.

#include <array>
#include <cstddef>
#include <functional>

#include "dimsum/core/gradient_options.hpp"
#include "dimsum/expr/expression.hpp"
#include "dimsum/shape/shape.hpp"

namespace dimsum::expr {

// The operands of a node: a plain aggregate, far cheaper to compile than std::tuple, which
// matters because every distinct formula instantiates its own.
template <class... T>
struct operands;
template <>
struct operands<> {
    static constexpr std::size_t size = 0;
};
template <class A>
struct operands<A> {
    static constexpr std::size_t size = 1;
    A first;
};
template <class A, class B>
struct operands<A, B> {
    static constexpr std::size_t size = 2;
    A first;
    B second;
};
template <class A, class B, class C>
struct operands<A, B, C> {
    static constexpr std::size_t size = 3;
    A first;
    B second;
    C third;
};
template <class A, class B, class C, class D, class... Rest>
struct operands<A, B, C, D, Rest...> {  // any number: the fourth and later in `rest`
    static constexpr std::size_t size = 4 + sizeof...(Rest);
    A first;
    B second;
    C third;
    operands<D, Rest...> rest;
};

template <class... T, class F>
constexpr void for_each_in(const operands<T...>& o, F& f) {
    if constexpr (sizeof...(T) >= 1) f(o.first);
    if constexpr (sizeof...(T) >= 2) f(o.second);
    if constexpr (sizeof...(T) >= 3) f(o.third);
    if constexpr (sizeof...(T) >= 4) for_each_in(o.rest, f);
}

// The one walk over a node's operands: f(operand) for each, in order; nothing for a leaf (a
// tensor or a view, which has no operands).
template <class Node, class F>
constexpr void for_each_operand(const Node& node, F&& f) {
    if constexpr (requires { node.operands; }) for_each_in(node.operands, f);
}

// Whether a formula reads GPU memory (a device_leaf anywhere in it): known at compile time,
// so that a backend of the host refuses it with one error.
template <class E>
constexpr bool reads_device_memory();
template <class... X>
constexpr bool any_reads_device_memory(const operands<X...>*) {
    return (reads_device_memory<X>() || ... || false);
}
template <class E>
constexpr bool reads_device_memory() {
    using P = std::remove_cvref_t<E>;
    if constexpr (device_leaf<P>) return true;
    else if constexpr (requires { &P::operands; }) return any_reads_device_memory(static_cast<const decltype(P::operands)*>(nullptr));
    else return false;
}

// The views (reshape, permute, select, slice) of anything but a named tensor or view are
// formulas, read only: writing into one is this one error, not an overload failure.
template <class>
inline constexpr fixed_string read_only_view{
    "dimsum: assign: a view of a temporary or of a formula is read only: evaluate it into a tensor first, or view a "
    "named tensor"};

// A number broadcast to any shape.
template <class T>
struct scalar {
    using shape_type = ::dimsum::shape<>;
    using value_type = T;
    T value;
    expr::operands<> operands;
    shape_type shape() const { return {}; }
};
// In a formula of bf16, which computes in float, a number keeps float's precision (x * 0.1f
// multiplies by 0.1f, not by 0.1 rounded to bf16), as PyTorch computes bf16 with a scalar.
template <>
struct scalar<bf16> {
    using shape_type = ::dimsum::shape<>;
    using value_type = bf16;
    float value;
    expr::operands<> operands;
    shape_type shape() const { return {}; }
};

// f applied element by element, the operands broadcast to `shape_type`.
template <class Shape, class F, class... Operands>
struct elementwise {
    using shape_type = Shape;
    using value_type = std::remove_cvref_t<decltype(F{}(value_type_of<Operands>{}...))>;
    expr::operands<Operands...> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// The operand's values as element type To (ds::cast): to bf16 from float, the nearest bf16;
// to float or double from bf16 or integers, the same value.
template <class To, class Operand>
struct cast {
    using shape_type = shape_of<Operand>;
    using value_type = To;
    expr::operands<Operand> operands;
    shape_type shape() const { return operands.first.shape(); }
};

// A user's function f applied element by element (ds::map), each operand's elements passed
// as its own element type, the operands broadcast to `shape_type`.
template <class Shape, class F, class... Operands>
struct map {
    using shape_type = Shape;
    using value_type = std::remove_cvref_t<std::invoke_result_t<const F&, value_type_of<Operands>...>>;
    F function;
    expr::operands<Operands...> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// The same elements in row-major order under other axes (split, merge, rename).
template <class Shape, class Operand>
struct reshape {
    using shape_type = Shape;
    using value_type = value_type_of<Operand>;
    expr::operands<Operand> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
    template <class E>
    void operator=(const E&) const { (void)sizeof(static_shape_error<read_only_view<E>>); }
};

// Result axis i is operand axis Order[i].
template <class Shape, auto Order, class Operand>
struct permute {
    using shape_type = Shape;
    using value_type = value_type_of<Operand>;
    static constexpr auto order = Order;
    expr::operands<Operand> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
    template <class E>
    void operator=(const E&) const { (void)sizeof(static_shape_error<read_only_view<E>>); }
};

// The slice at `index` along operand axis Axis, which the result drops.
template <class Shape, std::size_t Axis, class Operand>
struct select {
    using shape_type = Shape;
    using value_type = value_type_of<Operand>;
    static constexpr std::size_t axis = Axis;
    expr::operands<Operand> operands;
    shape_type extents;
    std::size_t index;
    shape_type shape() const { return extents; }
    template <class E>
    void operator=(const E&) const { (void)sizeof(static_shape_error<read_only_view<E>>); }
};

// The positions begin, begin + spacing, ... along operand axis Axis, whose extent in Shape
// says how many.
template <class Shape, std::size_t Axis, class Operand>
struct slice {
    using shape_type = Shape;
    using value_type = value_type_of<Operand>;
    static constexpr std::size_t axis = Axis;
    expr::operands<Operand> operands;
    shape_type extents;
    std::size_t begin, spacing;
    shape_type shape() const { return extents; }
    template <class E>
    void operator=(const E&) const { (void)sizeof(static_shape_error<read_only_view<E>>); }
};

// A and B one after the other along axis Axis (concat, stack): the same axes, the same
// extents but along Axis.
template <class Shape, std::size_t Axis, class A, class B>
struct concat {
    using shape_type = Shape;
    using value_type = value_type_of<A>;
    static constexpr std::size_t axis = Axis;
    expr::operands<A, B> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// Table's slices at the ids along its axis Axis: the result has Table's axes before Axis, then
// the ids' axes, then Table's axes after Axis. Ids is a tensor or view of integers.
template <class Shape, std::size_t Axis, class Table, class Ids>
struct gather {
    using shape_type = Shape;
    using value_type = value_type_of<Table>;
    static constexpr std::size_t axis = Axis;
    expr::operands<Table, Ids> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// (..., m, k) x (..., k, n) -> (..., m, n), leading axes broadcast.
template <class Shape, class Lhs, class Rhs>
struct matmul {
    using shape_type = Shape;
    using value_type = value_type_of<Lhs>;
    expr::operands<Lhs, Rhs> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// exp(x - max) / sum(exp(x - max)) along axis Axis.
template <std::size_t Axis, class Operand>
struct softmax {
    using shape_type = shape_of<Operand>;
    using value_type = value_type_of<Operand>;
    static constexpr std::size_t axis = Axis;
    expr::operands<Operand> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// (x - mean) / sqrt(variance + epsilon) along axis Axis, the biased variance.
template <std::size_t Axis, class Operand>
struct layer_norm {
    using shape_type = shape_of<Operand>;
    using value_type = value_type_of<Operand>;
    static constexpr std::size_t axis = Axis;
    expr::operands<Operand> operands;
    shape_type extents;
    double epsilon;
    shape_type shape() const { return extents; }
};

// Reduction (fn::sum, fn::max, fn::mean) along operand axis Axis, which the result drops.
template <class Shape, class Reduction, std::size_t Axis, class Operand>
struct reduce {
    using shape_type = Shape;
    using value_type = value_type_of<Operand>;
    static constexpr std::size_t axis = Axis;
    expr::operands<Operand> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// The gradient of Formula's value with respect to the values of Leaf (a tensor or view that
// it reads), given that value's cotangent: the number 1 for a scalar Formula (ds::grad), any
// formula of Formula's shape (ds::vjp). Of Leaf's shape; lowering differentiates
// (evaluation/differentiate.hpp), as `options` says.
template <class Shape, class Formula, class Cotangent, class Leaf>
struct gradient {
    using shape_type = Shape;
    using value_type = value_type_of<Formula>;
    expr::operands<Formula, Cotangent, Leaf> operands;
    shape_type extents;
    gradient_options options;
    shape_type shape() const { return extents; }
};

// A lazy boolean (query, key) mask, true where the key lies in the query's future. Queries
// and keys are aligned at their ends: query i sees keys j <= i + (keys - queries), so that
// with fewer queries than keys (decoding) the last query sees every key.
template <class Query, class Key>
struct causal_mask {
    using shape_type = ::dimsum::shape<Query, Key>;
    using value_type = bool;
    expr::operands<> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

// 0, 1, ..., n - 1 along Axis, as values of T: a lazy leaf, like causal_mask.
template <class Axis, class T>
struct arange {
    using shape_type = ::dimsum::shape<Axis>;
    using value_type = T;
    expr::operands<> operands;
    shape_type extents;
    shape_type shape() const { return extents; }
};

}  // namespace dimsum::expr
