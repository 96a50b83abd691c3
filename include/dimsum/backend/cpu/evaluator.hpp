#pragma once
// The CPU backend: SIMD kernels run in parallel with OpenMP.
//
// run(formula, destination) lowers the formula to a program of plain steps
// (evaluation/lower.hpp), as the reference backend does, then runs each step with a fast kernel:
//   matmul(softmax(f(matmul(Q, K^T))), V)
//                             -> fused attention (attention.hpp), found by evaluation/attention_pattern.hpp;
//                                unless the evaluator is made with fuse_attention = false;
//   matmul                    -> gemm (gemm.hpp), and when the matmul sits inside an
//                                elementwise formula of its own shape, that formula becomes the
//                                GEMM's epilogue, applied to each block of C while it is in cache;
//   softmax, layer_norm,
//   sum, max, mean            -> the line kernels (rowwise.hpp);
//   elementwise steps         -> one fused pass (fused.hpp) over the result, whose inputs are
//                                tensors, views of them, and the values of the steps above;
//   permute, reshape, select  -> new strides over their operand's value, no copy where the
//                                layout allows.
// Values that must exist in memory live in this thread's temporaries (workspace.hpp), kept
// from one evaluation to the next, so a formula evaluated in a loop allocates nothing after
// its first evaluation.

#include <array>
#include <cstddef>
#include <optional>
#include <vector>

#include "dimsum/evaluation/attention_pattern.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/workspace.hpp"
#include "dimsum/evaluation/lower.hpp"
#include "dimsum/evaluation/step_values.hpp"

// The kernels' definitions, unless they come compiled from dimsum::kernels (kernels.hpp).
#ifndef DIMSUM_PRECOMPILED_KERNELS
#include "dimsum/backend/cpu/attention.hpp"
#include "dimsum/backend/cpu/elementwise.hpp"
#include "dimsum/backend/cpu/fused.hpp"
#include "dimsum/backend/cpu/gemm.hpp"
#include "dimsum/backend/cpu/rowwise.hpp"
#endif

namespace dimsum::backend::cpu {

using evaluation::program;
using evaluation::step;
using evaluation::step_kind;

namespace detail {

// The block function of each elementwise function of a formula, by op code: only these are
// compiled into a header-only build's translation unit (xsimd's exp, tanh and erf are slow to
// compile; a table of all fourteen made examples/multi_head.cpp 1 to 2 s slower to build).
template <class T, class E>
void add_block(const E&, block_table<T>&) {}
template <class T, class S, class F, class... X>
void add_block(const expr::elementwise<S, F, X...>&, block_table<T>& table) {
    table[std::size_t(F::code)] = &apply_to_block<F, T, sizeof...(X)>;
}
template <class T, class E>
void collect_blocks(const E& e, block_table<T>& table) {
    add_block<T>(e, table);
    expr::for_each_operand(e, [&table](const auto& operand) { collect_blocks<T>(operand, table); });
}

// Everything one evaluation needs, kept per thread and element type so that it is allocated
// once: the lowered program, the values of its steps, and the temporaries that hold them.
template <class T>
struct plan {
    program<T> steps;
    block_table<T> blocks{};
    std::vector<strided<const T>> values;
    std::vector<char> computed;
    std::vector<std::size_t> leaves;
    fused_program<T> fused;
    std::size_t in_place_input = 0;  // which of fused.inputs reads the destination (or the scores tile)
    bool fuse_attention = true;

    static plan& of_this_thread() {
        thread_local plan p;
        return p;
    }
};

template <class T>
class executor : public evaluation::step_values<T, executor<T>> {
    using values = evaluation::step_values<T, executor<T>>;
    friend values;
    using values::fresh;
    using values::value;

public:
    explicit executor(plan<T>& p) : values(p.steps, p.values, p.computed), p_(p) {}

