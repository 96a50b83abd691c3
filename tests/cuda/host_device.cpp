// A stand-in for the dimsum::cuda library on the host, for machines without a GPU (CI): the
// interface of backend/cuda/kernels.hpp implemented with host memory and plain loops over the
// same bodies the kernels run (backend/cuda/device_functions.hpp), and cuBLAS's product by
// its definition, refusing the arguments cuBLAS refuses. Linked into tests/cuda/'s host
// tests in place of dimsum::cuda, it checks everything of the CUDA backend but the kernels'
// launches, CUDA's own calls and cuBLAS itself: those only a GPU checks (the same tests
// linked with dimsum::cuda, run by scripts/gpu_check.sh). The tiled attention runs as its
// kernel does, a block's threads as fibers meeting at barriers (below).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "dimsum/backend/cuda/arena.hpp"
#include "dimsum/backend/cuda/attention_tiles.hpp"
#include "dimsum/backend/cuda/device_functions.hpp"
#include "dimsum/backend/cuda/kernels.hpp"

// (the fibers of the tiled attention, below)
#if defined(__SANITIZE_ADDRESS__)
#define DIMSUM_FIBERS_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DIMSUM_FIBERS_UNDER_ASAN 1
#endif
#endif
#ifdef DIMSUM_FIBERS_UNDER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "tests/cuda/host_device.cpp switches fibers on x86-64 only (the machines dimsum is built for)"
#endif

// stack_switch(&save, to): pushes the callee-saved registers and MXCSR and the x87 control
// word, stores the stack pointer in save, takes `to` as the stack pointer, pops the same and
// returns on that stack. fiber_entry is where a new fiber's first switch returns to: it calls
// r13(r12) and never comes back.
extern "C" void dimsum_stack_switch(void** save, void* to);
extern "C" void dimsum_fiber_entry();
asm(R"(
    .text
    .globl dimsum_stack_switch
    .type dimsum_stack_switch, @function
dimsum_stack_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size dimsum_stack_switch, .-dimsum_stack_switch

    .globl dimsum_fiber_entry
    .type dimsum_fiber_entry, @function
dimsum_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size dimsum_fiber_entry, .-dimsum_fiber_entry
)");

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
void run_scatter(context&, const scatter_pass& p) { each_item(p, device::scatter_line<float>, device::scatter_line<double>); }
// The tiled attention's body (attention_tiles.hpp) run as its kernel runs it: a block's 256
// threads as fibers of the calling thread, each run until it meets the block's barrier, at
// every sync() of the block and twice for each group reduction (write, meet, read, meet).
// One round runs every thread from one barrier to the next; the order of the threads
// alternates from round to round (forward, backward), so that a thread that reads what
// another writes between the same two barriers (a race on the GPU) does not always run after
// the writer. A barrier or a reduction that some threads of the block never reach is reported
// and aborts, where the GPU hangs. Blocks run one after the other; the shared memory starts as
// NaN in every block, as memory no one wrote.
//
// Why fibers, switched by hand: OS threads meeting at a std::barrier spent nearly all their
// time in the kernel's futex calls, and ucontext's swapcontext in the sigprocmask call it
// makes at every switch (each over 80% of test_cuda_host's attention cases, which took
// minutes under the sanitizers). A switch here saves the callee-saved registers and the
// floating-point control words on the running stack and loads another stack: no system call.
namespace {

class block_fibers {
public:
    static constexpr std::size_t stack_bytes = 128 * 1024;

    block_fibers() = default;
    block_fibers(const block_fibers&) = delete;
    block_fibers& operator=(const block_fibers&) = delete;
    ~block_fibers() {
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        ASAN_UNPOISON_MEMORY_REGION(stacks_.get(), tiles::block_threads * stack_bytes);  // the fibers' frames
#endif
    }

