#pragma once
// The CPU executor: plans a lowered program and runs the plan, binding each entry's places
// (evaluation/plan.hpp: operands, formula inputs, out) to memory and calling its kernel:
//   gemm       -> gemm.hpp, its epilogue formula a fused pass over each finished block of C
//                 (fused.hpp: region_program), then, if the plan asks, the block rounded into
//                 memory of a narrower type (bf16);
//   attention  -> the fused attention kernel (attention.hpp), the rest of the score function
//                 a fused pass over each tile of scores;
//   attention_backward -> its fused backward (attention_gradient.hpp), the same;
//   fused, copy -> one fused elementwise pass (fused.hpp), which rounds a result stored
//                 narrower block by block;
//   rowwise    -> the line kernels (rowwise.hpp), the same line by line;
//   indices    -> elementwise.hpp's loop (causal_mask, arange: small, read broadcast);
//   convert    -> a loop (bf16 values, lengths and positions to the formula's type);
//   narrow     -> a loop (a value rounded into a temporary of a narrower type, which products
//                 read as stored, or into such a destination);
//   gather, scatter -> gather.hpp, once every id has been checked (evaluation/integers.hpp).
// Every kernel reads its operands as stored (kernels.hpp: source_array, source_matrix), T or
// a narrower type that it widens as it reads; the executor only says which.
// The plan's temporaries live in this thread's temporaries (runtime/workspace.hpp), kept from
// one evaluation to the next, so a formula evaluated in a loop allocates nothing after its
// first evaluation.
// Nothing here depends on the formula (its functions come as the block table): dimsum::kernels
// holds it compiled for float and double (src/kernels.cpp), and a program that links it sees
// only plan_and_run's declaration (kernels.hpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "dimsum/backend/cpu/attention.hpp"
#include "dimsum/backend/cpu/attention_gradient.hpp"
#include "dimsum/backend/cpu/elementwise.hpp"
#include "dimsum/backend/cpu/fused.hpp"
#include "dimsum/backend/cpu/gather.hpp"
#include "dimsum/backend/cpu/gemm.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/optimizer.hpp"
#include "dimsum/backend/cpu/rowwise.hpp"
#include "dimsum/backend/cpu/workspace.hpp"
#include "dimsum/evaluation/convert.hpp"
#include "dimsum/evaluation/integers.hpp"
#include "dimsum/evaluation/plan.hpp"

namespace dimsum::backend::cpu::detail {

using evaluation::entry;
using evaluation::entry_kind;
using evaluation::no_step;

// Runs a plan: each entry by its kernel.
template <class T>
class executor {
public:
    // `destination`: where the plan's destination layout starts, of T, or of bf16 where the
    // plan rounds into it (plan::destination_type); `others`: the other roots' (of T).
    executor(state<T>& s, void* destination, std::span<const evaluation::strided<T>> others = {}) : s_(s), memory_(s.memory) {
        memory_.bind_destinations(reinterpret_cast<std::uintptr_t>(destination), others);
    }

    void run() {
        evaluation::check_before_running<T>(s_.program, s_.bindings, s_.plan);
        memory_.bind(s_.bindings);
        memory_.temporaries.clear();
        temporaries& memory = thread_temporaries();
        for (const evaluation::temporary& t : s_.plan.temporaries) {
            with_storage<T>(t.type, [&]<class U>() {
                memory_.temporaries.push_back(reinterpret_cast<std::uintptr_t>(memory.allocate<U>(t.size)));
            });
        }
        for (const entry& e : s_.plan.entries) run(e);
    }

private:
    void run(const entry& e) {
        // a pass or a kernel along an axis may write memory of a narrower type itself, rounding as it goes
        const rounded_memory<T> rounded = stored_narrower(e.out) ? rounded_at(e.out, e.out.where.offset) : rounded_memory<T>{};
        const strided<T> dst = rounded ? shape_only(e.out.where) : at(e.out);
        if (rounded && e.kind != entry_kind::fused && e.kind != entry_kind::copy && e.kind != entry_kind::rowwise &&
            e.kind != entry_kind::narrow) {
            throw std::logic_error("dimsum: a plan has a kernel write another type than its own");
        }
        switch (e.kind) {
            case entry_kind::gemm: return multiply(e, dst);
            case entry_kind::attention: return attend(e, dst);
            case entry_kind::attention_backward: return attend_backward(e, dst);
            case entry_kind::fused: case entry_kind::copy:
                build_fused(e, dst);
                return run_fused<T>(s_.fused, dst, true, nullptr, rounded);
            case entry_kind::narrow:  // a loop: the value rounded into the type of its place
                return with_storage<T>(e.out.type, [&]<class U>() {
                    evaluation::convert_each(read(e.operands[0]), evaluation::strided_at(reinterpret_cast<U*>(memory_.writable_start_of(e.out)), e.out.where),
                                             [](T value) { return stored_as<U>(value); });
                });
            case entry_kind::rowwise: return rowwise(e, dst, rounded);
            case entry_kind::indices: return cpu::indices<T>(e.causal, dst);
            case entry_kind::convert: return evaluation::convert_binding<T>(s_.bindings[e.operands[0].index], dst);
            case entry_kind::gather:
                return cpu::gather<T>(read(e.operands[0]), e.axis, evaluation::integers_of(s_.bindings[e.operands[1].index]), dst);
            case entry_kind::scatter:
                return cpu::scatter_add<T>(read(e.operands[0]), e.axis, evaluation::integers_of(s_.bindings[e.operands[1].index]), dst);
        }
    }

