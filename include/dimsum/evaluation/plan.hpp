#pragma once
// The planner: a lowered program (program.hpp) becomes a plan, the list of kernel calls a
// backend makes, in order, and the temporaries they need. Every decision about how a formula
// runs is made here, once, for every backend:
//   matmul(softmax(f(matmul(Q, K^T))), V)  -> one `attention` entry, from the attention step
//                                             that a program pass made of it (passes.hpp);
//   the gradients dQ, dK^T, dV of an attention -> one `attention_backward` entry writing all
//                                             three, from the attention_gradient steps that a
//                                             program pass made of them (passes.hpp);
//   an elementwise formula that a program pass made the epilogue of a product (passes.hpp:
//   group_epilogues)                       -> one `gemm` entry whose epilogue is that formula,
//                                             applied to each block of the product in cache;
//   any other matmul                       -> a `gemm` entry;
//   softmax, layer_norm, layer_norm_gradient, sum, max, mean
//                                          -> a `rowwise` entry;
//   an elementwise formula                 -> one `fused` pass over its result, whose inputs
//                                             are tensors, views and other entries' values;
//   causal_mask, arange                    -> an `indices` entry: values computed from their
//                                             indices, read by the formula around them;
//   a tensor of bf16 or integers read by a formula
//                                          -> a `convert` into a temporary of the formula's type;
//   a tensor of bf16 (or a view of one), an operand of a product, of attention, of a fused
//   pass or of a kernel along an axis
//                                          -> read by that entry where it lies, where the
//                                             backend's kernels read bf16 themselves;
//   cast<bf16>(x) (or a view of it), read so, there
//                                          -> x rounded into a bf16 temporary, which the entry
//                                             reads as bf16: written so by the pass or kernel
//                                             along an axis that computes x, rounded by the
//                                             gemm or attention that computes x, each block as
//                                             it finishes, else by a `narrow` entry;
//   the value of a formula of bf16, where the backend's kernels write bf16
//                                          -> rounded into the destination the same way;
//   a matrix packed once (ds::prepack), a product's right operand
//                                          -> read by the `gemm` from its packing, where the
//                                             backend reads such packing (not even converted);
//   gather                                 -> a `gather` entry, which reads its ids as integers;
//   scatter (a gather's gradient)          -> a `scatter` entry, which reads its ids likewise;
//   concat                                 -> no entry: each operand is written straight into
//                                             its slice of the result;
//   embed (a gradient's)                   -> a constant pass of zeros, then the operand
//                                             written straight into its part of the result;
//   a view written to memory               -> a `copy`;
//   permute, reshape, select               -> no entry: a new layout of their operand's value,
//                                             unless a reshape needs the operand row-major
//                                             first (a `copy` into a temporary);
//   a permutation of a value still to be computed
//                                          -> the value is computed straight into the
//                                             destination seen through the inverse permutation.
// A plan holds no pointer: each value is a place (a binding, a temporary or the destination,
// and a layout in it), so that an executor can run it on any memory of the same layouts.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include <string>

#include "dimsum/evaluation/fold_batch.hpp"
#include "dimsum/evaluation/layout.hpp"
#include "dimsum/evaluation/passes.hpp"
#include "dimsum/evaluation/program.hpp"

