// Multi-head self-attention, batch 2, seq 10, model 768, 12 heads of 64: with separate
// Q, K, V projections, with one fused QKV projection, and causal.
#include "multi_head_attention.hpp"

#include <algorithm>
#include <iostream>

int main() {
    namespace ds = dimsum;
    using namespace mha;

    activations x = make_input(2, 10);  // (batch=2, seq=10, model=768)
    weight w_q = make_weight(2), w_k = make_weight(3), w_v = make_weight(4), w_o = make_weight(5);

    activations separate = self_attention(x, w_q, w_k, w_v, w_o);
    activations fused = self_attention(x, fuse(w_q, w_k, w_v), w_o);
    activations causal = self_attention(x, w_q, w_k, w_v, w_o, /*causal=*/true);

    auto gap = ds::eval(ds::max<Model>(ds::abs(separate - fused)));  // (batch, seq)
    float largest_gap = *std::max_element(gap.data(), gap.data() + gap.size());

    std::cout << "input x\n" << x.shape() << "\n\n"
              << "attention with separate W_Q, W_K, W_V\n" << separate << "\n\n"
              << "attention with one fused W_QKV (768 x 2304)\n" << fused << "\n\n"
              << "largest |separate - fused| = " << largest_gap << "\n\n"
              << "causal attention\n" << causal << "\n";
    return largest_gap < 1e-5f ? 0 : 1;
}
