// dimsum::cuda: the tiled fused attention (backend/cuda/attention_tiles.hpp) as a kernel: one
// block of 256 threads per (batch item, 64 queries), its tiles in dynamic shared memory.
// run_attention (passes.cu) sends it the passes tiles::accepts, every other to the row kernel.
#include <cuda_runtime.h>

#include <string>

#include "dimsum/backend/cuda/attention_tiles.hpp"
#include "runtime.cuh"

namespace dimsum::backend::cuda {

namespace {

// What attention_tile asks of its block, on the device.
struct device_block {
    int thread;
    unsigned char* shared;
    __device__ void sync() { __syncthreads(); }
    template <class Op>
    __device__ float group_reduce(float value, Op op) {
        for (int lanes = tiles::group / 2; lanes > 0; lanes /= 2) value = op(value, __shfl_xor_sync(0xffffffffu, value, lanes));
        return value;
    }
};

template <int columns>
__global__ void __launch_bounds__(tiles::block_threads, 2)
    attention_tiles(const __grid_constant__ attention_pass p, const __grid_constant__ tiles::layout shape) {
    extern __shared__ __align__(16) unsigned char shared[];
    device_block block{static_cast<int>(threadIdx.x), shared};
    tiles::attention_tile<columns>(p, shape, blockIdx.x, block);
}

template <int columns>
void launch_tiles(context& c, const attention_pass& pass) {
    const tiles::layout shape(pass);
    const std::size_t blocks = tiles::blocks(pass);
    if (blocks == 0) return;
    if (blocks > 0x7fffffffu) {
        throw cuda_error("dimsum: cuda: attention of " + std::to_string(blocks) + " blocks of queries (not supported yet)");
    }
    const std::size_t bytes = shape.bytes();
    check(cudaFuncSetAttribute(attention_tiles<columns>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
          "cudaFuncSetAttribute (attention tiles)");
    attention_tiles<columns><<<static_cast<unsigned>(blocks), tiles::block_threads, bytes, c.stream>>>(pass, shape);
    check_launch(c, "attention tiles kernel launch");
}

}  // namespace

void run_attention_in_tiles(context& c, const attention_pass& pass) {
    if (pass.dv <= 64) launch_tiles<4>(c, pass);
    else launch_tiles<8>(c, pass);
}

}  // namespace dimsum::backend::cuda
