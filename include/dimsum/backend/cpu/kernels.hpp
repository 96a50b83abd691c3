#pragma once
// What the CPU kernels take and the calls they answer, without their definitions: the one
// header the CPU evaluator needs. The definitions (gemm.hpp, attention.hpp, fused.hpp,
// rowwise.hpp, elementwise.hpp, gather.hpp) need xsimd or OpenMP and are compiled into every translation unit that evaluates a
// formula, unless the program defines DIMSUM_PRECOMPILED_KERNELS and links dimsum::kernels
// (src/kernels.cpp), which holds them compiled once for float and double, with the executor
// that calls them (executor.hpp: plan_and_run).

#include <array>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "dimsum/core/bf16.hpp"
#include "dimsum/evaluation/memory.hpp"
#include "dimsum/evaluation/plan.hpp"
#include "dimsum/evaluation/program.hpp"
#include "dimsum/evaluation/strided.hpp"
#include "dimsum/core/functors.hpp"

namespace dimsum::backend::cpu {

using evaluation::max_rank;
using evaluation::strided;

// The instruction set the kernels were compiled for, as xsimd names it ("avx512dq",
// "fma3+avx2", "sse2", ...): dimsum::kernels' where the program links it, else the
// program's own (its -march). A template only so that it is compiled where the kernels are.
template <class = void>
const char* instruction_set();

// ---- matrix products (gemm.hpp)

// A strided matrix: a pointer to element (0, 0) and its layout (evaluation::matrix_layout:
// element (i, j) at data[i * row_stride + j * col_stride]).
using evaluation::matrix_layout;
template <class T>
struct matrix : matrix_layout {
    T* data = nullptr;

    matrix() = default;
    matrix(T* first, const matrix_layout& where) : matrix_layout(where), data(first) {}
    matrix(T* first, std::size_t rows, std::size_t cols, std::ptrdiff_t row_stride, std::ptrdiff_t col_stride)
        : matrix_layout{rows, cols, row_stride, col_stride}, data(first) {}
};

// The same elements, rows and columns swapped.
template <class T>
matrix<T> transposed(const matrix<T>& m) {
    return {m.data, evaluation::transposed(m)};
}

// The part of m from (row, col) on; given extents, only rows x cols of it.
template <class T>
matrix<T> sub(matrix<T> m, std::size_t row, std::size_t col) {
    m.data += m.at(row, col);
    return m;
}
template <class T>
matrix<T> sub(const matrix<T>& m, std::size_t row, std::size_t col, std::size_t rows, std::size_t cols) {
    matrix<T> part = sub(m, row, col);
    part.rows = rows;
    part.cols = cols;
    return part;
}

// ---- operands as they are stored

using evaluation::element_type;

// The element types a kernel computing in T reads and writes: T itself, and bf16, which it
// widens to T as it reads (widened) and rounds into as it writes (stored_as). The one list
// of them: fp16 storage would be one more case here, with its two conversions, and no field
// of any kernel's interface. Calls f.template operator()<U>() for U the type `type` names.
// Always inlined, as the visits below: each branch then compiles as its caller's own code (a
// kernel's inner loops in a lambda, outlined, lost 6% of a decoding step).
[[noreturn]] inline void unstored_type() {
    throw std::logic_error("dimsum: a kernel reads or writes an element type it does not store");
}
template <class T, class F>
[[gnu::always_inline]] inline void with_storage(element_type type, F&& f) {
    if (type == evaluation::element_type_of<T>()) return f.template operator()<T>();
    if (type == element_type::bf16) return f.template operator()<bf16>();
    unstored_type();
}
// A stored value as T, and a value of T as stored.
template <class T, class U>
constexpr T widened(U x) {
    if constexpr (std::is_same_v<U, T>) return x;
    else return static_cast<T>(widen(x));
}
template <class U, class T>
constexpr U stored_as(T x) {
    if constexpr (std::is_same_v<U, T>) return x;
    else return U(x);
}

// Memory holding elements of a type known at run time (with_storage's).
template <class T, class Pointer = const void*>
struct stored_memory {
    Pointer data = nullptr;
    element_type type = evaluation::element_type_of<T>();

