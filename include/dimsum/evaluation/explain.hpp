#pragma once
// A plan as text, one line per entry, in the spirit of Halide's print_loop_nest: what each
// kernel call computes and writes, which nodes fused into it, which operands are views that
// cost no copy, and the temporaries. `ds::explain(formula)` (backend/default.hpp) prints the
// plan of the default backend; each evaluator has explain(formula) for its own.
//
//   in0, in1, ...  the formula's tensors, in the order they appear in it;
//   t0, t1, ...    temporaries the plan allocates;
//   out            the destination.
// An operand written `transpose(view(t0))` is t0 read through new strides: no copy. A formula
// of bf16 computes in float (double on the reference backend), its tensors read through
// `convert` entries (or by the products and the fused attention themselves, where the
// backend's read bf16: marked `[bf16 read where it lies]`), and its value is rounded into
// the bf16 destination at the end. cast<bf16>(x) that such a kernel reads is a `narrow` entry:
// x's value rounded into a bf16 temporary (`t3 ..., bf16`), which the kernel reads; where a
// gemm or attention computes x, it rounds each block as it finishes: `[rounded into t3 block
// by block]`. On such a backend the formula's own value is rounded into `out` the same way.

#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "dimsum/evaluation/lower.hpp"
#include "dimsum/evaluation/plan.hpp"

namespace dimsum::evaluation {

namespace explaining {

class printer {
public:
    printer(const program& p, const plan& pl, element_type computes_in)
        : steps_(p.steps), backwards_(p.attention_backwards), plan_(pl), computes_in_(computes_in),
          number_(pl.temporaries.size(), no_step) {
        // temporaries numbered in the order entries write them
        std::size_t next = 0;
        for (const entry& e : plan_.entries) {
            if (e.out.memory == memory_kind::temporary && number_[e.out.index] == no_step) number_[e.out.index] = next++;
            const std::size_t also = e.kind == entry_kind::attention_backward ? 2 : e.with_lse ? 1 : 0;
            for (std::size_t a = 0; a < also; ++a) {
                const place& p = e.also_out[a];
                if (p.memory == memory_kind::temporary && number_[p.index] == no_step) number_[p.index] = next++;
            }
            if (e.rounded_into && e.rounded_into->memory == memory_kind::temporary && number_[e.rounded_into->index] == no_step) {
                number_[e.rounded_into->index] = next++;
            }
        }
        for (std::size_t& n : number_) n = n == no_step ? next++ : n;
    }

    std::string text(std::string_view backend, element_type stored) {
        std::size_t bytes = 0;
        for (const temporary& t : plan_.temporaries) bytes += t.size * size_of(t.type);
        out_ << backend << " plan, " << name_of(computes_in_);
        if (stored != computes_in_) out_ << " stored as " << name_of(stored);
        out_ << ": " << plan_.entries.size() << (plan_.entries.size() == 1 ? " entry, " : " entries, ")
             << plan_.temporaries.size() << (plan_.temporaries.size() == 1 ? " temporary" : " temporaries");
        if (!plan_.temporaries.empty()) out_ << " (" << human_bytes(bytes) << ")";
        out_ << '\n';
        for (std::size_t i = 0; i < plan_.entries.size(); ++i) write_entry(i + 1, plan_.entries[i]);
        if (stored != computes_in_ && plan_.destination_type != stored) out_ << "  then out, computed in " << name_of(computes_in_) << ", rounded to " << name_of(stored) << '\n';
        for (std::size_t b = 0, id = 0; id < steps_.size(); ++id) {  // bindings are numbered as first read
            if (steps_[id].kind != step_kind::tensor || steps_[id].binding != b) continue;
            out_ << "  in" << b++ << ' ';
            shape(steps_[id]);
            out_ << '\n';
        }
        std::vector<std::size_t> by_number(number_.size());
        for (std::size_t t = 0; t < number_.size(); ++t) by_number[number_[t]] = t;
        for (std::size_t n = 0; n < by_number.size(); ++n) {
            const temporary& t = plan_.temporaries[by_number[n]];
            out_ << "  t" << n << ' ' << t.size << " elements, " << (t.type != computes_in_ ? std::string(name_of(t.type)) + ", " : "")
                 << human_bytes(t.size * size_of(t.type)) << '\n';
        }
        return out_.str();
    }

private:
    static std::string human_bytes(std::size_t bytes) {
        std::ostringstream s;
        s.precision(1);
        s << std::fixed;
        if (bytes < 1024) s << bytes << " B";
        else if (bytes < 1024 * 1024) s << bytes / 1024.0 << " KiB";
        else s << bytes / (1024.0 * 1024.0) << " MiB";
        return s.str();
    }