namespace dimsum::evaluation {

// Where a value lives: memory, the value's layout in it, and the type of its elements: the
// type the program computes in, or a narrower one it is stored in (bf16), which only the
// kernels that read or write that type see.
enum class memory_kind : std::uint8_t { binding, temporary, destination };
struct place {
    memory_kind memory = memory_kind::destination;
    std::size_t index = 0;  // which binding or temporary
    layout where{};
    element_type type = element_type::float32;
};

// The same memory seen through another layout (a view of the value there).
inline place seen_as(const place& p, const layout& where) { return {p.memory, p.index, where, p.type}; }

enum class entry_kind : std::uint8_t { gemm, attention, attention_backward, fused, copy, rowwise, indices, convert, narrow, gather,
                                      scatter };

// The kernel of a rowwise entry, along its axis. layer_norm_gradient reads two arrays of the
// same extents, a layer norm's input and the cotangent of its value (operands 0 and 1).
enum class line_op : std::uint8_t { softmax, layer_norm, layer_norm_gradient, sum, max, mean };

// One node of an elementwise formula that a kernel computes: a fused pass, a gemm's epilogue,
// the rest of attention's score function. A formula's nodes come in evaluation order, each
// function reading earlier ones; the last is its value. Nothing in it points back into the
// program, so that a backend runs it as it is.
struct formula_node {
    enum class kind : std::uint8_t { input, constant, function };
    kind what = kind::input;
    op_code op = op_code::add;   // function; op_code::map: the user's program::functions[map]
    std::size_t map = 0;
    std::array<std::size_t, max_operands> operands{};  // function: earlier nodes, from the formula's first
    std::size_t operand_count = 0;
    double constant = 0;         // constant
    // input: where it is read (plan::inputs[input]: in its own type, broadcast to the
    // formula's rank); or, with kernel_value, the value the entry's kernel computes (the
    // product, the scores), read where the kernel holds it
    std::size_t input = 0;
    bool kernel_value = false;
};

struct entry {
    entry_kind kind;
    // gemm, attention: the matmul step; fused, copy: the root of the pass; attention_backward:
    // the attention_gradient step it was planned for; the others: the step
    std::size_t step = 0;  // narrow: the step whose value it rounds
    place out{};  // what the entry writes: the value of `step`, or of `epilogue` if there is one;
                  // attention_backward: dQ
    std::array<place, 2> also_out{};  // attention_backward: dK^T and dV; attention, with_lse: the log-sum-exps
    // attention: also writes each query's log-sum-exp (batch..., queries) into also_out[0], for
    // a fused backward of it; attention_backward: reads them (operands[5])
    bool with_lse = false;
    std::size_t epilogue = no_step;  // gemm: the elementwise formula applied to the product, if any
    attention_match attention{};     // attention, attention_backward: what the matcher found
    double slope = 1;                // attention_backward: the score function's slope (see attention_backward)
    // attention_backward: which of dQ, dK^T and dV no step reads, so that the kernel need not
    // compute them (their places are still planned, and left unwritten)
    std::array<bool, 3> unread_gradients{};
    bool packed_right = false;       // gemm: the right operand is read from its binding's packing
    // rowwise: its kernel, its axis and a layer norm's epsilon (number); gather, scatter: the table's axis;
    // indices: causal_mask (causal) or arange. Copied from the step, so that an executor reads
    // no step.
    line_op line = line_op::softmax;
    std::size_t axis = 0;
    double number = 0;
    bool causal = false;
    // What the kernel reads, each in its own type (a kernel that reads bf16 reads it where it
    // lies) and laid out with the entry's rank (broadcast): gemm: A and B (B's binding, where
    // packed_right); attention: Q, K^T and V; attention_backward: Q, K^T, V, O, dO and the
    // log-sum-exps; rowwise: the lines (layer_norm_gradient: and the cotangent's); gather: the
    // table and the ids (integers); scatter: the values and the ids; convert: the binding;
    // narrow: the value it rounds.
    std::array<place, 6> operands{};
    std::size_t operand_count = 0;
    // fused, copy: the formula the pass computes; gemm: its epilogue; attention, attention_backward:
    // the rest of its score function: plan::nodes[first_node, first_node + node_count) (none: 0)
    std::size_t first_node = 0;
    std::size_t node_count = 0;
    // gemm: where its epilogue is the product plus one vector along the product's columns for
    // every row (a bias), that vector's node, from first_node: a kernel that rounds may add it
    // itself. Else no_step.
    std::size_t bias_node = no_step;
    // gemm, attention: memory of a narrower type (a temporary, or the destination) that each
    // finished block of `out` is also rounded into, laid out as `out` (a narrow entry fused
    // into the kernel)
    std::optional<place> rounded_into{};
    // with rounded_into: `out` is the rounding scratch, which no entry reads, so a kernel that
    // holds its results elsewhere until they are final may write rounded_into alone (attention does)
    bool out_unread = false;
};

// Memory a plan needs for one evaluation: `size` elements of `type` (the program's, or bf16
// for a cast<bf16> rounded for the kernels that read bf16).
struct temporary {
    std::size_t size = 0;
    element_type type = element_type::float32;
};

struct plan {
    std::vector<entry> entries;
    std::vector<formula_node> nodes;  // the entries' formulas, one after another
    std::vector<place> inputs;        // where their input nodes read
    std::vector<temporary> temporaries;
    element_type destination_type = element_type::float32;  // of the memory the value is written into
    std::vector<place> values;             // of each step whose value some entry reads, in the program's type
    std::vector<char> placed;              // whether values[step] is set
    // where the steps read in the narrower type they are stored in lie: a tensor of bf16
    // where it lies, a cast<bf16> rounded into a temporary, a view of either (the planner's
    // record, which explain prints; the entries say where they read them)
    std::vector<place> stored_values;
    std::vector<char> stored_placed;       // whether stored_values[step] is set
    // the planner's scratch, kept for its capacity
    std::vector<std::size_t> leaves;
    std::vector<char> own_values, live;  // mark_own_values'
    std::vector<std::size_t> formula_steps;  // the step of each node of the formula being built
    std::vector<layout*> alongside_c;  // fold_product_batches: the layouts that fold with a product's C
    // the attention steps whose entries keep each query's log-sum-exp, and where (attend)
    std::vector<std::pair<std::size_t, place>> log_sum_exps;

