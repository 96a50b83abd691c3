// A Llama-style decoder, for examples/decoder.cpp (checked against PyTorch) and
// dimsum_bench's decoder rows (timed against PyTorch): token embedding (gather), one
// nn::decoder_layer (RMSNorm, grouped-query attention with rotary embeddings over a KV cache,
// SwiGLU), a final RMSNorm and the output projection. Sizes is a struct of axis types: Vocab, Model,
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

// The decoder's weights, by the names of the checkpoint: the layer is the library's.
template <class Sizes>
using layer = ds::nn::decoder_layer<float, typename Sizes::Model, typename Sizes::Heads, typename Sizes::KvHeads,
                                    typename Sizes::Head, typename Sizes::Hidden>;
template <class Sizes>
struct decoder_weights {
    BOOST_HANA_DEFINE_STRUCT(decoder_weights,
        (ds::tensor<float, typename Sizes::Vocab, typename Sizes::Model>, embedding),
        (layer<Sizes>, block),
        (ds::tensor<float, typename Sizes::Model>, norm),
        (ds::tensor<float, typename Sizes::Model, typename Sizes::Vocab>, output));
};

// The decoder with its cache: step() runs new tokens at the positions after those seen.
// Its tensors keep their memory, so a step of the same size as the one before allocates
// nothing.
template <class Sizes>
class decoder {
    using Vocab = typename Sizes::Vocab;
    using Model = typename Sizes::Model;

public:
    decoder(const decoder_weights<Sizes>& w, std::size_t batch, std::size_t max_positions)
        : w_(w), rope_(max_positions, 10000.0), cache_(batch, max_positions) {}

    // tokens (batch, seq=n) at positions size() .. size() + n: the logits of the last one.
    void step(const ds::tensor<std::int64_t, Batch, Seq>& tokens, ds::tensor<float, Batch, Vocab>& logits) {
        const std::size_t n = tokens.extent(1);
        x_ = ds::gather<Vocab>(w_.embedding, tokens);  // (batch, seq, model)
        if (out_.extent(0) != x_.extent(0) || out_.extent(1) != n) out_ = ds::tensor<float, Batch, Seq, Model>(x_.shape());
        w_.block.forward(x_, cache_, out_.view(), rope_);
        logits = ds::matmul(ds::nn::rms_norm(ds::select<Seq>(out_, n - 1), w_.norm, 1e-5), w_.output);
    }

    std::size_t size() const { return cache_.size(); }
    void restart() { cache_.clear(); }                 // a new sequence; the memory stays
    void rewind(std::size_t size) { cache_.keep(size); }  // back to the first `size` positions

private:
    const decoder_weights<Sizes>& w_;
    ds::nn::rotary<float, Seq, typename Sizes::Head> rope_;
    ds::nn::kv_cache<float, Batch, typename Sizes::KvHeads, Seq, typename Sizes::Head> cache_;
    ds::tensor<float, Batch, Seq, Model> x_, out_;
};

}  // namespace llama
