// A shape mistake in the multi-head example: the output projection given as (heads, head).
// expect: dimsum: matmul: contracted axes differ: model=768 vs heads=12
// max-lines: 15
#include "multi_head_attention.hpp"

using namespace mha;

int main() {
    activations x = make_input(2, 10);
    weight w_q = make_weight(2), w_k = make_weight(3), w_v = make_weight(4);
#ifdef DIMSUM_KO
    ds::tensor<float, Heads, Head> w_o;
#else
    weight w_o = make_weight(5);
#endif
    auto q = split_heads(ds::matmul(x, w_q)), k = split_heads(ds::matmul(x, w_k)), v = split_heads(ds::matmul(x, w_v));
    activations y = ds::matmul(merge_heads(attention(q, k, v)), w_o);
    (void)y;
}