    // Empty, for a program of `steps` steps. values keeps its elements: placed says which
    // are set, and a plan made in a loop then writes no more memory than it uses.
    void clear(std::size_t steps) {
        entries.clear();
        nodes.clear();
        inputs.clear();
        temporaries.clear();
        if (values.size() < steps) values.resize(steps);
        placed.assign(steps, 0);
        if (stored_values.size() < steps) stored_values.resize(steps);
        stored_placed.assign(steps, 0);
        leaves.clear();
        log_sum_exps.clear();
    }
};

// The layout of view step s (permute, select, slice, reshape) of a value laid out as `from`, if the
// layout can express it (a reshape may need a row-major copy first).
inline std::optional<layout> view_layout(const step& s, const layout& from) {
    if (group_of(s.kind) != step_group::view) return std::nullopt;
    if (s.kind == step_kind::permute) return permute(from, s.order);
    if (s.kind == step_kind::select) return select(from, s.axis, s.index);
    if (s.kind == step_kind::slice) return slice(from, s.axis, s.index, s.extents[s.axis], s.spacing);
    return reshape(from, s.rank, s.extents);
}

class planner {
public:
    // `bindings` give the layouts of the program's tensors, `destination` that of the memory
    // its value goes to, whose elements are of `destination_type`: the program's type, or bf16,
    // into which the plan then rounds the value (planner_options::read_bf16 only: the
    // backend's kernels write bf16). `other_destinations`: those of the values of
    // program::other_roots, in order (destinations 1, 2, ...), of the program's type. No
    // memory is read.
    planner(const program& p, const std::vector<binding>& bindings, const layout& destination, element_type destination_type,
            planner_options options, plan& out, std::span<const layout> other_destinations = {})
        : steps_(p.steps), attentions_(p.attentions), backwards_(p.attention_backwards), bindings_(bindings), options_(options), plan_(out),
          computes_in_(p.steps.empty() ? destination_type : p.steps[p.root].computes_in) {
        plan_.clear(steps_.size());
        plan_.destination_type = destination_type;
        mark_own_values(p, plan_.own_values, plan_.live);
        const place out_to{memory_kind::destination, 0, destination, destination_type};
        if (other_destinations.size() != p.other_roots.size() || (!p.other_roots.empty() && destination_type != computes_in_)) {
            throw std::logic_error("dimsum: planner: the destinations do not match the program's roots");
        }
        if (destination_type == computes_in_) {
            // each root into its destination, where the roots after it read it if they do
            write_part(p.root, out_to);
            for (std::size_t r = 0; r < p.other_roots.size(); ++r) {
                write_part(p.other_roots[r], {memory_kind::destination, r + 1, other_destinations[r], computes_in_});
            }
            return;
        }
        if (destination_type != element_type::bf16 || !options.read_bf16) {
            throw std::logic_error("dimsum: planner: a destination of a type the backend's kernels do not write");
        }
        // The value rounded straight into the destination (cast<bf16> at the root rounds
        // nothing more), computed in the destination's layout where that is dense, so that a
        // product or attention computing it rounds each block there.
        // (No step reads the root: the destination is its one reader.)
        const bool cast = rounds_to_bf16(steps_[p.root]);
        const std::size_t value = cast ? steps_[p.root].operands[0] : p.root;
        round_value(value, !cast || steps_[value].rounded_alone, is_dense(destination) ? destination : row_major(destination.rank, destination.extents),
                    out_to);
    }

private:
    // The place of step id's value, planning the entries that compute it the first time.
    const place& value(std::size_t id) {
        if (!plan_.placed[id]) {
            plan_.values[id] = compute(id);
            plan_.placed[id] = 1;
        }
        return plan_.values[id];
    }

    place compute(std::size_t id) {
        const step& s = steps_[id];
        switch (group_of(s.kind)) {
            case step_group::memory: {
                if (s.type == s.computes_in) return binding_place(s.binding);
                place converted = temporary(s.rank, s.extents);  // bf16 or integers, read as the formula's type
                set_operands(add(entry_kind::convert, id, converted), binding_place(s.binding));
                return converted;
            }
            case step_group::view: {
                if (s.kind == step_kind::reshape && copy_is_certain(s)) {  // computed into the copy at once
                    const step& operand = steps_[s.operands[0]];
                    place copy = temporary(operand.rank, operand.extents);
                    write(s.operands[0], copy);
                    return seen_as(copy, *view_layout(s, copy.where));
                }
                const place from = value(s.operands[0]);
                if (auto view = view_layout(s, from.where)) return seen_as(from, *view);
                // a reshape that the layout cannot express: a row-major copy of the operand first
                place copy = temporary(from.where.rank, from.where.extents);
                write(s.operands[0], copy);
                return seen_as(copy, *view_layout(s, copy.where));
            }
            case step_group::number: case step_group::indices: case step_group::elementwise: case step_group::join:
            case step_group::product: case step_group::line: {  // an array that entries compute
                place array = s.kind == step_kind::attention_gradient ? temporary(layout_for_readers(id, s.rank, s.extents))
                                                                      : temporary(s.rank, s.extents);
                write(id, array);
                return array;
            }
        }
        __builtin_unreachable();  // every kind is handled above
    }

    place binding_place(std::size_t b) const { return {memory_kind::binding, b, bindings_[b].where, bindings_[b].type}; }

    place temporary(std::size_t rank, const extents_t& extents) { return temporary(row_major(rank, extents)); }
    // A temporary of `type` (by default the program's) seen through `where`, a layout over
    // where.size() elements from 0.
    place temporary(const layout& where, std::optional<element_type> type = std::nullopt) {
        place t{memory_kind::temporary, plan_.temporaries.size(), where, type.value_or(computes_in_)};
        plan_.temporaries.push_back({where.size(), t.type});
        return t;
    }

    // (an entry is a kilobyte: built where it stays, since a decoding step plans a dozen)
    entry& add(entry_kind kind, std::size_t step, const place& out, std::size_t epilogue = no_step,
               const attention_match* attention = nullptr) {
        entry& e = plan_.entries.emplace_back();
        e.kind = kind;
        e.step = step;
        e.out = out;
        e.epilogue = epilogue;
        if (attention) e.attention = *attention;
        return e;
    }
    template <class... Places>
    static void set_operands(entry& e, const Places&... operands) {
        e.operand_count = 0;
        ((e.operands[e.operand_count++] = operands), ...);
    }

