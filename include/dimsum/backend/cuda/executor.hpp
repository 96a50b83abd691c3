#pragma once
// The CUDA executor: runs a plan (evaluation/plan.hpp) on the GPU, on the host side of
// dimsum::cuda. The evaluator (evaluator.hpp) plans; this binds each entry's places to device
// memory (evaluation/memory.hpp) and maps the entry to a pass of the dimsum::cuda library
// (kernels.hpp):
//   gemm       -> cuBLAS (gemm_layout.hpp), its batch folded into rows by the plan where it
//                 can be, then its epilogue formula as one fused pass over the product, in place;
//   fused, copy, convert -> one fused pass (one kernel launch) over the result;
//   attention  -> one fused pass (kernels.hpp: tiles of queries and keys, or a thread per
//                 query; the online softmax, no queries x keys matrix), the rest of the score
//                 function applied to each score;
//   rowwise    -> one thread per line;
//   indices, gather, scatter -> a pass each (scatter: a thread per line, in order).
// Host bindings are copied to device memory first (staging.hpp); a binding on the device is
// read where it is. Temporaries and staged copies come from the calling thread's arena.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "dimsum/backend/cuda/gemm_layout.hpp"
#include "dimsum/backend/cuda/kernels.hpp"
#include "dimsum/backend/cuda/staging.hpp"
#include "dimsum/evaluation/memory.hpp"
#include "dimsum/evaluation/plan.hpp"

namespace dimsum::backend::cuda {

namespace detail {

using evaluation::entry;
using evaluation::entry_kind;
using evaluation::layout;
using evaluation::no_step;

// Device memory seen through a layout: element `index` at address + where.at(index) elements.
// The address is an integer: device memory is never dereferenced on the host.
struct device_array {
    std::uintptr_t address = 0;  // of the element at offset 0
    element_type type = element_type::float32;
    layout where{};

    const void* first() const {
        return reinterpret_cast<const void*>(address + static_cast<std::uintptr_t>(where.offset * std::ptrdiff_t(size_of(type))));
    }
    void* first_writable() const { return const_cast<void*>(first()); }
};

template <class T>
class executor {
public:
    // `memory`: its bindings and temporaries are bound here; kept by the caller for its capacity.
    executor(const evaluation::plan& plan, const std::vector<evaluation::binding>& bindings, evaluation::bound_memory& memory,
             context& c, gemm_precision precision, std::size_t key_splits)
        : plan_(plan), bindings_(bindings), memory_(memory), c_(c), precision_(precision), key_splits_(key_splits) {}

    // Computes the plan and stores its value, as `type` (T, or bf16: rounded), into device
    // memory of layout `where` at `address` (0: a new array of the arena); returns that memory.
    // The plan's destination is `where` itself, or, when rounding, a row-major array of T.
    // `others`: the layouts the plan gives program::other_roots' values (of T), each then
    // computed into a new array of the arena, whose address follows the root's in
    // memory.destinations (destination r + 1 for other root r).
    device_array run(const layout& where, std::uintptr_t address, element_type type, std::span<const layout> others = {}) {
        begin(c_);
        upload_bindings(c_, bindings_, memory_.bindings);
        memory_.temporaries.clear();
        for (const evaluation::temporary& t : plan_.temporaries) memory_.temporaries.push_back(address_of(allocate(c_, t.size * sizeof(T))));
        const std::size_t n = where.size();
        if (!address) address = address_of(allocate(c_, n * size_of(type)));
        const device_array value{address, type, where};
        const bool rounds = type != type_;
        const device_array computed = rounds ? device_array{address_of(allocate(c_, n * sizeof(T))), type_, evaluation::row_major(where.rank, where.extents)}
                                             : value;
        memory_.destinations.assign(1, computed.address);
        for (const layout& other : others) memory_.destinations.push_back(address_of(allocate(c_, other.size() * sizeof(T))));
        for (const entry& e : plan_.entries) run(e);
        if (rounds && n != 0) copy(computed, value);  // stores bf16
        return value;
    }

private:
    static constexpr element_type type_ = evaluation::element_type_of<T>();
    static std::uintptr_t address_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

