// A Llama-style decoder block as dimsum formulas, for examples/decoder.cpp (checked against
// PyTorch) and dimsum_bench's decoder rows (timed against PyTorch): token embedding
// (gather), RMSNorm, grouped-query attention with rotary embeddings over a KV cache, SwiGLU,
// a final RMSNorm and the output projection. Sizes is a struct of axis types: Vocab, Model,
// Heads, KvHeads, Head, Hidden (all static).
#pragma once

#include <dimsum/dimsum.hpp>

#include <cstddef>
#include <cstdint>

namespace llama {

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;

// The sizes of tests/reference/generate_decoder.py's decoder, which examples/decoder.cpp
// checks against PyTorch.
struct tiny {
    using Vocab = ds::axis<"vocab", 50>;
    using Model = ds::axis<"model", 32>;
    using Heads = ds::axis<"heads", 4>;
    using KvHeads = ds::axis<"kv_heads", 2>;
    using Head = ds::axis<"head", 8>;
    using Hidden = ds::axis<"hidden", 48>;
};

template <class Sizes>
struct axes : Sizes {
    using Group = ds::axis<"group", Sizes::Heads::static_extent / Sizes::KvHeads::static_extent>;  // query heads per kv head
    using OneGroup = ds::axis<"group", 1>;  // keys and values: broadcast over the group
    using Inner = ds::axis<"heads*head", Sizes::Heads::static_extent * Sizes::Head::static_extent>;
    using KvInner = ds::axis<"kv_heads*head", Sizes::KvHeads::static_extent * Sizes::Head::static_extent>;
};

// The weights, by the names of the checkpoint.
template <class Sizes, class A = axes<Sizes>>
struct block_weights {
    using Model = typename A::Model;
    BOOST_HANA_DEFINE_STRUCT(block_weights,
        (ds::tensor<float, Model>, attention_norm),
        (ds::tensor<float, Model, typename A::Inner>, w_q),
        (ds::tensor<float, Model, typename A::KvInner>, w_k),
        (ds::tensor<float, Model, typename A::KvInner>, w_v),
        (ds::tensor<float, typename A::Inner, Model>, w_o),
        (ds::tensor<float, Model>, ffn_norm),
        (ds::tensor<float, Model, typename A::Hidden>, w_1),
        (ds::tensor<float, Model, typename A::Hidden>, w_3),
        (ds::tensor<float, typename A::Hidden, Model>, w_2));
};
template <class Sizes, class A = axes<Sizes>>
struct decoder_weights {
    BOOST_HANA_DEFINE_STRUCT(decoder_weights,
        (ds::tensor<float, typename A::Vocab, typename A::Model>, embedding),
        (block_weights<Sizes>, block),
        (ds::tensor<float, typename A::Model>, norm),
        (ds::tensor<float, typename A::Model, typename A::Vocab>, output));
};

// The decoder with its cache: step() runs new tokens at the positions after those seen.
// Its tensors keep their memory, so a step of the same size as the one before allocates
// nothing.
template <class Sizes>
class decoder {
    using A = axes<Sizes>;
    using Vocab = typename A::Vocab;
    using Model = typename A::Model;
    using KvHeads = typename A::KvHeads;
    using Group = typename A::Group;
    using OneGroup = typename A::OneGroup;
    using Head = typename A::Head;
    using Inner = typename A::Inner;

public:
    decoder(const decoder_weights<Sizes>& w, std::size_t batch, std::size_t max_positions)
        : w_(w), rope_(max_positions, 10000.0), cache_(batch, max_positions) {}

    // tokens (batch, seq=n) at positions size() .. size() + n: the logits of the last one.
    void step(const ds::tensor<std::int64_t, Batch, Seq>& tokens, ds::tensor<float, Batch, Vocab>& logits) {
        const block_weights<Sizes>& b = w_.block;
        const std::size_t first = cache_.size(), n = tokens.extent(1);
        x_ = ds::gather<Vocab>(w_.embedding, tokens);  // (batch, seq, model)
        h_ = ds::nn::rms_norm(x_, b.attention_norm, 1e-5);
        // the new keys and values, rotated keys, into the cache: (batch, kv_heads, seq, head)
        auto k = ds::transpose<Seq, KvHeads>(ds::view<Batch, Seq, KvHeads, Head>(ds::matmul(h_, b.w_k)));
        auto v = ds::transpose<Seq, KvHeads>(ds::view<Batch, Seq, KvHeads, Head>(ds::matmul(h_, b.w_v)));
        cache_.append(rope_(k, first), v);
        // the queries, query head h as (h / group, h % group): (batch, kv_heads, group, seq, head)
        auto q = rope_(ds::permute<Batch, KvHeads, Group, Seq, Head>(
                           ds::view<Batch, Seq, KvHeads, Group, Head>(ds::matmul(h_, b.w_q))),
                       first);
        // every query sees the cached positions up to its own (the causal mask aligns the ends)
        auto z = ds::nn::causal_attention(q, ds::unsqueeze<OneGroup, 2>(cache_.keys()),
                                          ds::unsqueeze<OneGroup, 2>(cache_.values()));
        auto heads = ds::view<Batch, Seq, Inner>(ds::permute<Batch, Seq, KvHeads, Group, Head>(z));
        attended_ = x_ + ds::matmul(heads, b.w_o);
        out_ = attended_ + ds::nn::swiglu(ds::nn::rms_norm(attended_, b.ffn_norm, 1e-5), b.w_1, b.w_3, b.w_2);
        logits = ds::matmul(ds::nn::rms_norm(ds::select<Seq>(out_, n - 1), w_.norm, 1e-5), w_.output);
    }

    std::size_t size() const { return cache_.size(); }
    void restart() { cache_.clear(); }                 // a new sequence; the memory stays
    void rewind(std::size_t size) { cache_.keep(size); }  // back to the first `size` positions

private:
    const decoder_weights<Sizes>& w_;
    ds::nn::rotary<float, Seq, Head> rope_;
    ds::nn::kv_cache<float, Batch, KvHeads, Seq, Head> cache_;
    ds::tensor<float, Batch, Seq, Model> x_, h_, attended_, out_;
};

}  // namespace llama