    // Writes the value of step `id` into dst, which has that step's extents.
    void write(std::size_t id, const strided<T>& dst) {
        const step<T>& s = p_.steps[id];
        switch (s.kind) {
            case step_kind::matmul:
                if (auto match = attention_at(id)) return attend(*match, dst);
                return multiply(id, dst, nullptr);
            case step_kind::softmax: return cpu::softmax<T>(value(s.operands[0]), dst, s.axis);
            case step_kind::layer_norm: return cpu::layer_norm<T>(value(s.operands[0]), dst, s.axis, s.number);
            case step_kind::sum: return cpu::reduce<fn::sum, T>(value(s.operands[0]), dst, s.axis);
            case step_kind::max: return cpu::reduce<fn::max, T>(value(s.operands[0]), dst, s.axis);
            case step_kind::mean: return cpu::reduce<fn::mean, T>(value(s.operands[0]), dst, s.axis);
            case step_kind::causal_mask: return causal_mask(s, dst);
            case step_kind::permute:
                // A permutation of a value still to be computed (attention's heads, merged back
                // into rows): computed straight into dst seen through the inverse permutation,
                // rather than into a temporary that is then copied.
                if (!evaluation::is_view(p_.steps[s.operands[0]].kind)) return write(s.operands[0], unpermuted(s, dst));
                return write_fused(id, dst);
            case step_kind::tensor: case step_kind::number: case step_kind::elementwise: case step_kind::reshape:
            case step_kind::select:
                return write_fused(id, dst);  // a fused pass, or a copy of a view
        }
    }

private:
    std::optional<evaluation::attention_match<T>> attention_at(std::size_t id) const {
        if (!p_.fuse_attention) return std::nullopt;
        return evaluation::match_attention(p_.steps, id);
    }

    // dst, which has the permute step s's axes, seen with its operand's axes.
    static strided<T> unpermuted(const step<T>& s, const strided<T>& dst) {
        strided<T> inner = dst;
        for (std::size_t i = 0; i < s.rank; ++i) {
            inner.extents[s.order[i]] = dst.extents[i];
            inner.strides[s.order[i]] = dst.strides[i];
        }
        return inner;
    }

    // Memory for a step's value: this evaluation's temporaries.
    T* allocate(std::size_t count) { return thread_temporaries().template allocate<T>(count); }

    static void causal_mask(const step<T>& s, const strided<T>& dst) {
        for (std::size_t q = 0; q < s.extents[0]; ++q) {
            for (std::size_t k = 0; k < s.extents[1]; ++k) {
                auto at = static_cast<std::ptrdiff_t>(q) * dst.strides[0] + static_cast<std::ptrdiff_t>(k) * dst.strides[1];
                dst.data[at] = evaluation::in_future(q, k, s.extents[0], s.extents[1]) ? T(1) : T(0);
            }
        }
    }

    // The steps an elementwise formula rooted at `id` reads as inputs, in evaluation order.
    void find_leaves(std::size_t id, std::vector<std::size_t>& leaves) const {
        const step<T>& s = p_.steps[id];
        if (s.kind == step_kind::elementwise) {
            for (std::size_t o = 0; o < s.operand_count; ++o) find_leaves(s.operands[o], leaves);
        } else if (s.kind != step_kind::number) {
            leaves.push_back(id);
        }
    }

    // Appends the fused nodes of step `id` to p_.fused; returns the index of its node. The
    // step `in_place`, if any, reads the destination itself (the GEMM epilogue's C).
    std::size_t add_nodes(std::size_t id, std::size_t in_place, const strided<T>& dst) {
        const step<T>& s = p_.steps[id];
        fused_node<T> node;
        if (s.kind == step_kind::elementwise) {
            node.what = fused_node<T>::kind::function;
            node.function = p_.blocks[std::size_t(s.op)];
            node.operand_count = s.operand_count;
            for (std::size_t o = 0; o < s.operand_count; ++o) node.operands[o] = add_nodes(s.operands[o], in_place, dst);
        } else if (s.kind == step_kind::number) {
            node.what = fused_node<T>::kind::constant;
            node.value = s.number;
        } else {
            node.what = fused_node<T>::kind::input;
            node.input = p_.fused.inputs.size();
            if (id == in_place) p_.in_place_input = node.input;
            strided<const T> v = id == in_place ? strided<const T>{dst.data, dst.rank, dst.extents, dst.strides} : value(id);
            p_.fused.inputs.push_back(evaluation::broadcast_to_rank(v, dst.rank));
        }
        p_.fused.nodes.push_back(node);
        return p_.fused.nodes.size() - 1;
    }