    // Whether place p holds a type narrower than T, which kernels widen as they read and round into as they write.
    static bool stored_narrower(const evaluation::place& p) { return p.type != evaluation::element_type_of<T>(); }
    // The memory of a place of T that an entry writes: the destination's or a temporary's.
    strided<T> at(const evaluation::place& p) const { return evaluation::written_at<T>(memory_, p); }
    // The values at place p, of T.
    strided<const T> read(const evaluation::place& p) const { return evaluation::read_at<T>(memory_, p); }

    // dst = the kernel along an axis of entry e; its operand may be stored narrower, and its
    // result rounded (dst then gives only the layout).
    void rowwise(const entry& e, const strided<T>& dst, const rounded_memory<T>& rounded) const {
        const source_array<T> x = input(e.operands[0]);
        switch (e.line) {
            case evaluation::line_op::softmax: return cpu::softmax<T>(x, dst, e.axis, rounded);
            case evaluation::line_op::layer_norm: return cpu::layer_norm<T>(x, dst, e.axis, static_cast<T>(e.number), rounded);
            case evaluation::line_op::layer_norm_gradient:
                return cpu::layer_norm_gradient<T>(x, input(e.operands[1]), dst, e.axis, static_cast<T>(e.number), rounded);
            case evaluation::line_op::sum: return cpu::reduce<fn::sum, T>(x, dst, e.axis, rounded);
            case evaluation::line_op::max: return cpu::reduce<fn::max, T>(x, dst, e.axis, rounded);
            case evaluation::line_op::mean: return cpu::reduce<fn::mean, T>(x, dst, e.axis, rounded);
        }
    }

    // s_.fused := entry e's formula (evaluation::formula_node), its inputs bound to memory; the
    // value the entry's kernel computes read from `kernel_value` (the GEMM epilogue's C, or
    // the attention's scores tile), s_.in_place_input saying which input that is.
    void build_fused(const entry& e, const strided<T>& kernel_value) {
        s_.fused.clear();
        s_.in_place_input = no_input;
        for (std::size_t n = e.first_node; n < e.first_node + e.node_count; ++n) {
            const evaluation::formula_node& from = s_.plan.nodes[n];
            fused_node<T> node;
            switch (from.what) {
                case evaluation::formula_node::kind::function:
                    node.what = fused_node<T>::kind::function;
                    if (from.op == op_code::map) node.host = &s_.program.functions[from.map];
                    else node.function = s_.blocks[std::size_t(from.op)];
                    node.operand_count = from.operand_count;
                    std::copy_n(from.operands.begin(), from.operand_count, node.operands.begin());
                    break;
                case evaluation::formula_node::kind::constant:
                    node.what = fused_node<T>::kind::constant;
                    node.value = static_cast<T>(from.constant);
                    break;
                case evaluation::formula_node::kind::input: {
                    node.what = fused_node<T>::kind::input;
                    node.input = s_.fused.inputs.size();
                    if (from.kernel_value) s_.in_place_input = node.input;
                    s_.fused.inputs.push_back(from.kernel_value ? source_array<T>(kernel_value) : input(s_.plan.inputs[from.input]));
                    break;
                }
            }
            s_.fused.nodes.push_back(node);
        }
    }

    // The leading axes of `shape` (all but the last two) and each operand's strides along them;
    // every operand has shape's rank.
    template <class... Operands>
    static batch_layout<sizeof...(Operands)> leading_axes(const strided<T>& shape, const Operands&... operands) {
        batch_layout<sizeof...(Operands)> batch;
        batch.rank = shape.where.rank - 2;
        for (std::size_t i = 0; i < batch.rank; ++i) {
            batch.extents[i] = shape.where.extents[i];
            std::size_t o = 0;
            ((batch.strides[o++][i] = operands.where.strides[i]), ...);
        }
        return batch;
    }

