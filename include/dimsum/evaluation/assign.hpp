#pragma once
// The one place where a formula meets a backend: `eval` makes a tensor of a formula and
// `assign` stores a formula into existing memory, copying through a temporary when the
// formula reads the memory it writes. A backend provides one call,
//     backend.run(formula, destination_view)
// which writes the formula's value into a view of exactly the formula's shape that the
// formula does not read.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <tuple>

#include "dimsum/core/element_type.hpp"
#include "dimsum/expr/expression.hpp"
#include "dimsum/shape/conform.hpp"

namespace dimsum::evaluation {

// Calls f with a read-only view of every tensor the formula reads.
template <class E, class F>
void for_each_tensor(const E& e, F&& f) {
    if constexpr (is_tensor_view<E>::value) f(e);
    else if constexpr (is_tensor<E>::value) f(e.view());
    else std::apply([&](const auto&... operand) { (for_each_tensor(operand, f), ...); }, e.operands);
}

// The bytes a view can reach, as [first, last); empty for an empty view.
template <class V>
std::pair<std::uintptr_t, std::uintptr_t> reach(const V& v) {
    if (v.size() == 0) return {0, 0};
    std::ptrdiff_t low = 0, high = 0;
    for (std::size_t i = 0; i < V::rank; ++i) {
        std::ptrdiff_t r = static_cast<std::ptrdiff_t>(v.extent(i) - 1) * v.strides()[i];
        (r < 0 ? low : high) += r;
    }
    auto base = reinterpret_cast<std::uintptr_t>(v.data());
    using T = typename V::value_type;
    return {base + static_cast<std::uintptr_t>(low * std::ptrdiff_t(sizeof(T))),
            base + static_cast<std::uintptr_t>((high + 1) * std::ptrdiff_t(sizeof(T)))};
}

template <class E, class V>
bool reads_memory_of(const E& e, const V& dst) {
    auto [first, last] = reach(dst);
    bool overlap = false;
    for_each_tensor(e, [&](const auto& v) {
        auto [f, l] = reach(v);
        overlap = overlap || (f < last && first < l);
    });
    return overlap;
}

template <class Backend, class E>
auto eval_with(Backend& backend, const E& e) {
    tensor_of_shape_t<value_type_of<E>, shape_of<E>> result(e.shape());
    backend.run(e, result.view());
    return result;
}

template <class Backend, class V, class E>
void assign_with(Backend& backend, const V& dst, const E& e) {
    using target_shape = shape_of<E>;
    constexpr message shapes_error = detail::conform_error<shape_of<V>, target_shape>("assign");
    if constexpr (shapes_error.length != 0) {
        fail<shapes_error>();
    } else if constexpr (!std::is_same_v<value_type_of<V>, value_type_of<E>>) {
        fail<detail::element_type_error<value_type_of<V>, value_type_of<E>>("assign")>();
    } else {
        if (dst.shape().extents() != e.shape().extents()) {
            message m;
            m << "dimsum: assign: cannot store " << e.shape() << " in " << dst.shape();
            throw shape_error(m);
        }
        view_of_shape_t<value_type_of<V>, target_shape> target(dst.data(), e.shape(), dst.strides());
        if (reads_memory_of(e, dst)) {
            auto copy = eval_with(backend, e);
            backend.run(std::as_const(copy).view(), target);
        } else {
            backend.run(e, target);
        }
    }
}

}  // namespace dimsum::evaluation