    // How a gemm reads the operands of its product.
    struct product_operands {
        bool packed_right = false;
        std::array<place, 2> operands{};  // as they lie, of their own rank
    };
    // Places the operands of product `id` as its gemm reads them: a right operand from its
    // packing (ds::prepack), in its binding; an operand of bf16 where it lies (no convert);
    // any other as a value of the program's type.
    product_operands place_operands_of_product(std::size_t id) {
        const step& s = steps_[id];
        const step& right = steps_[s.operands[1]];
        product_operands how;
        how.packed_right = options_.read_packed && right.kind == step_kind::tensor && bindings_[right.binding].packed;
        how.operands[0] = read_operand(s.operands[0]);
        how.operands[1] = how.packed_right ? binding_place(right.binding) : read_operand(s.operands[1]);
        return how;
    }
    // e's operands := these places, broadcast to rank (written where they stay).
    template <class... Places>
    static void set_broadcast_operands(entry& e, std::size_t rank, const Places&... operands) {
        set_operands(e, operands...);
        for (std::size_t o = 0; o < e.operand_count; ++o) broadcast_in_place(e.operands[o].where, rank);
    }
    // Where a kernel reads step `id`: where it is stored in a narrower type, if it is
    // (stored_value), else its value in the program's type, planned if need be.
    place read_operand(std::size_t id) {
        if (const std::optional<place> stored = stored_value(id)) return *stored;
        return value(id);
    }
    // Where a kernel may read step `id` in the narrower type it is stored in (planner_options::
    // read_bf16): a bf16 tensor where it lies; cast<bf16> of a formula, rounded into a bf16
    // temporary (narrowed); or views of either that a layout expresses.
    std::optional<place> stored_value(std::size_t id) {
        if (!options_.read_bf16) return std::nullopt;
        const step& s = steps_[id];
        if (s.kind == step_kind::tensor) {
            if (s.type != element_type::bf16) return std::nullopt;
            return binding_place(s.binding);
        }
        if (rounds_to_bf16(s)) return narrowed(id, row_major(s.rank, s.extents));
        if (!is_view(s.kind)) return std::nullopt;
        if (s.kind == step_kind::reshape) {
            // A reshape of a permutation of cast<bf16> (attention's heads merged back into
            // rows, rounded): the rounded values stored in the permuted order, rows a reshape reads.
            const step& permutation = steps_[s.operands[0]];
            const std::size_t rounded = permutation.operands[0];
            if (permutation.kind == step_kind::permute && rounds_to_bf16(steps_[rounded]) && !plan_.stored_placed[rounded]) {
                narrowed(rounded, unpermute(row_major(permutation.rank, permutation.extents), permutation.order));
            }
        }
        const std::optional<place> from = stored_value(s.operands[0]);
        if (!from) return std::nullopt;
        const std::optional<layout> view = view_layout(s, from->where);
        if (!view) return std::nullopt;
        return seen_as(*from, *view);
    }
    // The one temporary that values dead once rounded to bf16 share (narrowed), seen as `where`
    // and grown to hold it.
    place rounding_scratch(const layout& where) {
        if (rounding_scratch_ == no_step) rounding_scratch_ = temporary(row_major(0, {})).index;
        std::size_t& size = plan_.temporaries[rounding_scratch_].size;
        size = std::max(size, where.size());
        return {memory_kind::temporary, rounding_scratch_, where, computes_in_};
    }
    // The bf16 temporary that cast<bf16> step `id` is rounded into, laid out as `where`, planned
    // the first time.
    place narrowed(std::size_t id, const layout& where) {
        if (!plan_.stored_placed[id]) {
            const place bf16 = temporary(where, element_type::bf16);
            round_value(steps_[id].operands[0], steps_[steps_[id].operands[0]].rounded_alone, where, bf16);
            plan_.stored_values[id] = bf16;
            plan_.stored_placed[id] = 1;
        }
        return plan_.stored_values[id];
    }
    // Plans the entries that compute step id's value and round it into `bf16` (a bf16 temporary,
    // or the destination). `rounded_alone`: nothing else reads the value (the root, or a value
    // find_rounded_alone marked), so that it is dead once rounded, if not placed already:
    //  - a pass or a line kernel computing it writes bf16 itself (a product the pass absorbs
    //    rounds each block into it: write_fused);
    //  - a product or attention computes it into the scratch every such value shares, laid out
    //    as `bf16` (`wide`), and rounds each block as it finishes. It is not placed for later
    //    readers: there are none but a cast's own float value, which computes it again.
    // Any other value is computed laid out as `wide` (unless another entry placed it first),
    // then rounded by the product or attention that computes it, where `wide` is bf16's own
    // layout, or else by a narrow entry, one pass.
    void round_value(std::size_t id, bool rounded_alone, const layout& wide, const place& bf16) {
        const step& computed = steps_[id];
        const bool unplanned = !plan_.placed[id] && !is_view(computed.kind);
        const bool dead_once_rounded = unplanned && rounded_alone;
        const step_group group = group_of(computed.kind);
        if (dead_once_rounded && (group == step_group::elementwise || group == step_group::line)) return write(id, bf16);
        bool by_kernel = false, in_scratch = false;
        if (unplanned) {
            in_scratch = dead_once_rounded && group == step_group::product && options_.fuse_epilogues &&
                                    wide == bf16.where;
            const place value = in_scratch ? rounding_scratch(wide) : temporary(wide);
            write(id, value);
            if (!in_scratch) {
                plan_.values[id] = value;
                plan_.placed[id] = 1;
            }
            const entry& last = plan_.entries.back();  // write() added at least one entry
            const bool computes_value = last.kind == entry_kind::attention
                                            ? last.step == id
                                            : last.kind == entry_kind::gemm && options_.fuse_epilogues &&
                                                  (last.epilogue == id || (last.epilogue == no_step && last.step == id));
            by_kernel = computes_value && last.out.memory == value.memory && last.out.index == value.index &&
                        last.out.where == value.where && value.where == bf16.where;
            if (in_scratch && !by_kernel) {
                throw std::logic_error("dimsum: planner: a product in the rounding scratch was not rounded by its kernel");
            }
        } else {
            value(id);
        }
        if (by_kernel) {
            plan_.entries.back().rounded_into = bf16;
            plan_.entries.back().out_unread = in_scratch;
        } else {
            set_operands(add(entry_kind::narrow, id, bf16), plan_.values[id]);
        }
    }
    // A leaf of an elementwise formula (a pass, a gemm's epilogue, attention's score function):
    // read by the pass as bf16 where it lies, if it can be (stored_value: a tensor of bf16, or a
    // view of one or of a rounded cast), else planned as a value. The rule holds for every
    // pass, so that a step read so is read so by all of them.
    void read_leaf(std::size_t leaf) {
        if (const std::optional<place> stored = stored_value(leaf)) {
            plan_.stored_values[leaf] = *stored;
            plan_.stored_placed[leaf] = 1;
            return;
        }
        value(leaf);
    }
    entry& add_product(std::size_t id, const place& dst, std::size_t epilogue, const product_operands& how) {
        entry& e = add(entry_kind::gemm, id, dst, epilogue);
        e.packed_right = how.packed_right;
        set_broadcast_operands(e, steps_[id].rank, how.operands[0], how.operands[1]);
        return e;
    }