    void shape(const step& s) { printing::shape(out_, s); }

    void memory(const place& p) {
        switch (p.memory) {
            case memory_kind::destination: out_ << "out"; return;
            case memory_kind::temporary: out_ << 't' << number_[p.index]; return;
            case memory_kind::binding: out_ << "in" << p.index; return;
        }
    }

    // Step id as an entry reads it: a value another entry computed, a view of one, or an
    // elementwise formula computed in the entry itself. `product` prints as `inner`: the
    // entry's own product or scores.
    void operand(std::size_t id, std::size_t product = no_step, std::string_view inner = {}) {
        const step& s = steps_[id];
        if (id == product) {
            out_ << inner;
            return;
        }
        if (plan_.stored_placed[id]) {
            const bool cast = rounds_to_bf16(s);
            // rounded into a bf16 temporary, which the kernel, or this formula, reads
            if ((cast && as_stored_) || formula_reads_rounded(id)) return memory(plan_.stored_values[id]);
            if (!cast) return formula(id, product, inner);  // a leaf a pass reads as bf16 where it lies
        }
        const bool converted = s.kind == step_kind::tensor && s.type != s.computes_in;  // into a temporary
        if (plan_.placed[id] && (!is_view(s.kind) || converted) && !as_stored_) return memory(plan_.values[id]);
        formula(id, product, inner);
    }

    // Step id's own node, its operands as operand() prints them.
    void formula(std::size_t id, std::size_t product = no_step, std::string_view inner = {}) {
        const step& s = steps_[id];
        switch (group_of(s.kind)) {
            case step_group::memory: out_ << "in" << s.binding; return;
            case step_group::number: out_ << s.number; return;
            case step_group::elementwise:
                out_ << name_of(s.op) << '(';
                for (std::size_t o = 0; o < s.operand_count; ++o) {
                    out_ << (o ? ", " : "");
                    operand(s.operands[o], product, inner);
                }
                out_ << ')';
                return;
            case step_group::view: {
                const std::size_t from = s.operands[0];
                const bool copied = !as_stored_ && plan_.placed[id] && plan_.values[id].memory == memory_kind::temporary &&
                                    (!plan_.placed[from] || plan_.values[from].memory != memory_kind::temporary ||
                                     plan_.values[from].index != plan_.values[id].index);
                out_ << name_of(s.kind) << '(';
                if (copied) memory(plan_.values[id]);  // over a row-major copy of the operand
                else operand(from, product, inner);
                if (s.kind == step_kind::select) out_ << ", " << s.index;
                if (s.kind == step_kind::slice) {
                    out_ << ", " << s.index << ':' << s.index + s.extents[s.axis] * s.spacing;
                    if (s.spacing != 1) out_ << ':' << s.spacing;
                }
                out_ << ')';
                return;
            }
            case step_group::indices: case step_group::join: case step_group::product: case step_group::line:
                out_ << name_of(s.kind);  // computed by an entry of its own
                return;
        }
    }

    // Whether the formula of the entry being written reads step id, a cast<bf16>, from the
    // bf16 temporary it was rounded into (an input node there: plan.hpp's find_leaves).
    bool formula_reads_rounded(std::size_t id) const {
        if (!entry_ || !plan_.stored_placed[id] || !rounds_to_bf16(steps_[id])) return false;
        const place& p = plan_.stored_values[id];
        for (std::size_t n = entry_->first_node; n < entry_->first_node + entry_->node_count; ++n) {
            const formula_node& node = plan_.nodes[n];
            if (node.what != formula_node::kind::input || node.kernel_value) continue;
            const place& in = plan_.inputs[node.input];
            if (in.memory == p.memory && in.index == p.index && in.type == p.type) return true;
        }
        return false;
    }