    bool holds_own() const { return type == evaluation::element_type_of<T>(); }
    // The same memory `elements` elements on; null stays null (an operand given by its
    // extents only, as B packed once is).
    void advance(std::ptrdiff_t elements) {
        using byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const char, char>;
        if (data) data = static_cast<byte*>(data) + elements * static_cast<std::ptrdiff_t>(evaluation::size_of(type));
    }
};

// A matrix that a kernel computing in T reads, as it is stored: element (i, j) at
// data[i * row_stride + j * col_stride], of `type`. A kernel widens a narrower type as it
// packs or loads it, never into a copy of the whole operand, and computes the same sums in
// the same order: its result is that of the widened values, bit for bit.
template <class T>
struct source_matrix : stored_memory<T>, matrix_layout {
    source_matrix() = default;
    template <class U>
    source_matrix(const matrix<const U>& m)  // NOLINT: a matrix as stored is a source
        : stored_memory<T>{m.data, evaluation::element_type_of<U>()}, matrix_layout(m) {}
    source_matrix(const stored_memory<T>& memory, const matrix_layout& where) : stored_memory<T>(memory), matrix_layout(where) {}

    // Its elements, where they are of T; else its extents and strides only (data null).
    matrix<const T> own() const { return {this->holds_own() ? static_cast<const T*>(this->data) : nullptr, *this}; }
    // read(the matrix as a matrix<const U> of the type U it is stored as)
    template <class F>
    [[gnu::always_inline]] void visit(F&& read) const {
        with_storage<T>(this->type, [&]<class U>() { read(stored<U>()); });
    }
    // The matrix as stored, of U (a kernel for that type), `elements` elements on (another
    // batch item); null data stays null.
    template <class U>
    matrix<const U> stored(std::ptrdiff_t elements = 0) const {
        if (this->type != evaluation::element_type_of<U>()) throw std::logic_error("dimsum: a kernel reads an operand as another type");
        stored_memory<T> at = *this;
        at.advance(elements);
        return {static_cast<const U*>(at.data), *this};
    }
};

// The same elements, rows and columns swapped.
template <class T>
source_matrix<T> transposed(const source_matrix<T>& m) {
    return {m, evaluation::transposed(m)};
}

// A strided array that a kernel computing in T reads, as it is stored (as source_matrix).
template <class T>
struct source_array : stored_memory<T> {
    evaluation::layout where{};  // offsets from data: where.offset is 0

    source_array() = default;
    template <class U>
    source_array(const strided<U>& s)  // NOLINT: an array as stored is a source
        : stored_memory<T>{s.data, evaluation::element_type_of<std::remove_const_t<U>>()}, where(s.where) {}

    // Its elements, where they are of T; else its layout only (data null).
    strided<const T> own() const { return {this->holds_own() ? static_cast<const T*>(this->data) : nullptr, where}; }
    // read(the array as a strided<const U> of the type U it is stored as)
    template <class F>
    [[gnu::always_inline]] void visit(F&& read) const {
        with_storage<T>(this->type, [&]<class U>() { read(strided<const U>{static_cast<const U*>(this->data), where}); });
    }
};

// An array's last two axes as a matrix (its first element's).
template <class T>
matrix<T> last_two_axes(const strided<T>& s) {
    return {s.data, evaluation::last_two_axes(s.where)};
}
template <class T>
source_matrix<T> last_two_axes(const source_array<T>& s) {
    return {s, evaluation::last_two_axes(s.where)};
}

// Memory that a kernel computing in T rounds its values into as it writes them, of a
// narrower storage type, laid out as the result it belongs to (the same offsets from data).
// Null: the kernel writes its result of T only.
template <class T>
struct rounded_memory : stored_memory<T, void*> {
    explicit operator bool() const { return this->data != nullptr; }
    template <class U>
    U* as() const {
        return static_cast<U*>(this->data);
    }
};
template <class T, class U>
rounded_memory<T> rounded_into(U* memory) {
    return {{memory, evaluation::element_type_of<U>()}};
}

namespace detail {
// value rounded up to a multiple of `multiple` (a panel's width, a block's depth)
constexpr std::size_t round_up(std::size_t value, std::size_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
}
}  // namespace detail

inline constexpr std::size_t max_batch_rank = max_rank - 2;

// The leading (batch) axes of a problem on N operands, and each operand's strides along
// them; an operand that broadcasts along an axis has stride 0 there.
template <std::size_t N>
struct batch_layout {
    std::size_t rank = 0;
    std::array<std::size_t, max_batch_rank> extents{};
    std::array<std::array<std::ptrdiff_t, max_batch_rank>, N> strides{};  // per operand