    // An elementwise formula (or a view, copied): one fused pass, or the epilogue of a matmul.
    void write_fused(std::size_t id, const strided<T>& dst) {
        // pass 1: the inputs' values, which may need kernels of their own
        std::size_t first_leaf = p_.leaves.size();
        find_leaves(id, p_.leaves);
        std::size_t in_place = p_.steps.size();  // none
        for (std::size_t i = first_leaf; i < p_.leaves.size(); ++i) {
            std::size_t leaf = p_.leaves[i];
            const step<T>& s = p_.steps[leaf];
            if (in_place == p_.steps.size() && s.kind == step_kind::matmul && s.rank == dst.rank && s.rank >= 2 &&
                s.extents == dst.extents && leaf != id && !attention_at(leaf)) {
                in_place = leaf;  // computed straight into dst, the rest of the formula its epilogue
                value(s.operands[0]);
                value(s.operands[1]);
            } else {
                value(leaf);
            }
        }
        p_.leaves.resize(first_leaf);
        // pass 2: the fused program (nothing below recurses, so p_.fused is free)
        p_.fused.clear();
        add_nodes(id, in_place, dst);
        if (in_place == p_.steps.size()) run_fused<T>(p_.fused, dst, true);
        else multiply(in_place, dst, &p_.fused);
    }

    struct epilogue_context {
        const fused_program<T>* program;
        strided<T> dst;
    };
    // The box of an array of `shape`'s extents that a kernel's tile covers: batch item `item`
    // (numbered in row-major order over the leading axes), rows [row, row + rows) and columns
    // [col, col + cols).
    static fused_region tile_of(const strided<T>& shape, std::size_t item, std::size_t row, std::size_t col,
                                std::size_t rows, std::size_t cols) {
        fused_region tile;
        const std::size_t r = shape.rank;
        for (std::size_t axis = r - 2; axis-- > 0;) {
            tile.first[axis] = item % shape.extents[axis];
            item /= shape.extents[axis];
            tile.extents[axis] = 1;
        }
        tile.first[r - 2] = row;
        tile.first[r - 1] = col;
        tile.extents[r - 2] = rows;
        tile.extents[r - 1] = cols;
        return tile;
    }

    static void apply_epilogue(const void* context, std::size_t item, std::size_t row, std::size_t col,
                               std::size_t rows, std::size_t cols) {
        const auto& c = *static_cast<const epilogue_context*>(context);
        const fused_region region = tile_of(c.dst, item, row, col, rows, cols);
        run_fused<T>(*c.program, c.dst, false, &region);
    }
    static void reserve_epilogue(const void* context) {
        prepare_fused<T>(*static_cast<const epilogue_context*>(context)->program);
    }

    // The score function's fused program, run on one tile of scores (attention.hpp): its
    // inputs moved to the tile's position, the scores read from the tile itself.
    struct score_context {
        const fused_program<T>* program;
        std::size_t tile_input;
        strided<T> scores;  // the extents of the scores; no data
    };
    static void apply_score_function(const void* context, std::size_t item, std::size_t query, std::size_t key,
                                     std::size_t queries, std::size_t keys, T* tile, std::ptrdiff_t query_stride) {
        const auto& c = *static_cast<const score_context*>(context);
        const std::size_t r = c.scores.rank;
        const fused_region place = tile_of(c.scores, item, query, key, queries, keys);
        strided<T> result{tile, r, place.extents, {}};  // the tile itself: batch axes of extent 1
        result.strides[r - 2] = query_stride;
        result.strides[r - 1] = 1;
        fused_program<T>& local = tile_program();
        local.nodes = c.program->nodes;  // within the capacity reserve_score_function took
        local.inputs = c.program->inputs;
        for (std::size_t i = 0; i < local.inputs.size(); ++i) {
            strided<const T>& input = local.inputs[i];
            if (i == c.tile_input) {
                input = {tile, r, result.extents, result.strides};
                continue;
            }
            for (std::size_t axis = 0; axis < r; ++axis) input.data += static_cast<std::ptrdiff_t>(place.first[axis]) * input.strides[axis];
        }
        run_fused<T>(local, result, false);
    }

