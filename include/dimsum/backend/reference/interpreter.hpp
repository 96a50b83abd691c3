#pragma once
// Evaluates a lowered formula (program.hpp) with plain loops. A step's value is either read
// element by element (tensors, numbers, masks, elementwise steps) or materialised once into
// a strided array (matmul, softmax, layer_norm, reductions; permute, reshape and select, which only
// change strides where the layout allows).

#include <memory>
#include <vector>

#include "dimsum/backend/reference/kernels.hpp"
#include "dimsum/evaluation/program.hpp"
#include "dimsum/evaluation/strided.hpp"
#include "dimsum/evaluation/step_values.hpp"

namespace dimsum::backend::reference {

using evaluation::in_future;
using evaluation::max_operands;
using evaluation::program;
using evaluation::step;
using evaluation::step_kind;
using evaluation::step_values;


namespace detail {
// The interpreter's own storage for its steps' values, constructed before step_values uses it.
template <class T>
struct value_storage {
    std::vector<strided<const T>> values;
    std::vector<char> computed;
    std::vector<std::unique_ptr<T[]>> buffers;
};
}  // namespace detail

template <class T>
class interpreter : private detail::value_storage<T>, public step_values<T, interpreter<T>> {
    using storage = detail::value_storage<T>;
    using values = step_values<T, interpreter<T>>;
    friend values;
    using values::fresh;
    using values::steps_;
    using values::value;

public:
    explicit interpreter(const program<T>& steps) : values(steps, storage::values, storage::computed) {}

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
            case step_kind::tensor: case step_kind::number: case step_kind::causal_mask: case step_kind::elementwise:
            case step_kind::permute: case step_kind::reshape: case step_kind::select:
                for_each_index(dst.extents, dst.rank, [&](const std::size_t* index) { dst.at(index) = read(id, index); });
                return;
        }
    }

private:
    // The element of step `id` at `index` (that step's rank).
    T read(std::size_t id, const std::size_t* index) {
        const step<T>& s = steps_[id];
        switch (s.kind) {
            case step_kind::number: return s.number;
            case step_kind::causal_mask: {
                std::size_t q = s.extents[0] == 1 ? 0 : index[0], k = s.extents[1] == 1 ? 0 : index[1];
                return in_future(q, k, s.extents[0], s.extents[1]) ? T(1) : T(0);
            }
            case step_kind::elementwise: {
                T arguments[max_operands];
                for (std::size_t i = 0; i < s.operand_count; ++i) {
                    arguments[i] = read(s.operands[i], broadcast_index(s, steps_[s.operands[i]], index).data());
                }
                return fn::evaluate(s.op, arguments);
            }
            case step_kind::tensor: case step_kind::permute: case step_kind::reshape: case step_kind::select:
            case step_kind::matmul: case step_kind::softmax: case step_kind::layer_norm: case step_kind::sum:
            case step_kind::max: case step_kind::mean:
                return value(id).at(index);
        }
        __builtin_unreachable();  // every kind is handled above
    }

    // The index into an operand broadcast to step s: right-aligned, 0 along extents of 1.
    static std::array<std::size_t, max_rank> broadcast_index(const step<T>& s, const step<T>& operand,
                                                             const std::size_t* index) {
        std::array<std::size_t, max_rank> at{};
        std::size_t lead = s.rank - operand.rank;
        for (std::size_t i = 0; i < operand.rank; ++i) at[i] = operand.extents[i] == 1 ? 0 : index[lead + i];
        return at;
    }

    // A new array, owned by the interpreter until it is done.
    T* allocate(std::size_t count) {
        storage::buffers.emplace_back(new T[count]());
        return storage::buffers.back().get();
    }
};

}  // namespace dimsum::backend::reference
