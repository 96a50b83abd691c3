#pragma once
// Reverse-mode differentiation of a program (program.hpp): the gradient of a step's value
// with respect to one binding's values, given that value's cotangent, as steps appended to
// the program. A gradient is then a value like any other: the planner fuses its steps, it
// reuses the forward's values (an appended step equal to one there is that step, as in
// lowering), and every backend runs it. ops/grad.hpp makes formulas of it (ds::grad, ds::vjp).
//
// One sweep from the output down (operands come before their readers): a step's adjoint, the
// cotangent of its value, is the sum of what each reader's rule gives it, and a rule is a few
// steps of the kinds lowering makes (contribution, below). Broadcasting is undone by sums
// (sum_to); a reduction's adjoint is broadcast back (expand); select's and slice's is placed
// into zeros (an embed step). Gradients of NaN and infinity follow from the rules as written,
// which are PyTorch's: max and min give half to each of two equal operands, pow's exponent
// gets 0 where the base is 0, a comparison, mask logic, where's condition and gather's ids
// carry none.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include "dimsum/core/gradient_options.hpp"
#include "dimsum/evaluation/attention_pattern.hpp"
#include "dimsum/evaluation/program.hpp"

namespace dimsum::evaluation {

namespace differentiation {

// Whether operand o of step s carries a gradient.
constexpr bool carries_gradient(const step& s, std::size_t o) {
    if (s.kind == step_kind::gather || s.kind == step_kind::scatter) return o == 0;  // not the ids
    if (s.kind == step_kind::embed) return o == 0;     // the value, not the zeros
    if (s.kind != step_kind::elementwise) return true;
    switch (s.op) {
        case op_code::less: case op_code::less_equal: case op_code::greater: case op_code::greater_equal:
        case op_code::equal: case op_code::not_equal: case op_code::logical_and: case op_code::logical_or:
        case op_code::logical_not:
            return false;  // masks: constant almost everywhere
        case op_code::where: return o != 0;
        default: return true;
    }
}

// Appends steps of the program's type to a program, each merged with an equal one there.
class builder {
public:
    builder(program& p, element_type type, gradient_options options = {}) : p_(p), type_(type), options_(options) {}

    const step& at(std::size_t id) const { return p_.steps[id]; }

    std::size_t add(step s) {
        s.type = s.computes_in = type_;
        return add_step(p_, s);
    }

    std::size_t number(double value) {
        step s{step_kind::number};
        s.number = value;
        return add(s);
    }

    // op of the operands, broadcast as elementwise functions are; of `like`'s extents instead
    // where given (which the operands broadcast to).
    std::size_t apply(op_code op, std::size_t a, std::size_t b = no_step, std::size_t c = no_step, const step* like = nullptr) {
        step s{step_kind::elementwise};
        s.op = op;
        for (std::size_t operand : {a, b, c}) {
            if (operand != no_step) s.operands[s.operand_count++] = operand;
        }
        if (like) {
            shape_like(s, *like);
        } else if (all_numbers(s)) {
            return fold(s);
        } else {
            for (std::size_t o = 0; o < s.operand_count; ++o) {
                const step& operand = at(s.operands[o]);
                if (operand.rank > s.rank) {  // right-aligned: what is there moves right
                    const std::size_t lead = operand.rank - s.rank;
                    for (std::size_t i = s.rank; i-- > 0;) s.extents[lead + i] = s.extents[i];
                    for (std::size_t i = 0; i < lead; ++i) s.extents[i] = 1;
                    s.rank = operand.rank;
                }
                const std::size_t lead = s.rank - operand.rank;
                for (std::size_t i = 0; i < operand.rank; ++i) {
                    if (operand.extents[i] != 1) s.extents[lead + i] = operand.extents[i];
                }
            }
            for (std::size_t o = 0; o < s.operand_count; ++o) {  // names: an operand's of the same extents
                const step& operand = at(s.operands[o]);
                if (operand.rank == s.rank && operand.extents == s.extents && operand.axes) s.axes = operand.axes;
            }
            // A constant expanded to extents (expand) is read as its number, the step keeping
            // the extents it gave; and x * 1 is x. A mean's adjoint times a cotangent of 1
            // times x was a pass computing c * 1 * x; it is c * x, and a seed of 1 times a
            // cotangent is the cotangent itself, read where it lies.
            for (std::size_t o = 0; o < s.operand_count; ++o) {
                const step& operand = at(s.operands[o]);
                if (operand.kind == step_kind::elementwise && operand.op == op_code::multiply && all_numbers(operand)) {
                    s.operands[o] = fold(operand);
                }
            }
            if (all_numbers(s)) return expand(fold(s), s);
            if (s.op == op_code::multiply && s.operand_count == 2) {
                for (std::size_t o = 0; o < 2; ++o) {
                    const step& factor = at(s.operands[o]);
                    const std::size_t other = s.operands[1 - o];
                    if (factor.kind == step_kind::number && factor.number == 1.0 && same_extents(at(other), s)) return other;
                }
            }
        }
        return add(s);
    }
    std::size_t multiply(std::size_t a, std::size_t b) { return apply(op_code::multiply, a, b); }
    std::size_t divide(std::size_t a, std::size_t b) { return apply(op_code::divide, a, b); }
    std::size_t plus(std::size_t a, std::size_t b) { return apply(op_code::add, a, b); }
    std::size_t minus(std::size_t a, std::size_t b) { return apply(op_code::subtract, a, b); }
    std::size_t negate(std::size_t a) { return apply(op_code::negate, a); }
    std::size_t scaled(std::size_t a, double by) { return multiply(a, number(by)); }

