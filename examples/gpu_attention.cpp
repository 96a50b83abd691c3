// The README's multi-head attention (multi_head_attention.hpp) on GPU tensors: the same
// formulas, with the input and the weights copied to the device once, evaluated there by the
// CUDA backend, and the result checked against the CPU backend on the host.
//
// Built where dimsum::cuda is (examples/CMakeLists.txt): linked with it, the program runs on
// CUDA device 0 and exits 77 (ctest: "Skipped") where there is none; linked with the host
// stand-in of the device (tests/cuda/host_device.cpp), it runs in every CI build.
#include "multi_head_attention.hpp"

#include <dimsum/backend/cuda/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cuda = dimsum::backend::cuda;
using namespace mha;

int main() {
    const cuda::device_status status = cuda::query_devices();
    if (status.count == 0) {
        std::printf("skipped: no CUDA device (%s)\n", status.reason.c_str());
        return 77;
    }
    std::printf("CUDA device 0: %s\n", status.name.c_str());

    const activations x = make_input(2, 10);  // (batch=2, seq=10, model=768), on the host
    const weight w_q = make_weight(2), w_k = make_weight(3), w_v = make_weight(4), w_o = make_weight(5);

    try {
        // to the device once: (batch, seq, model) and four (model, model)
        const auto x_gpu = cuda::to_device(x);
        const auto wq_gpu = cuda::to_device(w_q), wk_gpu = cuda::to_device(w_k);
        const auto wv_gpu = cuda::to_device(w_v), wo_gpu = cuda::to_device(w_o);

        // the formula of self_attention, over device tensors, evaluated on the GPU
        auto q = split_heads(ds::matmul(x_gpu, wq_gpu));  // (batch, heads, seq, head)
        auto k = split_heads(ds::matmul(x_gpu, wk_gpu));
        auto v = split_heads(ds::matmul(x_gpu, wv_gpu));
        auto formula = ds::matmul(merge_heads(attention(q, k, v)), wo_gpu);  // (batch, seq, model)
        const cuda::evaluator gpu;
        std::printf("%s", gpu.explain(formula).c_str());  // the plan: GEMMs and fused attention
        const cuda::tensor<float, Batch, Seq, Model> y_gpu = cuda::eval(formula, gpu);

        const activations y = cuda::to_host(y_gpu);   // (batch, seq, model)
        const activations want = self_attention(x, w_q, w_k, w_v, w_o);  // the CPU backend
        double worst = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            const double d = std::abs(double(y.data()[i]) - double(want.data()[i]));
            worst = std::isnan(d) ? INFINITY : std::max(worst, d);  // a NaN fails
        }
        std::printf("y(0, 0, 0:4) = %.5f %.5f %.5f %.5f\n", y(0, 0, 0), y(0, 0, 1), y(0, 0, 2), y(0, 0, 3));
        std::printf("largest difference from the CPU backend: %.2e\n", worst);
        return worst <= 1e-5 ? 0 : 1;
    } catch (const std::exception& e) {
        std::printf("gpu_attention: %s\n", e.what());
        return 1;
    }
}
