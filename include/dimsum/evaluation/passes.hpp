#pragma once
// The program passes: each rewrites a lowered program (program.hpp) into one that computes the
// same value with more of the plan's decisions said as steps, before the planner (plan.hpp)
// places the values in memory. A pass is a function of the program alone: it reads no memory
// and no layout, so that it can be printed (to_text) and tested by itself
// (tests/evaluation/test_plan.cpp). They run in the order of `program_passes`:
//   recognise_attention_backward
//                         the products dQ, dK^T and dV of an attention that differentiation
//                         recorded (program::attention_backwards) -> attention_gradient steps,
//                         which the planner computes as one fused backward;
//   recognise_layer_norm_backward
//                         the gradient of a layer norm's input that differentiation recorded
//                         (program::layer_norm_backwards) -> a layer_norm_gradient step, one
//                         kernel along the axis;
//   recognise_attention   matmul(softmax(f(matmul(Q, K^T))), V), softmax along the keys
//                         -> one attention step (attention_pattern.hpp says what it matches);
//   group_epilogues       an elementwise formula of a product of its own extents, which
//                         nothing else reads -> the product's epilogue (step::epilogue);
//   find_rounded_alone    the operand of a cast<bf16> that nothing else reads -> marked as
//                         dead once rounded (step::rounded_alone).
// A pass leaves the steps it replaced where they are, so that every step keeps its index;
// those no other step reads any more are dead, and to_text marks them so.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "dimsum/evaluation/attention_pattern.hpp"
#include "dimsum/evaluation/program.hpp"

namespace dimsum::evaluation {

struct planner_options {
    bool fuse_attention = true;  // attention as one step (recognise_attention), else matmul, softmax, matmul
    bool fuse_epilogues = true;  // elementwise formulas of a product into its gemm
    bool read_packed = false;    // a product's right operand packed once is read from its packing
    bool read_bf16 = false;      // an operand of bf16 of a product or of attention (a tensor, cast<bf16>
                                 // of a formula, or a view of either) is read as bf16, with no convert
    // with fuse_attention, the gradients of an attention as one fused backward, which reads
    // the log-sum-exps its forward's entry keeps (recognise_attention_backward), else the
    // products and line kernels differentiation made: for a backend whose executor runs
    // attention_backward entries
    bool fuse_attention_backward = false;
    // a layer norm's input's gradient as one line kernel, which reads the input and the
    // cotangent (recognise_layer_norm_backward), else the means and the elementwise formula
    // differentiation made: for a backend whose executor runs the layer_norm_gradient line
    bool fuse_layer_norm_backward = false;
};

// Each matmul that is the outer product of attention becomes an attention step, in place:
// operands Q, K^T and V, and its entry in program::attentions. The scores Q K^T and the score
// function stay as steps, which the attention step reads through that entry; the softmax and
// the old operands are dead unless something else reads them. Steps are visited in order, so
// an attention step is never the scores of another.
inline void recognise_attention(program& p) {
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        const std::optional<attention_match> match = match_attention(p.steps, id);
        if (!match) continue;
        step& s = p.steps[id];
        const step& scores = p.steps[match->scores];
        s.kind = step_kind::attention;
        s.operands = {scores.operands[0], scores.operands[1], match->values};
        s.operand_count = 3;
        s.index = p.attentions.size();
        p.attentions.push_back(*match);
    }
}

// Each gradient product of an attention that differentiation recorded (attention_backward)
// becomes an attention_gradient step, in place: operands Q, K^T and V, the record's index in
// step::index, and which operand's gradient it is in step::axis. The record says what else
// the backward reads (O, dO, the score function); the planner computes the three gradients
// in one entry (plan.hpp: attend_backward), and the steps that computed P, dP and dS for the
// products are dead unless something else reads them.
inline void recognise_attention_backward(program& p) {
    for (std::size_t r = 0; r < p.attention_backwards.size(); ++r) {
        const attention_backward& a = p.attention_backwards[r];
        const step& scores = p.steps[a.forward.scores];
        for (std::size_t which = 0; which < 3; ++which) {
            if (a.gradients[which] == no_step) continue;
            step& s = p.steps[a.gradients[which]];
            s.kind = step_kind::attention_gradient;
            s.operands = {scores.operands[0], scores.operands[1], a.forward.values};
            s.operand_count = 3;
            s.index = r;
            s.axis = which;
        }
    }
}

