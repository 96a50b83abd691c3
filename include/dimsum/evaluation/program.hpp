#pragma once
// A formula lowered to plain data (lower.hpp): a tree of steps, each with its extents, its
// element type and an op code, and no pointer to memory. A program's leaves are bindings,
// operand slots that the caller fills with memory when the program runs, so a program does
// not depend on where its tensors live (host or device). Every backend executes programs;
// none sees a formula's type. Booleans (masks) travel as numbers: 1 for true, 0 for false.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dimsum/core/element_type.hpp"
#include "dimsum/core/functors.hpp"
#include "dimsum/evaluation/codes.hpp"
#include "dimsum/evaluation/layout.hpp"
#include "dimsum/shape/axis.hpp"

namespace dimsum::evaluation {

enum class step_kind { tensor, number, causal_mask, arange, elementwise, permute, reshape, select, slice, concat, gather,
                       embed, scatter, matmul, attention, attention_gradient, softmax, layer_norm, layer_norm_gradient,
                       sum, max, mean };

// The kinds in groups that are planned alike, so that a switch over every kind lists groups:
//   memory       a tensor: a binding's memory, as it lies;
//   number       a constant;
//   indices      causal_mask, arange: values computed from their indices alone;
//   elementwise  a function of its operands' elements, broadcast;
//   view         permute, reshape, select, slice: the operand's value seen through a new layout;
//   join         concat, gather, embed, scatter: elements of the operands moved, none computed
//                (differentiate.hpp makes the last two: embed, select's and slice's adjoint, its
//                operand placed where the select or slice read, zeros elsewhere; scatter,
//                gather's adjoint, its values added up at the ids, zeros elsewhere);
//   product      matmul, attention and attention_gradient (program passes find them in a
//                program: passes.hpp);
//   line         softmax, layer_norm, layer_norm_gradient (a program pass finds it:
//                passes.hpp), sum, max, mean: a kernel along one axis.
enum class step_group { memory, number, indices, elementwise, view, join, product, line };

constexpr step_group group_of(step_kind kind) {
    switch (kind) {
        case step_kind::tensor: return step_group::memory;
        case step_kind::number: return step_group::number;
        case step_kind::causal_mask: case step_kind::arange: return step_group::indices;
        case step_kind::elementwise: return step_group::elementwise;
        case step_kind::permute: case step_kind::reshape: case step_kind::select: case step_kind::slice: return step_group::view;
        case step_kind::concat: case step_kind::gather: case step_kind::embed: case step_kind::scatter:
            return step_group::join;
        case step_kind::matmul: case step_kind::attention: case step_kind::attention_gradient: return step_group::product;
        case step_kind::softmax: case step_kind::layer_norm: case step_kind::layer_norm_gradient: case step_kind::sum:
        case step_kind::max: case step_kind::mean:
            return step_group::line;
    }
    return step_group::memory;  // not reached: every kind is listed
}

template <class T>
constexpr element_type element_type_of() {
    static_assert(tensor_element<T>, "dimsum: programs hold float, double, bf16, int32_t and int64_t");
    if constexpr (std::is_same_v<T, float>) return element_type::float32;
    else if constexpr (std::is_same_v<T, double>) return element_type::float64;
    else if constexpr (std::is_same_v<T, bf16>) return element_type::bf16;
    else if constexpr (std::is_same_v<T, std::int32_t>) return element_type::int32;
    else return element_type::int64;
}

inline constexpr std::size_t max_operands = 3;  // where(condition, a, b)

// Whether a step's value is memory that exists already, seen through a layout (a tensor, or a
// view of another step's value), rather than an array that an executor computes.
constexpr bool is_view(step_kind kind) {
    return group_of(kind) == step_group::memory || group_of(kind) == step_group::view;
}

// No step: a step field that names none.
inline constexpr std::size_t no_step = std::numeric_limits<std::size_t>::max();

struct step {
    step_kind kind;
    element_type type = element_type::float32;     // what the value holds
    element_type computes_in = element_type::float32;  // what arithmetic on it uses
    // once find_rounded_alone (passes.hpp) ran: nothing reads this value but one cast<bf16>
    // (here, beside the other one-byte fields, where it adds nothing to the step's size)
    bool rounded_alone = false;
    std::size_t rank = 0;
    extents_t extents{};                 // of this step's value
    const axis_desc* axes = nullptr;     // their names (static storage), for explain()
    std::array<std::size_t, max_operands> operands{};
    std::size_t operand_count = 0;

