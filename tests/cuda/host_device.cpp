// A stand-in for the dimsum::cuda library on the host, for machines without a GPU (CI): the
// interface of backend/cuda/kernels.hpp implemented with host memory and plain loops over the
// same bodies the kernels run (backend/cuda/device_functions.hpp), and cuBLAS's product by
// its definition, refusing the arguments cuBLAS refuses. Linked into tests/cuda/'s host
// tests in place of dimsum::cuda, it checks everything of the CUDA backend but the kernels'
// launches, CUDA's own calls and cuBLAS itself: those only a GPU checks (the same tests
// linked with dimsum::cuda, run by scripts/gpu_check.sh). The tiled attention runs as its
// kernel does, a block's threads as threads meeting at barriers (below).

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "dimsum/backend/cuda/arena.hpp"
#include "dimsum/backend/cuda/attention_tiles.hpp"
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
void copy_on_device(context&, void* to, const void* from, std::size_t bytes) {
    if (bytes != 0) std::memcpy(to, from, bytes);
}

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

void run_fused(context&, const fused_pass& p) {
    each_item(p, device::fused_lane<float>, device::fused_lane<double>, device::lane_count(p));
}
void run_rowwise(context&, const rowwise_pass& p) { each_item(p, device::rowwise_line<float>, device::rowwise_line<double>); }
void run_indices(context&, const indices_pass& p) { each_item(p, device::indices_element<float>, device::indices_element<double>); }
void run_gather(context&, const gather_pass& p) { each_item(p, device::gather_element<float>, device::gather_element<double>); }
// The tiled attention's body (attention_tiles.hpp) run as its kernel runs it: a block's 256
// threads as threads of their own, meeting at a barrier for each sync() of the block and twice
// for each group reduction (write, meet, read, meet), so that a barrier or a reduction that
// some threads of the block never reach hangs here as it hangs on the GPU. Blocks run one after
// the other; the shared memory starts as NaN in every block, as memory no one wrote.
namespace {
// A barrier of a block's threads that, unlike the GPU's, says so when some thread never comes:
// a watchdog aborts with a message if no barrier phase completes for 20 seconds.
class block_barrier {
public:
    explicit block_barrier(int threads) : meet_(threads, completion{&phases_}), watchdog_([this] { watch(); }) {}
    ~block_barrier() {
        done_ = true;
        watchdog_.join();
    }
    void arrive_and_wait() { meet_.arrive_and_wait(); }

private:
    struct completion {
        std::atomic<unsigned long long>* phases;
        void operator()() noexcept { phases->fetch_add(1, std::memory_order_relaxed); }
    };
    void watch() {
        unsigned long long seen = phases_.load();
        auto since = std::chrono::steady_clock::now();
        while (!done_) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const unsigned long long now = phases_.load();
            if (now != seen) {
                seen = now;
                since = std::chrono::steady_clock::now();
            } else if (std::chrono::steady_clock::now() - since > std::chrono::seconds(20)) {
                std::fputs("host stand-in: some threads of a block reached a barrier or group reduction of attention_tile and the "
                           "others never did (on a GPU: a hang)\n", stderr);
                std::abort();
            }
        }
    }
    std::atomic<unsigned long long> phases_{0};
    std::atomic<bool> done_{false};
    std::barrier<completion> meet_;
    std::thread watchdog_;
};

struct host_block {
    int thread;
    unsigned char* shared;
    block_barrier* meet;
    float* slots;  // one per thread: the values a group reduction exchanges
    void sync() { meet->arrive_and_wait(); }
    // The device's shuffle butterfly, step for step, from the 16 values of the group: each
    // thread writes its value, all meet, each computes the butterfly for its own place.
    template <class Op>
    float group_reduce(float value, Op op) {
        slots[thread] = value;
        sync();
        const int first = thread / tiles::group * tiles::group;
        float values[tiles::group];
        for (int l = 0; l < tiles::group; ++l) values[l] = slots[first + l];
        sync();
        for (int lanes = tiles::group / 2; lanes > 0; lanes /= 2) {
            float next[tiles::group];
            for (int l = 0; l < tiles::group; ++l) next[l] = op(values[l], values[l ^ lanes]);
            for (int l = 0; l < tiles::group; ++l) values[l] = next[l];
        }
        return values[thread - first];
    }
};

template <int columns>
void attention_in_tiles(const attention_pass& p) {
    const tiles::layout shape(p);
    const std::size_t blocks = tiles::blocks(p), bytes = shape.bytes();
    std::unique_ptr<unsigned char[]> shared(new unsigned char[bytes + 16]);
    unsigned char* aligned = shared.get() + (16 - reinterpret_cast<std::uintptr_t>(shared.get()) % 16) % 16;
    block_barrier meet(tiles::block_threads);
    std::vector<float> slots(tiles::block_threads);
    const auto thread = [&](int t) {
        host_block block{t, aligned, &meet, slots.data()};
        for (std::size_t b = 0; b < blocks; ++b) {
            if (t == 0) std::memset(aligned, 0xff, bytes);  // NaN
            block.sync();
            tiles::attention_tile<columns>(p, shape, b, block);
            block.sync();
        }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < tiles::block_threads; ++t) threads.emplace_back(thread, t);
    thread(0);
    for (std::thread& t : threads) t.join();
}
}  // namespace

void run_attention(context&, const attention_pass& p) {
    if (tiles::accepts(p)) {
        if (p.dv <= 64) attention_in_tiles<4>(p);
        else attention_in_tiles<8>(p);
        return;
    }
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