    // v as the extents of `like`, which have as many elements (row-major order).
    std::size_t reshape(std::size_t v, const step& like) {
        if (same_extents(at(v), like)) return v;
        // a constant broadcast (a mean's adjoint, 1 / count everywhere): the same constant
        // at the new extents, inside its reader's formula, rather than memory to view
        if (at(v).kind == step_kind::elementwise && all_numbers(at(v))) return expand(fold(at(v)), like);
        step s{step_kind::reshape};
        shape_like(s, like);
        s.operands[s.operand_count++] = v;
        return add(s);
    }
    // v with axis `axis` put back at extent 1: a reduction of a value of like's extents, ready
    // to broadcast along that axis again.
    std::size_t unreduce(std::size_t v, const step& like, std::size_t axis) {
        if (at(v).kind == step_kind::number) return v;  // broadcasts as it is
        if (at(v).kind == step_kind::elementwise && all_numbers(at(v))) return fold(at(v));  // a constant expanded
        step kept{step_kind::reshape};
        shape_like(kept, like);
        kept.extents[axis] = 1;
        kept.axes = nullptr;
        return reshape(v, kept);
    }
    // v (..., m, n) as a matrix (rows, n): its leading axes and m merged into rows.
    std::size_t rows_of(std::size_t v) {
        const step& from = at(v);
        step matrix{step_kind::reshape};
        matrix.rank = 2;
        matrix.extents[0] = 1;
        for (std::size_t i = 0; i + 1 < from.rank; ++i) matrix.extents[0] *= from.extents[i];
        matrix.extents[1] = from.extents[from.rank - 1];
        return reshape(v, matrix);
    }
    // v broadcast to like's extents.
    std::size_t expand(std::size_t v, const step& like) {
        if (same_extents(at(v), like)) return v;
        return apply(op_code::multiply, v, number(1), no_step, &like);
    }
    // The sum of v along `axis`, which the result drops (kind: sum, max or mean alike).
    std::size_t reduce(step_kind kind, std::size_t v, std::size_t axis) {
        const step& from = at(v);
        step s{kind};
        s.rank = from.rank - 1;
        for (std::size_t i = 0, j = 0; i < from.rank; ++i) {
            if (i != axis) s.extents[j++] = from.extents[i];
        }
        s.axis = axis;
        s.operands[s.operand_count++] = v;
        return add(s);
    }
    // The adjoint of broadcasting: v summed along the axes that broadcasting added to like's
    // (leading axes, and axes of extent 1 in like), then given like's extents.
    std::size_t sum_to(std::size_t v, const step& like) {
        while (at(v).rank > like.rank) v = reduce(step_kind::sum, v, 0);
        for (std::size_t i = like.rank; i-- > 0;) {
            if (like.extents[i] == 1 && at(v).extents[i] != 1) v = reduce(step_kind::sum, v, i);
        }
        return reshape(v, like);
    }

    std::size_t permute(std::size_t v, const order_t& order) {
        const step& from = at(v);
        step s{step_kind::permute};
        s.rank = from.rank;
        for (std::size_t i = 0; i < s.rank; ++i) s.extents[i] = from.extents[order[i]];
        s.order = order;
        s.operands[s.operand_count++] = v;
        return add(s);
    }
    std::size_t transpose_last_two(std::size_t v) {
        const std::size_t rank = at(v).rank;
        order_t order{};
        for (std::size_t i = 0; i < rank; ++i) order[i] = i;
        std::swap(order[rank - 2], order[rank - 1]);
        return permute(v, order);
    }
    // (..., m, k) x (..., k, n), the leading axes broadcast.
    std::size_t matmul(std::size_t a, std::size_t b) {
        const step& left = at(a);
        const step& right = at(b);
        step s{step_kind::matmul};
        s.rank = std::max(left.rank, right.rank);
        for (std::size_t i = 0; i + 2 < s.rank; ++i) {  // the batch axes, right-aligned
            const std::size_t from_right = s.rank - 2 - i;  // 1 for the batch axis next to the matrix
            const std::size_t l = from_right <= left.rank - 2 ? left.extents[left.rank - 2 - from_right] : 1;
            const std::size_t r = from_right <= right.rank - 2 ? right.extents[right.rank - 2 - from_right] : 1;
            s.extents[i] = l == 1 ? r : l;
        }
        s.extents[s.rank - 2] = left.extents[left.rank - 2];
        s.extents[s.rank - 1] = right.extents[right.rank - 1];
        s.operands[s.operand_count++] = a;
        s.operands[s.operand_count++] = b;
        return add(s);
    }
    std::size_t slice(std::size_t v, std::size_t axis, std::size_t first, std::size_t count, std::size_t spacing) {
        step s{step_kind::slice};
        shape_like(s, at(v));
        s.extents[axis] = count;
        s.axis = axis;
        s.index = first;
        s.spacing = spacing;
        s.operands[s.operand_count++] = v;
        return add(s);
    }
    std::size_t select(std::size_t v, std::size_t axis, std::size_t index) {
        const step& from = at(v);
        step s{step_kind::select};
        s.rank = from.rank - 1;
        for (std::size_t i = 0, j = 0; i < from.rank; ++i) {
            if (i != axis) s.extents[j++] = from.extents[i];
        }
        s.axis = axis;
        s.index = index;
        s.operands[s.operand_count++] = v;
        return add(s);
    }
    // The adjoint of a gather (kind) of `like` along `axis` at `ids`, from its adjoint v: v's
    // values added up at the ids (a scatter step of like's extents); of a scatter, v gathered.
    std::size_t regather(step_kind kind, std::size_t v, std::size_t ids, const step& like, std::size_t axis) {
        step s{kind == step_kind::gather ? step_kind::scatter : step_kind::gather};
        shape_like(s, like);
        s.axis = axis;
        s.operands[s.operand_count++] = v;
        s.operands[s.operand_count++] = ids;
        return add(s);
    }
    // Zeros of like's extents with v where a select (v has one axis fewer) or a slice along
    // `axis` from `first`, every `spacing`, would read.
    std::size_t embed(std::size_t v, const step& like, std::size_t axis, std::size_t first, std::size_t spacing) {
        step s{step_kind::embed};
        shape_like(s, like);
        s.axis = axis;
        s.index = first;
        s.spacing = spacing;
        s.operands[s.operand_count++] = v;
        s.operands[s.operand_count++] = number(0);
        return add(s);
    }

