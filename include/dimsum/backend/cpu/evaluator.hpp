#pragma once
// The CPU backend: SIMD kernels run in parallel by the thread team (runtime/thread_team.hpp).
//
// run(formula, destination) lowers the formula (evaluation/lower.hpp) and collects the block
// functions of its elementwise functions: the two steps that depend on the formula, compiled
// in the caller's translation unit. The rest does not: plan_and_run plans the program
// (evaluation/plan.hpp) and runs each entry of the plan by its kernel (executor.hpp), compiled
// once in dimsum::kernels where the program links it, else here with the kernels.

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/workspace.hpp"
#include "dimsum/core/index_error.hpp"  // what an evaluation throws for an id out of range
#include "dimsum/evaluation/explain.hpp"
#include "dimsum/evaluation/lower.hpp"
#include "dimsum/runtime/member_memory.hpp"

// The executor's and the kernels' definitions, unless they come compiled from dimsum::kernels.
#ifndef DIMSUM_PRECOMPILED_KERNELS
#include "dimsum/backend/cpu/executor.hpp"
#endif

namespace dimsum::backend::cpu {

namespace detail {

// The block function of each elementwise function of a formula, by op code: only these are
// compiled into a header-only build's translation unit (xsimd's exp, tanh and erf are slow to
// compile; a table of all fourteen made examples/multi_head.cpp 1 to 2 s slower to build). A
// program that links dimsum::kernels takes the table of all, compiled there once.
template <class T, class E>
void add_block(const E&, block_table<T>&) {}
template <class T, class S, class F, class... X>
void add_block(const expr::elementwise<S, F, X...>&, block_table<T>& table) {
    table[std::size_t(F::code)] = &apply_to_block<F, T, sizeof...(X)>;
}
template <class T, class X>
void add_block(const expr::cast<bf16, X>&, block_table<T>& table) {
    table[std::size_t(op_code::round_bf16)] = &apply_to_block<fn::round_bf16, T, 1>;
}
// A gradient's steps apply functions that its formula does not (the derivatives':
// evaluation/differentiate.hpp): all of them.
template <class T, class S, class F, class C, class L>
void add_block(const expr::gradient<S, F, C, L>&, block_table<T>& table) {
    table = every_block<T>();
}
template <class T, class E>
void collect_blocks([[maybe_unused]] const E& e, block_table<T>& table) {
#ifdef DIMSUM_PRECOMPILED_KERNELS
    if (!table[std::size_t(op_code::add)]) table = every_block<T>();  // on the thread's first evaluation
#else
    add_block<T>(e, table);
    expr::for_each_operand(e, [&table](const auto& operand) { collect_blocks<T>(operand, table); });
#endif
}

}  // namespace detail

class evaluator {
public:
    // Whether attention formulas run fused (attention.hpp), and their gradients by the fused
    // backward (attention_gradient.hpp), or step by step, as written and as differentiated.
    bool fuse_attention = true;

    evaluation::planner_options planning() const {
        return {.fuse_attention = fuse_attention,
                .fuse_epilogues = true,
                .read_packed = true,
                .read_bf16 = true,
                .fuse_attention_backward = fuse_attention,
                .fuse_layer_norm_backward = true};
    }

    // Writes the value of e into dst, a view of e's shape that e does not read. A formula of
    // bf16 computes in float, and its value is rounded into dst by the kernel that computes it,
    // block by block, or else by a last pass (evaluation/plan.hpp).
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        temporaries& memory = thread_temporaries();
        try {
            run_into(e, evaluation::to_strided(dst));
        } catch (...) {
            memory.abandon();  // the thread as it was before, whatever failed
            throw;
        }
        memory.finish();
    }

    // Lowers a program with lower(program, bindings), which sets its root and other roots, then
    // computes the root into `destination` and each of program::other_roots into `others`, in
    // order, planned as one program: the gradients of a parameter struct (nn/gradients.hpp).
    // Every elementwise function's block is at hand: the steps are not a formula's.
    template <class T, class Lower>
    void run_program(Lower&& lower, const evaluation::strided<T>& destination, std::span<const evaluation::strided<T>> others) {
        temporaries& memory = thread_temporaries();
        try {
            auto& s = detail::state<T>::of_this_thread();
            lower(s.program, s.bindings);
            s.blocks = every_block<T>();
            detail::plan_and_run<T>(s, destination.where, evaluation::element_type_of<T>(), static_cast<void*>(destination.data),
                                    planning(), others);
        } catch (...) {
            memory.abandon();
            throw;
        }
        memory.finish();
    }

    // The plan run(e, ...) follows for a new tensor of e's shape, as text (evaluation/explain.hpp).
    template <class E>
    std::string explain(const E& e, evaluation::explain_detail detail = evaluation::explain_detail::plan) const {
        return evaluation::explain_formula<compute_type_t<value_type_of<E>>>(e, planning(), "cpu", detail);
    }

private:
    template <class E, class U>
    void run_into(const E& e, const strided<U>& destination) {
        using T = compute_type_t<U>;
        auto& s = detail::state<T>::of_this_thread();
        evaluation::lower<T>(e, s.program, s.bindings);
        detail::collect_blocks<T>(e, s.blocks);
        detail::plan_and_run<T>(s, destination.where, evaluation::element_type_of<U>(),
                                static_cast<void*>(destination.data), planning());
    }
};

// The bytes of intermediate values that the calling thread's last evaluation of a formula over
// T held: e.g. whether attention ran without its queries x keys matrix.
template <class T>
std::size_t last_temporary_bytes() {
    return thread_temporaries().last_total();
}

}  // namespace dimsum::backend::cpu