// Each layer norm's gradient that differentiation recorded (layer_norm_backward) becomes a
// layer_norm_gradient step, in place: operands the layer norm's input and the cotangent of its
// value, its axis and epsilon. Per line, the kernel computes the layer norm again, then
//     dx = (g - mean(g) - y mean(g y)) / sqrt(variance + epsilon),
// the formula the record's step computed, in one pass where the formula took four entries and
// the statistics four more; those steps are dead unless something else reads them.
inline void recognise_layer_norm_backward(program& p) {
    for (const layer_norm_backward& r : p.layer_norm_backwards) {
        const step forward = p.steps[r.forward];
        const step& input = p.steps[forward.operands[0]];
        const step& cotangent = p.steps[r.cotangent];
        if (cotangent.rank != input.rank || cotangent.extents != input.extents) continue;  // a broadcast one: as written
        step& s = p.steps[r.gradient];
        s.kind = step_kind::layer_norm_gradient;
        s.operands = {forward.operands[0], r.cotangent, 0};
        s.operand_count = 2;
        s.axis = forward.axis;
        s.number = forward.number;
    }
}

// The steps an elementwise formula rooted at `id` reads as inputs: every step below it that
// is neither elementwise nor a number, in evaluation order (a step read twice appears twice),
// appended to `leaves`. The planner writes a formula's leaves in this order. With `computed`
// (the planner's): an elementwise step whose value an entry computed already is a leaf too,
// read rather than computed again (a forward value that a gradient's formula reads); with
// `stored` (the planner's stored_placed), so is a cast<bf16> rounded into memory already, id
// itself included: its bf16 values, widened as read, are the cast's value, where computing
// the cast again would compute its operand again (a product, say, dead once rounded:
// find_rounded_alone); with `own` (mark_own_values'), so is one below id that is a value of
// its own.
inline void find_leaves(const std::vector<step>& steps, std::size_t id, std::vector<std::size_t>& leaves,
                        const std::vector<char>* computed = nullptr, const std::vector<char>* own = nullptr,
                        const std::vector<char>* stored = nullptr) {
    auto walk = [&](auto& self, std::size_t at) -> void {
        const step& s = steps[at];
        const bool read = (computed && (*computed)[at]) || (stored && (*stored)[at]) || (own && at != id && (*own)[at]);
        if (s.kind == step_kind::elementwise && !read) {
            for (std::size_t o = 0; o < s.operand_count; ++o) self(self, s.operands[o]);
        } else if (s.kind != step_kind::number) {
            leaves.push_back(at);
        }
    };
    walk(walk, id);
}

// live[id] := whether step id is read by a root, directly or through others (attention's
// scores and score function through program::attentions, its backward's inputs through
// program::attention_backwards).
inline void mark_live(const program& p, std::vector<char>& live) {
    live.assign(p.steps.size(), 0);
    if (p.steps.empty()) return;
    live[p.root] = 1;
    for (const std::size_t root : p.other_roots) live[root] = 1;
    for (std::size_t id = p.steps.size(); id-- > 0;) {  // operands come before their readers
        if (!live[id]) continue;
        const step& s = p.steps[id];
        for (std::size_t o = 0; o < s.operand_count; ++o) live[s.operands[o]] = 1;
        if (s.kind == step_kind::attention) {
            live[p.attentions[s.index].scores] = live[p.attentions[s.index].score_function] = 1;
        } else if (s.kind == step_kind::attention_gradient) {
            const attention_backward& a = p.attention_backwards[s.index];
            live[a.forward.scores] = live[a.forward.score_function] = live[a.output] = live[a.cotangent] = 1;
        }
    }
}

// own[id] := whether step id's value is memory of its own (or a root's) that the formulas
// reading it read: the roots, and the operands of the live steps that are not elementwise
// (kernels, views, joins). A formula that reads one reads its memory rather than computing it
// again inside its own. (Neither a cast<bf16> nor its operand is one: the cast rounds its
// operand as it is computed, and a kernel reads its bf16 value, which the planner places
// apart: a formula computes the float cast again.) `live`: mark_live's, scratch.
inline void mark_own_values(const program& p, std::vector<char>& own, std::vector<char>& live) {
    mark_live(p, live);
    own.assign(p.steps.size(), 0);
    if (p.steps.empty()) return;
    own[p.root] = 1;
    for (const std::size_t root : p.other_roots) own[root] = 1;
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        const step& s = p.steps[id];
        if (!live[id] || s.kind == step_kind::elementwise) continue;
        for (std::size_t o = 0; o < s.operand_count; ++o) {
            if (!rounds_to_bf16(p.steps[s.operands[o]])) own[s.operands[o]] = 1;
        }
    }
}