    std::size_t binding = 0;   // tensor: which of the program's bindings holds it
    double number = 0;         // number (exact for float and double); layer_norm, layer_norm_gradient: epsilon
    op_code op{};              // elementwise: which function of the operands
    order_t order{};           // permute: result axis i is operand axis order[i]
    std::size_t axis = 0;      // select, slice, concat, gather, embed, scatter, and the line kernels;
                               // attention_gradient: which operand's gradient (0: Q, 1: K^T, 2: V)
    std::size_t index = 0;     // select; slice, embed: the first position kept; map: which of the program's
                               // functions; attention: which of the program's attentions; attention_gradient:
                               // which of its attention_backwards
    std::size_t spacing = 1;   // slice, embed: the distance between the positions kept
    // elementwise, once group_epilogues (passes.hpp) ran: the product whose gemm computes
    // this step's formula as its epilogue, wherever the planner writes the formula; else no_step
    std::size_t epilogue = no_step;

    // The same computation (operands compared by index): what lowering merges.
    bool operator==(const step&) const = default;
};

// Whether step s is cast<bf16>: its value rounded to bf16 (computed in the program's type).
constexpr bool rounds_to_bf16(const step& s) { return s.kind == step_kind::elementwise && s.op == op_code::round_bf16; }

// readers[id] := how many operand slots of the steps read step id (one per step).
inline void count_readers(const std::vector<step>& steps, std::vector<std::size_t>& readers) {
    readers.assign(steps.size(), 0);
    for (const step& s : steps) {
        for (std::size_t o = 0; o < s.operand_count; ++o) ++readers[s.operands[o]];
    }
}

// A user's elementwise function (ds::map): the one part of a program that is code, not data.
// It runs on the host only, and only while the formula that holds the callable lives (one
// evaluation). Called on a block of n values of the program's type: out[i] = f(in[0][i], ...)
// for i < n, possibly from several threads at once. Lowering sets the pointer of its type.
struct host_function {
    const void* callable = nullptr;
    void (*on_floats)(const void* callable, std::size_t n, const float* const* in, float* out) = nullptr;
    void (*on_doubles)(const void* callable, std::size_t n, const double* const* in, double* out) = nullptr;

    template <class T>
    void operator()(std::size_t n, const T* const* in, T* out) const {
        if constexpr (std::is_same_v<T, float>) on_floats(callable, n, in, out);
        else on_doubles(callable, n, in, out);
    }
};

// What an attention step computes, softmax(f(Q K^T)) V with softmax along the keys, beyond
// its operands Q, K^T and V: the steps that stay in the program from the formula it replaced
// (the product Q K^T and the score function f, a formula of it) and the parts of f taken out
// for the kernel to do itself (attention_pattern.hpp).
struct attention_match {
    std::size_t scores = 0;          // the matmul(Q, K^T) step: operands Q and K^T
    std::size_t values = 0;          // V
    std::size_t score_function = 0;  // what is left of f, as a formula of `scores`; == scores if nothing
    double scale = 1;                // the number the scores are multiplied by ...
    bool divides = false;            // ... or divided by: computed as 1 / scale in the element type
    bool causal = false;

    bool operator==(const attention_match&) const = default;
};

// The backward of one attention that differentiation (differentiate.hpp) went through, found
// in a form a fused kernel computes: the score function is, on the scores that the softmax
// gives weight, the scores times a constant `slope` (masks of -infinity, additive masks and
// a bias that need no gradient), so that the gradient of the scores is
//     dS = scale slope P (dP - rowsum(dO O)),  dP = dO V^T,  P = softmax(f(Q K^T)),
// and nothing but this attention reads P or the scores. `gradients` are the steps that
// differentiation made for the products dQ = dS K, dK^T = Q^T dS and dV = P^T dO (no_step
// for an operand that needed none); the pass recognise_attention_backward turns each into an
// attention_gradient step that reads this record, and the planner makes one entry of the three.
struct attention_backward {
    attention_match forward;          // the attention, as match_attention found it
    std::size_t output = 0;           // O: the step of its value (a matmul, or an attention step)
    std::size_t cotangent = 0;        // dO: the step of O's adjoint
    std::array<std::size_t, 3> gradients{};  // the products of dQ, dK^T and dV, or no_step
    double slope = 1;                 // the score function's derivative where a score has weight

