#pragma once
// Which backend evaluates formulas, and the user-facing eval and assign that use it: the CPU
// backend (SIMD and OpenMP). The reference backend stays selectable, e.g.
// `ds::eval(formula, ds::backend::reference::evaluator{})`.

#include "dimsum/backend/cpu/evaluator.hpp"
#include "dimsum/backend/reference/evaluator.hpp"
#include "dimsum/evaluation/assign.hpp"

#include <string>

namespace dimsum {

using default_backend = backend::cpu::evaluator;

// The value of a formula as a new tensor, e.g. `auto y = ds::eval(ds::matmul(x, w));`.
template <operand E>
auto eval(E&& e) {
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else {
        default_backend backend;
        return evaluation::eval_with(backend, e);
    }
}

// The same on a backend of the caller's choice, e.g. `ds::backend::reference::evaluator{}`.
template <operand E, class Backend>
auto eval(E&& e, Backend backend) {
    if constexpr (is_invalid<E>) return invalid_expression{};
    else return evaluation::eval_with(backend, e);
}

// The plan the default backend follows to evaluate a formula, as text: which kernels it calls,
// what fused into each, which operands are views, what temporaries it needs
// (evaluation/explain.hpp). E.g. `std::cout << ds::explain(attention(q, k, v));`
template <operand E>
std::string explain(const E& e) {
    if constexpr (is_invalid<E>) return std::string{};  // its error has been reported
    else return default_backend{}.explain(e);
}

// The same for a backend of the caller's choice.
template <operand E, class Backend>
std::string explain(const E& e, const Backend& backend) {
    if constexpr (is_invalid<E>) return std::string{};
    else return backend.explain(e);
}

// `ds::explain(formula, ds::explain_detail::passes)`: before the plan, the program as lowered
// and after each program pass, one line a step (evaluation/passes.hpp); on the default backend,
// or on one of the caller's choice given third.
using evaluation::explain_detail;
template <operand E, class Backend = default_backend>
std::string explain(const E& e, explain_detail detail, const Backend& backend = {}) {
    if constexpr (is_invalid<E>) return std::string{};
    else return backend.explain(e, detail);
}

// `dst = formula` and ds::assign (tensor/tensor_view.hpp) evaluate on the default backend.
template <>
struct default_assignment<void> {
    template <class Dst, class E>
    static void run(Dst&& dst, const E& e) {
        if constexpr (!is_invalid<E>) {
            default_backend backend;
            if constexpr (is_tensor<std::remove_cvref_t<Dst>>::value) evaluation::assign_with(backend, dst.view(), e);
            else evaluation::assign_with(backend, dst, e);
        }
    }
};

}  // namespace dimsum
