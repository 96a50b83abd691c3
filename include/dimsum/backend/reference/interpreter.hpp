#pragma once
// Evaluates a lowered formula (program.hpp) with plain loops. A step's value is either read
// element by element (tensors, numbers, masks, elementwise steps) or materialised once into
// a strided array (matmul, softmax, layer_norm, reductions; permute, reshape and select, which only
// change strides where the layout allows).

#include <memory>
#include <vector>

#include "dimsum/backend/reference/kernels.hpp"
#include "dimsum/backend/reference/program.hpp"
#include "dimsum/backend/reference/reshape_strides.hpp"

namespace dimsum::backend::reference {

template <class T>
class interpreter {
public:
    explicit interpreter(const program<T>& steps) : steps_(steps), values_(steps.size()), computed_(steps.size()) {}

    // Writes the value of step `id` into dst, which has that step's extents.
    void write(std::size_t id, strided<T> dst) {
        const step<T>& s = steps_[id];
        switch (s.kind) {
            case step_kind::matmul: {
                strided<const T> a = broadcast_to_rank(value(s.operands[0]), s.rank);
                strided<const T> b = broadcast_to_rank(value(s.operands[1]), s.rank);
                matmul<T>(a, b, dst);
                return;
            }
            case step_kind::softmax: softmax<T>(value(s.operands[0]), dst, s.axis); return;
            case step_kind::layer_norm: layer_norm<T>(value(s.operands[0]), dst, s.axis, s.number); return;
            case step_kind::sum: reduce<fn::sum, T>(value(s.operands[0]), dst, s.axis); return;
            case step_kind::max: reduce<fn::max, T>(value(s.operands[0]), dst, s.axis); return;
            case step_kind::mean: reduce<fn::mean, T>(value(s.operands[0]), dst, s.axis); return;
            default:
                for_each_index(dst.extents, dst.rank, [&](const std::size_t* index) { dst.at(index) = read(id, index); });
        }
    }

private:
    // The element of step `id` at `index` (that step's rank).
    T read(std::size_t id, const std::size_t* index) {
        const step<T>& s = steps_[id];
        switch (s.kind) {
            case step_kind::number: return s.number;
            case step_kind::causal_mask: {
                // key k lies in query q's future when k > q + (keys - queries)
                auto q = static_cast<long long>(s.extents[0] == 1 ? 0 : index[0]);
                auto k = static_cast<long long>(s.extents[1] == 1 ? 0 : index[1]);
                return k > q + static_cast<long long>(s.extents[1]) - static_cast<long long>(s.extents[0]) ? T(1) : T(0);
            }
            case step_kind::elementwise: {
                T arguments[max_operands];
                for (std::size_t i = 0; i < s.operand_count; ++i) {
                    arguments[i] = read(s.operands[i], broadcast_index(s, steps_[s.operands[i]], index).data());
                }
                return s.function(arguments);
            }
            default: return value(id).at(index);
        }
    }

    // The index into an operand broadcast to step s: right-aligned, 0 along extents of 1.
    static std::array<std::size_t, max_rank> broadcast_index(const step<T>& s, const step<T>& operand,
                                                             const std::size_t* index) {
        std::array<std::size_t, max_rank> at{};
        std::size_t lead = s.rank - operand.rank;
        for (std::size_t i = 0; i < operand.rank; ++i) at[i] = operand.extents[i] == 1 ? 0 : index[lead + i];
        return at;
    }

    // The value of step `id` as a strided array, computed once.
    const strided<const T>& value(std::size_t id) {
        if (!computed_[id]) {
            values_[id] = compute(id);
            computed_[id] = true;
        }
        return values_[id];
    }

    strided<const T> compute(std::size_t id) {
        const step<T>& s = steps_[id];
        switch (s.kind) {
            case step_kind::tensor: return s.tensor;
            case step_kind::permute: {
                strided<const T> from = value(s.operands[0]), m = from;
                for (std::size_t i = 0; i < s.rank; ++i) {
                    m.extents[i] = from.extents[s.order[i]];
                    m.strides[i] = from.strides[s.order[i]];
                }
                return m;
            }
            case step_kind::select: {
                strided<const T> from = value(s.operands[0]), m = from;
                m.data += static_cast<std::ptrdiff_t>(s.index) * from.strides[s.axis];
                m.rank = s.rank;
                for (std::size_t i = s.axis; i < s.rank; ++i) {
                    m.extents[i] = from.extents[i + 1];
                    m.strides[i] = from.strides[i + 1];
                }
                return m;
            }
            case step_kind::reshape: {
                strided<const T> m = value(s.operands[0]);
                if (m.size() != 0) {
                    auto strides = reshape_strides(m.extents, m.strides, m.rank, s.extents, s.rank);
                    if (!strides) {  // the layout does not allow it: copy into row-major order first
                        strided<T> copy = fresh(m.rank, m.extents);
                        write(s.operands[0], copy);
                        m = {copy.data, copy.rank, copy.extents, copy.strides};
                        strides = reshape_strides(m.extents, m.strides, m.rank, s.extents, s.rank);
                    }
                    m.strides = *strides;
                }
                m.rank = s.rank;
                m.extents = s.extents;
                return m;
            }
            default: {
                strided<T> m = fresh(s.rank, s.extents);
                write(id, m);
                return {m.data, m.rank, m.extents, m.strides};
            }
        }
    }

    // A new row-major array, owned by the interpreter until it is done.
    strided<T> fresh(std::size_t rank, const std::array<std::size_t, max_rank>& extents) {
        strided<T> s{nullptr, rank, extents, {}};
        std::size_t size = dimsum::detail::row_major(extents.data(), rank, s.strides.data());
        buffers_.emplace_back(new T[size]());
        s.data = buffers_.back().get();
        return s;
    }

    const program<T>& steps_;
    std::vector<strided<const T>> values_;
    std::vector<bool> computed_;
    std::vector<std::unique_ptr<T[]>> buffers_;
};

}  // namespace dimsum::backend::reference
