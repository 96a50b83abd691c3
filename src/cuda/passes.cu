// dimsum::cuda: the passes of backend/cuda/kernels.hpp. Each kernel is a grid-stride loop over
// the body it shares with the host stand-in of the tests (backend/cuda/device_functions.hpp);
// products go to cuBLAS. First versions, chosen for being plainly right: one thread per
// element (indices, gather), per 4 elements (fused), per line (rowwise, scatter) or per query
// (attention; attention.cu has the tiled kernel that most attention takes), no shared
// memory, no vector loads, no tensor cores.
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "dimsum/backend/cuda/attention_tiles.hpp"
#include "dimsum/backend/cuda/device_functions.hpp"
#include "runtime.cuh"

namespace dimsum::backend::cuda {

namespace {

constexpr int threads_per_block = 256;

// Enough blocks to fill the device a few times over; the loops stride over the rest.
unsigned blocks_for(const context& c, std::size_t n) {
    const std::size_t wanted = (n + threads_per_block - 1) / threads_per_block;
    const std::size_t cap = static_cast<std::size_t>(c.multiprocessors) * 32;
    return static_cast<unsigned>(wanted < cap ? wanted : cap);
}

// body(pass, i) for every item i < n: one thread per item, striding over the grid.
// The pass stays in the kernel's parameter space (__grid_constant__): taking its address (the
// bodies take it by reference) would otherwise copy its 2 to 3 KB into each thread's memory.
template <class Pass, void (*body)(const Pass&, std::size_t)>
__global__ void each_item(const __grid_constant__ Pass pass, std::size_t n) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
        body(pass, i);
    }
}

// Launches kernel<float> or kernel<double> over n items (the pass's items unless said), then
// checks the launch.
template <class Pass>
void launch(context& c, void (*as_float)(Pass, std::size_t), void (*as_double)(Pass, std::size_t), const Pass& pass,
            const char* name, std::size_t n) {
    if (n == 0) return;
    const element_type type = pass.type;
    const unsigned blocks = blocks_for(c, n);
    if (type == element_type::float64) as_double<<<blocks, threads_per_block, 0, c.stream>>>(pass, n);
    else as_float<<<blocks, threads_per_block, 0, c.stream>>>(pass, n);
    check_launch(c, name);
}
template <class Pass>
void launch(context& c, void (*as_float)(Pass, std::size_t), void (*as_double)(Pass, std::size_t), const Pass& pass,
            const char* name) {
    launch(c, as_float, as_double, pass, name, device::item_count(pass));
}

int as_int(long long value, const char* what) {
    if (value > INT_MAX) {
        throw cuda_error(std::string("dimsum: cuda: a product's ") + what + " of " + std::to_string(value) +
                         " exceeds cuBLAS's 32-bit sizes (not supported yet)");
    }
    return static_cast<int>(value);
}

}  // namespace

void check_launch(context& c, const char* name) {
    check(cudaGetLastError(), name);
    // DIMSUM_CUDA_SYNC=1: wait after each pass, so that a fault names the pass that made it
    // (scripts/gpu_check.sh sets it; else a fault shows at the next wait, under that call's name)
    static const bool wait_after_each_pass = [] {
        const char* value = std::getenv("DIMSUM_CUDA_SYNC");
        return value && std::string(value) == "1";
    }();
    if (wait_after_each_pass) check(cudaStreamSynchronize(c.stream), name);
}

void run_fused(context& c, const fused_pass& pass) {
    launch(c, each_item<fused_pass, device::fused_lane<float>>, each_item<fused_pass, device::fused_lane<double>>, pass,
           "fused kernel launch", device::lane_count(pass));
}

void run_rowwise(context& c, const rowwise_pass& pass) {
    launch(c, each_item<rowwise_pass, device::rowwise_line<float>>, each_item<rowwise_pass, device::rowwise_line<double>>,
           pass, "rowwise kernel launch");
}

void run_indices(context& c, const indices_pass& pass) {
    launch(c, each_item<indices_pass, device::indices_element<float>>, each_item<indices_pass, device::indices_element<double>>,
           pass, "indices kernel launch");
}

void run_gather(context& c, const gather_pass& pass) {
    launch(c, each_item<gather_pass, device::gather_element<float>>, each_item<gather_pass, device::gather_element<double>>,
           pass, "gather kernel launch");
}

void run_scatter(context& c, const scatter_pass& pass) {
    launch(c, each_item<scatter_pass, device::scatter_line<float>>, each_item<scatter_pass, device::scatter_line<double>>,
           pass, "scatter kernel launch");
}

void run_attention(context& c, const attention_pass& pass) {
    if (tiles::accepts(pass)) return run_attention_in_tiles(c, pass);
    launch(c, each_item<attention_pass, device::attention_row<float>>, each_item<attention_pass, device::attention_row<double>>,
           pass, "attention kernel launch");
    if (pass.key_splits > 1) {  // the key ranges' partials, combined: one thread per output element
        launch(c, each_item<attention_pass, device::attention_combine<float>>,
               each_item<attention_pass, device::attention_combine<double>>, pass, "attention combine kernel launch",
               device::combine_count(pass));
    }
}

void run_gemm(context& c, const gemm_call& g) {
    const bool wide = g.type == element_type::float64;
    const cudaDataType_t data = wide ? CUDA_R_64F : CUDA_R_32F;
    const cublasComputeType_t compute =
        wide ? CUBLAS_COMPUTE_64F : (g.precision == gemm_precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    const double one_d = 1, zero_d = 0;
    const float one_f = 1, zero_f = 0;
    const void* alpha = wide ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
    const void* beta = wide ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
    check(cublasGemmStridedBatchedEx(c.blas, g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     as_int(g.m, "m"), as_int(g.n, "n"), as_int(g.k, "k"), alpha, g.a, data,
                                     as_int(g.lda, "lda"), g.stride_a, g.b, data, as_int(g.ldb, "ldb"), g.stride_b, beta, g.c,
                                     data, as_int(g.ldc, "ldc"), g.stride_c, as_int(g.batch, "batch"), compute,
                                     CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
}

}  // namespace dimsum::backend::cuda