// How many operand slots of the elementwise formula rooted at `id` read step `leaf`, each of
// its steps counted once. `seen`: one mark per step, all clear, and clear again on return.
inline std::size_t reads_within(const std::vector<step>& steps, std::size_t id, std::size_t leaf, std::vector<char>& seen) {
    std::size_t count = 0;
    auto walk = [&](auto& self, std::size_t at) -> void {
        if (seen[at]) return;
        seen[at] = 1;
        const step& s = steps[at];
        for (std::size_t o = 0; o < s.operand_count; ++o) {
            if (s.operands[o] == leaf) ++count;
            else if (steps[s.operands[o]].kind == step_kind::elementwise) self(self, s.operands[o]);
        }
    };
    walk(walk, id);
    auto unmark = [&](auto& self, std::size_t at) -> void {
        if (!seen[at]) return;
        seen[at] = 0;
        for (std::size_t o = 0; o < steps[at].operand_count; ++o) self(self, steps[at].operands[o]);
    };
    unmark(unmark, id);
    return count;
}

// Each elementwise step whose formula the planner writes whole gets, as step::epilogue, the
// product that computes that formula as its epilogue: the first leaf of the formula
// (find_leaves' order) that is a matmul of the step's extents, of rank 2 or more, which no
// step outside the formula reads (so that its value is needed nowhere else, and a gemm can
// hand each finished block to the formula). The planner fuses it wherever it writes the
// step's formula, unless memory rules that out there (the product computed already, or a
// bf16 destination with gaps). The scores of an attention step are no gemm's: the attention
// kernel computes its score function. The steps keep their kinds and operands: the formula
// still says what its epilogue computes.
inline void group_epilogues(program& p) {
    auto is_product = [](const step& s) { return s.kind == step_kind::matmul && s.rank >= 2; };
    std::vector<std::size_t>& products = p.scratch.products;  // the candidates: few, and often none
    products.clear();
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        if (is_product(p.steps[id])) products.push_back(id);
    }
    if (products.empty()) return;
    std::vector<std::size_t>& readers = p.scratch.readers;
    count_readers(p.steps, readers);
    for (const attention_match& a : p.attentions) readers[a.scores] = no_step;  // never an epilogue's product
    // The formulas the planner writes whole: the values of their own (mark_own_values) and
    // the operands of casts to bf16 (computed, then rounded). A formula inside another is
    // computed inside it: only the outer one is looked at, so that a chain of elementwise steps
    // is walked once; the walks stop at values of their own, which a formula reads.
    std::vector<char>& own = p.scratch.own;
    mark_own_values(p, own, p.scratch.seen);
    std::vector<char>& written = p.scratch.written;
    written = own;
    for (const step& s : p.steps) {
        if (rounds_to_bf16(s)) written[s.operands[0]] = 1;
    }
    p.scratch.seen.assign(p.steps.size(), 0);
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        step& s = p.steps[id];
        if (s.kind != step_kind::elementwise || !written[id]) continue;
        const bool some_fits = std::any_of(products.begin(), products.end(), [&](std::size_t m) {
            return p.steps[m].rank == s.rank && p.steps[m].extents == s.extents;
        });
        if (!some_fits) continue;  // no walk: most formulas of a program
        // the leaves in find_leaves' order, up to the first that qualifies
        auto first_product = [&](auto& self, std::size_t at) -> bool {
            const step& here = p.steps[at];
            if (at != id && own[at]) return false;  // a value of its own: read from its memory
            if (here.kind == step_kind::elementwise) {
                for (std::size_t o = 0; o < here.operand_count; ++o) {
                    if (self(self, here.operands[o])) return true;
                }
                return false;
            }
            if (!is_product(here) || here.rank != s.rank || here.extents != s.extents ||
                reads_within(p.steps, id, at, p.scratch.seen) != readers[at]) {
                return false;
            }
            s.epilogue = at;
            return true;
        };
        first_product(first_product, id);
    }
    // A product that two written formulas read, each through steps of its own (as a forward
    // value and a gradient that read the same sum do, gelu(x W + b) and gelu'(x W + b)), is kept
    // by neither: it is computed once, into a value both read, rather than once in each gemm,
    // or once in one's gemm and again for the other. A formula that reads another written
    // whole reads its memory, or computes it inside its own (a cast of it): either way the
    // product is that formula's, and the walk stops there.
    std::vector<std::size_t>& reached_by = p.scratch.readers;  // the first formula that reads each product
    reached_by.assign(p.steps.size(), no_step);
    std::vector<char>& shared = p.scratch.seen;
    shared.assign(p.steps.size(), 0);
    std::vector<std::size_t>& walked = p.scratch.walked;  // the formula whose walk last passed each step
    walked.assign(p.steps.size(), no_step);
    bool any_shared = false;
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        if (p.steps[id].kind != step_kind::elementwise || !written[id]) continue;
        auto walk = [&](auto& self, std::size_t at) -> void {
            if (walked[at] == id || (at != id && written[at])) return;  // another formula's, counted there
            walked[at] = id;
            const step& here = p.steps[at];
            if (is_product(here)) {
                if (reached_by[at] == no_step) reached_by[at] = id;
                else if (reached_by[at] != id) shared[at] = any_shared = true;
                return;
            }
            if (here.kind != step_kind::elementwise) return;
            for (std::size_t o = 0; o < here.operand_count; ++o) self(self, here.operands[o]);
        };
        walk(walk, id);
    }
    if (!any_shared) return;
    for (step& s : p.steps) {
        if (s.kind == step_kind::elementwise && s.epilogue != no_step && shared[s.epilogue]) s.epilogue = no_step;
    }
}