    // The memory that binding `part` reads, as view steps of tensor step `whole` (of binding
    // `of`): each of part's axes walks along one of whole's (every so many), whole's other axes
    // are selected; failing that, the same after splitting whole's axes where part's strides
    // fall inside one (a view that splits a row's columns into heads, then permutes them).
    // no_step where no such views express it (other element types, memory outside whole's,
    // strides that no axis of whole divides).
    std::size_t view_within(std::size_t whole, const binding& of, const binding& part, const step& as) {
        const layout& outer = of.where;
        const layout& inner = part.where;
        if (part.type != of.type || part.on_device || of.on_device) return no_step;
        const std::ptrdiff_t bytes = static_cast<const char*>(part.data) - static_cast<const char*>(of.data);
        const std::ptrdiff_t size = static_cast<std::ptrdiff_t>(size_of(of.type));
        if (bytes % size != 0) return no_step;
        const std::ptrdiff_t first = bytes / size + inner.offset - outer.offset;  // in elements, from whole's first
        if (first < 0) return no_step;
        // the same elements in the same order under other axes (an eager ds::view of a tensor)
        if (first == 0 && is_row_major(outer) && is_row_major(inner) && outer.size() == inner.size()) return reshape(whole, as);
        layout axes = outer;
        std::optional<placement> where = place(axes, first, inner);
        std::size_t v = whole;
        if (!where) {
            if (!split_where_read(axes, inner)) return no_step;
            where = place(axes, first, inner);
            if (!where) return no_step;
            step finer{step_kind::reshape};
            finer.rank = axes.rank;
            finer.extents = axes.extents;
            v = reshape(whole, finer);
        }
        for (std::size_t k = axes.rank; k-- > 0;) {  // from the last axis, so that a select leaves the others in place
            const std::size_t walker = where->walker[k], start = where->start[k], spacing = where->spacing[k];
            if (walker == no_step && at(v).extents[k] == 1) {
                v = reshape(v, without_axis(at(v), k));  // nothing to select: its adjoint is a reshape, not zeros
            } else if (walker == no_step) {
                v = select(v, k, start);
            } else {
                const std::size_t count = inner.extents[walker];
                if (start != 0 || spacing != 1 || count != at(v).extents[k]) v = slice(v, k, start, count, spacing);
            }
        }
        order_t order{};  // part's axes of extent above 1, in its order: which of v's axes each is
        std::size_t kept = 0;
        for (std::size_t j = 0; j < inner.rank; ++j) {
            if (inner.extents[j] == 1) continue;
            std::size_t position = 0;
            for (std::size_t k = 0; k < axes.rank; ++k) {
                if (where->walker[k] == j) break;
                if (where->walker[k] != no_step) ++position;
            }
            order[kept++] = position;
        }
        bool identity = true;
        for (std::size_t i = 0; i < kept; ++i) identity = identity && order[i] == i;
        if (!identity) v = permute(v, order);
        return reshape(v, as);
    }