    // Plans the entries that write the value of step `id` into `dst` (of that step's extents).
    void write(std::size_t id, const place& dst) {
        const step& s = steps_[id];
        switch (group_of(s.kind)) {
            case step_group::product:
                if (s.kind == step_kind::attention) return attend(id, attentions_[s.index], dst);
                if (s.kind == step_kind::attention_gradient) return attend_backward(id, dst);
                add_product(id, dst, no_step, place_operands_of_product(id));
                return;
            case step_group::line: {
                // widened as read, where they are of bf16; both planned before the entry is added
                const place lines = read_operand(s.operands[0]);
                const bool with_cotangent = s.kind == step_kind::layer_norm_gradient;  // its lines beside x's
                const place cotangent = with_cotangent ? read_operand(s.operands[1]) : place{};
                entry& e = add(entry_kind::rowwise, id, dst);
                e.line = s.kind == step_kind::softmax               ? line_op::softmax
                         : s.kind == step_kind::layer_norm          ? line_op::layer_norm
                         : s.kind == step_kind::layer_norm_gradient ? line_op::layer_norm_gradient
                         : s.kind == step_kind::sum                 ? line_op::sum
                         : s.kind == step_kind::max                 ? line_op::max
                                                                    : line_op::mean;
                e.axis = s.axis;
                e.number = s.number;
                if (with_cotangent) return set_operands(e, lines, cotangent);
                return set_operands(e, lines);
            }
            case step_group::indices:
                add(entry_kind::indices, id, dst).causal = s.kind == step_kind::causal_mask;
                return;
            case step_group::join:
                if (s.kind == step_kind::gather || s.kind == step_kind::scatter) return index_by_ids(id, dst);
                if (s.kind == step_kind::embed) return embed(id, dst);
                return concatenate(id, dst);
            case step_group::view:
                // A permutation of a value still to be computed (attention's heads, merged back
                // into rows): computed straight into dst seen through the inverse permutation,
                // rather than into a temporary that is then copied. In a temporary of its own,
                // the value stays there for its later readers (a fused attention backward reads
                // O), which would otherwise compute it again.
                if (s.kind == step_kind::permute && computable_in_place(id)) {
                    const std::size_t operand = s.operands[0];
                    const place value = seen_as(dst, unpermute(dst.where, s.order));
                    write(operand, value);
                    if (dst.memory == memory_kind::temporary && dst.index != rounding_scratch_ && dst.type == computes_in_) {
                        plan_.values[operand] = value;
                        plan_.placed[operand] = 1;
                    }
                    return;
                }
                // A reshape of a value still to be computed, or of such a permutation (heads
                // merged back into rows, or a gradient through heads split off a row's columns,
                // at the root): the same, into dst seen with the operand's extents where that is
                // a view, rather than a temporary and a copy.
                if (s.kind == step_kind::reshape && dst.type == computes_in_ && dst.where.size() != 0 &&
                    computable_in_place(s.operands[0])) {
                    const std::size_t operand = s.operands[0];
                    if (const auto seen = reshape(dst.where, steps_[operand].rank, steps_[operand].extents)) {
                        if (is_view(steps_[operand].kind)) return write(operand, seen_as(dst, *seen));
                        return write_part(operand, seen_as(dst, *seen));
                    }
                }
                return write_fused(id, dst);  // a copy of the view
            case step_group::memory: case step_group::number: case step_group::elementwise:
                return write_fused(id, dst);  // a fused pass, or a copy
        }
    }

    // A gather (or a scatter, its adjoint) entry: the table (the values) as a value; the ids
    // where they are, as integers.
    void index_by_ids(std::size_t id, const place& dst) {
        const step& s = steps_[id];
        const place values = value(s.operands[0]);
        entry& e = add(s.kind == step_kind::gather ? entry_kind::gather : entry_kind::scatter, id, dst);
        e.axis = s.axis;
        set_operands(e, values, binding_place(steps_[s.operands[1]].binding));
    }