    void write_entry(std::size_t number, const entry& e) {
        entry_ = &e;
        write_entry_text(number, e);
        entry_ = nullptr;
    }
    void write_entry_text(std::size_t number, const entry& e) {
        const step& s = steps_[e.epilogue != no_step ? e.epilogue : e.step];
        const step& own = steps_[e.step];
        out_ << "  " << number << ". ";
        std::string kind;
        switch (e.kind) {
            case entry_kind::gemm: kind = "gemm"; break;
            case entry_kind::attention: kind = "attention"; break;
            case entry_kind::attention_backward: kind = "attention_backward"; break;
            case entry_kind::fused: kind = "fused"; break;
            case entry_kind::copy: kind = "copy"; break;
            case entry_kind::rowwise: kind = "rowwise"; break;
            case entry_kind::indices: kind = "indices"; break;
            case entry_kind::convert: kind = "convert"; break;
            case entry_kind::narrow: kind = "narrow"; break;
            case entry_kind::gather: kind = "gather"; break;
            case entry_kind::scatter: kind = "scatter"; break;
        }
        out_ << kind << std::string(kind.size() < 11 ? 11 - kind.size() : 1, ' ');
        if (e.kind == entry_kind::attention_backward) {
            gradients_of_attention(e);
            out_ << '\n';
            return;
        }
        memory(e.out);
        out_ << ' ';
        shape(s);
        layout dense = row_major(e.out.where.rank, e.out.where.extents);
        dense.offset = e.out.where.offset;
        if (!(e.out.where == dense)) out_ << " (strided)";
        if (e.out.where.offset != 0) out_ << " (from element " << e.out.where.offset << ')';
        out_ << " = ";
        switch (e.kind) {
            case entry_kind::gemm:
                if (e.epilogue == no_step) {
                    product(e, e.step);
                } else {
                    std::ostringstream inner;
                    std::swap(inner, out_);
                    product(e, e.step);
                    std::swap(inner, out_);
                    formula(e.epilogue, e.step, inner.str());
                    out_ << "  [epilogue fused]";
                }
                if (e.packed_right) out_ << "  [right operand packed once]";
                folded_mark(e, own);
                stored_mark(e);
                rounded_mark(e);
                break;
            case entry_kind::attention:
                attention(e);
                rounded_mark(e);
                break;
            case entry_kind::attention_backward: break;  // written above
            case entry_kind::fused:
                if (formula_reads_rounded(e.step)) {
                    out_ << name_of(computes_in_) << '(';  // the cast's bf16 values, widened (plan.hpp's find_leaves)
                    memory(plan_.stored_values[e.step]);
                    out_ << ')';
                } else {
                    formula(e.step);
                }
                break;
            case entry_kind::copy: operand(e.step); break;  // a view, or a value computed before
            case entry_kind::rowwise:
                out_ << name_of(own.kind) << '<' << axis_name(steps_[own.operands[0]], own.axis) << ">(";
                for (std::size_t o = 0; o < e.operand_count; ++o) {
                    out_ << (o ? ", " : "");
                    stored_operand(e, o, own.operands[o]);
                }
                out_ << ')';
                stored_mark(e);
                break;
            case entry_kind::indices: out_ << name_of(steps_[e.step].kind); break;
            case entry_kind::convert: out_ << name_of(own.computes_in) << '('; formula(e.step); out_ << ')'; break;
            case entry_kind::narrow:
                out_ << name_of(op_code::round_bf16) << '(';
                operand(e.step);
                out_ << ')';
                break;
            case entry_kind::gather:
                out_ << "gather<" << axis_name(steps_[own.operands[0]], own.axis) << ">(";
                operand(own.operands[0]);
                out_ << ", ";
                formula(own.operands[1]);
                out_ << ')';
                break;
            case entry_kind::scatter:
                out_ << "scatter_add<" << axis_name(own, own.axis) << ">(";
                operand(own.operands[0]);
                out_ << ", ";
                formula(own.operands[1]);
                out_ << ')';
                break;
        }
        out_ << '\n';
    }

    std::string axis_name(const step& s, std::size_t axis) const {
        if (s.axes && !s.axes[axis].name.empty()) return std::string(s.axes[axis].name);
        return "axis " + std::to_string(axis);
    }

    // Product step `matmul` as entry e reads it (a gemm's own, or attention's scores); an
    // operand read as bf16 is printed as the views of its tensor.
    void product(const entry& e, std::size_t matmul_step) {
        const step& matmul = steps_[matmul_step];
        out_ << "matmul(";
        stored_operand(e, 0, matmul.operands[0]);
        out_ << ", ";
        stored_operand(e, 1, matmul.operands[1]);
        out_ << ')';
    }
    // Operand `slot` of entry e, step id; one read as bf16 where it lies, as the views of its tensor.
    void stored_operand(const entry& e, std::size_t slot, std::size_t id) {
        as_stored_ = reads_stored(e, slot);
        operand(id);
        as_stored_ = false;
    }
    // A product whose batch axes the plan folded into its rows (fold_product_batches).
    void folded_mark(const entry& e, const step& product) {
        const layout& c = e.out.where;
        if (c.rank == product.rank) return;
        out_ << "  [" << product.rank - c.rank << (product.rank - c.rank == 1 ? " batch axis" : " batch axes")
             << " folded into " << c.extents[c.rank - 2] << " rows]";
    }
    void rounded_mark(const entry& e) {
        if (!e.rounded_into) return;
        out_ << "  [rounded into ";
        memory(*e.rounded_into);
        out_ << " block by block]";
    }
    void stored_mark(const entry& e) {
        for (std::size_t slot = 0; slot < e.operand_count; ++slot) {
            if (reads_stored(e, slot)) {
                out_ << "  [" << name_of(e.operands[slot].type) << " read where it lies]";
                return;
            }
        }
    }
    // Whether entry e's kernel reads operand `slot` in a narrower type where it lies (a packed
    // right operand is read from its packing).
    bool reads_stored(const entry& e, std::size_t slot) const {
        const bool kernel = e.kind == entry_kind::gemm || e.kind == entry_kind::attention || e.kind == entry_kind::rowwise ||
                            e.kind == entry_kind::attention_backward;
        const bool packed = e.kind == entry_kind::gemm && e.packed_right && slot == 1;
        return kernel && slot < e.operand_count && !packed && e.operands[slot].type != computes_in_;
    }