    void run(const entry& e) {
        const device_array dst = at(e.out);
        if (dst.where.size() == 0) return;
        switch (e.kind) {
            case entry_kind::gemm: return multiply(e, dst);
            case entry_kind::fused: case entry_kind::copy: return fuse(e, dst);
            case entry_kind::convert: return copy(read(e.operands[0]), dst);
            case entry_kind::rowwise: return rowwise(e, read(e.operands[0]), dst);
            case entry_kind::indices:
                return run_indices(c_, {.causal = e.causal, .type = type_, .rank = dst.where.rank, .extents = dst.where.extents,
                                        .out = dst.first_writable(), .out_strides = dst.where.strides});
            case entry_kind::gather: return gather(e, dst);
            case entry_kind::attention: return attend(e, dst);
            case entry_kind::scatter: return scatter(e, dst);
            case entry_kind::narrow: break;  // planned only for kernels that read bf16 (read_bf16)
            case entry_kind::attention_backward:  // planned only where asked for (fuse_attention_backward)
                throw std::logic_error("dimsum: the CUDA backend runs attention's gradients step by step");
        }
        throw std::logic_error("dimsum: the CUDA backend runs plans that read no operand as bf16");
    }

    // dst = the table's rows the ids name (entry e: the table, then the ids, already checked).
    void gather(const entry& e, const device_array& dst) {
        const device_array table = read(e.operands[0]);
        gather_pass pass;
        by_ids(pass, e, dst);
        pass.table = table.first();
        pass.table_rank = table.where.rank;
        pass.table_extents = table.where.extents;
        pass.table_strides = table.where.strides;
        run_gather(c_, pass);
    }

    // dst = the values added into the table's rows the ids name (a gather's adjoint; entry e:
    // the values, then the ids, already checked).
    void scatter(const entry& e, const device_array& dst) {
        const device_array values = read(e.operands[0]);
        scatter_pass pass;
        by_ids(pass, e, dst);
        pass.values = values.first();
        pass.values_strides = values.where.strides;
        pass.id_extents = read(e.operands[1]).where.extents;
        run_scatter(c_, pass);
    }

    // What a gather's and a scatter's passes share: the type, the table's axis, the ids (entry
    // e's second operand) and the destination.
    template <class Pass>
    void by_ids(Pass& pass, const entry& e, const device_array& dst) const {
        const device_array ids = read(e.operands[1]);
        pass.type = type_;
        pass.axis = e.axis;
        pass.ids = ids.first();
        pass.id_type = ids.type;
        pass.id_rank = ids.where.rank;
        pass.id_strides = ids.where.strides;
        pass.out = dst.first_writable();
        pass.out_rank = dst.where.rank;
        pass.out_extents = dst.where.extents;
        pass.out_strides = dst.where.strides;
    }

    // The memory an entry writes at place p (the destination's or a temporary's, of T).
    device_array at(const evaluation::place& p) const { return {memory_.writable_start_of(p), p.type, p.where}; }
    // The values at place p: a binding's (of its own type), or memory the plan writes.
    device_array read(const evaluation::place& p) const { return {memory_.start_of(p), p.type, p.where}; }

    // A new fused pass writing dst, with no node yet.
    fused_pass& pass_for(const device_array& dst) {
        fused_pass& pass = pass_;
        pass.type = type_;
        pass.rank = dst.where.rank;
        pass.extents = dst.where.extents;
        pass.out = dst.first_writable();
        pass.out_type = dst.type;
        pass.out_strides = dst.where.strides;
        pass.node_count = pass.input_count = 0;
        return pass;
    }
    // Appends an input node reading v (broadcast to the pass's rank); returns its index.
    std::size_t add_input(const device_array& v, fused_pass& pass) {
        if (pass.input_count == max_fused_inputs || pass.node_count == max_fused_nodes) too_large();
        const layout broadcast = evaluation::broadcast(v.where, pass.rank);
        fused_input& in = pass.inputs[pass.input_count];
        in.data = device_array{v.address, v.type, broadcast}.first();
        in.type = v.type;
        in.strides = broadcast.strides;
        fused_node& node = pass.nodes[pass.node_count];
        node = {};
        node.what = fused_node::kind::input;
        node.input = static_cast<std::uint8_t>(pass.input_count++);
        return pass.node_count++;
    }
    [[noreturn, gnu::cold]] static void too_large() {
        throw std::length_error("dimsum: cuda: an elementwise formula of more than " + std::to_string(max_fused_nodes) +
                                " steps or " + std::to_string(max_fused_inputs) +
                                " inputs is not supported yet; evaluate a part of it into a tensor first");
    }