    // The score function's program as moved to one tile: per thread, since the team runs tiles at once.
    static fused_program<T>& tile_program() {
        thread_local fused_program<T> local;
        return local;
    }
    static void reserve_score_function(const void* context) {
        const auto& c = *static_cast<const score_context*>(context);
        tile_program().nodes.reserve(c.program->nodes.size());
        tile_program().inputs.reserve(c.program->inputs.size());
        prepare_fused<T>(*c.program);
    }

    // A strided array's last two axes as a matrix (its first element's).
    template <class X>
    static matrix<X> last_two_axes(const strided<X>& s) {
        const std::size_t r = s.rank;
        return {s.data, s.extents[r - 2], s.extents[r - 1], s.strides[r - 2], s.strides[r - 1]};
    }

    // The leading axes of `shape` (all but the last two) and each operand's strides along them;
    // every operand has shape's rank.
    template <class... Operands>
    static batch_layout<sizeof...(Operands)> leading_axes(const strided<T>& shape, const Operands&... operands) {
        batch_layout<sizeof...(Operands)> batch;
        batch.rank = shape.rank - 2;
        for (std::size_t i = 0; i < batch.rank; ++i) {
            batch.extents[i] = shape.extents[i];
            std::size_t o = 0;
            ((batch.strides[o++][i] = operands.strides[i]), ...);
        }
        return batch;
    }

    // dst = the attention `match` describes (attention_pattern.hpp), by the fused kernel.
    void attend(const evaluation::attention_match<T>& match, const strided<T>& dst) {
        const step<T>& scores = p_.steps[match.scores];
        const std::size_t r = dst.rank;
        strided<const T> q = evaluation::broadcast_to_rank(value(scores.operands[0]), r);   // (..., queries, d)
        strided<const T> kt = evaluation::broadcast_to_rank(value(scores.operands[1]), r);  // (..., d, keys)
        strided<const T> v = evaluation::broadcast_to_rank(value(match.values), r);         // (..., keys, dv)
        attention_problem<T> problem;
        problem.q = last_two_axes(q);
        problem.k = transposed(last_two_axes(kt));
        problem.v = last_two_axes(v);
        problem.o = last_two_axes(dst);
        problem.batch = leading_axes(dst, q, kt, v, dst);
        problem.scale = match.scale;
        problem.causal = match.causal;
        score_context context{&p_.fused, 0, {nullptr, r, scores.extents, {}}};
        if (match.score_function != match.scores) {
            // the rest of the score function: its inputs' values first, then its program
            std::size_t first_leaf = p_.leaves.size();
            find_leaves(match.score_function, p_.leaves);
            for (std::size_t i = first_leaf; i < p_.leaves.size(); ++i) {
                if (p_.leaves[i] != match.scores) value(p_.leaves[i]);
            }
            p_.leaves.resize(first_leaf);
            p_.fused.clear();
            add_nodes(match.score_function, match.scores, context.scores);
            context.tile_input = p_.in_place_input;
            problem.scores = {&apply_score_function, &reserve_score_function, &context};
        }
        attention<T>(problem);
    }

    // Drops axis `axis` of s, folding it into the next one (the rows), whose extent becomes
    // `rows`; the strides of the rows stay.
    template <class S>
    static void fold_into_rows(S& s, std::size_t axis, std::size_t rows) {
        for (std::size_t i = axis; i + 1 < s.rank; ++i) {
            s.extents[i] = s.extents[i + 1];
            s.strides[i] = s.strides[i + 1];
        }
        --s.rank;
        s.extents[axis] = rows;
    }

