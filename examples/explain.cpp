// What the CPU backend will run for the README's multi-head attention (batch 2, seq 10,
// model 768, 12 heads of 64): ds::explain prints the plan, one line per kernel call, and
// evaluates nothing.
#include "multi_head_attention.hpp"

#include <iostream>

int main() {
    namespace ds = dimsum;
    using namespace mha;

    activations x = make_input(2, 10);  // (batch=2, seq=10, model=768)
    weight w_q = make_weight(2), w_k = make_weight(3), w_v = make_weight(4), w_o = make_weight(5);

    auto q = split_heads(ds::matmul(x, w_q));
    auto k = split_heads(ds::matmul(x, w_k));
    auto v = split_heads(ds::matmul(x, w_v));
    std::cout << ds::explain(ds::matmul(merge_heads(attention(q, k, v)), w_o));

    // The reference backend's plan of the same formula: every step its own entry.
    std::cout << '\n' << ds::explain(ds::matmul(merge_heads(attention(q, k, v)), w_o), ds::backend::reference::evaluator{});

    // The program as lowered and after each program pass (one line a step), then the plan.
    std::cout << '\n' << ds::explain(attention(q, k, v), ds::explain_detail::passes);
}
