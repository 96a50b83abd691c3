// dimsum::cuda: devices, each thread's stream and cuBLAS handle, its device arena, copies, and
// CUDA's errors as exceptions (backend/cuda/kernels.hpp).
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <string>

#include "runtime.cuh"

namespace dimsum::backend::cuda {

void check(cudaError_t status, const char* call) {
    if (status == cudaSuccess) return;
    (void)cudaGetLastError();  // clear a non-sticky error, so that the next call is not blamed
    throw cuda_error(std::string("dimsum: cuda: ") + call + ": " + cudaGetErrorString(status) + " (" +
                     cudaGetErrorName(status) + ")");
}

void check(cublasStatus_t status, const char* call) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    throw cuda_error(std::string("dimsum: cuda: ") + call + ": " + cublasGetStatusString(status) + " (" +
                     cublasGetStatusName(status) + ")");
}

device_status query_devices() {
    device_status s;
    cudaRuntimeGetVersion(&s.runtime_version);
    cudaDriverGetVersion(&s.driver_version);
    int count = 0;
    // With no driver this returns cudaErrorInsufficientDriver and leaves count as it was.
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
        s.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status);
        return s;
    }
    s.count = count;
    if (count == 0) {
        s.reason = "cudaGetDeviceCount: 0 devices";
        return s;
    }
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess) s.name = properties.name;
    return s;
}

context::context() {
    const device_status status = query_devices();
    if (status.count == 0) throw cuda_error("dimsum: cuda: no CUDA device (" + status.reason + ")");
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cublasCreate(&blas), "cublasCreate");
    check(cublasSetStream(blas, stream), "cublasSetStream");
    int count = 0;
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
    multiprocessors = count;
}

context::~context() {
    cudaStreamSynchronize(stream);
    memory.release([](void* p) { cudaFree(p); });
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
}

// A block of the arena.
static void* device_block(std::size_t bytes) {
    void* memory = nullptr;
    check(cudaMalloc(&memory, bytes), ("cudaMalloc (" + std::to_string(bytes) + " bytes)").c_str());
    return memory;
}
static void free_block(void* memory) { check(cudaFree(memory), "cudaFree"); }

context& this_thread_context() {
    thread_local context c;
    return c;
}

void begin(context& c) {
    check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");  // the last evaluation's work done
    c.memory.begin(device_block, free_block);
}
void* allocate(context& c, std::size_t bytes) { return c.memory.allocate(bytes, device_block); }
std::size_t device_allocations(const context& c) { return c.memory.allocations(); }
std::size_t device_bytes(const context& c) { return c.memory.bytes(); }

void* allocate_memory(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return device_block(bytes);
}
void free_memory(void* memory) noexcept {
    if (memory) cudaFree(memory);
}

void upload(context& c, void* device, const void* host, std::size_t bytes) {
    if (bytes == 0) return;
    // From pageable memory: returns once the source has been staged, so host may change after.
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, c.stream), "cudaMemcpyAsync (to the device)");
}

void finish(context& c) { check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize"); }

void copy_on_device(context& c, void* to, const void* from, std::size_t bytes) {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, c.stream), "cudaMemcpyAsync (on the device)");
}

void download(context& c, void* host, const void* device, std::size_t bytes) {
    finish(c);  // every error of the evaluation first, before the host memory is touched
    if (bytes == 0) return;
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, c.stream), "cudaMemcpyAsync (to the host)");
    finish(c);
}

}  // namespace dimsum::backend::cuda
