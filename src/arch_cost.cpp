// What the instruction set costs a consumer: a BERT-base encoder block (batch 4, seq 128,
// model 768, 12 heads, feed-forward 3072), the same source compiled twice by src/CMakeLists.txt,
// with dimsum::dimsum (-march=${DIMSUM_ARCH}) and with dimsum::headers and no -march (what a
// consumer without the flag gets: SSE2 on x86-64). scripts/arch_cost.sh runs the two in turns
// and prints the ratio (docs/performance.md).
#include <dimsum/dimsum.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;
using Head = ds::axis<"head", 64>;
using Hidden = ds::axis<"hidden", 3072>;

int main() {
    ds::nn::multi_head_attention<float, Model, Heads, Head> attention;
    ds::fill_uniform(attention.w_qkv.emplace(), 1, -0.03, 0.03);
    ds::fill_uniform(attention.w_o, 2, -0.03, 0.03);
    ds::tensor<float, Model, Hidden> w_1;
    ds::tensor<float, Hidden, Model> w_2;
    ds::tensor<float, Hidden> b_1;
    ds::tensor<float, Model> gamma, beta;
    ds::fill_uniform(w_1, 3, -0.03, 0.03);
    ds::fill_uniform(w_2, 4, -0.03, 0.03);
    ds::fill_uniform(gamma, 5);
    ds::tensor<float, Batch, Seq, Model> x(Batch{4}, Seq{128}), h(Batch{4}, Seq{128}), y(Batch{4}, Seq{128});
    ds::fill_normal(x, 6);

    double best = 1e300;
    for (int round = 0; round < 6; ++round) {  // the first warms the workspace, not timed
        const auto start = std::chrono::steady_clock::now();
        attention.forward(x, x, h.view());
        h = ds::nn::layer_norm(x + h, gamma, beta);
        y = ds::nn::layer_norm(h + ds::matmul(ds::nn::gelu(ds::matmul(h, w_1) + b_1), w_2), gamma, beta);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (round > 0) best = std::min(best, ms);
    }
    std::printf("%.2f %s\n", best, ds::backend::cpu::instruction_set());  // milliseconds, instruction set
}