    // Whether step v's value is stored in bf16: a bf16 tensor, a cast<bf16>, or a view of either.
    bool stored_as_bf16(std::size_t v) const {
        const step& s = at(v);
        if (s.kind == step_kind::tensor) return s.type == element_type::bf16;
        if (rounds_to_bf16(s)) return true;
        return is_view(s.kind) && s.operand_count == 1 && stored_as_bf16(s.operands[0]);
    }
    // The operand a gradient's product multiplies `other` by, for cotangent g: g, or g rounded
    // to bf16 where other is stored in bf16 (gradient_options::bf16_products).
    std::size_t cotangent_beside(std::size_t g, std::size_t other) {
        if (!options_.bf16_products || !stored_as_bf16(other) || stored_as_bf16(g)) return g;
        p_.has_casts_to_bf16 = true;
        return apply(op_code::round_bf16, g);
    }
    // The product that gives operand o of matmul step s its gradient from cotangent g, before
    // any sum over broadcast batch axes: dA = dC B^T, dB = A^T dC, dC as cotangent_beside the
    // other operand gives it. The matmul rule and an attention's record make theirs here, so
    // that they are one step.
    std::size_t operand_product(const step& s, std::size_t o, std::size_t g) {
        const std::size_t other = s.operands[1 - o], dc = cotangent_beside(g, other);
        return o == 0 ? matmul(dc, transpose_last_two(other)) : matmul(transpose_last_two(other), dc);
    }

    // A layer norm's gradient, recorded once (program::layer_norm_backwards).
    void record(const layer_norm_backward& r) {
        if (std::find(p_.layer_norm_backwards.begin(), p_.layer_norm_backwards.end(), r) == p_.layer_norm_backwards.end()) {
            p_.layer_norm_backwards.push_back(r);
        }
    }

private:
    // The number elementwise step s of numbers computes, computed here (in double).
    std::size_t fold(const step& s) {
        double values[max_operands]{};
        for (std::size_t o = 0; o < s.operand_count; ++o) values[o] = at(s.operands[o]).number;
        return number(fn::apply(s.op, values));
    }
    bool all_numbers(const step& s) const {
        for (std::size_t o = 0; o < s.operand_count; ++o) {
            if (at(s.operands[o]).kind != step_kind::number) return false;
        }
        return true;
    }
    static bool same_extents(const step& a, const step& b) { return a.rank == b.rank && a.extents == b.extents; }
    static bool is_row_major(const layout& l) {
        layout dense = row_major(l.rank, l.extents);
        dense.offset = l.offset;
        return dense == l;
    }
    // Where a part of a whole lies, per axis of the whole: the index the part starts at, and
    // which of the part's axes walks it, every `spacing` (no_step: the part selects `start`).
    struct placement {
        std::array<std::size_t, max_rank> start{}, walker{}, spacing{};
    };
    // The placement of the elements `inner` reads, from element `first` of `whole`'s (in
    // elements), or none where some axis of inner walks along no axis of whole.
    static std::optional<placement> place(const layout& whole, std::ptrdiff_t first, const layout& inner) {
        placement p;
        // whole's axes from the largest stride: where part's first element lies, and which walks each of part's axes
        std::array<std::size_t, max_rank> by_stride{};
        for (std::size_t k = 0; k < whole.rank; ++k) by_stride[k] = k;
        std::sort(by_stride.begin(), by_stride.begin() + whole.rank,
                  [&](std::size_t a, std::size_t b) { return whole.strides[a] > whole.strides[b]; });
        std::ptrdiff_t rest = first;
        for (std::size_t i = 0; i < whole.rank; ++i) {
            const std::size_t k = by_stride[i];
            if (whole.strides[k] <= 0) return std::nullopt;
            p.start[k] = static_cast<std::size_t>(rest / whole.strides[k]);
            rest %= whole.strides[k];
            p.walker[k] = no_step;
        }
        if (rest != 0) return std::nullopt;
        for (std::size_t j = 0; j < inner.rank; ++j) {
            if (inner.extents[j] == 1) continue;
            std::size_t found = no_step;
            for (std::size_t i = 0; i < whole.rank && found == no_step; ++i) {
                const std::size_t k = by_stride[i];
                if (p.walker[k] == no_step && whole.extents[k] > 1 && inner.strides[j] > 0 && inner.strides[j] % whole.strides[k] == 0) {
                    found = k;
                }
            }
            if (found == no_step) return std::nullopt;
            p.walker[found] = j;
            p.spacing[found] = static_cast<std::size_t>(inner.strides[j] / whole.strides[found]);
            if (p.start[found] + (inner.extents[j] - 1) * p.spacing[found] >= whole.extents[found]) return std::nullopt;
        }
        for (std::size_t k = 0; k < whole.rank; ++k) {
            if (p.start[k] >= whole.extents[k]) return std::nullopt;
        }
        return p;
    }
    // Splits whole's axes where inner reads inside one: an axis of extent n and stride s that
    // inner walks at stride s * f, f dividing n, becomes the axes (n / f, f) of strides
    // (s * f, s), and so on for each smaller f dividing the last. Whether any axis split.
    static bool split_where_read(layout& whole, const layout& inner) {
        layout finer;
        bool split = false;
        for (std::size_t k = 0; k < whole.rank; ++k) {
            const std::size_t n = whole.extents[k];
            const std::ptrdiff_t s = whole.strides[k];
            std::array<std::size_t, max_rank> factors{};  // of n, each dividing the one before
            std::size_t count = 0;
            for (std::size_t j = 0; j < inner.rank && s > 0; ++j) {
                if (inner.extents[j] == 1 || inner.strides[j] <= s || inner.strides[j] % s != 0) continue;
                const std::size_t f = static_cast<std::size_t>(inner.strides[j] / s);
                if (f >= n || n % f != 0 || count == max_rank) continue;
                std::size_t i = count++;  // kept from the largest
                for (; i > 0 && factors[i - 1] < f; --i) factors[i] = factors[i - 1];
                factors[i] = f;
            }
            std::size_t above = n;
            for (std::size_t i = 0; i < count; ++i) {
                const std::size_t f = factors[i];
                if (f == above || above % f != 0) continue;
                if (finer.rank + 2 > max_rank) return false;
                finer.extents[finer.rank] = above / f;
                finer.strides[finer.rank++] = s * static_cast<std::ptrdiff_t>(f);
                above = f;
                split = true;
            }
            if (finer.rank == max_rank) return false;
            finer.extents[finer.rank] = above;
            finer.strides[finer.rank++] = s;
        }
        finer.offset = whole.offset;
        whole = finer;
        return split;
    }
    // A step of from's extents but axis `axis` (for a reshape that drops an axis of extent 1).
    static step without_axis(const step& from, std::size_t axis) {
        step s{step_kind::reshape};
        for (std::size_t i = 0; i < from.rank; ++i) {
            if (i != axis) s.extents[s.rank++] = from.extents[i];
        }
        return s;
    }
    static void shape_like(step& s, const step& like) {
        s.rank = like.rank;
        s.extents = like.extents;
        s.axes = like.axes;
    }