    // Appends entry e's formula (evaluation::formula_node) to the pass, its inputs bound to
    // memory, the value the entry's kernel computes read from `kernel_value` (a product's
    // epilogue reads the destination itself); returns which input that is (max_fused_inputs: none).
    std::size_t add_formula(const entry& e, const device_array& kernel_value, fused_pass& pass) {
        std::size_t kernel_input = max_fused_inputs;
        for (std::size_t n = e.first_node; n < e.first_node + e.node_count; ++n) {
            const evaluation::formula_node& from = plan_.nodes[n];
            if (from.what == evaluation::formula_node::kind::input) {
                const std::size_t node = add_input(from.kernel_value ? kernel_value : read(plan_.inputs[from.input]), pass);
                if (from.kernel_value) kernel_input = pass.nodes[node].input;
                continue;
            }
            if (pass.node_count == max_fused_nodes) too_large();
            fused_node& f = pass.nodes[pass.node_count++];
            f = {};
            if (from.what == evaluation::formula_node::kind::constant) {
                f.what = fused_node::kind::constant;
                f.value = from.constant;
                continue;
            }
            f.what = fused_node::kind::function;
            f.op = from.op;
            f.operand_count = static_cast<std::uint8_t>(from.operand_count);
            for (std::size_t o = 0; o < from.operand_count; ++o) f.operands[o] = static_cast<std::uint8_t>(from.operands[o]);
        }
        return kernel_input;
    }

    // The pass with its axes coalesced (most formulas become one contiguous axis, cheap to
    // index on the device), launched.
    void launch(fused_pass& pass) {
        pass.rank = evaluation::coalesce_together(pass.rank, pass.extents, pass.input_count + 1, [&](std::size_t a) -> strides_t& {
            return a == 0 ? pass.out_strides : pass.inputs[a - 1].strides;
        });
        run_fused(c_, pass);
    }

    // to = from, element by element (widened or rounded as the types say): one fused pass.
    void copy(const device_array& from, const device_array& to) {
        fused_pass& pass = pass_for(to);
        add_input(from, pass);
        launch(pass);
    }

    // dst = entry e's formula, one fused pass; the value its kernel computed read from dst.
    void fuse(const entry& e, const device_array& dst) {
        fused_pass& pass = pass_for(dst);
        add_formula(e, dst, pass);
        launch(pass);
    }

    void rowwise(const entry& e, const device_array& x, const device_array& dst) {
        rowwise_pass pass;
        switch (e.line) {
            case evaluation::line_op::softmax: pass.op = line_op::softmax; break;
            case evaluation::line_op::layer_norm: pass.op = line_op::layer_norm; break;
            case evaluation::line_op::layer_norm_gradient:  // not asked for (evaluator::planning): the formula runs
                throw std::logic_error("dimsum: the CUDA backend runs a layer norm's gradient step by step");
            case evaluation::line_op::sum: pass.op = line_op::sum; break;
            case evaluation::line_op::max: pass.op = line_op::max; break;
            case evaluation::line_op::mean: pass.op = line_op::mean; break;
        }
        pass.type = type_;
        pass.rank = x.where.rank;
        pass.axis = e.axis;
        pass.extents = x.where.extents;
        pass.x = x.first();
        pass.x_strides = x.where.strides;
        pass.y = dst.first_writable();
        pass.y_strides = dst.where.strides;
        pass.epsilon = e.number;
        run_rowwise(c_, pass);
    }

