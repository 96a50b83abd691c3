#pragma once
// Finds attention in a lowered program (program.hpp): the steps of
//     matmul(softmax(f(matmul(Q, K^T))), V)        softmax along the keys,
// where f, the score function, is any elementwise formula of the scores of the same shape.
// The program pass recognise_attention (passes.hpp) makes it one attention step, and the
// planner (plan.hpp) one `attention` entry, which a backend runs as a fused kernel that never
// holds the queries x keys matrix. Two parts of f are taken out for the kernel to do itself,
// however the user spells them:
//   - a causal mask applied last, masked_fill(s, causal_mask(...), -infinity), so that the
//     kernel can skip the tiles above the diagonal;
//   - then, if what is left is the scores times or divided by a number, that number (the
//     scale: `* 0.125f`, `/ std::sqrt(64.0f)`, `0.125f *`).
// Anything else left of f (an additive mask, a padding mask, a bias) stays a formula, which
// the kernel applies to each tile of scores as a fused elementwise pass.

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include "dimsum/evaluation/program.hpp"

namespace dimsum::evaluation {

// Whether step s applies the elementwise function `op`.
inline bool applies(const step& s, op_code op) {
    return s.kind == step_kind::elementwise && s.op == op;
}

// Whether step s can be the scores Q K^T of attention weights of `weights`' extents: a
// matmul of those extents (not one that the score function broadcasts).
inline bool is_scores(const step& s, const step& weights) {
    return s.kind == step_kind::matmul && s.rank == weights.rank && s.extents == weights.extents;
}

// The first scores (is_scores) inside the elementwise formula rooted at `id`.
inline std::optional<std::size_t> find_scores(const std::vector<step>& steps, std::size_t id, const step& weights) {
    const step& s = steps[id];
    if (is_scores(s, weights)) return id;
    if (s.kind != step_kind::elementwise) return std::nullopt;
    for (std::size_t o = 0; o < s.operand_count; ++o) {
        if (auto found = find_scores(steps, s.operands[o], weights)) return found;
    }
    return std::nullopt;
}

// The attention rooted at matmul step `id`, if it is one.
inline std::optional<attention_match> match_attention(const std::vector<step>& steps, std::size_t id) {
    const step& outer = steps[id];
    if (outer.kind != step_kind::matmul || outer.rank < 2) return std::nullopt;
    const step& weights = steps[outer.operands[0]];
    if (weights.kind != step_kind::softmax || weights.axis != weights.rank - 1 || weights.rank != outer.rank) {
        return std::nullopt;
    }
    attention_match match;
    match.values = outer.operands[1];
    std::size_t f = weights.operands[0];

    // a causal mask applied last: where(causal_mask, -infinity, rest)
    const step& last = steps[f];
    if (applies(last, op_code::where)) {
        const step& mask = steps[last.operands[0]];
        const step& fill = steps[last.operands[1]];
        const std::size_t r = weights.rank;
        if (mask.kind == step_kind::causal_mask && mask.extents[0] == weights.extents[r - 2] &&
            mask.extents[1] == weights.extents[r - 1] && fill.kind == step_kind::number &&
            fill.number == -std::numeric_limits<double>::infinity()) {
            match.causal = true;
            f = last.operands[2];
        }
    }
    // the scores, perhaps scaled by a number
    const step& rest = steps[f];
    auto number = [&](std::size_t operand) { return steps[rest.operands[operand]].kind == step_kind::number; };
    auto scores = [&](std::size_t operand) { return is_scores(steps[rest.operands[operand]], weights); };
    if (is_scores(rest, weights)) {
        match.scores = match.score_function = f;
    } else if (applies(rest, op_code::multiply) && ((scores(0) && number(1)) || (number(0) && scores(1)))) {
        std::size_t s = scores(0) ? 0 : 1;
        match.scores = match.score_function = rest.operands[s];
        match.scale = steps[rest.operands[1 - s]].number;
    } else if (applies(rest, op_code::divide) && scores(0) && number(1)) {
        match.scores = match.score_function = rest.operands[0];
        match.scale = steps[rest.operands[1]].number;
        match.divides = true;
    } else if (auto found = find_scores(steps, f, weights); found && rest.kind == step_kind::elementwise) {
        match.scores = *found;
        match.score_function = f;
    } else {
        return std::nullopt;
    }
    return match;  // the scores have the weights' rank, which is the outer product's
}

}  // namespace dimsum::evaluation

namespace dimsum::evaluation {

// The factor the scores are multiplied by, in the element type T.
template <class T>
T scale_of(const attention_match& match) {
    return match.divides ? T(1) / static_cast<T>(match.scale) : static_cast<T>(match.scale);
}

}  // namespace dimsum::evaluation