// Marks, as step::rounded_alone, each value that nothing reads but one cast<bf16>: once
// rounded it is dead, so the planner computes it straight into bf16 (a pass or a line kernel
// writing bf16, a product or attention rounding each block from a scratch shared by all such
// values) rather than keeping it wide. (The root needs no mark: no step reads it, so a bf16
// destination is its one reader.) Where and by which kernel the rounding happens depends on
// memory, and stays the planner's.
inline void find_rounded_alone(program& p) {
    if (!p.has_casts_to_bf16) return;  // the common case: nothing to walk
    std::vector<std::size_t>& readers = p.scratch.readers;
    count_readers(p.steps, readers);
    // an attention's fused backward reads its output O, through its record (a value rounded
    // to bf16 for the products alone would otherwise be rounded dead, and the attention
    // computed again for the backward)
    for (const step& s : p.steps) {
        if (s.kind == step_kind::attention_gradient) ++readers[p.attention_backwards[s.index].output];
    }
    for (const step& s : p.steps) {
        if (rounds_to_bf16(s) && readers[s.operands[0]] == 1) p.steps[s.operands[0]].rounded_alone = true;
    }
}

struct program_pass {
    std::string_view name;
    bool (*runs)(const planner_options&);  // whether the backend asks for it
    void (*rewrite)(program&);
};

inline constexpr program_pass program_passes[] = {
    {"recognise_attention_backward", [](const planner_options& o) { return o.fuse_attention_backward && o.fuse_attention; },
     recognise_attention_backward},
    {"recognise_layer_norm_backward", [](const planner_options& o) { return o.fuse_layer_norm_backward; },
     recognise_layer_norm_backward},
    {"recognise_attention", [](const planner_options& o) { return o.fuse_attention; }, recognise_attention},
    {"group_epilogues", [](const planner_options& o) { return o.fuse_epilogues; }, group_epilogues},
    {"find_rounded_alone", [](const planner_options& o) { return o.read_bf16; }, find_rounded_alone},
};

