#pragma once
// The reference backend: obviously correct, the oracle every fast backend is tested against.
// It stays in the tree.
//
// run(formula, destination) lowers the formula (evaluation/lower.hpp), plans it without
// fusion (evaluation/plan.hpp: every matmul, softmax and elementwise pass its own entry) and
// runs the plan with plain loops that accumulate in double (long double for double tensors).
// Planning and running do not depend on the formula: dimsum::kernels holds them compiled for
// float and double (src/kernels.cpp) where the program links it.

#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dimsum/evaluation/convert.hpp"
#include "dimsum/evaluation/explain.hpp"
#include "dimsum/evaluation/lower.hpp"
#include "dimsum/evaluation/plan.hpp"

namespace dimsum::backend::reference {

// Plans the program without fusion and runs the plan into `destination`, and the values of
// program::other_roots into `others` (interpreter.hpp).
template <class T>
void plan_and_interpret(evaluation::program& p, const std::vector<evaluation::binding>& bindings,
                        const evaluation::strided<T>& destination, const evaluation::planner_options& options,
                        std::span<const evaluation::strided<T>> others = {});

}  // namespace dimsum::backend::reference

#ifndef DIMSUM_PRECOMPILED_KERNELS
#include "dimsum/backend/reference/interpreter.hpp"
#endif

namespace dimsum::backend::reference {

class evaluator {
public:
    static constexpr evaluation::planner_options planning{false, false};

    // What a formula of T is computed in here: double for bf16 (the oracle rounds once, from
    // double), else T.
    template <class T>
    using computes_in = std::conditional_t<std::is_same_v<T, bf16>, double, T>;

    // Writes the value of e into dst, a view of e's shape that e does not read. A formula of bf16
    // is computed in double from the bf16 values, then rounded once into dst.
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        if constexpr (std::is_same_v<T, bf16>) {
            tensor<computes_in<T>, A...> wide(dst.shape());
            run(e, wide.view());
            evaluation::round_into<computes_in<T>>(evaluation::to_strided(std::as_const(wide).view()),
                                                   evaluation::to_strided(dst));
        } else {
            run_computing(e, dst);
        }
    }

    // Lowers a program with lower(program, bindings), which sets its root and other roots, then
    // computes the root into `destination` and each of program::other_roots into `others`, in
    // order, planned as one program (nn/gradients.hpp).
    template <class T, class Lower>
    void run_program(Lower&& lower, const evaluation::strided<T>& destination, std::span<const evaluation::strided<T>> others) {
        evaluation::program program;
        std::vector<evaluation::binding> bindings;
        lower(program, bindings);
        plan_and_interpret<T>(program, bindings, destination, planning, others);
    }

    // The plan run(e, ...) follows for a new tensor of e's shape, as text (evaluation/explain.hpp).
    template <class E>
    std::string explain(const E& e, evaluation::explain_detail detail = evaluation::explain_detail::plan) const {
        return evaluation::explain_formula<computes_in<value_type_of<E>>>(e, planning, "reference", detail);
    }

private:
    template <class E, class T, class... A>
    void run_computing(const E& e, const tensor_view<T, A...>& dst) {
        evaluation::program program;
        std::vector<evaluation::binding> bindings;
        evaluation::lower<T>(e, program, bindings);
        plan_and_interpret<T>(program, bindings, evaluation::to_strided(dst), planning);
    }
};

}  // namespace dimsum::backend::reference