    bool operator==(const attention_backward&) const = default;
};

// The gradient of one layer_norm that differentiation went through: the step it made for the
// gradient of the layer norm's input (the formula of the means and the deviation that
// `differentiation::contribution` writes), which the pass recognise_layer_norm_backward
// turns into one layer_norm_gradient step: operands the layer norm's input and `cotangent`,
// computed by a kernel along the axis in one pass over each line.
struct layer_norm_backward {
    std::size_t forward = 0;    // the layer_norm step
    std::size_t cotangent = 0;  // the adjoint of its value
    std::size_t gradient = 0;   // the step of its input's gradient

    bool operator==(const layer_norm_backward&) const = default;
};

struct program {
    std::vector<step> steps;
    std::size_t root = 0;           // the step whose value the program computes
    // the steps whose values it computes besides, each into its own destination (1, 2, ...):
    // the gradients of a parameter struct (nn/gradients.hpp), planned with the root
    std::vector<std::size_t> other_roots;
    std::size_t binding_count = 0;
    std::vector<host_function> functions;  // of its map steps
    std::vector<attention_match> attentions;  // of its attention steps
    std::vector<attention_backward> attention_backwards;  // of its attention_gradient steps (and candidates)
    std::vector<layer_norm_backward> layer_norm_backwards;  // the layer norms differentiation went through
    // whether it has a cast<bf16> step: known as it is lowered (at compile time), so that a
    // pass about them costs a formula without one nothing
    bool has_casts_to_bf16 = false;
    // while lowering the formula of a gradient (lower.hpp): the tensor steps of the tensors it
    // is taken with respect to, so that an eager view of one (a transpose, a slice) lowers to
    // view steps of it, and its gradient includes what is read through the view
    std::vector<std::size_t> differentiated;
    // the passes' scratch, kept for its capacity: a program lowered and planned in a loop
    // allocates nothing after the first time
    struct {
        std::vector<std::size_t> products, readers, walked;
        std::vector<char> seen, written, own;
    } scratch;
    // differentiate's (differentiate.hpp), likewise: a training step allocates nothing after its first
    struct {
        std::vector<char> depends, live;
        std::vector<std::size_t> readers, adjoint, records;
    } sweep;

    void clear() {
        steps.clear();
        root = 0;
        other_roots.clear();
        binding_count = 0;
        functions.clear();
        attentions.clear();
        attention_backwards.clear();
        layer_norm_backwards.clear();
        has_casts_to_bf16 = false;
        differentiated.clear();
    }
};

// Step s appended to p, unless p has the same computation already (steps are pure): the index
// of the step that computes it. Lowering and differentiation append through it, so that a
// sub-formula or an adjoint used twice is computed once.
inline std::size_t add_step(program& p, const step& s) {
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
        if (p.steps[id] == s) return id;
    }
    p.steps.push_back(s);
    return p.steps.size() - 1;
}

// What fills a binding when a program runs: memory of an element type, seen through a layout.
struct binding {
    const void* data = nullptr;
    element_type type = element_type::float32;
    layout where{};
    // The same values packed once for a backend's products (ds::prepack), opaque here; a
    // planner told to read such packing (planner_options::read_packed) lets the products
    // that take them as their right operand read it instead.
    const void* packed = nullptr;
    // The memory is a GPU's (a cuda::tensor): only a backend that reads device memory runs the
    // program, and the host never dereferences data.
    bool on_device = false;
};

// The names of the step kinds and op codes, as explain() prints them.
constexpr std::string_view name_of(step_kind kind) {
    switch (kind) {
        case step_kind::tensor: return "tensor";
        case step_kind::number: return "number";
        case step_kind::causal_mask: return "causal_mask";
        case step_kind::arange: return "arange";
        case step_kind::elementwise: return "elementwise";
        case step_kind::permute: return "transpose";
        case step_kind::reshape: return "view";
        case step_kind::select: return "select";
        case step_kind::slice: return "slice";
        case step_kind::concat: return "concat";
        case step_kind::gather: return "gather";
        case step_kind::embed: return "embed";
        case step_kind::scatter: return "scatter_add";
        case step_kind::matmul: return "matmul";
        case step_kind::attention: return "attention";
        case step_kind::attention_gradient: return "attention_gradient";
        case step_kind::softmax: return "softmax";
        case step_kind::layer_norm: return "layer_norm";
        case step_kind::layer_norm_gradient: return "layer_norm_gradient";
        case step_kind::sum: return "sum";
        case step_kind::max: return "max";
        case step_kind::mean: return "mean";
    }
    return "";
}

using fn::name_of;  // of an op code (core/functors.hpp)

}  // namespace dimsum::evaluation
