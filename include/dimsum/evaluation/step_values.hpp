#pragma once
// The values of a lowered program's steps as strided arrays, each computed once: shared by
// every backend that executes a program (the reference interpreter, the CPU executor).

#include <array>
#include <cstddef>
#include <vector>

#include "dimsum/evaluation/program.hpp"
#include "dimsum/evaluation/reshape_strides.hpp"

namespace dimsum::evaluation {

// `from` is the operand's value. A reshape that the layout cannot express needs the operand
// in row-major order first: copy() makes such a copy of it and returns it.
template <class T, class Copy>
strided<const T> view_of(const step<T>& s, strided<const T> from, Copy&& copy) {
    strided<const T> m = from;
    switch (s.kind) {
        case step_kind::permute:  // result axis i is operand axis order[i]
            for (std::size_t i = 0; i < s.rank; ++i) {
                m.extents[i] = from.extents[s.order[i]];
                m.strides[i] = from.strides[s.order[i]];
            }
            return m;
        case step_kind::select:  // the operand at `index` along `axis`, one axis fewer
            m.data += static_cast<std::ptrdiff_t>(s.index) * from.strides[s.axis];
            m.rank = s.rank;
            for (std::size_t i = s.axis; i < s.rank; ++i) {
                m.extents[i] = from.extents[i + 1];
                m.strides[i] = from.strides[i + 1];
            }
            return m;
        case step_kind::reshape: {
            if (m.size() != 0) {
                auto strides = reshape_strides(m.extents, m.strides, m.rank, s.extents, s.rank);
                if (!strides) {  // the layout does not allow it: copy into row-major order first
                    strided<T> row_major = copy();
                    m = {row_major.data, row_major.rank, row_major.extents, row_major.strides};
                    strides = reshape_strides(m.extents, m.strides, m.rank, s.extents, s.rank);
                }
                m.strides = *strides;
            }
            m.rank = s.rank;
            m.extents = s.extents;
            return m;
        }
        case step_kind::tensor: case step_kind::number: case step_kind::causal_mask: case step_kind::elementwise:
        case step_kind::matmul: case step_kind::softmax: case step_kind::layer_norm: case step_kind::sum:
        case step_kind::max: case step_kind::mean:
            break;  // not views
    }
    return from;  // never reached: only view steps come here
}

// The value of each step, for an executor `Derived` that provides write(id, strided<T>) (the
// step's value into an array of its extents) and allocate(count) (memory for one). A tensor's
// value is its memory; a view step's, new strides over its operand's value; any other step's,
// a fresh row-major array that the executor writes.
template <class T, class Derived>
class step_values {
protected:
    // values and computed: storage the executor keeps (and may reuse between evaluations).
    step_values(const program<T>& steps, std::vector<strided<const T>>& values, std::vector<char>& computed)
        : steps_(steps), values_(values), computed_(computed) {
        values_.assign(steps.size(), strided<const T>{});
        computed_.assign(steps.size(), 0);
    }

    // The value of step `id`, computed once.
    const strided<const T>& value(std::size_t id) {
        if (!computed_[id]) {
            values_[id] = compute(id);
            computed_[id] = 1;
        }
        return values_[id];
    }

    // A new row-major array of these extents, from the executor's memory.
    strided<T> fresh(std::size_t rank, const std::array<std::size_t, max_rank>& extents) {
        strided<T> s{nullptr, rank, extents, {}};
        std::size_t size = dimsum::detail::row_major(extents.data(), rank, s.strides.data());
        s.data = self().allocate(size);
        return s;
    }

    const program<T>& steps_;

private:
    strided<const T> compute(std::size_t id) {
        const step<T>& s = steps_[id];
        switch (s.kind) {
            case step_kind::tensor: return s.tensor;
            case step_kind::permute:
            case step_kind::select:
            case step_kind::reshape: {
                if (s.kind == step_kind::reshape && copy_is_certain(s)) {  // computed into the copy at once
                    const step<T>& operand = steps_[s.operands[0]];
                    strided<T> copy = fresh(operand.rank, operand.extents);
                    self().write(s.operands[0], copy);
                    return view_of(s, strided<const T>{copy.data, copy.rank, copy.extents, copy.strides}, [] { return strided<T>{}; });
                }
                const strided<const T>& from = value(s.operands[0]);
                return view_of(s, from, [&] {
                    strided<T> copy = fresh(from.rank, from.extents);
                    self().write(s.operands[0], copy);
                    return copy;
                });
            }
            case step_kind::number: case step_kind::causal_mask: case step_kind::elementwise: case step_kind::matmul:
            case step_kind::softmax: case step_kind::layer_norm: case step_kind::sum: case step_kind::max:
            case step_kind::mean: {  // an array the executor computes
                strided<T> m = fresh(s.rank, s.extents);
                self().write(id, m);
                return {m.data, m.rank, m.extents, m.strides};
            }
        }
        __builtin_unreachable();  // every kind is handled above
    }
    Derived& self() { return static_cast<Derived&>(*this); }

    // Whether reshape step s will need its operand copied into row-major order, known before
    // the operand exists: when the operand is a permutation of a value still to be computed
    // (row-major in its own axes), such as attention's heads merged back into rows. The
    // executor then computes the value straight into the copy, with no temporary between.
    bool copy_is_certain(const step<T>& s) const {
        const step<T>& permute = steps_[s.operands[0]];
        if (permute.kind != step_kind::permute || computed_[s.operands[0]] || computed_[permute.operands[0]]) return false;
        const step<T>& inner = steps_[permute.operands[0]];
        if (is_view(inner.kind)) return false;  // its layout is not row-major
        std::array<std::ptrdiff_t, max_rank> row_major{}, strides{};
        std::array<std::size_t, max_rank> extents{};
        dimsum::detail::row_major(inner.extents.data(), inner.rank, row_major.data());
        for (std::size_t i = 0; i < permute.rank; ++i) {
            extents[i] = inner.extents[permute.order[i]];
            strides[i] = row_major[permute.order[i]];
        }
        std::size_t size = 1;
        for (std::size_t i = 0; i < permute.rank; ++i) size *= extents[i];
        return size != 0 && !reshape_strides(extents, strides, permute.rank, s.extents, s.rank);
    }

    std::vector<strided<const T>>& values_;
    std::vector<char>& computed_;
};

}  // namespace dimsum::evaluation