    // dst = the attention the entry describes (evaluation/attention_pattern.hpp), fused.
    void attend(const entry& e, const device_array& dst) {
        const evaluation::attention_match& match = e.attention;
        const std::size_t r = dst.where.rank;
        // (..., queries, d), (..., d, keys), (..., keys, dv)
        const device_array q = read(e.operands[0]), kt = read(e.operands[1]), v = read(e.operands[2]);
        attention_pass& pass = attention_;
        pass.type = type_;
        pass.batch_rank = r - 2;
        for (std::size_t i = 0; i + 2 < r; ++i) pass.batch_extents[i] = dst.where.extents[i];
        pass.queries = dst.where.extents[r - 2];
        pass.dv = dst.where.extents[r - 1];
        pass.keys = kt.where.extents[r - 1];
        pass.d = q.where.extents[r - 1];
        const auto operand = [r](const device_array& a, std::ptrdiff_t rows, std::ptrdiff_t cols) {
            attention_operand o;
            o.data = a.first();
            for (std::size_t i = 0; i + 2 < r; ++i) o.batch[i] = a.where.strides[i];
            o.rows = rows;
            o.cols = cols;
            return o;
        };
        pass.q = operand(q, q.where.strides[r - 2], q.where.strides[r - 1]);
        pass.k = operand(kt, kt.where.strides[r - 1], kt.where.strides[r - 2]);  // K^T read across: K's rows are keys
        pass.v = operand(v, v.where.strides[r - 2], v.where.strides[r - 1]);
        pass.o = operand(dst, dst.where.strides[r - 2], dst.where.strides[r - 1]);
        pass.scale = static_cast<double>(evaluation::scale_of<T>(match));
        pass.causal = match.causal;
        pass.has_score_function = match.score_function != match.scores;
        if (pass.has_score_function) {  // the rest of the score function, its score an input of no memory
            evaluation::extents_t scores = dst.where.extents;  // O's batch, (queries, keys)
            scores[r - 1] = pass.keys;
            const device_array scores_shape{0, type_, evaluation::row_major(r, scores)};
            fused_pass& f = pass_for(scores_shape);
            pass.score_input = add_formula(e, scores_shape, f);
            if (pass.score_input == max_fused_inputs) throw std::logic_error("dimsum: cuda: a score function that does not read its scores");
            pass.score = f;
        }
        // few queries and many keys: the keys split into ranges, their partials in the arena
        const std::size_t rows = pass.dv == 0 ? 0 : dst.where.size() / pass.dv;  // (batch..., queries)
        const std::size_t key_blocks = (pass.keys + attention_pass::key_block - 1) / attention_pass::key_block;
        pass.key_splits = pass.dv == 0 ? 1
                          : key_splits_ == 0 ? attention_key_splits(rows, pass.queries, pass.keys)
                                             : std::clamp<std::size_t>(key_splits_, 1, std::max<std::size_t>(key_blocks, 1));
        pass.partials = pass.key_splits > 1 ? allocate(c_, rows * pass.key_splits * (2 + pass.dv) * sizeof(T)) : nullptr;
        run_attention(c_, pass);
    }

    // A row-major copy of v in the arena; an axis of extent 1 keeps stride 0, so that an
    // operand broadcast along a batch axis stays broadcast (one item, read by every item of C).
    device_array packed(const device_array& v) {
        device_array dense{address_of(allocate(c_, v.where.size() * sizeof(T))), type_,
                          evaluation::row_major(v.where.rank, v.where.extents)};
        for (std::size_t i = 0; i < dense.where.rank; ++i) {
            if (dense.where.extents[i] == 1) dense.where.strides[i] = 0;
        }
        copy(v, dense);
        return dense;
    }

    // dst = the product (cuBLAS), then the entry's epilogue, a fused pass reading dst in place.
    // The product goes into dst, or into a row-major temporary then copied when no form of
    // cuBLAS's writes dst; an operand that no form reads is copied row-major first.
    void multiply(const entry& e, const device_array& destination) {
        device_array a = read(e.operands[0]), b = read(e.operands[1]);
        const device_array& c = destination;
        device_array target = c;
        blas_product form = plan_product(a.where, b.where, target.where);
        if (!form.c_fits) {
            target = {address_of(allocate(c_, c.where.size() * sizeof(T))), type_, evaluation::row_major(c.where.rank, c.where.extents)};
            form = plan_product(a.where, b.where, target.where);
        }
        if (form.pack_a) a = packed(a);
        if (form.pack_b) b = packed(b);
        gemm_into(a, b, target);
        if (target.address != c.address) {  // the temporary into dst
            copy(target, c);
        }
        if (e.epilogue != no_step) fuse(e, destination);
    }

    // c = a b over every batch item (gemm_layout.hpp: cuBLAS's strided batch and a call per outer item).
    void gemm_into(const device_array& a, const device_array& b, const device_array& c) {
        if (a.where.extents[a.where.rank - 1] == 0) {  // an empty sum: zeros
            fused_pass& pass = pass_for(c);
            pass.nodes[0] = {};
            pass.node_count = 1;
            return launch(pass);
        }
        const blas_product form = plan_product(a.where, b.where, c.where);
        if (!form.c_fits || form.pack_a || form.pack_b) throw std::logic_error("dimsum: cuda: a product cuBLAS cannot read");
        gemm_call call;
        call.type = type_;
        call.precision = precision_;
        gemm_calls(call, form, {a.first(), a.where}, {b.first(), b.where}, {c.first(), c.where},
                   [this](const gemm_call& one) { run_gemm(c_, one); });
    }

    const evaluation::plan& plan_;
    const std::vector<evaluation::binding>& bindings_;
    evaluation::bound_memory& memory_;
    context& c_;
    gemm_precision precision_;
    std::size_t key_splits_;  // 0: attention_key_splits chooses
    fused_pass pass_{};  // the pass being built (about 2 KB: kept here, not on the stack per call)
    attention_pass attention_{};
};

}  // namespace detail

}  // namespace dimsum::backend::cuda
