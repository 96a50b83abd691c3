#pragma once
// The op codes of dimsum's elementwise functions, apart from the functors (functors.hpp), in a
// header that any C++ compiler reads, nvcc included (backend/cuda/), since it names no formula type.

#include <cstddef>
#include <cstdint>

namespace dimsum {

// dimsum's closed set of elementwise functions. A backend dispatches on it with a switch that
// has no default, so that a code added here is a -Wswitch error wherever it is not handled.
enum class op_code : std::uint8_t {
    add, subtract, multiply, divide, negate,
    exp, log, sqrt, tanh, abs, erf, sigmoid, silu, gelu,
    gelu_derivative,  // gelu's derivative, which differentiation writes (no operation of its own)
    sin, cos, rsqrt,
    round_bf16,  // cast<bf16>: the nearest bf16, kept in the formula's type
    maximum, minimum, pow,
    less, less_equal, greater, greater_equal, equal, not_equal,  // give masks
    logical_and, logical_or, logical_not,                        // of masks
    where,  // where(condition, a, b): the condition a mask of 0 and 1
    map,    // a user's function (ds::map), which a program holds as an evaluation::host_function
};
inline constexpr std::size_t op_code_count = std::size_t(op_code::map) + 1;

}  // namespace dimsum