    // dst = the attention the entry describes (evaluation/attention_pattern.hpp), by the fused kernel.
    void attend(const entry& e, const strided<T>& dst) {
        const evaluation::attention_match& match = e.attention;
        attention_problem<T> problem;
        const source_array<T> q = input(e.operands[0]);   // (..., queries, d)
        const source_array<T> kt = input(e.operands[1]);  // (..., d, keys)
        const source_array<T> v = input(e.operands[2]);   // (..., keys, dv)
        problem.q = last_two_axes(q);
        problem.k = transposed(last_two_axes(kt));
        problem.v = last_two_axes(v);
        problem.o = last_two_axes(dst);
        problem.batch = leading_axes(dst, q, kt, v, dst);
        problem.scale = evaluation::scale_of<T>(match);
        problem.causal = match.causal;
        if (e.rounded_into) {
            problem.o_rounded = rounded_into(e, dst);
            problem.o_unread = e.out_unread;
        }
        if (e.with_lse) problem.lse = at(e.also_out[0]).data;
        region_program<T> score_function;
        problem.scores = score_function_of(e, dst, kt, score_function);
        attention<T>(problem);
    }

    // The rest of attention entry e's score function (if any) as the epilogue of each tile of
    // scores: O's batch (that of `shape`, of O's or dQ's extents), (queries, keys). `program`
    // must outlive the kernel's call.
    score_epilogue<T> score_function_of(const entry& e, const strided<T>& shape, const source_array<T>& kt,
                                        region_program<T>& program) {
        if (e.node_count == 0) return {};
        const std::size_t r = shape.where.rank;
        program = {&s_.fused, no_input, {nullptr, r, shape.where.extents, {}}};
        program.result.where.extents[r - 1] = kt.where.extents[r - 1];
        build_fused(e, program.result);
        program.own = s_.in_place_input;
        return score_epilogue_of(program);
    }

    // dQ (dq), dK^T and dV = the gradients of the attention entry e describes, by the fused
    // backward (attention_gradient.hpp). Q, K^T and V as stored (of T or bf16: the planner's
    // read_operand), O and dO of T.
    void attend_backward(const entry& e, const strided<T>& dq) {
        const strided<T> dkt = at(e.also_out[0]), dv = at(e.also_out[1]);
        const source_array<T> q = input(e.operands[0]), kt = input(e.operands[1]), v = input(e.operands[2]);
        const source_array<T> o = input(e.operands[3]), d_o = input(e.operands[4]);
        auto own = [](const source_array<T>& x) {
            if (!x.holds_own()) throw std::logic_error("dimsum: a plan has the attention backward read another type than its own");
            return last_two_axes(x).own();
        };
        attention_gradient_problem<T> problem;
        problem.q = last_two_axes(q);
        problem.k = transposed(last_two_axes(kt));
        problem.v = last_two_axes(v);
        problem.o = own(o);
        problem.d_o = own(d_o);
        problem.dq = last_two_axes(dq);
        problem.dk = transposed(last_two_axes(dkt));
        problem.dv = last_two_axes(dv);
        problem.batch = leading_axes(dq, q, kt, v, o, d_o, dq, dkt, dv);
        matrix<T>* gradients[3] = {&problem.dq, &problem.dk, &problem.dv};
        for (std::size_t which = 0; which < 3; ++which) {
            if (e.unread_gradients[which]) gradients[which]->data = nullptr;  // not computed
        }
        problem.scale = evaluation::scale_of<T>(e.attention);
        problem.slope = static_cast<T>(e.slope);
        problem.causal = e.attention.causal;
        if (e.with_lse) problem.lse = read(e.operands[5]).data;
        region_program<T> score_function;
        problem.scores = score_function_of(e, dq, kt, score_function);
        attention_gradient<T>(problem);
    }

    // The packing of the right operand of gemm entry e, which the plan reads from its binding
    // (ds::prepack packs a matrix of bf16 into float panels, of float or double as it is).
    const packed_operand<T>* packed_right(const entry& e) const {
        const evaluation::binding& b = s_.bindings[e.operands[1].index];
        const bool packed_as_t =
            b.type == evaluation::element_type_of<T>() || (b.type == evaluation::element_type::bf16 && std::is_same_v<T, float>);
        if (!b.packed || !packed_as_t) throw std::logic_error("dimsum: a plan reads a packing its operand lacks");
        return static_cast<const packed_operand<T>*>(b.packed);
    }
    // The extents and strides of a layout, its data left null: a product whose right operand is
    // packed, or a kernel whose result is rounded, reads only its shape there.
    static strided<T> shape_only(const evaluation::layout& where) {
        strided<T> s{nullptr, where};
        s.where.offset = 0;
        return s;
    }
    // The memory of place p, from its start (a binding's, a temporary's or the destination's).
    void* memory_of(const evaluation::place& p) const { return reinterpret_cast<void*>(memory_.start_of(p)); }
    // Place p, of a narrower type, as memory a kernel rounds into, `offset` elements from its start.
    rounded_memory<T> rounded_at(const evaluation::place& p, std::ptrdiff_t offset) const {
        rounded_memory<T> m{{memory_of(p), p.type}};
        m.advance(offset);
        return m;
    }
    // What a kernel reads at place p, as stored: of T, or of a narrower type it widens.
    source_array<T> input(const evaluation::place& p) const {
        source_array<T> s;  // built in place: see strided_at
        s.data = memory_of(p);
        s.type = p.type;
        s.where = p.where;
        s.where.offset = 0;
        s.advance(p.where.offset);
        return s;
    }

