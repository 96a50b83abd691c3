#pragma once
// A formula lowered to plain data: a tree of steps over one element type T, which the
// interpreter (interpreter.hpp) evaluates. Lowering is the only part of the reference backend
// compiled once per formula type, and it is small: everything that loops is compiled once
// per element type. Booleans (masks) travel as T: 1 for true, 0 for false.

#include <array>
#include <cstddef>
#include <vector>

#include "dimsum/evaluation/strided.hpp"
#include "dimsum/core/functors.hpp"

namespace dimsum::evaluation {

enum class step_kind { tensor, number, causal_mask, elementwise, permute, reshape, select, matmul, softmax, layer_norm, sum, max, mean };

inline constexpr std::size_t max_operands = 3;  // where(condition, a, b)

// The causal mask's rule (expr::causal_mask), for every backend: key k lies in query q's
// future when k > q + (keys - queries), queries and keys aligned at their ends.
constexpr bool in_future(std::size_t query, std::size_t key, std::size_t queries, std::size_t keys) {
    return key + queries > query + keys;
}

// Whether a step's value is memory that exists already, seen through strides (a tensor, or a
// view of another step's value), rather than an array that an executor computes.
constexpr bool is_view(step_kind kind) {
    return kind == step_kind::tensor || kind == step_kind::permute || kind == step_kind::reshape ||
           kind == step_kind::select;
}

template <class T>
struct step {
    step_kind kind;
    std::size_t rank = 0;
    std::array<std::size_t, max_rank> extents{};  // of this step's value
    std::array<std::size_t, max_operands> operands{};
    std::size_t operand_count = 0;

    strided<const T> tensor{};                // tensor: the user's memory
    T number{};                               // number; layer_norm: epsilon
    op_code op{};                             // elementwise: which function of the operands
    std::array<std::size_t, max_rank> order{};  // permute: result axis i is operand axis order[i]
    std::size_t axis = 0;                     // select, softmax, layer_norm, reductions
    std::size_t index = 0;                    // select
};

template <class T>
using program = std::vector<step<T>>;

}  // namespace dimsum::evaluation
