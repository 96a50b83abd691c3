#pragma once
// The one place where a formula meets a backend: `eval` makes a tensor of a formula and
// `assign` stores a formula into existing memory, copying through a temporary when the
// formula reads the memory it writes. A backend provides one call,
//     backend.run(formula, destination_view)
// which writes the formula's value into a view of exactly the formula's shape that the
// formula does not read.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "dimsum/core/element_type.hpp"
#include "dimsum/expr/nodes.hpp"
#include "dimsum/shape/conform.hpp"

namespace dimsum::evaluation {

// The bytes a view can reach, as [first, last); empty for an empty view.
struct byte_range {
    std::uintptr_t first = 0, last = 0;
    bool overlaps(const byte_range& other) const { return first < other.last && other.first < last; }
};

template <class V>
byte_range reach_of(const V& v) {
    auto extents = v.shape().extents();
    auto range = detail::reach(extents.data(), v.strides().data(), V::rank);
    if (!range) return {0, UINTPTR_MAX};  // unknowable (an unchecked view): overlaps everything
    auto [low, high] = *range;
    auto base = reinterpret_cast<std::uintptr_t>(v.data());
    std::ptrdiff_t size = sizeof(typename V::value_type);
    return {base + static_cast<std::uintptr_t>(low * size), base + static_cast<std::uintptr_t>(high * size)};
}

// Whether any tensor the formula reads overlaps `target`.
template <class E>
bool reads(const E& e, const byte_range& target) {
    if constexpr (is_tensor_view<E>::value) return reach_of(e).overlaps(target);
    else if constexpr (is_tensor<E>::value) return reach_of(e.view()).overlaps(target);
    else if constexpr (packed_leaf<E>) return reach_of(e.values()).overlaps(target);
    else if constexpr (device_leaf<E>) return reach_of(e.device_memory()).overlaps(target);  // addresses never shared with the host
    bool hit = false;
    expr::for_each_operand(e, [&hit, &target](const auto& operand) { hit = hit || reads(operand, target); });
    return hit;
}

template <class>
inline constexpr fixed_string computes_in_floats{
    "dimsum: formulas compute in float or double (bf16 in float): a formula of integers (ids, lengths) is read by comparisons and "
    "gather, not evaluated on its own"};

template <class>
inline constexpr fixed_string reads_gpu_memory{
    "dimsum: this formula reads GPU memory (a cuda::tensor or a view of one), which this backend cannot: evaluate it "
    "with ds::backend::cuda::evaluator, or copy it to the host first (cuda::to_host)"};

// Whether Backend reads device memory (says so with `static constexpr bool reads_device_memory = true`).
template <class Backend>
inline constexpr bool backend_reads_device_memory = requires { requires Backend::reads_device_memory; };

template <class Backend, class E>
auto eval_with(Backend& backend, const E& e) {
    if constexpr (expr::reads_device_memory<E>() && !backend_reads_device_memory<Backend>) {
        (void)sizeof(static_shape_error<reads_gpu_memory<E>>);
    } else if constexpr (!evaluable_element<value_type_of<E>>) {
        (void)sizeof(static_shape_error<computes_in_floats<E>>);
    } else {
        tensor_of_shape_t<value_type_of<E>, shape_of<E>> result(e.shape());
        backend.run(e, result.view());
        return result;
    }
}

template <class Backend, class V, class E>
void assign_with(Backend& backend, const V& dst, const E& e) {
    using target_shape = shape_of<E>;
    constexpr message shapes_error = detail::conform_error<shape_of<V>, target_shape>("assign");
    if constexpr (shapes_error.length != 0) {
        fail<shapes_error>();
    } else if constexpr (!std::is_same_v<value_type_of<V>, value_type_of<E>>) {
        fail<detail::element_type_error<value_type_of<V>, value_type_of<E>>("assign")>();
    } else if constexpr (expr::reads_device_memory<E>() && !backend_reads_device_memory<Backend>) {
        (void)sizeof(static_shape_error<reads_gpu_memory<E>>);
    } else if constexpr (!evaluable_element<value_type_of<E>>) {
        (void)sizeof(static_shape_error<computes_in_floats<E>>);
    } else {
        auto extents = e.shape().extents();
        if (dst.shape().extents() != extents) {
            auto dst_extents = dst.shape().extents();
            detail::throw_cannot_store("assign", {target_shape::axes.data(), extents.data(), target_shape::rank},
                                       {shape_of<V>::axes.data(), dst_extents.data(), shape_of<V>::rank});
        }
        const auto target = [&] {
            if constexpr (device_leaf<V>) return dst.with_shape(e.shape());  // device memory stays typed so
            else return view_of_shape_t<value_type_of<V>, target_shape>(dst.data(), e.shape(), dst.strides());
        }();
        if (reads(e, reach_of(dst))) {
            auto copy = eval_with(backend, e);
            backend.run(std::as_const(copy).view(), target);
        } else {
            backend.run(e, target);
        }
    }
}

}  // namespace dimsum::evaluation