    std::size_t count() const {
        std::size_t n = 1;
        for (std::size_t i = 0; i < rank; ++i) n *= extents[i];
        return n;
    }
    // Where item `flat` (the items numbered in row-major order) starts in each operand.
    std::array<std::ptrdiff_t, N> offsets(std::size_t flat) const {
        std::array<std::ptrdiff_t, N> at{};
        for (std::size_t i = rank; i-- > 0;) {
            auto index = static_cast<std::ptrdiff_t>(flat % extents[i]);
            flat /= extents[i];
            for (std::size_t o = 0; o < N; ++o) at[o] += index * strides[o][i];
        }
        return at;
    }
};

// The right operand of products packed once (ds::prepack): every panel gemm would pack from
// it, in the order gemm reads them, for the tiling (nr, kc, nc) it was packed for.
// A matrix of bf16 may also hold `pairs`: its panels for the bf16 instructions (bf16_gemm.hpp),
// in the depth blocks (pairs_kc) of one path's kernel, which reads them instead (null, or
// another kernel: B packed at each call).
template <class T>
struct packed_operand {
    const T* panels = nullptr;
    std::size_t rows = 0, cols = 0;
    std::size_t nr = 0, kc = 0, nc = 0;
    const bf16* pairs = nullptr;
    std::size_t pairs_kc = 0;
};

// The elements of a packed_operand of rows x cols, and the packing of m into `panels` of that
// many elements (U: m's element type, widened to T).
template <class T>
std::size_t packed_elements(std::size_t rows, std::size_t cols);
template <class T, class U>
packed_operand<T> pack_operand(const matrix<const U>& m, T* panels);
enum class bf16_path;  // bf16_paths.hpp
// Likewise for a bf16 matrix's pairs (packed_operand::pairs): their elements, and m packed for
// the kernel of `path` (amx or avx512_bf16), in its depth blocks, whose depth it returns.
template <class = void>
std::size_t pair_elements(std::size_t rows, std::size_t cols);
template <class = void>
std::size_t pack_pairs(const matrix<const bf16>& m, bf16* pairs, bf16_path path);

// C = A B for each item of the batch; A, B and C hold item 0.
template <class T>
struct gemm_problem {
    source_matrix<T> a;  // (m, k), as stored: of T, or of bf16 widened as it is read
    source_matrix<T> b;  // (k, n), likewise
    matrix<T> c;         // (m, n), not overlapping A or B
    batch_layout<3> batch;  // operands a, b, c
    // B packed once, the same for every item: read instead of b, which then gives only its
    // extents (data null), or, where B is stored narrower than T, the same values that the
    // products streaming B read instead (half the bytes).
    const packed_operand<T>* packed_b = nullptr;
    // C's values read by no one but the epilogue, which writes what there is to write (a bf16
    // result): a kernel may then keep each block's sums in its own buffer and hand the epilogue
    // that (gemm_epilogue::apply_to_block), never writing C itself. The bf16 kernels do.
    bool c_unread = false;
};

// Called for each region of C once its values are final: rows [row, row + rows) and columns
// [col, col + cols) of batch item `item`. It may read and rewrite that region, nothing else,
// and must not allocate: `prepare`, called on every thread that will apply it before any
// writes, takes that thread's memory for it.
//
// With C unread (gemm_problem::c_unread), a kernel of float sums may instead call
// apply_to_block with the region's values in its own buffer, element (i, j) at
// block[i * ld + j], where they may be rewritten too; the epilogue then writes whatever the
// product's result is (C itself is never read again).
//
// Most bf16 products' epilogue is also given as data (`rounding`): C's values, plus a vector
// along its columns where `bias` is set (a layer's bias, as stored), rounded into `rounded`
// (bf16 memory: the bf16 kernels round nothing else) at C's offsets (item, row and column as
// C's). A kernel holding each micro-tile's final sums in its own buffer (C unread) rounds them
// so while they are in L1. An epilogue for C unread has apply_to_block (a program to run on
// each block), or this, or both: then this.
struct gemm_rounding {
    rounded_memory<float> rounded;  // null: the epilogue is not this
    stored_memory<float> bias;      // null: no bias
    std::ptrdiff_t bias_stride = 0;  // column j's at bias[j * bias_stride]
};
struct gemm_epilogue {
    void (*apply)(const void* context, std::size_t item, std::size_t row, std::size_t col, std::size_t rows,
                  std::size_t cols) = nullptr;
    void (*reserve)(const void* context) = nullptr;
    const void* context = nullptr;
    void (*apply_to_block)(const void* context, std::size_t item, std::size_t row, std::size_t col, std::size_t rows,
                           std::size_t cols, float* block, std::ptrdiff_t ld) = nullptr;
    gemm_rounding rounding{};
    void operator()(std::size_t item, std::size_t row, std::size_t col, std::size_t rows, std::size_t cols) const {
        if (apply) apply(context, item, row, col, rows, cols);
    }
    void prepare() const {
        if (reserve) reserve(context);
    }
};

// C = A B for every item of the batch, then the epilogue on each finished region of C.
template <class T>
void gemm(const gemm_problem<T>& problem, const gemm_epilogue& epilogue = {});

// ---- attention (attention.hpp)

// Called on each tile of scores, queries [query, query + queries) x keys [key, key + keys)
// of batch item `item`, before the softmax reads them: it may rewrite the tile (score (i, j)
// at tile[i * query_stride + j]) and nothing else, and must not allocate: `prepare`, called on
// every thread that will apply it before any writes, takes that thread's memory for it.
template <class T>
struct score_epilogue {
    void (*apply)(const void* context, std::size_t item, std::size_t query, std::size_t key, std::size_t queries,
                  std::size_t keys, T* tile, std::ptrdiff_t query_stride) = nullptr;
    void (*reserve)(const void* context) = nullptr;
    const void* context = nullptr;
    void prepare() const {
        if (reserve) reserve(context);
    }
};

// n values `from_stride` apart, rounded to the nearest U into `to`, `to_stride` apart: a
// finished line of a result that a bf16 kernel reads next (gemm's epilogue, attention's rows
// of O, both at the same offsets), or a block or line of a pass or line kernel's buffer
// (contiguous) that it writes as U.
template <class T, class U>
void round_line(const T* from, std::ptrdiff_t from_stride, U* to, std::ptrdiff_t to_stride, std::size_t n) {
    if (from_stride == 1 && to_stride == 1) {
        for (std::size_t i = 0; i < n; ++i) to[i] = stored_as<U>(from[i]);
        return;
    }
    for (std::size_t i = 0; i < n; ++i) {
        const auto at = static_cast<std::ptrdiff_t>(i);
        to[at * to_stride] = stored_as<U>(from[at * from_stride]);
    }
}
// The same into rounded memory, `at` elements from its start.
template <class T>
void round_line(const T* from, std::ptrdiff_t from_stride, const rounded_memory<T>& to, std::ptrdiff_t at,
                std::ptrdiff_t to_stride, std::size_t n) {
    with_storage<T>(to.type, [&]<class U>() { round_line(from, from_stride, to.template as<U>() + at, to_stride, n); });
}

// n values of U `stride` apart, widened into `to` (contiguous): a block or line that a
// kernel reads as stored.
template <class T, class U>
void widen_block(const U* from, std::ptrdiff_t stride, std::size_t n, T* to) {
    if (stride == 1) {
        for (std::size_t i = 0; i < n; ++i) to[i] = widened<T>(from[i]);
        return;
    }
    for (std::size_t i = 0; i < n; ++i) to[i] = widened<T>(from[static_cast<std::ptrdiff_t>(i) * stride]);
}

// O = softmax(f(Q K^T)) V along the keys for every item of the batch, where f multiplies by
// `scale`, then applies `scores` if given; then, if `causal`, keys in a query's future
// (evaluation::in_future) get weight 0. A query whose keys are all masked gets O = 0.
// Operands hold item 0.
template <class T>
struct attention_problem {
    source_matrix<T> q;  // (queries, d), as stored (as gemm_problem's operands)
    source_matrix<T> k;  // (keys, d)
    source_matrix<T> v;  // (keys, dv)
    matrix<T> o;         // (queries, dv), not overlapping the others
    batch_layout<4> batch;  // operands q, k, v, o (keys and values may be shared by the heads: stride 0)
    T scale = 1;
    bool causal = false;
    score_epilogue<T> scores;
    // If set, O is also rounded into this memory, of o's layout (the same offsets from o.data),
    // as each row is written: the value a bf16 kernel reads next.
    rounded_memory<T> o_rounded;
    // With o_rounded: o's values of T are read by no one (a scratch), so only o_rounded is
    // written; o still gives the layout.
    bool o_unread = false;
    // If set, each query's log-sum-exp of its weights, log sum_j e^(f(Q K^T))_ij (-infinity
    // where every key is masked), is written at lse[item * queries + query]: what the fused
    // backward (attention_gradient) recomputes the weights from.
    T* lse = nullptr;
};

template <class T>
void attention(const attention_problem<T>& problem);

// ---- attention's backward (attention_gradient.hpp)

// The gradients of O = softmax(f(Q K^T)) V (f: the scale, the score function `scores`, the
// causal mask, as attention_problem has them) for the cotangent dO of O, written (not added)
// for every item of the batch:
//     dQ = dS K,  dK = dS^T Q,  dV = P^T dO,  dS = slope P (dP - rowsum(dO O)),  dP = dO V^T,
// where `slope` is f's derivative where a score has weight (evaluation::attention_backward).
// Operands hold item 0; the outputs overlap no operand and one another.
template <class T>
struct attention_gradient_problem {
    source_matrix<T> q;   // (queries, d), as stored: of T, or of bf16 (widened as copied)
    source_matrix<T> k;   // (keys, d), the same
    source_matrix<T> v;   // (keys, dv), the same
    matrix<const T> o;    // (queries, dv): the forward's value
    matrix<const T> d_o;  // (queries, dv)
    // The gradients; one with null data is not wanted, and not computed.
    matrix<T> dq;         // (queries, d)
    matrix<T> dk;         // (keys, d)
    matrix<T> dv;         // (keys, dv)
    batch_layout<8> batch;  // q, k, v, o, d_o, dq, dk, dv (K and V may be shared by heads: stride 0)
    T scale = 1;
    T slope = 1;
    bool causal = false;
    score_epilogue<T> scores;
    // The forward's log-sum-exp per query (attention_problem::lse), laid out alike.
    const T* lse = nullptr;
};

template <class T>
void attention_gradient(const attention_gradient_problem<T>& problem);

// ---- the fused elementwise pass (fused.hpp) and its block functions (elementwise.hpp)

// out[i] = f(in[0][i], ..., in[N-1][i]) for i < n.
template <class T>
using block_function = void (*)(std::size_t n, const T* const* in, T* out);

template <class F, class T, std::size_t N>
void apply_to_block(std::size_t n, const T* const* in, T* out);

inline constexpr std::size_t max_function_operands = 3;

// The block function of each op code that a program uses (cpu/evaluator.hpp fills it).
template <class T>
using block_table = std::array<block_function<T>, op_code_count>;

// The block function of every elementwise function (fn::elementwise_functions), map's aside.
template <class T>
block_table<T> every_block();

template <class T>
struct fused_node {
    enum class kind { input, constant, function };
    kind what = kind::input;
    std::size_t input = 0;                                // input: which of the pass's inputs
    T value{};                                            // constant
    block_function<T> function = nullptr;                 // function, of earlier nodes:
    const evaluation::host_function* host = nullptr;      //   or a user's (ds::map) instead
    std::array<std::size_t, max_function_operands> operands{};
    std::size_t operand_count = 0;
};

// Nodes in evaluation order, each reading only earlier ones; the last is the result. Every
// input has the result's rank (stride 0 where it broadcasts), and is read as stored: one
// stored narrower is widened block by block.
template <class T>
struct fused_program {
    std::vector<fused_node<T>> nodes;
    std::vector<source_array<T>> inputs;
    void clear() {
        nodes.clear();
        inputs.clear();
    }
};

using evaluation::box;

// Writes the program's result into `result`, or only into `region` of it (the inputs read
// at the same positions). `parallel`: whether it may start threads. Every thread it runs on
// takes its memory before any of them writes. With `rounded`, the result is rounded into
// that memory instead, laid out as `result` (whose data is then null), block by block.
template <class T>
void run_fused(const fused_program<T>& program, const strided<T>& result, bool parallel,
               const box* region = nullptr, const rounded_memory<T>& rounded = {});

// Takes, on the calling thread, the memory that run_fused of `program` needs there, so that a
// run_fused inside another kernel's team (an epilogue) allocates nothing.
template <class T>
void prepare_fused(const fused_program<T>& program);

// ---- kernels along one axis (rowwise.hpp)

// x is read as stored, and with `rounded` the result is rounded into that memory instead of
// written to out (which then gives only its extents and strides, its data null): the kernel
// widens each line it reads and rounds each line it writes in its own line buffer, so memory
// sees the stored type's bytes (half float's for bf16).

// out = softmax of x along axis; out has x's extents.
template <class T>
void softmax(const source_array<T>& x, const strided<T>& out, std::size_t axis, const rounded_memory<T>& rounded = {});

// out = layer_norm of x along axis (no scale or shift); out has x's extents.
template <class T>
void layer_norm(const source_array<T>& x, const strided<T>& out, std::size_t axis, T epsilon,
                const rounded_memory<T>& rounded = {});

// out = the gradient of layer_norm along axis at x for the cotangent g of its value:
// (g - mean(g) - y mean(g y)) / sqrt(variance + epsilon), y = layer_norm(x); g and out have
// x's extents.
template <class T>
void layer_norm_gradient(const source_array<T>& x, const source_array<T>& g, const strided<T>& out, std::size_t axis, T epsilon,
                         const rounded_memory<T>& rounded = {});

// out = the reduction (fn::sum, fn::max, fn::mean) of x along axis; out has x's axes without it.
template <class Reduction, class T>
void reduce(const source_array<T>& x, const strided<T>& out, std::size_t axis, const rounded_memory<T>& rounded = {});

// ---- indexing (gather.hpp)

// out (before..., ids..., after...) = table (before..., ids[...], after...), the ids along
// table's axis `axis`; every id lies in [0, extent) (checked by the caller).
template <class T>
void gather(const strided<const T>& table, std::size_t axis, const evaluation::integers& ids, const strided<T>& out);

// gather's adjoint: out (before..., extent, after...) = 0, then out (before..., ids[...], after...)
// += values (before..., ids..., after...), each element's sum in the order of the ids, so that
// the result does not depend on the threads; every id lies in [0, extent) (checked by the caller).
template <class T>
void scatter_add(const strided<const T>& values, std::size_t axis, const evaluation::integers& ids, const strided<T>& out);

// ---- optimizers' updates (optimizer.hpp), for nn/optimizers.hpp

// AdamW's constants for one step (torch.optim.AdamW).
template <class T>
struct adamw_step {
    T decay, beta1, beta2, step_size, correction2, epsilon;
};

// For i in [first, last): p *= decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// p -= step_size m / (sqrt(v) / correction2 + epsilon). p, g, m and v do not overlap.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, std::size_t first, std::size_t last, const adamw_step<T>& c);

// ---- the executor (executor.hpp)

namespace detail {

// No input of a fused program (state::in_place_input where none reads the destination).
inline constexpr std::size_t no_input = ~std::size_t(0);

// Everything one evaluation needs, kept per thread and element type so that it is allocated
// once: the program, its bindings, its plan, and the executor's own tables.
template <class T>
struct state {
    evaluation::program program;
    std::vector<evaluation::binding> bindings;
    evaluation::plan plan;
    block_table<T> blocks{};
    evaluation::bound_memory memory;  // the plan's places bound to this evaluation's memory (temporaries: T, or bf16)
    fused_program<T> fused;
    std::size_t in_place_input = no_input;  // which of fused.inputs reads the destination (or the scores tile), if one does
    std::vector<evaluation::layout> other_destinations;  // of program::other_roots, kept for their capacity

    static state& of_this_thread() {
        thread_local state s;
        return s;
    }
};

// Plans s.program (with s.bindings) for a destination laid out as `destination` and runs the
// plan, writing `memory` (of destination_type: T, or bf16), each elementwise function by its
// block in s.blocks; and the values of program::other_roots into `others`, in order. The part
// of an evaluation that does not depend on the formula.
template <class T>
void plan_and_run(state<T>& s, const evaluation::layout& destination, evaluation::element_type destination_type, void* memory,
                  const evaluation::planner_options& options, std::span<const evaluation::strided<T>> others = {});

}  // namespace detail

}  // namespace dimsum::backend::cpu
