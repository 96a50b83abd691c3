#pragma once
// What the CPU kernels take and the calls they answer, without their definitions: the one
// header the CPU evaluator needs. The definitions (gemm.hpp, attention.hpp, fused.hpp,
// rowwise.hpp, elementwise.hpp, gather.hpp) need xsimd or OpenMP and are compiled into every translation unit that evaluates a
// formula, unless the program defines DIMSUM_PRECOMPILED_KERNELS and links dimsum::kernels
// (src/kernels.cpp), which holds them compiled once for float and double, with the executor
// that calls them (executor.hpp: plan_and_run).

#include <array>
#include <cstddef>
#include <vector>

#include "dimsum/core/bf16.hpp"
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

// A strided matrix: element (i, j) at data[i * row_stride + j * col_stride].
template <class T>
struct matrix {
    T* data = nullptr;
    std::size_t rows = 0, cols = 0;
    std::ptrdiff_t row_stride = 0, col_stride = 0;
};

// The same elements, rows and columns swapped.
template <class T>
matrix<T> transposed(const matrix<T>& m) {
    return {m.data, m.cols, m.rows, m.col_stride, m.row_stride};
}

// The part of m from (row, col) on; given extents, only rows x cols of it.
template <class T>
matrix<T> sub(matrix<T> m, std::size_t row, std::size_t col) {
    m.data += static_cast<std::ptrdiff_t>(row) * m.row_stride + static_cast<std::ptrdiff_t>(col) * m.col_stride;
    return m;
}
template <class T>
matrix<T> sub(const matrix<T>& m, std::size_t row, std::size_t col, std::size_t rows, std::size_t cols) {
    matrix<T> part = sub(m, row, col);
    part.rows = rows;
    part.cols = cols;
    return part;
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
    matrix<const T> a;  // (m, k)
    matrix<const T> b;  // (k, n)
    matrix<T> c;        // (m, n), not overlapping A or B
    batch_layout<3> batch;  // operands a, b, c
    // B packed once, the same for every item: read instead of b, which then gives only its
    // extents (its data may be null)
    const packed_operand<T>* packed_b = nullptr;
    // A or B stored as bf16 (a bf16 tensor that the plan reads where it lies): its elements,
    // at a's (b's) extents and strides, read instead of a.data (b.data, then null). The kernel
    // widens them to T as it packs or loads them, never into a copy of the whole operand, and
    // computes the same sums in the same order: C is that of the widened values, bit for bit.
    // With packed_b, b_bf16 may hold the same values, for the products that stream them faster.
    const bf16* a_bf16 = nullptr;
    const bf16* b_bf16 = nullptr;
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
// along its columns where `bias` or `bias_bf16` is set (a layer's bias), rounded to bf16 into
// `rounded` at C's offsets (item, row and column as C's). A kernel holding each micro-tile's
// final sums in its own buffer (C unread) rounds them so while they are in L1. An epilogue for
// C unread has apply_to_block (a program to run on each block), or this, or both: then this.
struct gemm_rounding {
    bf16* rounded = nullptr;  // null: the epilogue is not this
    const float* bias = nullptr;
    const bf16* bias_bf16 = nullptr;
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

// n values `from_stride` apart, rounded to the nearest bf16 into `to`, `to_stride` apart: a
// finished line of a result that a bf16 kernel reads next (gemm's epilogue, attention's rows
// of O, both at the same offsets), or a block or line of a pass or line kernel's buffer
// (contiguous) that it writes as bf16.
template <class T>
void round_line(const T* from, std::ptrdiff_t from_stride, bf16* to, std::ptrdiff_t to_stride, std::size_t n) {
    if (from_stride == 1 && to_stride == 1) {
        for (std::size_t i = 0; i < n; ++i) to[i] = bf16(from[i]);
        return;
    }
    for (std::size_t i = 0; i < n; ++i) {
        const auto at = static_cast<std::ptrdiff_t>(i);
        to[at * to_stride] = bf16(from[at * from_stride]);
    }
}

// n values of bf16 `stride` apart, widened into `to` (contiguous): a block or line that a
// kernel reads as bf16.
template <class T>
void widen_block(const bf16* from, std::ptrdiff_t stride, std::size_t n, T* to) {
    if (stride == 1) {
        for (std::size_t i = 0; i < n; ++i) to[i] = static_cast<T>(widen(from[i]));
        return;
    }
    for (std::size_t i = 0; i < n; ++i) to[i] = static_cast<T>(widen(from[static_cast<std::ptrdiff_t>(i) * stride]));
}

// O = softmax(f(Q K^T)) V along the keys for every item of the batch, where f multiplies by
// `scale`, then applies `scores` if given; then, if `causal`, keys in a query's future
// (evaluation::in_future) get weight 0. A query whose keys are all masked gets O = 0.
// Operands hold item 0.
template <class T>
struct attention_problem {
    matrix<const T> q;  // (queries, d)
    matrix<const T> k;  // (keys, d)
    matrix<const T> v;  // (keys, dv)
    matrix<T> o;        // (queries, dv), not overlapping the others
    batch_layout<4> batch;  // operands q, k, v, o (keys and values may be shared by the heads: stride 0)
    T scale = 1;
    bool causal = false;
    score_epilogue<T> scores;
    // Q, K or V stored as bf16, read instead of its data (then null) as gemm_problem's a_bf16
    // reads A: widened as packed or loaded, the same sums in the same order as the widened values'.
    const bf16* q_bf16 = nullptr;
    const bf16* k_bf16 = nullptr;
    const bf16* v_bf16 = nullptr;
    // If set, O is also rounded into this memory, of o's layout (the same offsets from it), as
    // each row is written: the value a bf16 kernel reads next.
    bf16* o_bf16 = nullptr;
    // With o_bf16: o's float values are read by no one (a scratch), so only o_bf16 is written;
    // o still gives the layout.
    bool o_unread = false;
};

template <class T>
void attention(const attention_problem<T>& problem);

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
// input has the result's rank (stride 0 where it broadcasts). An input of bf16 is read where
// it lies, bf16_inputs[i], and widened block by block (inputs[i] then gives only its extents
// and strides, its data null).
template <class T>
struct fused_program {
    std::vector<fused_node<T>> nodes;
    std::vector<strided<const T>> inputs;
    std::vector<const bf16*> bf16_inputs;  // per input: its bf16 values, or null
    void clear() {
        nodes.clear();
        inputs.clear();
        bf16_inputs.clear();
    }
};

// A box of the result: extents[i] values from first[i] along each axis.
struct fused_region {
    std::array<std::size_t, max_rank> first{}, extents{};
};

// Writes the program's result into `result`, or only into `region` of it (the inputs read
// at the same positions). `parallel`: whether it may start threads. Every thread it runs on
// takes its memory before any of them writes. With `bf16_result`, the result is rounded into
// that memory, laid out as `result` (whose data is then null), block by block.
template <class T>
void run_fused(const fused_program<T>& program, const strided<T>& result, bool parallel,
               const fused_region* region = nullptr, bf16* bf16_result = nullptr);

// Takes, on the calling thread, the memory that run_fused of `program` needs there, so that a
// run_fused inside another kernel's team (an epilogue) allocates nothing.
template <class T>
void prepare_fused(const fused_program<T>& program);

// ---- kernels along one axis (rowwise.hpp)

// Where a line kernel's operand or result lies when it is of bf16 (its strided<T> then gives
// only the extents and strides, its data null): the kernel widens each line it reads and
// rounds each line it writes in its own line buffer, so memory sees half float's bytes.
struct bf16_lines {
    const bf16* in = nullptr;
    bf16* out = nullptr;
};

// out = softmax of x along axis; out has x's extents.
template <class T>
void softmax(const strided<const T>& x, const strided<T>& out, std::size_t axis, bf16_lines narrow = {});

// out = layer_norm of x along axis (no scale or shift); out has x's extents.
template <class T>
void layer_norm(const strided<const T>& x, const strided<T>& out, std::size_t axis, T epsilon, bf16_lines narrow = {});

// out = the reduction (fn::sum, fn::max, fn::mean) of x along axis; out has x's axes without it.
template <class Reduction, class T>
void reduce(const strided<const T>& x, const strided<T>& out, std::size_t axis, bf16_lines narrow = {});

// ---- indexing (gather.hpp)

// out (before..., ids..., after...) = table (before..., ids[...], after...), the ids along
// table's axis `axis`; every id lies in [0, extent) (checked by the caller).
template <class T>
void gather(const strided<const T>& table, std::size_t axis, const evaluation::integers& ids, const strided<T>& out);

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
    std::vector<void*> temporaries;  // the plan's, in this evaluation's memory: T, or bf16
    fused_program<T> fused;
    std::size_t in_place_input = no_input;  // which of fused.inputs reads the destination (or the scores tile), if one does

    static state& of_this_thread() {
        thread_local state s;
        return s;
    }
};

// Plans s.program (with s.bindings) for a destination laid out as `destination` and runs the
// plan, writing `memory` (of destination_type: T, or bf16), each elementwise function by its
// block in s.blocks. The part of an evaluation that does not depend on the formula.
template <class T>
void plan_and_run(state<T>& s, const evaluation::layout& destination, evaluation::element_type destination_type, void* memory,
                  const evaluation::planner_options& options);

}  // namespace detail

}  // namespace dimsum::backend::cpu