    // Each operand into its slice of dst.
    void concatenate(std::size_t id, const place& dst) {
        const step& s = steps_[id];
        const std::size_t split = steps_[s.operands[0]].extents[s.axis];
        for (std::size_t o = 0; o < 2; ++o) {
            const std::size_t operand = s.operands[o];
            write_part(operand, seen_as(dst, slice(dst.where, s.axis, o == 0 ? 0 : split, steps_[operand].extents[s.axis], 1)));
        }
    }
    // Zeros (the constant operand) into dst, then the value into the positions of dst that a
    // select (the value has one axis fewer) or a slice would read.
    void embed(std::size_t id, const place& dst) {
        const step& s = steps_[id];
        const step& value = steps_[s.operands[0]];
        write_fused(s.operands[1], dst);
        const layout part = value.rank < s.rank ? select(dst.where, s.axis, s.index)
                                                : slice(dst.where, s.axis, s.index, value.extents[s.axis], s.spacing);
        write_part(s.operands[0], seen_as(dst, part));
    }
    // Step id's value into `part` (a part of a join's memory, or a root's destination), where
    // a later reader finds it; a value computed already is copied there.
    void write_part(std::size_t id, const place& part) {
        if (plan_.placed[id]) return write_fused(id, part);
        write(id, part);
        if (!is_view(steps_[id].kind)) {
            plan_.values[id] = part;
            plan_.placed[id] = 1;
        }
    }

    // An elementwise formula (or a view, copied): one fused pass, or the epilogue of the
    // product group_epilogues gave it, computed straight into dst. Into bf16 memory, the pass
    // writes bf16 itself; the product, whose sums need float, goes to the rounding scratch laid
    // out as dst (which must then be dense) and rounds each block into dst.
    void write_fused(std::size_t id, const place& dst) {
        const bool bf16_dst = dst.type == element_type::bf16;
        // the product group_epilogues gave the formula, unless it is computed already or dst
        // is bf16 with gaps
        std::size_t product = steps_[id].epilogue;
        if (product != no_step && (plan_.placed[product] || (bf16_dst && !is_dense(dst.where)))) product = no_step;
        const std::size_t first_leaf = plan_.leaves.size();
        find_leaves(steps_, id, plan_.leaves, &plan_.placed, &plan_.own_values, &plan_.stored_placed);
        if (product != no_step && std::find(plan_.leaves.begin() + first_leaf, plan_.leaves.end(), product) == plan_.leaves.end()) {
            product = no_step;  // a value computed already stands between the formula and its product
        }
        product_operands how;
        bool operands_placed = false;
        for (std::size_t i = first_leaf; i < plan_.leaves.size(); ++i) {  // in the formula's order
            const std::size_t leaf = plan_.leaves[i];
            if (leaf != product) {
                read_leaf(leaf);
            } else if (!operands_placed) {  // the product read again is the same accumulator
                how = place_operands_of_product(leaf);
                operands_placed = true;
            }
        }
        plan_.leaves.resize(first_leaf);
        if (product != no_step && bf16_dst) {
            entry& e = add_product(product, rounding_scratch(dst.where), id, how);
            e.rounded_into = dst;
            e.out_unread = true;
            return add_formula(e, id, product);
        }
        if (product != no_step) return add_formula(add_product(product, dst, id, how), id, product);
        add_formula(add(steps_[id].kind == step_kind::elementwise ? entry_kind::fused : entry_kind::copy, id, dst), id, no_step);
    }

    // Entry e's formula: the elementwise formula rooted at `root`, whose leaves are placed,
    // with the value of step `kernel_value` (if any) read where e's kernel holds it; its inputs
    // broadcast to the rank of what the entry writes (attention: the rank of its batch of
    // tiles of scores, which is O's).
    void add_formula(entry& e, std::size_t root, std::size_t kernel_value) {
        const std::size_t rank = e.out.where.rank;
        e.first_node = plan_.nodes.size();
        plan_.formula_steps.clear();
        add_node(root, kernel_value, rank, e.first_node);
        e.node_count = plan_.nodes.size() - e.first_node;
        if (e.kind == entry_kind::gemm) e.bias_node = bias_of(&plan_.nodes[e.first_node], e.node_count, plan_.inputs);
    }
    // Which of a gemm's epilogue nodes is a bias the product is plus (entry::bias_node): the
    // formula is an add of the product and an input that is one vector for every row.
    static std::size_t bias_of(const formula_node* nodes, std::size_t count, const std::vector<place>& inputs) {
        using kind = formula_node::kind;
        if (count != 3 || nodes[2].what != kind::function || nodes[2].op != op_code::add) return no_step;
        if (nodes[0].what != kind::input || nodes[1].what != kind::input) return no_step;
        if (nodes[0].kernel_value == nodes[1].kernel_value) return no_step;
        const std::size_t bias = nodes[0].kernel_value ? 1 : 0;  // either order: + commutes
        const layout& where = inputs[nodes[bias].input].where;
        for (std::size_t axis = 0; axis + 1 < where.rank; ++axis) {
            if (where.strides[axis] != 0 && where.extents[axis] != 1) return no_step;
        }
        return bias;
    }
    // Appends the nodes of step id (one node for a step read more than once); returns its
    // node's index from the formula's first.
    std::size_t add_node(std::size_t id, std::size_t kernel_value, std::size_t rank, std::size_t first) {
        for (std::size_t k = 0; k < plan_.formula_steps.size(); ++k) {
            if (plan_.formula_steps[k] == id) return k;
        }
        const step& s = steps_[id];
        // a function of its operands, unless an entry computed its value already or it is a
        // cast<bf16> rounded into memory already (find_leaves)
        const bool function = s.kind == step_kind::elementwise && !plan_.placed[id] && !plan_.stored_placed[id];
        std::array<std::size_t, max_operands> operands{};  // a function's, planned first
        if (function) {
            for (std::size_t o = 0; o < s.operand_count; ++o) operands[o] = add_node(s.operands[o], kernel_value, rank, first);
        }
        // Written where it stays, field by field (small: an input's place is in plan::inputs).
        formula_node& node = plan_.nodes.emplace_back();
        if (function) {
            node.what = formula_node::kind::function;
            node.op = s.op;
            node.map = s.index;
            node.operand_count = s.operand_count;
            node.operands = operands;
        } else if (s.kind == step_kind::number) {
            node.what = formula_node::kind::constant;
            node.constant = s.number;
        } else if (id == kernel_value) {
            node.kernel_value = true;
        } else {
            if (!plan_.placed[id] && !plan_.stored_placed[id]) throw std::logic_error("dimsum: planner: a formula reads a value not planned");
            node.input = plan_.inputs.size();
            place& in = plan_.inputs.emplace_back(plan_.stored_placed[id] ? plan_.stored_values[id] : plan_.values[id]);
            broadcast_in_place(in.where, rank);
        }
        plan_.formula_steps.push_back(id);
        return plan_.nodes.size() - 1 - first;
    }