    // Runs body(t) for every thread t of the block, to the end.
    template <class Body>
    void run(Body& body) {
        body_ = &body;
        call_ = [](void* b, int t) { (*static_cast<Body*>(b))(t); };
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        ASAN_UNPOISON_MEMORY_REGION(stacks_.get(), tiles::block_threads * stack_bytes);
#endif
        for (int t = 0; t < tiles::block_threads; ++t) {
            fiber& f = fibers_[t];
            f.at = phase::running;
            f.self = this;
            f.thread = t;
            // the registers a first switch pops (MXCSR and the control word as now, r15 ...
            // rbp), then where it returns: fiber_entry, which calls r13(r12) on a stack
            // aligned as a call wants it
            char* top = stack_of(t) + stack_bytes;
            auto* words = reinterpret_cast<std::uint64_t*>(top) - 10;
            std::uint32_t mxcsr = 0;
            std::uint16_t control = 0;
            asm volatile("stmxcsr %0" : "=m"(mxcsr));
            asm volatile("fnstcw %0" : "=m"(control));
            words[0] = mxcsr | std::uint64_t(control) << 32;
            words[1] = 0;                                          // r15
            words[2] = 0;                                          // r14
            words[3] = reinterpret_cast<std::uint64_t>(&start);   // r13
            words[4] = reinterpret_cast<std::uint64_t>(&f);       // r12
            words[5] = 0;                                          // rbx
            words[6] = 0;                                          // rbp
            words[7] = reinterpret_cast<std::uint64_t>(&dimsum_fiber_entry);
            f.stack = words;  // after the return, the stack pointer is top - 16: 16-byte aligned
        }
        for (bool backwards = false;; backwards = !backwards) {
            int finished = 0, waiting = 0;
            for (int i = 0; i < tiles::block_threads; ++i) {
                running_ = backwards ? tiles::block_threads - 1 - i : i;
                fiber& f = fibers_[running_];
                enter(f);
                if (f.at == phase::finished) ++finished;
                else ++waiting;
            }
            if (finished == tiles::block_threads) return;
            if (waiting != tiles::block_threads) {
                std::fprintf(stderr, "host stand-in: %d threads of a block reached a barrier or group reduction of attention_tile "
                             "and %d never did (on a GPU: a hang)\n", waiting, finished);
                std::abort();
            }
        }
    }

    // Called by the running thread: waits at the block's barrier while the others run.
    void sync() {
        fiber& f = fibers_[running_];
        f.at = phase::waiting;
        leave(f, false);
    }

private:
    enum class phase { running, waiting, finished };
    struct fiber {
        void* stack = nullptr;  // its stack pointer while it waits
        phase at = phase::running;
        block_fibers* self = nullptr;
        int thread = 0;
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        void* fake_stack = nullptr;
#endif
    };

    char* stack_of(int t) const { return stacks_.get() + std::size_t(t) * stack_bytes; }

    // From the calling thread's stack into fiber f, until it waits or finishes.
    void enter(fiber& f) {
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        void* fake_stack = nullptr;
        __sanitizer_start_switch_fiber(&fake_stack, stack_of(f.thread), stack_bytes);
#endif
        f.at = phase::running;
        dimsum_stack_switch(&thread_stack_, f.stack);
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    }
    // From fiber f back to the calling thread's stack; `last`: f has finished and is not entered again.
    void leave(fiber& f, [[maybe_unused]] bool last) {
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        __sanitizer_start_switch_fiber(last ? nullptr : &f.fake_stack, thread_bottom_, thread_size_);
#endif
        dimsum_stack_switch(&f.stack, thread_stack_);
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
    }
    static void start(fiber* f) {
        block_fibers& self = *f->self;
#ifdef DIMSUM_FIBERS_UNDER_ASAN
        __sanitizer_finish_switch_fiber(nullptr, &self.thread_bottom_, &self.thread_size_);  // the stack it came from
#endif
        self.call_(self.body_, f->thread);
        f->at = phase::finished;
        self.leave(*f, true);
        std::abort();  // not reached: a finished fiber is not entered again
    }

    std::unique_ptr<char[]> stacks_{new char[tiles::block_threads * stack_bytes]};
    fiber fibers_[tiles::block_threads];
    void* thread_stack_ = nullptr;  // the calling thread's stack pointer while a fiber runs
    [[maybe_unused]] const void* thread_bottom_ = nullptr;  // its stack, for AddressSanitizer
    [[maybe_unused]] std::size_t thread_size_ = 0;
    void* body_ = nullptr;
    void (*call_)(void*, int) = nullptr;
    int running_ = 0;
};

struct host_block {
    int thread;
    unsigned char* shared;
    block_fibers* fibers;
    float* slots;  // one per thread: the values a group reduction exchanges
    void sync() { fibers->sync(); }
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
    thread_local std::unique_ptr<block_fibers> fibers;  // 32 MiB of stacks, kept for the next call
    if (!fibers) fibers = std::make_unique<block_fibers>();
    std::vector<float> slots(tiles::block_threads);
    auto thread = [&](int t) {
        host_block block{t, aligned, fibers.get(), slots.data()};
        for (std::size_t b = 0; b < blocks; ++b) {
            if (t == 0) std::memset(aligned, 0xff, bytes);  // NaN
            block.sync();
            tiles::attention_tile<columns>(p, shape, b, block);
            block.sync();
        }
    };
    fibers->run(thread);
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