    void attention(const entry& e) {
        attention_formula(e);
        const attention_match& m = e.attention;
        out_ << "  [fused: no (queries, keys) matrix" << (m.causal ? ", tiles above the diagonal skipped" : "") << ']';
        if (e.with_lse) {
            out_ << "  [each query's log-sum-exp kept in ";
            memory(e.also_out[0]);
            out_ << ']';
        }
        stored_mark(e);
    }
    // softmax(scores) x V, as entry e reads them.
    void attention_formula(const entry& e) {
        const attention_match& m = e.attention;
        out_ << "softmax(";
        std::ostringstream inner;
        std::swap(inner, out_);
        product(e, m.scores);
        std::swap(inner, out_);
        if (m.score_function != m.scores) formula(m.score_function, m.scores, inner.str());
        else out_ << inner.str();
        if (m.scale != 1 || m.divides) out_ << (m.divides ? " / " : " * ") << m.scale;
        if (m.causal) out_ << ", causal";
        out_ << ") x ";
        stored_operand(e, 2, m.values);
    }

    // The gradients of an attention for the cotangent of its value:
    //   `out, t4, t5 (unread, not computed) = dQ, dK^T, dV of softmax(...) x in2 for cotangent t1  [fused backward: ...]`
    void gradients_of_attention(const entry& e) {
        const place* outs[3] = {&e.out, &e.also_out[0], &e.also_out[1]};
        const evaluation::attention_backward& a = backwards_[steps_[e.step].index];
        for (std::size_t which = 0; which < 3; ++which) {
            out_ << (which ? ", " : "");
            memory(*outs[which]);
            if (e.unread_gradients[which]) out_ << " (unread, not computed)";
        }
        out_ << " = dQ, dK^T, dV of ";
        attention_formula(e);
        out_ << " for cotangent ";
        operand(a.cotangent);
        out_ << "  [fused backward: no (queries, keys) matrix, P recomputed from the log-sum-exps in ";
        memory(e.operands[5]);
        out_ << (e.attention.causal ? ", tiles above the diagonal skipped" : "") << ']';
        stored_mark(e);
    }

    const std::vector<step>& steps_;
    const std::vector<evaluation::attention_backward>& backwards_;
    const plan& plan_;
    const element_type computes_in_;  // the program's type
    std::vector<std::size_t> number_;  // each temporary's number in the text
    std::ostringstream out_;
    bool as_stored_ = false;  // printing an operand read where it lies: views of a tensor, no temporary
    const entry* entry_ = nullptr;  // the entry being written
};

}  // namespace explaining

// The plan as text (see the top of this file); `stored`: the destination's element type, when
// it is not the one the program computes in.
inline std::string explain(const program& p, const plan& pl, std::string_view backend,
                           std::optional<element_type> stored = std::nullopt) {
    const element_type computes_in = p.steps.empty() ? element_type::float32 : p.steps[0].computes_in;
    return explaining::printer(p, pl, computes_in).text(backend, stored.value_or(computes_in));
}

// How much ds::explain says: the plan, or before it the program as lowered and after each
// program pass (passes.hpp: one line a step).
enum class explain_detail { plan, passes };

// The plan of formula e for a new tensor of its shape, made with `options`, computing in T.
template <class T, class E>
std::string explain_formula(const E& e, planner_options options, std::string_view backend,
                            explain_detail detail = explain_detail::plan) {
    program p;
    std::vector<binding> bindings;
    lower<T>(e, p, bindings);
    const step& root = p.steps[p.root];
    plan pl;
    const element_type stored = element_type_of<value_type_of<E>>();
    const element_type rounded_by_kernels = options.read_bf16 && stored == element_type::bf16 ? stored : element_type_of<T>();
    std::string passes;
    make_plan(p, bindings, row_major(root.rank, root.extents), rounded_by_kernels, options, pl,
              detail == explain_detail::passes ? &passes : nullptr);
    return passes + explain(p, pl, backend, stored);
}

}  // namespace dimsum::evaluation