    // The fused attention: Q, K^T, V and the inputs of the rest of the score function first.
    void attend(std::size_t id, const attention_match& match, const place& dst) {
        const step& scores = steps_[match.scores];
        const std::size_t inputs[3] = {scores.operands[0], scores.operands[1], match.values};  // Q, K^T, V
        std::array<place, 3> operands;
        for (std::size_t o = 0; o < 3; ++o) operands[o] = read_operand(inputs[o]);
        read_score_function(match);
        entry& e = add(entry_kind::attention, id, dst, no_step, &match);
        set_broadcast_operands(e, dst.where.rank, operands[0], operands[1], operands[2]);
        if (match.score_function != match.scores) add_formula(e, match.score_function, match.scores);
        // a fused backward of this attention reads each query's log-sum-exp: kept here
        const bool differentiated = std::any_of(backwards_.begin(), backwards_.end(), [&](const attention_backward& a) {
            return a.output == id && std::any_of(a.gradients.begin(), a.gradients.end(), [&](std::size_t g) {
                       return g != no_step && steps_[g].kind == step_kind::attention_gradient;
                   });
        });
        if (differentiated) {
            const place lse = temporary(dst.where.rank - 1, dst.where.extents);  // (batch..., queries)
            plan_.entries.back().with_lse = true;
            plan_.entries.back().also_out[0] = lse;
            plan_.log_sum_exps.push_back({id, lse});
        }
    }
    // The inputs of the rest of attention's score function, placed (or read as stored).
    void read_score_function(const attention_match& match) {
        if (match.score_function == match.scores) return;
        const std::size_t first_leaf = plan_.leaves.size();
        find_leaves(steps_, match.score_function, plan_.leaves);
        for (std::size_t i = first_leaf; i < plan_.leaves.size(); ++i) {
            if (plan_.leaves[i] != match.scores) read_leaf(plan_.leaves[i]);
        }
        plan_.leaves.resize(first_leaf);
    }

    // The fused backward of an attention (attention_backward), planned for its gradient step
    // `id` into dst: one entry that writes dQ, dK^T and dV, each of the attention's batch
    // (O's leading axes). Those of its other gradient steps go to temporaries, where they are
    // placed; one that no step asked for (its operand carries no gradient) to a temporary
    // nothing reads. Q, K^T, V, O and dO are read as values of the program's type.
    void attend_backward(std::size_t id, const place& dst) {
        const attention_backward& a = backwards_[steps_[id].index];
        const step& scores = steps_[a.forward.scores];
        const std::size_t inputs[5] = {scores.operands[0], scores.operands[1], a.forward.values, a.output, a.cotangent};
        std::array<place, 5> operands;  // Q, K^T and V read where they lie, if bf16 (read_operand), O and dO as values
        for (std::size_t o = 0; o < 5; ++o) operands[o] = o < 3 ? read_operand(inputs[o]) : value(inputs[o]);
        read_score_function(a.forward);
        const step& o = steps_[a.output];  // (batch..., queries, dv)
        const step& kt = steps_[scores.operands[1]];  // (..., d, keys)
        const std::size_t r = o.rank, d = kt.extents[kt.rank - 2], keys = kt.extents[kt.rank - 1];
        std::array<place, 3> outs;
        for (std::size_t which = 0; which < 3; ++which) {
            const std::size_t g = a.gradients[which];
            if (g == id) {
                outs[which] = dst;
                continue;
            }
            extents_t extents = o.extents;  // dQ (..., queries, d), dK^T (..., d, keys), dV (..., keys, dv)
            if (which == 0) extents[r - 1] = d;
            if (which == 1) extents[r - 2] = d, extents[r - 1] = keys;
            if (which == 2) extents[r - 2] = keys;
            outs[which] = g == no_step ? temporary(r, extents) : temporary(layout_for_readers(g, r, extents));
            if (g != no_step && !plan_.placed[g]) {
                plan_.values[g] = outs[which];
                plan_.placed[g] = 1;
            }
        }
        entry& e = add(entry_kind::attention_backward, id, outs[0], no_step, &a.forward);
        e.also_out = {outs[1], outs[2]};
        for (std::size_t which = 0; which < 3; ++which) e.unread_gradients[which] = a.gradients[which] == no_step;
        e.slope = a.slope;
        set_broadcast_operands(e, r, operands[0], operands[1], operands[2], operands[3], operands[4]);
        // the log-sum-exps the forward's entry kept (attend: O is an attention step, whose
        // entry value(O) planned above; the last, where O was computed more than once)
        for (auto kept = plan_.log_sum_exps.rbegin(); kept != plan_.log_sum_exps.rend() && !e.with_lse; ++kept) {
            if (kept->first != a.output) continue;
            e.with_lse = true;
            e.operands[e.operand_count++] = kept->second;
        }
        if (!e.with_lse) throw std::logic_error("dimsum: planner: a fused attention backward whose forward is no attention entry");
        if (a.forward.score_function != a.forward.scores) add_formula(e, a.forward.score_function, a.forward.scores);
    }