    // (..., batch, m, k) x (k, n), with B the same for every item and the items' rows one
    // after the other in A, in C and in every input of the epilogue, is one taller product
    // (batch m, k) x (k, n): B is then packed once for all rows, instead of being read again
    // for each item (x W for x of (batch, seq, model) is the common case). Folds the
    // innermost batch axes while that holds.
    static void fold_batch_into_rows(strided<const T>& a, strided<const T>& b, strided<T>& c,
                                     std::vector<strided<const T>>* inputs) {
        while (c.rank > 2) {
            const std::size_t axis = c.rank - 3, m = c.extents[axis + 1];
            const auto rows_continue = [&](const auto& s) {
                return c.extents[axis] == 1 || s.strides[axis] == s.strides[axis + 1] * static_cast<std::ptrdiff_t>(m);
            };
            bool folds = (b.strides[axis] == 0 || c.extents[axis] == 1) && a.extents[axis + 1] == m && rows_continue(a) &&
                         rows_continue(c);
            for (std::size_t i = 0; folds && inputs && i < inputs->size(); ++i) folds = rows_continue((*inputs)[i]);
            if (!folds) return;
            const std::size_t rows = c.extents[axis] * m;
            fold_into_rows(a, axis, rows);
            fold_into_rows(c, axis, rows);
            for (std::size_t i = axis; i + 1 < b.rank; ++i) {  // B: the batch axis simply goes
                b.extents[i] = b.extents[i + 1];
                b.strides[i] = b.strides[i + 1];
            }
            --b.rank;
            for (std::size_t i = 0; inputs && i < inputs->size(); ++i) fold_into_rows((*inputs)[i], axis, rows);
        }
    }

    // dst = the matmul step `id`, then `epilogue` (a fused program reading dst) over it.
    void multiply(std::size_t id, const strided<T>& destination, fused_program<T>* epilogue) {
        const step<T>& s = p_.steps[id];
        strided<const T> a = evaluation::broadcast_to_rank(value(s.operands[0]), s.rank);
        strided<const T> b = evaluation::broadcast_to_rank(value(s.operands[1]), s.rank);
        strided<T> dst = destination;
        fold_batch_into_rows(a, b, dst, epilogue ? &epilogue->inputs : nullptr);
        gemm_problem<T> problem;
        problem.a = last_two_axes(a);
        problem.b = last_two_axes(b);
        problem.c = last_two_axes(dst);
        problem.batch = leading_axes(dst, a, b, dst);
        if (!epilogue) return gemm<T>(problem);
        epilogue_context context{epilogue, dst};
        gemm<T>(problem, gemm_epilogue{&apply_epilogue, &reserve_epilogue, &context});
    }

    plan<T>& p_;
};

}  // namespace detail

class evaluator {
public:
    // Whether attention formulas run fused (attention.hpp) or step by step, as written.
    bool fuse_attention = true;

    // Writes the value of e into dst, a view of e's shape that e does not read.
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        auto& p = detail::plan<T>::of_this_thread();
        p.fuse_attention = fuse_attention;
        temporaries& memory = thread_temporaries();
        try {
            p.steps.clear();
            std::size_t root = evaluation::lower<T>(e, p.steps);
            detail::collect_blocks<T>(e, p.blocks);
            detail::executor<T>(p).write(root, evaluation::to_strided(dst));
        } catch (...) {
            memory.abandon();  // the thread as it was before, whatever failed
            throw;
        }
        memory.finish();
    }
};

// The bytes of intermediate values that the calling thread's last evaluation of a formula over
// T held: e.g. whether attention ran without its queries x keys matrix.
template <class T>
std::size_t last_temporary_bytes() {
    return thread_temporaries().last_total();
}

}  // namespace dimsum::backend::cpu
