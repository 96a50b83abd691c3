// The context of backend/cuda/kernels.hpp as the library defines it, and its error checks;
// nvcc only.
#pragma once

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <cstddef>

#include "dimsum/backend/cuda/arena.hpp"
#include "dimsum/backend/cuda/kernels.hpp"

namespace dimsum::backend::cuda {

// Throws a cuda_error naming the call, if status is an error.
void check(cudaError_t status, const char* call);
void check(cublasStatus_t status, const char* call);

// After a kernel's launch: its error, named `name`; with DIMSUM_CUDA_SYNC=1, also the wait for
// it, so that a fault is blamed on the kernel that made it (passes.cu).
void check_launch(context& c, const char* name);

// The fused attention in tiles (attention.cu), for the passes tiles::accepts.
void run_attention_in_tiles(context& c, const attention_pass& pass);

class context {
public:
    context();
    ~context();
    context(const context&) = delete;
    context& operator=(const context&) = delete;

    cudaStream_t stream{};
    cublasHandle_t blas{};
    int multiprocessors = 1;
    arena memory;
};

}  // namespace dimsum::backend::cuda