    // The layout of a temporary for the value of step g (of these extents) that a kernel writes
    // through any strides (a fused attention backward's dQ, dK^T and dV): row-major in the axis
    // order of the permutations that read it, one after the other, if some do, so that they
    // read it in order and a reshape after them is a view. dQ (batch, heads, queries, d), read
    // as (batch, queries, heads, d) to merge the heads back into rows, is laid out so; as the
    // axes come, a copy of 3 MB in a BERT layer's backward, dK^T's read column by column.
    layout layout_for_readers(std::size_t g, std::size_t rank, const extents_t& extents) const {
        order_t order{};  // axis i of the last permutation is axis order[i] of g
        for (std::size_t i = 0; i < rank; ++i) order[i] = i;
        std::size_t last = g;
        for (std::size_t id = g + 1; id < steps_.size(); ++id) {  // readers come after what they read
            const step& s = steps_[id];
            if (s.kind != step_kind::permute || s.operands[0] != last) continue;
            order_t composed{};
            for (std::size_t i = 0; i < rank; ++i) composed[i] = order[s.order[i]];
            order = composed;
            last = id;
        }
        if (last == g) return row_major(rank, extents);
        return unpermute(row_major(rank, steps_[last].extents), order);
    }

    // Whether reshape step s will need its operand copied into row-major order, known before
    // the operand exists: when the operand is a permutation of a value still to be computed
    // (row-major in its own axes), such as attention's heads merged back into rows. The
    // operand is then computed straight into the copy, with no temporary between.
    bool copy_is_certain(const step& s) const {
        const step& permutation = steps_[s.operands[0]];
        if (permutation.kind != step_kind::permute || !computable_in_place(s.operands[0])) return false;
        const step& inner = steps_[permutation.operands[0]];  // a value, row-major in its own axes
        const layout permuted = permute(row_major(inner.rank, inner.extents), permutation.order);
        return permuted.size() != 0 && !reshape(permuted, s.rank, s.extents);
    }

    // Whether write() computes step id's value straight into any memory it is given: a value
    // still to be computed, a permutation of one, or a reshape of either (write()'s view
    // branches, and copy_is_certain's copy).
    bool computable_in_place(std::size_t id) const {
        if (plan_.placed[id]) return false;
        const step& s = steps_[id];
        if (!is_view(s.kind)) return true;
        if (s.kind == step_kind::permute) return !is_view(steps_[s.operands[0]].kind) && !plan_.placed[s.operands[0]];
        return s.kind == step_kind::reshape && computable_in_place(s.operands[0]);
    }

    const std::vector<step>& steps_;
    const std::vector<attention_match>& attentions_;
    const std::vector<attention_backward>& backwards_;
    const std::vector<binding>& bindings_;
    planner_options options_;
    plan& plan_;
    element_type computes_in_;  // the program's type, that of its values
    std::size_t rounding_scratch_ = no_step;  // its index in plan_.temporaries, once there is one
};

// Each gemm entry's batch axes folded into its rows where the batch is one taller product
// (fold_batch.hpp): its operands, what it writes, the memory it rounds into and its
// epilogue's inputs alike, so that an executor runs the product the entry states. A step of
// placement: the places are final, and entries read one another's values through their own
// copies of them, which folding leaves as they are.
inline void fold_product_batches(plan& pl) {
    for (entry& e : pl.entries) {
        if (e.kind != entry_kind::gemm || e.out.where.rank <= 2) continue;
        pl.alongside_c.clear();
        for (std::size_t n = e.first_node; n < e.first_node + e.node_count; ++n) {
            const formula_node& node = pl.nodes[n];
            if (node.what == formula_node::kind::input && !node.kernel_value) pl.alongside_c.push_back(&pl.inputs[node.input].where);
        }
        if (e.rounded_into) pl.alongside_c.push_back(&e.rounded_into->where);
        fold_batch_into_rows(e.operands[0].where, e.operands[1].where, e.out.where, pl.alongside_c);
    }
}

// The plan of program p over memory of these layouts, into `out` (cleared first), writing its
// value into memory of `destination_type` (and those of its other roots into memory of the
// program's type laid out as `other_destinations`): the program passes the options ask for rewrite p
// (passes.hpp), the planner places its values, and each product's batch is folded where it
// can be. With `passes_text`: p as lowered and after each pass is appended there (explain).
inline void make_plan(program& p, const std::vector<binding>& bindings, const layout& destination,
                      element_type destination_type, planner_options options, plan& out, std::string* passes_text = nullptr,
                      std::span<const layout> other_destinations = {}) {
    run_program_passes(p, options, passes_text);
    planner(p, bindings, destination, destination_type, options, out, other_destinations);
    fold_product_batches(out);
}

}  // namespace dimsum::evaluation