    // Where entry e, writing dst (its out, a temporary, seen as the kernel sees it), also rounds
    // its values (entry::rounded_into): memory of the same layout, so the same offsets.
    rounded_memory<T> rounded_into(const entry& e, const strided<T>& dst) const {
        const evaluation::place& out = *e.rounded_into;
        if (e.out.memory != evaluation::memory_kind::temporary || !(out.where == e.out.where) || !stored_narrower(out)) {
            throw std::logic_error("dimsum: a kernel rounds into memory that is not laid out as what it writes");
        }
        return rounded_at(out, dst.data - reinterpret_cast<T*>(memory_.temporaries[e.out.index]));
    }

    // dst = the product, then the entry's epilogue (a fused pass reading dst) over each block.
    void multiply(const entry& e, const strided<T>& dst) {
        const packed_operand<T>* packed_b = e.packed_right ? packed_right(e) : nullptr;
        const source_array<T> a = input(e.operands[0]);
        // packed: gemm reads its panels, and the operand itself where it is stored narrower
        // (gemm.hpp: a few rows stream it instead), or only its shape
        source_array<T> b = input(e.operands[1]);
        if (packed_b && b.holds_own()) b.data = nullptr;
        const bool fused = e.epilogue != no_step;
        if (fused) build_fused(e, dst);
        gemm_problem<T> problem;
        problem.a = last_two_axes(a);
        problem.b = last_two_axes(b);
        problem.c = last_two_axes(dst);
        problem.batch = leading_axes(dst, a, b, dst);
        problem.packed_b = packed_b;
        if (!fused && !e.rounded_into) return gemm<T>(problem);
        region_program<T> program{fused ? &s_.fused : nullptr, fused ? s_.in_place_input : no_input, dst};
        if (e.rounded_into) program.rounded = rounded_into(e, dst);
        // dst the rounding scratch: the bf16 kernels keep each block's sums to themselves
        problem.c_unread = e.rounded_into && e.out_unread && std::is_same_v<T, float>;
        gemm_epilogue epilogue = gemm_epilogue_of(program);
        if (problem.c_unread) {
            epilogue.rounding = rounding_of(e, program.rounded, program.own);
            if (epilogue.rounding.rounded) epilogue.apply_to_block = nullptr;  // the kernels round it themselves
        }
        gemm<T>(problem, epilogue);
    }

    // Entry e's epilogue as the kernels' data (gemm_rounding), where the plan found it one
    // (entry::bias_node): the product rounded, or the product plus a bias rounded, the bias read
    // where it lies. Else none (rounded null): the kernels run the fused pass.
    gemm_rounding rounding_of(const entry& e, const rounded_memory<T>& rounded, std::size_t product) const {
        gemm_rounding rounding;
        if constexpr (std::is_same_v<T, float>) {  // (only float sums are rounded by the bf16 kernels, into bf16)
            if (e.node_count != 0 && e.bias_node == no_step) return rounding;
            if (rounded.type != evaluation::element_type::bf16) return rounding;
            rounding.rounded = rounded;
            if (e.node_count == 0) return rounding;
            const std::size_t bias = s_.fused.nodes[e.bias_node].input;
            if (bias == product) throw std::logic_error("dimsum: a plan adds a product to itself as a bias");
            const source_array<T>& in = s_.fused.inputs[bias];
            rounding.bias = {in.data, in.type};
            rounding.bias_stride = in.where.strides[in.where.rank - 1];
        }
        return rounding;
    }

    state<T>& s_;
    evaluation::bound_memory& memory_;  // s_.memory
};

template <class T>
void plan_and_run(state<T>& s, const evaluation::layout& destination, evaluation::element_type destination_type, void* memory,
                  const evaluation::planner_options& options, std::span<const evaluation::strided<T>> others) {
    s.other_destinations.clear();
    for (const evaluation::strided<T>& other : others) s.other_destinations.push_back(other.where);
    evaluation::make_plan(s.program, s.bindings, destination, destination_type, options, s.plan, nullptr, s.other_destinations);
    executor<T>(s, memory, others).run();
}

}  // namespace dimsum::backend::cpu::detail
