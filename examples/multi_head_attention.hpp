// Multi-head self-attention for BERT-base sizes, written as formulas. Shared by
// multi_head.cpp (which prints) and tests/nn/test_multi_head.cpp (which checks the results
// against PyTorch).
#pragma once

#include <dimsum/dimsum.hpp>

#include <cmath>
#include <limits>
#include <utility>

namespace mha {

namespace ds = dimsum;

using Batch = ds::axis<"batch">;  // extents known at run time
using Seq   = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;  // extents known at compile time
using Heads = ds::axis<"heads", 12>;
using Head  = ds::axis<"head", 64>;
using Part  = ds::axis<"part", 3>;      // query, key, value in a fused projection
using Fused = ds::axis<"qkv", 2304>;    // = part x model

using activations = ds::tensor<float, Batch, Seq, Model>;
using weight = ds::tensor<float, Model, Model>;
using fused_weight = ds::tensor<float, Model, Fused>;

// (batch, seq, model) -> (batch, heads, seq, head)
// (t is forwarded: a temporary tensor is then held by the formula, not viewed)
auto split_heads(auto&& t) {
    return ds::transpose<Seq, Heads>(ds::view<Batch, Seq, Heads, Head>(std::forward<decltype(t)>(t)));
}

// (batch, heads, seq, head) -> (batch, seq, model)
auto merge_heads(auto&& z) { return ds::view<Batch, Seq, Model>(ds::transpose<Heads, Seq>(std::forward<decltype(z)>(z))); }

// softmax(Q K^T / sqrt(d_head)) V for every batch and head: (batch, heads, seq, head)
auto attention(auto&& q, auto&& k, auto&& v) {
    return ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(k)) / 8.0f), v);
}

// The same, where no query sees a later key.
auto causal_attention(auto&& q, auto&& k, auto&& v) {
    auto scores = ds::matmul(q, ds::transpose(k)) / 8.0f;  // (batch, heads, seq, seq)
    Seq seq{scores.shape().extent(2)};
    auto masked = ds::masked_fill(scores, ds::causal_mask(seq, seq), -std::numeric_limits<float>::infinity());
    return ds::matmul(ds::softmax(masked), v);
}

// With separate projections W_Q, W_K, W_V (model, model) and the output projection W_O.
inline activations self_attention(const activations& x, const weight& w_q, const weight& w_k, const weight& w_v,
                                  const weight& w_o, bool causal = false) {
    auto q = split_heads(ds::matmul(x, w_q));  // (batch, heads, seq, head)
    auto k = split_heads(ds::matmul(x, w_k));
    auto v = split_heads(ds::matmul(x, w_v));
    if (causal) return ds::matmul(merge_heads(causal_attention(q, k, v)), w_o);
    return ds::matmul(merge_heads(attention(q, k, v)), w_o);
}

// With one fused (model, 3 x model) projection: one matmul, then three views of its result.
inline activations self_attention(const activations& x, const fused_weight& w_qkv, const weight& w_o) {
    auto qkv = ds::eval(ds::view<Batch, Seq, Part, Model>(ds::matmul(x, w_qkv)));  // (batch, seq, part, model)
    auto q = split_heads(ds::select<Part>(qkv, 0));  // (batch, heads, seq, head)
    auto k = split_heads(ds::select<Part>(qkv, 1));
    auto v = split_heads(ds::select<Part>(qkv, 2));
    return ds::matmul(merge_heads(attention(q, k, v)), w_o);
}

// W_QKV = [W_Q | W_K | W_V], written through views of its columns.
inline fused_weight fuse(const weight& w_q, const weight& w_k, const weight& w_v) {
    fused_weight w_qkv;
    auto parts = ds::view<Model, Part, Model>(w_qkv);  // (model, part, model), the same memory
    ds::select<Part>(parts, 0) = w_q;
    ds::select<Part>(parts, 1) = w_k;
    ds::select<Part>(parts, 2) = w_v;
    return w_qkv;
}

// Inputs that tests/reference/generate.py reproduces exactly: uniform, seeded.
inline constexpr double weight_bound = 0.036084391824351615;  // 1 / sqrt(768), as torch.nn.Linear

inline activations make_input(std::size_t batch, std::size_t seq) {
    activations x(Batch{batch}, Seq{seq});
    ds::fill_uniform(x, 1);
    return x;
}
inline weight make_weight(std::uint64_t seed) {
    weight w;
    ds::fill_uniform(w, seed, -weight_bound, weight_bound);
    return w;
}

}  // namespace mha
