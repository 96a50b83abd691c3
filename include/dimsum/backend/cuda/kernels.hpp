#pragma once
// The interface of the dimsum::cuda library (src/cuda/, compiled once by nvcc): plain data
// only, no CUDA header and no formula type, so that g++ (the evaluator, evaluator.hpp) and
// nvcc read the same declarations. nvcc cannot compile dimsum's formula headers (class-type
// template parameters such as axis<"seq">), so a formula never reaches it: the evaluator lowers
// and plans on the host, then hands each entry of the plan here as one of the passes below,
// with device pointers and layouts.
//
// Everything runs on one stream per thread, in order. An error of any CUDA call or kernel
// becomes a cuda_error naming the call and CUDA's message, at the latest from finish().

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dimsum/evaluation/codes.hpp"
#include "dimsum/evaluation/layout.hpp"

namespace dimsum::backend::cuda {

using evaluation::element_type;
using evaluation::extents_t;
using evaluation::max_rank;
using evaluation::strides_t;

// A CUDA call that failed, e.g. "dimsum: cuda: cudaMalloc (1073741824 bytes): out of memory
// (cudaErrorMemoryAllocation)".
class cuda_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// How many CUDA devices this process sees, and why none when none (e.g. "cudaGetDeviceCount:
// cudaErrorInsufficientDriver": no driver, as on a machine without a GPU). Never throws.
struct device_status {
    int count = 0;
    std::string reason;
    std::string name;          // of device 0, when there is one
    int runtime_version = 0;   // CUDA's, as 13000 for 13.0
    int driver_version = 0;
};
device_status query_devices();

// One thread's stream, cuBLAS handle and device memory (opaque here). The memory is an arena
// that grows to what the largest evaluation needs and is then kept, so that a formula
// evaluated in a loop allocates nothing after its first evaluation.
class context;
// The calling thread's context on device 0, opened at its first use; a cuda_error if no device.
context& this_thread_context();

// Device memory of the arena: begin() starts an evaluation (all the arena's memory free
// again), allocate() hands out `bytes` aligned to 256, valid until the next begin().
void begin(context& c);
void* allocate(context& c, std::size_t bytes);
// How many times the arena has asked CUDA for memory, ever (what a test of "no allocation
// after the first evaluation" counts), and the bytes it holds.
std::size_t device_allocations(const context& c);
std::size_t device_bytes(const context& c);

// Device memory of a tensor (cuda::tensor), apart from the arena: cudaMalloc, cudaFree.
void* allocate_memory(std::size_t bytes);
void free_memory(void* memory) noexcept;

// Copies in stream order. The host memory of an upload must stay as it is until the next
// finish() or download() (from pinned memory the copy is truly asynchronous; every caller
// here waits before it returns). download waits for everything before it and then copies,
// throwing the first error of the evaluation.
void upload(context& c, void* device, const void* host, std::size_t bytes);
void download(context& c, void* host, const void* device, std::size_t bytes);
// Waits for the stream; throws the first error of the evaluation.
void finish(context& c);
// A copy between two places of device memory, in stream order (cudaMemcpyAsync): the copy
// bandwidth that dimsum_gpu_bench measures its memory-bound passes against.
void copy_on_device(context& c, void* to, const void* from, std::size_t bytes);

// ---------------------------------------------------------------------------------------------
// The passes. Each computes in `type`, float32 or float64, and writes that type (a fused pass
// may also write bf16).

// One elementwise formula: out[index] = the last node's value at index, for every index of
// `extents` (row-major order). Nodes come in evaluation order; an input is read at
// data + sum(index[i] * strides[i]) as its own element type (bf16 and integers widened).
inline constexpr std::size_t max_fused_nodes = 48;
inline constexpr std::size_t max_fused_inputs = 16;
struct fused_node {
    enum class kind : std::uint8_t { input, constant, function };
    kind what = kind::constant;
    op_code op{};
    std::uint8_t operand_count = 0;
    std::uint8_t operands[3]{};  // earlier nodes
    std::uint8_t input = 0;      // input: which of the pass's inputs
    double value = 0;            // constant
};
struct fused_input {
    const void* data = nullptr;
    element_type type = element_type::float32;
    strides_t strides{};  // over the pass's axes; 0 where the input is broadcast
};
struct fused_pass {
    element_type type = element_type::float32;
    std::size_t rank = 0;
    extents_t extents{};
    void* out = nullptr;
    element_type out_type = element_type::float32;  // `type`, or bf16: rounded to nearest even as stored
    strides_t out_strides{};
    std::size_t node_count = 0, input_count = 0;
    fused_node nodes[max_fused_nodes];
    fused_input inputs[max_fused_inputs];
};
void run_fused(context& c, const fused_pass& pass);

// softmax, layer_norm (biased variance, epsilon) or a reduction along `axis` of x, into y: y
// has x's axes (softmax, layer_norm) or x's axes without `axis` (sum, max, mean).
enum class line_op : std::uint8_t { softmax, layer_norm, sum, max, mean };
struct rowwise_pass {
    line_op op = line_op::softmax;
    element_type type = element_type::float32;
    std::size_t rank = 0, axis = 0;
    extents_t extents{};  // of x
    const void* x = nullptr;
    strides_t x_strides{};
    void* y = nullptr;
    strides_t y_strides{};  // of y's axes
    double epsilon = 0;
};
void run_rowwise(context& c, const rowwise_pass& pass);

// arange (out[i] = i, rank 1) or causal_mask (out[q][k] = 1 where key k lies in query q's
// future, evaluation::in_future, else 0; rank 2).
struct indices_pass {
    bool causal = false;
    element_type type = element_type::float32;
    std::size_t rank = 1;
    extents_t extents{};
    void* out = nullptr;
    strides_t out_strides{};
};
void run_indices(context& c, const indices_pass& pass);

// out(before..., ids..., after...) = table(before..., ids[...], after...), the ids already
// checked against the table's extent along `axis`.
struct gather_pass {
    element_type type = element_type::float32;
    const void* table = nullptr;
    std::size_t table_rank = 0, axis = 0;
    extents_t table_extents{};
    strides_t table_strides{};
    const void* ids = nullptr;
    element_type id_type = element_type::int64;
    std::size_t id_rank = 0;
    strides_t id_strides{};
    void* out = nullptr;
    std::size_t out_rank = 0;
    extents_t out_extents{};
    strides_t out_strides{};
};
void run_gather(context& c, const gather_pass& pass);

// The adjoint of a gather (a gather's gradient with respect to its table): out(before...,
// r, after...) = the sum of values(before..., j..., after...) over the indices j of `ids`
// with ids[j] = r, zero where no id is r. One thread per (before..., after...) position owns
// out's line along `axis`: it writes the zeros, then adds the values in the order of j, so
// that the sums are the same from run to run (no atomics), at the cost of parallelism: as
// many threads as the positions (an embedding's gradient: its width).
struct scatter_pass {
    element_type type = element_type::float32;
    const void* values = nullptr;
    strides_t values_strides{};  // (before..., ids..., after...)
    const void* ids = nullptr;
    element_type id_type = element_type::int64;
    std::size_t id_rank = 0;
    extents_t id_extents{};
    strides_t id_strides{};
    std::size_t axis = 0;
    void* out = nullptr;
    std::size_t out_rank = 0;
    extents_t out_extents{};
    strides_t out_strides{};
};
void run_scatter(context& c, const scatter_pass& pass);

// The fused attention o = softmax(f(scale q K^T)) V along the keys, without the queries x keys
// matrix (evaluation/attention_pattern.hpp), with the online softmax: in float, with heads of at
// most 128 and the keys not split, in tiles of 64 queries x 64 keys (src/cuda/attention.cu);
// else one thread per query over blocks of keys (device_functions.hpp: attention_row). The batch axes are the leading ones
// of o, each operand with its own strides along them (0 where it is broadcast). f, the rest of
// the score function, is a fused pass over the scores' axes (batch..., queries, keys) whose
// input `score_input` is the score itself; a causal mask skips the keys in each query's future.
struct attention_operand {
    const void* data = nullptr;
    strides_t batch{};               // along the batch axes
    std::ptrdiff_t rows = 0, cols = 0;  // q: (queries, d); k: (keys, d); v: (keys, dv); o: (queries, dv)
};
struct attention_pass {
    static constexpr std::size_t key_block = 16;  // scores held at once: one rescale per block
    static constexpr std::size_t chunk = 64;      // output columns per walk over the keys
    element_type type = element_type::float32;
    std::size_t batch_rank = 0;
    extents_t batch_extents{};
    std::size_t queries = 0, keys = 0, d = 0, dv = 0;
    attention_operand q, k, v, o;
    double scale = 1;  // as the element type holds it
    bool causal = false;
    bool has_score_function = false;
    std::size_t score_input = 0;
    fused_pass score;  // out and out_strides unused
    // Split over the keys (flash-decoding), for few queries and many keys: each query's keys
    // are cut into `key_splits` ranges, each a thread of its own that writes its running
    // maximum, sum and unnormalised output to `partials`, (batch..., queries, key_splits,
    // 2 + dv) elements of the pass's type in device memory; a second kernel combines them.
    std::size_t key_splits = 1;
    void* partials = nullptr;
};
void run_attention(context& c, const attention_pass& pass);

// How many ranges of keys each query's attention is split into. Only for few queries per batch
// item (decoding: fewer than attention_split_below_queries); more queries go to the tiled
// kernel (src/cuda/attention.cu), whose blocks of queries fill the device without splitting.
// Then enough threads for the device (2^15 threads of one (query, key range) each; a first
// guess, not tuned), each range at least two key blocks; 1 where the rows alone give that many.
constexpr std::size_t attention_split_below_queries = 16;
constexpr std::size_t attention_threads_wanted = std::size_t(1) << 15;
constexpr std::size_t attention_min_keys_per_split = 2 * attention_pass::key_block;
constexpr std::size_t attention_key_splits(std::size_t rows, std::size_t queries, std::size_t keys) {
    if (rows == 0 || rows >= attention_threads_wanted || queries >= attention_split_below_queries) return 1;
    const std::size_t by_threads = attention_threads_wanted / rows, by_keys = keys / attention_min_keys_per_split;
    const std::size_t splits = by_threads < by_keys ? by_threads : by_keys;
    return splits > 1 ? splits : 1;
}

// cuBLAS's column-major strided batched product, as cublasGemmStridedBatchedEx takes it: for
// each of `batch` items, C (m x n, leading dimension ldc) = op(A) (m x k) op(B) (k x n), op a
// transpose where asked; item i's matrices start at i * stride_x. gemm_layout.hpp maps dimsum's
// row-major, strided products onto it.
enum class gemm_precision : std::uint8_t {
    exact,  // float in float (no TF32), double in double
    tf32,   // float inputs rounded to TF32 on tensor cores: about 1e-3 relative error
};
struct gemm_call {
    element_type type = element_type::float32;
    gemm_precision precision = gemm_precision::exact;
    bool transpose_a = false, transpose_b = false;
    long long m = 0, n = 0, k = 0;
    const void* a = nullptr;
    long long lda = 1, stride_a = 0;
    const void* b = nullptr;
    long long ldb = 1, stride_b = 0;
    void* c = nullptr;
    long long ldc = 1, stride_c = 0;
    long long batch = 1;
};
void run_gemm(context& c, const gemm_call& call);

}  // namespace dimsum::backend::cuda
