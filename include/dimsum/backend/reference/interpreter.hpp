#pragma once
// Runs a plan (evaluation/plan.hpp) made without fusion, with plain loops: each gemm,
// rowwise, indices, gather and scatter entry by a reference kernel (kernels.hpp), once every
// id has been checked; each fused or copy entry element by element, reading the formula's
// steps; convert element by element.

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "dimsum/backend/reference/kernels.hpp"
#include "dimsum/evaluation/convert.hpp"
#include "dimsum/evaluation/integers.hpp"
#include "dimsum/evaluation/memory.hpp"
#include "dimsum/evaluation/plan.hpp"
#include "dimsum/evaluation/program.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::backend::reference {

using evaluation::entry;
using evaluation::entry_kind;
using evaluation::max_operands;
using evaluation::step;
using evaluation::step_kind;

template <class T>
class interpreter {
public:
    interpreter(const evaluation::program& p, const std::vector<evaluation::binding>& bindings,
                const evaluation::plan& pl, const strided<T>& destination, std::span<const strided<T>> others = {})
        : program_(p), steps_(p.steps), bindings_(bindings), plan_(pl) {
        memory_.bind_destinations(reinterpret_cast<std::uintptr_t>(destination.data), others);
    }

    void run() {
        evaluation::check_before_running<T>(program_, bindings_, plan_);
        memory_.bind(bindings_);
        for (const evaluation::temporary& t : plan_.temporaries) {
            temporaries_.emplace_back(new T[t.size]());
            memory_.temporaries.push_back(reinterpret_cast<std::uintptr_t>(temporaries_.back().get()));
        }
        for (const entry& e : plan_.entries) run(e);
    }

private:
    void run(const entry& e) {
        if (e.kind == entry_kind::attention || e.kind == entry_kind::attention_backward || e.kind == entry_kind::narrow ||
            e.epilogue != evaluation::no_step) {
            throw std::logic_error("dimsum: the reference backend runs plans without fusion, reading no operand as bf16");
        }
        const strided<T> dst = at(e.out);
        switch (e.kind) {
            case entry_kind::gemm:
                return matmul<T>(read(e.operands[0]), read(e.operands[1]), dst);
            case entry_kind::rowwise: return rowwise(e, read(e.operands[0]), dst);
            case entry_kind::indices: return indices<T>(e.causal, dst);
            case entry_kind::fused: case entry_kind::copy:
                for_each_index(dst.where.extents, dst.where.rank, [&](const std::size_t* index) { dst.at(index) = read(e.step, index); });
                return;
            case entry_kind::convert: return evaluation::convert_binding<T>(bindings_[e.operands[0].index], dst);
            case entry_kind::gather:
                return gather<T>(read(e.operands[0]), e.axis, evaluation::integers_of(bindings_[e.operands[1].index]), dst);
            case entry_kind::scatter:
                return scatter_add<T>(read(e.operands[0]), e.axis, evaluation::integers_of(bindings_[e.operands[1].index]), dst);
            case entry_kind::attention: case entry_kind::attention_backward: case entry_kind::narrow: return;  // refused above
        }
    }

    static void rowwise(const entry& e, const strided<const T>& x, const strided<T>& dst) {
        switch (e.line) {
            case evaluation::line_op::softmax: return softmax<T>(x, dst, e.axis);
            case evaluation::line_op::layer_norm: return layer_norm<T>(x, dst, e.axis, static_cast<T>(e.number));
            case evaluation::line_op::layer_norm_gradient:  // a fusion (passes.hpp): its formula, as differentiated, here
                throw std::logic_error("dimsum: the reference backend runs plans without fusion, reading no operand as bf16");
            case evaluation::line_op::sum: return reduce<fn::sum, T>(x, dst, e.axis);
            case evaluation::line_op::max: return reduce<fn::max, T>(x, dst, e.axis);
            case evaluation::line_op::mean: return reduce<fn::mean, T>(x, dst, e.axis);
        }
    }

    // The element of step `id` at `index` (that step's rank): numbers and elementwise steps
    // computed here, every other step read from the value the plan placed.
    T read(std::size_t id, const std::size_t* index) const {
        const step& s = steps_[id];
        if (s.kind == step_kind::number) return static_cast<T>(s.number);
        if (s.kind != step_kind::elementwise) return read(plan_.values[id]).at(index);
        T arguments[max_operands];
        for (std::size_t i = 0; i < s.operand_count; ++i) {
            arguments[i] = read(s.operands[i], broadcast_index(s, steps_[s.operands[i]], index).data());
        }
        if (s.op != op_code::map) return fn::apply(s.op, arguments);
        const T* in[max_operands] = {&arguments[0], &arguments[1], &arguments[2]};
        T out{};
        program_.functions[s.index](1, in, &out);
        return out;
    }

    // The index into an operand broadcast to step s: right-aligned, 0 along extents of 1.
    static std::array<std::size_t, max_rank> broadcast_index(const step& s, const step& operand, const std::size_t* index) {
        std::array<std::size_t, max_rank> at{};
        std::size_t lead = s.rank - operand.rank;
        for (std::size_t i = 0; i < operand.rank; ++i) at[i] = operand.extents[i] == 1 ? 0 : index[lead + i];
        return at;
    }

    strided<T> at(const evaluation::place& p) const { return evaluation::written_at<T>(memory_, p); }
    strided<const T> read(const evaluation::place& p) const { return evaluation::read_at<T>(memory_, p); }

    const evaluation::program& program_;
    const std::vector<step>& steps_;
    const std::vector<evaluation::binding>& bindings_;
    const evaluation::plan& plan_;
    std::vector<std::unique_ptr<T[]>> temporaries_;
    evaluation::bound_memory memory_;
};

template <class T>
void plan_and_interpret(evaluation::program& p, const std::vector<evaluation::binding>& bindings,
                        const strided<T>& destination, const evaluation::planner_options& options,
                        std::span<const strided<T>> others) {
    evaluation::plan plan;
    std::vector<evaluation::layout> other_destinations;
    for (const strided<T>& other : others) other_destinations.push_back(other.where);
    evaluation::make_plan(p, bindings, destination.where, evaluation::element_type_of<T>(), options, plan, nullptr,
                          other_destinations);
    interpreter<T>(p, bindings, plan, destination, others).run();
}

}  // namespace dimsum::backend::reference