namespace printing {

inline void shape(std::ostream& out, const step& s) {
    out << '(';
    for (std::size_t i = 0; i < s.rank; ++i) {
        out << (i ? ", " : "");
        if (s.axes && !s.axes[i].name.empty()) out << s.axes[i].name << '=';
        out << s.extents[i];
    }
    out << ')';
}

// What step s computes from its operands, beyond its name: its axis, order, epsilon, ...
inline void parameters(std::ostream& out, const program& p, const step& s) {
    switch (group_of(s.kind)) {
        case step_group::elementwise:
            if (s.epilogue != no_step) out << " [epilogue of s" << s.epilogue << ']';
            break;
        case step_group::memory: case step_group::number: case step_group::indices: break;
        case step_group::view:
            if (s.kind == step_kind::permute) {
                out << " [order";
                for (std::size_t i = 0; i < s.rank; ++i) out << ' ' << s.order[i];
                out << ']';
            }
            if (s.kind == step_kind::select) out << " [axis " << s.axis << ", index " << s.index << ']';
            if (s.kind == step_kind::slice) out << " [axis " << s.axis << ", from " << s.index << ", every " << s.spacing << ']';
            break;
        case step_group::join: case step_group::line:
            out << " [axis " << s.axis;
            if (s.kind == step_kind::layer_norm || s.kind == step_kind::layer_norm_gradient) out << ", epsilon " << s.number;
            if (s.kind == step_kind::embed) out << ", from " << s.index << ", every " << s.spacing;
            out << ']';
            break;
        case step_group::product:
            if (s.kind == step_kind::attention) {
                const attention_match& m = p.attentions[s.index];
                out << " [scores s" << m.scores << ", score_function s" << m.score_function;
                if (m.scale != 1 || m.divides) out << (m.divides ? ", divided by " : ", times ") << m.scale;
                if (m.causal) out << ", causal";
                out << ']';
            }
            if (s.kind == step_kind::attention_gradient) {
                const attention_backward& a = p.attention_backwards[s.index];
                out << " [d" << (s.axis == 0 ? "Q" : s.axis == 1 ? "K^T" : "V") << " of s" << a.output << ", cotangent s"
                    << a.cotangent << ", score_function s" << a.forward.score_function << ", slope " << a.slope;
                if (a.forward.causal) out << ", causal";
                out << ']';
            }
            break;
    }
    if (s.rounded_alone) out << " [rounded alone]";
}

}  // namespace printing

// The program as text, one step a line: `s4 = matmul(s1, s3) (b=2, q=5, k=5) float`: its
// kind (a function's name, a tensor's binding, a number's value), its operands, its
// parameters in brackets, its extents, its element type (and what it computes in where that
// differs); `(dead)` where no root reads it, `<- root` at the root (`<- root 1`, `<- root 2`,
// ... at program::other_roots, whose destinations are 1, 2, ...).
inline std::string to_text(const program& p) {
    std::ostringstream out;
    std::vector<char> live;
    mark_live(p, live);
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        const step& s = p.steps[id];
        out << "  s" << id << " = ";
        if (s.kind == step_kind::tensor) out << "in" << s.binding;
        else if (s.kind == step_kind::number) out << s.number;
        else if (s.kind == step_kind::elementwise) out << name_of(s.op);
        else out << name_of(s.kind);
        if (s.operand_count != 0) {
            out << '(';
            for (std::size_t o = 0; o < s.operand_count; ++o) out << (o ? ", s" : "s") << s.operands[o];
            out << ')';
        }
        printing::parameters(out, p, s);
        out << ' ';
        printing::shape(out, s);
        out << ' ' << name_of(s.type);
        if (s.computes_in != s.type) out << " computes in " << name_of(s.computes_in);
        if (!live[id]) out << "  (dead)";
        if (id == p.root) out << "  <- root";
        for (std::size_t r = 0; r < p.other_roots.size(); ++r) {
            if (id == p.other_roots[r]) out << "  <- root " << r + 1;
        }
        out << '\n';
    }
    return out.str();
}

// Runs the passes the options ask for, in order, on p. With `text`: appends p as lowered and
// after each pass (or that the pass did not run), for explain.
inline void run_program_passes(program& p, const planner_options& options, std::string* text = nullptr) {
    if (text) *text += "program as lowered:\n" + to_text(p);
    for (const program_pass& pass : program_passes) {
        const bool runs = pass.runs(options);
        if (runs) pass.rewrite(p);
        if (text) *text += std::string("after ") + std::string(pass.name) + (runs ? ":\n" + to_text(p) : ": not run on this backend\n");
    }
}

}  // namespace dimsum::evaluation
