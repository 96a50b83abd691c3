// A stand-in for the dimsum::cuda library on the host, for machines without a GPU (CI): the
// interface of backend/cuda/kernels.hpp implemented with host memory and plain loops over the
// same bodies the kernels run (backend/cuda/device_functions.hpp), and cuBLAS's product by
// its definition, refusing the arguments cuBLAS refuses. Linked into tests/cuda/'s host
// tests in place of dimsum::cuda, it checks everything of the CUDA backend but the kernels'
// launches, CUDA's own calls and cuBLAS itself: those only a GPU checks (the same tests
// linked with dimsum::cuda, run by scripts/gpu_check.sh).

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "dimsum/backend/cuda/arena.hpp"
#include "dimsum/backend/cuda/device_functions.hpp"
#include "dimsum/backend/cuda/kernels.hpp"

namespace dimsum::backend::cuda {

static void* host_block(std::size_t bytes) { return ::operator new(bytes, std::align_val_t{arena::alignment}); }
static void free_block(void* memory) { ::operator delete(memory, std::align_val_t{arena::alignment}); }

class context {
public:
    context() = default;
    context(const context&) = delete;
    context& operator=(const context&) = delete;
    ~context() { memory.release(free_block); }
    arena memory;
};

device_status query_devices() { return {1, "", "host stand-in (tests/cuda/host_device.cpp)", 0, 0}; }

context& this_thread_context() {
    thread_local context c;
    return c;
}

void begin(context& c) { c.memory.begin(host_block, free_block); }
void* allocate(context& c, std::size_t bytes) { return c.memory.allocate(bytes, host_block); }
std::size_t device_allocations(const context& c) { return c.memory.allocations(); }
std::size_t device_bytes(const context& c) { return c.memory.bytes(); }

void* allocate_memory(std::size_t bytes) { return bytes == 0 ? nullptr : host_block(bytes); }
void free_memory(void* memory) noexcept {
    if (memory) free_block(memory);
}

void upload(context&, void* device, const void* host, std::size_t bytes) {
    if (bytes != 0) std::memcpy(device, host, bytes);
}
void download(context&, void* host, const void* device, std::size_t bytes) {
    if (bytes != 0) std::memcpy(host, device, bytes);
}
void finish(context&) {}

// body(pass, i) for every item of the pass (or the first n), in order: what a kernel does in
// parallel.
template <class Pass>
void each_item(const Pass& pass, void (*as_float)(const Pass&, std::size_t), void (*as_double)(const Pass&, std::size_t),
               std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) (pass.type == element_type::float64 ? as_double : as_float)(pass, i);
}
template <class Pass>
void each_item(const Pass& pass, void (*as_float)(const Pass&, std::size_t), void (*as_double)(const Pass&, std::size_t)) {
    each_item(pass, as_float, as_double, device::item_count(pass));
}

void run_fused(context&, const fused_pass& p) { each_item(p, device::fused_element<float>, device::fused_element<double>); }
void run_rowwise(context&, const rowwise_pass& p) { each_item(p, device::rowwise_line<float>, device::rowwise_line<double>); }
void run_indices(context&, const indices_pass& p) { each_item(p, device::indices_element<float>, device::indices_element<double>); }
void run_gather(context&, const gather_pass& p) { each_item(p, device::gather_element<float>, device::gather_element<double>); }
void run_attention(context&, const attention_pass& p) {
    each_item(p, device::attention_row<float>, device::attention_row<double>);
    if (p.key_splits > 1) each_item(p, device::attention_combine<float>, device::attention_combine<double>, device::combine_count(p));
}

// cuBLAS's product by its definition (column-major, op per operand), after the checks by which
// cublasGemmStridedBatchedEx answers CUBLAS_STATUS_INVALID_VALUE.
template <class T>
static void gemm_by_definition(const gemm_call& g) {
    const T* a = static_cast<const T*>(g.a);
    const T* b = static_cast<const T*>(g.b);
    T* c = static_cast<T*>(g.c);
    for (long long item = 0; item < g.batch; ++item) {
        for (long long j = 0; j < g.n; ++j) {
            for (long long i = 0; i < g.m; ++i) {
                T sum = 0;
                for (long long l = 0; l < g.k; ++l) {
                    const T x = g.transpose_a ? a[item * g.stride_a + l + i * g.lda] : a[item * g.stride_a + i + l * g.lda];
                    const T y = g.transpose_b ? b[item * g.stride_b + j + l * g.ldb] : b[item * g.stride_b + l + j * g.ldb];
                    sum += x * y;
                }
                c[item * g.stride_c + i + j * g.ldc] = sum;
            }
        }
    }
}

void run_gemm(context&, const gemm_call& g) {
    const auto at_least = [](long long ld, long long rows) { return ld >= (rows > 1 ? rows : 1); };
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 || !at_least(g.lda, g.transpose_a ? g.k : g.m) ||
        !at_least(g.ldb, g.transpose_b ? g.n : g.k) || !at_least(g.ldc, g.m)) {
        throw cuda_error("dimsum: cuda: cublasGemmStridedBatchedEx: CUBLAS_STATUS_INVALID_VALUE (host stand-in: m " +
                         std::to_string(g.m) + ", n " + std::to_string(g.n) + ", k " + std::to_string(g.k) + ", lda " +
                         std::to_string(g.lda) + ", ldb " + std::to_string(g.ldb) + ", ldc " + std::to_string(g.ldc) + ")");
    }
    if (g.type == element_type::float64) gemm_by_definition<double>(g);
    else gemm_by_definition<float>(g);
}

}  // namespace dimsum::backend::cuda