    program& p_;
    element_type type_;
    gradient_options options_;
};

// What step `id` (a copy: the builder appends to the steps) gives its operand o, from the
// adjoint g of its value: a value of the operand's extents.
inline std::size_t contribution(builder& b, const step& s, std::size_t id, std::size_t o, std::size_t g) {
    const std::size_t x = s.operands[o];
    const step operand = b.at(x);
    switch (s.kind) {
        case step_kind::elementwise: {
            const std::size_t a = s.operands[0], other = s.operands[1 - std::min<std::size_t>(o, 1)];
            const std::size_t zero = b.number(0), one = b.number(1);
            std::size_t c = no_step;
            switch (s.op) {
                case op_code::add: case op_code::round_bf16:  // cast<bf16> passes its cotangent on, as PyTorch's .to() does
                    c = g;
                    break;
                case op_code::subtract: c = o == 0 ? g : b.negate(g); break;
                case op_code::multiply: c = b.multiply(g, other); break;
                case op_code::divide:  // d(a/b)/db = -a/b^2
                    c = o == 0 ? b.divide(g, other) : b.negate(b.divide(b.multiply(g, a), b.multiply(x, x)));
                    break;
                case op_code::negate: c = b.negate(g); break;
                case op_code::exp: c = b.multiply(g, id); break;
                case op_code::log: c = b.divide(g, a); break;
                case op_code::sqrt: c = b.divide(g, b.scaled(id, 2)); break;
                case op_code::tanh: c = b.multiply(g, b.minus(one, b.multiply(id, id))); break;
                case op_code::abs:  // the sign: 0 at 0 (and for NaN)
                    c = b.multiply(g, b.minus(b.apply(op_code::greater, a, zero), b.apply(op_code::less, a, zero)));
                    break;
                case op_code::erf:  // 2/sqrt(pi) e^(-a^2)
                    c = b.multiply(g, b.scaled(b.apply(op_code::exp, b.negate(b.multiply(a, a))), 2 * std::numbers::inv_sqrtpi));
                    break;
                case op_code::sigmoid: c = b.multiply(g, b.multiply(id, b.minus(one, id))); break;
                case op_code::silu: {  // s (1 + a (1 - s)), s = sigmoid(a)
                    const std::size_t sig = b.apply(op_code::sigmoid, a);
                    c = b.multiply(g, b.multiply(sig, b.plus(one, b.multiply(a, b.minus(one, sig)))));
                    break;
                }
                case op_code::gelu: c = b.multiply(g, b.apply(op_code::gelu_derivative, a)); break;  // Phi(a) + a phi(a)
                case op_code::gelu_derivative: {  // (a gradient's gradient) phi(a) (2 - a^2)
                    const std::size_t pdf = b.scaled(b.apply(op_code::exp, b.scaled(b.multiply(a, a), -0.5)),
                                                     std::numbers::inv_sqrtpi / std::numbers::sqrt2);
                    c = b.multiply(g, b.multiply(pdf, b.minus(b.number(2), b.multiply(a, a))));
                    break;
                }
                case op_code::sin: c = b.multiply(g, b.apply(op_code::cos, a)); break;
                case op_code::cos: c = b.negate(b.multiply(g, b.apply(op_code::sin, a))); break;
                case op_code::rsqrt: c = b.multiply(b.scaled(g, -0.5), b.multiply(id, b.multiply(id, id))); break;
                case op_code::maximum: case op_code::minimum: {
                    // all of g where this operand is the larger (smaller), half where they are
                    // equal, all where either is NaN (the result is that NaN)
                    const std::size_t lost = s.op == op_code::maximum ? b.apply(op_code::less, x, other)
                                                                      : b.apply(op_code::greater, x, other);
                    const std::size_t tie = b.apply(op_code::equal, x, other);
                    c = b.apply(op_code::where, lost, zero, b.apply(op_code::where, tie, b.scaled(g, 0.5), g));
                    break;
                }
                case op_code::pow: {
                    const std::size_t exponent = s.operands[1];
                    if (o == 0) {  // e a^(e - 1); 0 where e is 0
                        const std::size_t slope = b.multiply(exponent, b.apply(op_code::pow, a, b.minus(exponent, one)));
                        c = b.apply(op_code::where, b.apply(op_code::equal, exponent, zero), zero, b.multiply(g, slope));
                    } else {  // a^e log(a); 0 where a is 0 and e >= 0
                        const std::size_t flat = b.apply(op_code::logical_and, b.apply(op_code::equal, a, zero),
                                                         b.apply(op_code::greater_equal, exponent, zero));
                        c = b.apply(op_code::where, flat, zero, b.multiply(g, b.multiply(id, b.apply(op_code::log, a))));
                    }
                    break;
                }
                case op_code::where:
                    c = o == 1 ? b.apply(op_code::where, a, g, zero) : b.apply(op_code::where, a, zero, g);
                    break;
                case op_code::less: case op_code::less_equal: case op_code::greater: case op_code::greater_equal:
                case op_code::equal: case op_code::not_equal: case op_code::logical_and: case op_code::logical_or:
                case op_code::logical_not:
                    throw std::logic_error("dimsum: differentiate: a mask's operand carries no gradient");
                case op_code::map:
                    throw std::logic_error("dimsum: differentiate: ds::map has no derivative");  // ops/grad.hpp refuses it
            }
            return b.sum_to(c, operand);
        }
        case step_kind::permute: {
            order_t inverse{};
            for (std::size_t i = 0; i < s.rank; ++i) inverse[s.order[i]] = i;
            return b.permute(g, inverse);
        }
        case step_kind::reshape: return b.reshape(g, operand);
        case step_kind::select: return b.embed(g, operand, s.axis, s.index, 1);
        case step_kind::slice: return b.embed(g, operand, s.axis, s.index, s.spacing);
        case step_kind::concat: {
            const std::size_t first = o == 0 ? 0 : b.at(s.operands[0]).extents[s.axis];
            return b.slice(g, s.axis, first, operand.extents[s.axis], 1);
        }
        case step_kind::embed:  // (a gradient's gradient) what the embed placed, read back
            return s.rank > operand.rank ? b.select(g, s.axis, s.index)
                                         : b.slice(g, s.axis, s.index, operand.extents[s.axis], s.spacing);
        case step_kind::gather: return b.regather(s.kind, g, s.operands[1], operand, s.axis);
        case step_kind::scatter: return b.regather(s.kind, g, s.operands[1], operand, s.axis);
        case step_kind::matmul: {  // dA = dC B^T, dB = A^T dC, each summed over the batch axes it was broadcast along
            if (o == 1 && operand.rank == 2 && s.rank > 2 && b.at(s.operands[0]).rank == s.rank) {
                // a matrix B that every batch shares (a weight): one product over the rows of
                // every batch, the batch axes folded into A's and dC's rows, rather than a
                // product per batch and their sum
                const std::size_t a = s.operands[0];
                return b.matmul(b.transpose_last_two(b.rows_of(a)), b.rows_of(b.cotangent_beside(g, a)));
            }
            return b.sum_to(b.operand_product(s, o, g), operand);
        }
        case step_kind::softmax: {  // y (g - sum(g y))
            const std::size_t inner = b.reduce(step_kind::sum, b.multiply(g, id), s.axis);
            return b.multiply(id, b.minus(g, b.unreduce(inner, s, s.axis)));
        }
        case step_kind::layer_norm: {  // (g - mean(g) - y mean(g y)) / sqrt(variance + epsilon)
            const std::size_t centred = b.minus(x, b.unreduce(b.reduce(step_kind::mean, x, s.axis), s, s.axis));
            const std::size_t variance = b.reduce(step_kind::mean, b.multiply(centred, centred), s.axis);
            const std::size_t inverse_deviation = b.apply(op_code::rsqrt, b.plus(variance, b.number(s.number)));
            const std::size_t mean_g = b.unreduce(b.reduce(step_kind::mean, g, s.axis), s, s.axis);
            const std::size_t mean_gy = b.unreduce(b.reduce(step_kind::mean, b.multiply(g, id), s.axis), s, s.axis);
            const std::size_t inner = b.minus(b.minus(g, mean_g), b.multiply(id, mean_gy));
            const std::size_t gradient = b.multiply(b.unreduce(inverse_deviation, s, s.axis), inner);
            b.record({.forward = id, .cotangent = g, .gradient = gradient});  // for one kernel (passes.hpp)
            return gradient;
        }
        case step_kind::sum: return b.expand(b.unreduce(g, operand, s.axis), operand);
        case step_kind::mean:
            return b.expand(b.unreduce(b.scaled(g, 1.0 / static_cast<double>(operand.extents[s.axis])), operand, s.axis), operand);
        case step_kind::max: {  // shared evenly by the positions that hold the maximum
            const std::size_t holds = b.apply(op_code::equal, x, b.unreduce(id, operand, s.axis));
            const std::size_t share = b.divide(g, b.reduce(step_kind::sum, holds, s.axis));
            return b.apply(op_code::where, holds, b.unreduce(share, operand, s.axis), b.number(0), &operand);
        }
        case step_kind::attention: case step_kind::attention_gradient: case step_kind::layer_norm_gradient:
            throw std::logic_error("dimsum: differentiate: attention and layer_norm_gradient steps come from a pass, after differentiation");
        case step_kind::tensor: case step_kind::number: case step_kind::causal_mask: case step_kind::arange:
            break;  // no operands
    }
    throw std::logic_error("dimsum: differentiate: a step without operands has no contribution");
}

// Whether the elementwise formula rooted at `id` reads step `target`.
inline bool reads(const std::vector<step>& steps, std::size_t id, std::size_t target) {
    if (id == target) return true;
    const step& s = steps[id];
    if (s.kind != step_kind::elementwise) return false;
    for (std::size_t o = 0; o < s.operand_count; ++o) {
        if (reads(steps, s.operands[o], target)) return true;
    }
    return false;
}

// The derivative of the score function f (the formula rooted at `f`) with respect to the
// scores, where the softmax gives a score weight, if it is one number there: f is a path of
// steps from its root to the scores, each read by nothing else (`readers`), through
//     a + b, a - b      the other operand reading no score;
//     a * c, a / c      c a number;
//     where(m, x, -infinity), where(m, -infinity, x)   a mask: weight 0 where it takes -infinity;
// and its other operands carry no gradient (`depends`), so that only Q, K and V have one.
inline std::optional<double> score_slope(const std::vector<step>& steps, std::size_t f, std::size_t scores,
                                         const std::vector<std::size_t>& readers, const std::vector<char>& depends) {
    double slope = 1;
    auto off_path = [&](std::size_t operand) { return !depends[operand] && !reads(steps, operand, scores); };
    auto minus_infinity = [&](std::size_t operand) {
        return steps[operand].kind == step_kind::number && steps[operand].number == -std::numeric_limits<double>::infinity();
    };
    for (std::size_t at = f; at != scores;) {
        const step& s = steps[at];
        if (s.kind != step_kind::elementwise || readers[at] != 1) return std::nullopt;
        const std::size_t a = s.operands[0], b = s.operands[1];
        switch (s.op) {
            case op_code::add:
                if (off_path(b)) at = a;
                else if (off_path(a)) at = b;
                else return std::nullopt;
                break;
            case op_code::subtract:
                if (!off_path(b)) return std::nullopt;
                at = a;
                break;
            case op_code::multiply:
                if (steps[b].kind == step_kind::number) { slope *= steps[b].number; at = a; }
                else if (steps[a].kind == step_kind::number) { slope *= steps[a].number; at = b; }
                else return std::nullopt;
                break;
            case op_code::divide:
                if (steps[b].kind != step_kind::number) return std::nullopt;
                slope /= steps[b].number;
                at = a;
                break;
            case op_code::where: {
                const std::size_t x = s.operands[1], y = s.operands[2];
                if (!off_path(a)) return std::nullopt;
                if (minus_infinity(x)) at = y;
                else if (minus_infinity(y)) at = x;
                else return std::nullopt;
                break;
            }
            default: return std::nullopt;
        }
    }
    if (readers[scores] != 1) return std::nullopt;
    return slope;
}

// The record of the attention whose value is matmul step `id` (attention_backward), if it
// is one in the form a fused backward computes and nothing else reads its weights or scores;
// its gradient products are filled in as the sweep makes them.
inline std::optional<attention_backward> attention_backward_at(const program& p, std::size_t id, std::size_t cotangent,
                                                              const std::vector<std::size_t>& readers,
                                                              const std::vector<char>& depends) {
    const std::optional<attention_match> match = match_attention(p.steps, id);
    if (!match) return std::nullopt;
    const std::size_t weights = p.steps[id].operands[0];
    if (readers[weights] != 1 || match->values == weights) return std::nullopt;
    const std::optional<double> slope = score_slope(p.steps, p.steps[weights].operands[0], match->scores, readers, depends);
    if (!slope) return std::nullopt;
    attention_backward a;
    a.forward = *match;
    a.output = id;
    a.cotangent = cotangent;
    a.gradients = {no_step, no_step, no_step};
    a.slope = *slope;
    return a;
}

// Record a appended to p's, or merged with the record of the same attention and cotangent
// that an earlier sweep left (whose products this sweep's merge with): its index.
inline std::size_t add_record(program& p, const attention_backward& a) {
    for (std::size_t r = 0; r < p.attention_backwards.size(); ++r) {
        attention_backward& there = p.attention_backwards[r];
        if (there.forward != a.forward || there.output != a.output || there.cotangent != a.cotangent) continue;
        for (std::size_t g = 0; g < 3; ++g) {
            if (there.gradients[g] == no_step) there.gradients[g] = a.gradients[g];
        }
        return r;
    }
    p.attention_backwards.push_back(a);
    return p.attention_backwards.size() - 1;
}

}  // namespace differentiation

// The gradients of step `output`'s value with respect to the values of each binding in
// `leaves`, given step `cotangent` (of output's extents), as steps appended to p, in one
// sweep: gradients[i] is a step of the extents of leaf i's tensor step; zeros where the output
// reads the binding only through masks; no_step where it does not read it at all. Each
// step's adjoint sums all its readers' contributions, whichever leaves it leads to, so the
// sweep for one leaf appends the same steps as the sweep for several (and merges with them).
inline void differentiate(program& p, std::size_t output, std::size_t cotangent, std::span<const std::size_t> leaves,
                          std::vector<std::size_t>& gradients, gradient_options options = {}) {
    auto is_leaf = [&](const step& s) {
        return s.kind == step_kind::tensor && std::find(leaves.begin(), leaves.end(), s.binding) != leaves.end();
    };
    const std::size_t count = output + 1;  // the steps the output may read
    std::vector<char>& depends = p.sweep.depends;  // whether a step reads a leaf through steps that carry gradients
    depends.assign(count, 0);
    for (std::size_t id = 0; id < count; ++id) {
        const step& s = p.steps[id];
        if (is_leaf(s)) {
            depends[id] = 1;
            continue;
        }
        for (std::size_t o = 0; o < s.operand_count; ++o) {
            if (differentiation::carries_gradient(s, o)) depends[id] |= depends[s.operands[o]];
        }
    }
    std::vector<char>& live = p.sweep.live;  // read by the output
    live.assign(count, 0);
    live[output] = 1;
    for (std::size_t id = count; id-- > 0;) {
        if (!live[id]) continue;
        for (std::size_t o = 0; o < p.steps[id].operand_count; ++o) live[p.steps[id].operands[o]] = 1;
    }
    std::vector<std::size_t>& readers = p.sweep.readers;  // operand slots of live steps that read each step
    readers.assign(count, 0);
    for (std::size_t id = 0; id < count; ++id) {
        if (!live[id]) continue;
        for (std::size_t o = 0; o < p.steps[id].operand_count; ++o) ++readers[p.steps[id].operands[o]];
    }
    std::vector<std::size_t>& adjoint = p.sweep.adjoint;
    adjoint.assign(count, no_step);
    differentiation::builder b(p, p.steps[output].computes_in, options);
    adjoint[output] = cotangent;
    std::vector<std::size_t>& records = p.sweep.records;  // this sweep's attentions, in p.attention_backwards
    records.clear();
    for (std::size_t id = count; id-- > 0;) {
        if (adjoint[id] == no_step || !depends[id]) continue;
        const step s = p.steps[id];  // a copy: the builder appends to p.steps
        for (std::size_t o = 0; o < s.operand_count; ++o) {
            const std::size_t x = s.operands[o];
            if (!differentiation::carries_gradient(s, o) || !depends[x]) continue;
            const std::size_t c = differentiation::contribution(b, s, id, o, adjoint[id]);
            adjoint[x] = adjoint[x] == no_step ? c : b.plus(adjoint[x], c);
        }
        // An attention's gradient products, recorded for a fused backward (attention_backward).
        // The builder merges a step equal to one there: each call below finds the product the
        // matmul rule just made (dV = P^T dO at O; dQ = dS K and dK^T = Q^T dS at the scores).
        if (s.kind != step_kind::matmul) continue;
        if (auto a = differentiation::attention_backward_at(p, id, adjoint[id], readers, depends)) {
            if (depends[s.operands[1]]) a->gradients[2] = b.operand_product(s, 1, adjoint[id]);
            records.push_back(differentiation::add_record(p, *a));
            continue;
        }
        for (const std::size_t r : records) {
            attention_backward& a = p.attention_backwards[r];
            if (a.forward.scores != id) continue;
            if (depends[s.operands[0]]) a.gradients[0] = b.operand_product(s, 0, adjoint[id]);
            if (depends[s.operands[1]]) a.gradients[1] = b.operand_product(s, 1, adjoint[id]);
        }
    }
    // each leaf's: the sum of the adjoints of the tensor steps that read its binding
    gradients.assign(leaves.size(), no_step);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        std::size_t leaf_step = no_step, gradient = no_step;
        for (std::size_t id = count; id-- > 0;) {
            const step& s = p.steps[id];
            if (s.kind != step_kind::tensor || s.binding != leaves[i] || !live[id]) continue;
            leaf_step = id;
            if (adjoint[id] != no_step) gradient = gradient == no_step ? adjoint[id] : b.plus(gradient, adjoint[id]);
        }
        if (leaf_step == no_step) continue;
        const step shape = p.steps[leaf_step];
        gradients[i] = gradient != no_step ? gradient : b.expand(b.number(0), shape);  // read through masks alone
    }
}

// The same for one binding: its gradient's step, or no_step.
inline std::size_t differentiate(program& p, std::size_t output, std::size_t cotangent, std::size_t leaf,
                                 gradient_options options = {}) {
    std::vector<std::size_t> gradients;
    differentiate(p, output, cotangent, std::span<const std::size_t>(&leaf, 1), gradients, options);
    return gradients[0];
}

}  // namespace dimsum::evaluation
