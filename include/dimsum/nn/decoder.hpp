#pragma once
// A Transformer decoder layer, pre-norm as in LLaMA (Touvron et al. 2023) and its kin
// (Mistral, Qwen, Gemma's layout with other norms aside):
//     h = x + attention(rms_norm(x))               grouped-query self-attention over a KV
//                                                  cache, keys and queries rotated (RoPE)
//     y = h + swiglu(rms_norm(h))                  (silu(h W_1) * h W_3) W_2
// Its weights by name for ds::load and ds::save. Prefill and decoding go through the same
// call: the rows given are the new positions, whose keys and values join the cache.

#include <cstddef>
#include <memory>

#include <boost/hana/define_struct.hpp>

#include "dimsum/backend/cpu/prepack.hpp"
#include "dimsum/nn/attention.hpp"
#include "dimsum/nn/kv_cache.hpp"
#include "dimsum/nn/layers.hpp"
#include "dimsum/nn/rotary.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum::nn {

// T: float or bf16. Heads query heads share KvHeads key/value heads (grouped-query attention;
// KvHeads = Heads is plain multi-head attention), each of Head columns; Hidden is the SwiGLU's
// width. The attention member is a multi_head_attention: separate w_q, w_k, w_v or one w_qkv,
// optional biases (Qwen has them on Q, K and V).
template <class T, axis_type Model, axis_type Heads, axis_type KvHeads, axis_type Head, axis_type Hidden>
struct decoder_layer {
    using attention_type = multi_head_attention<T, Model, Heads, Head, Head, Model, KvHeads>;
    BOOST_HANA_DEFINE_STRUCT(decoder_layer,
        (tensor<T, Model>, attention_norm),  // RMSNorm's gain before the attention
        (attention_type, attention),
        (tensor<T, Model>, ffn_norm),        // before the feed-forward
        (tensor<T, Model, Hidden>, w_1),     // (model, hidden): the gate, silu(x W_1)
        (tensor<T, Model, Hidden>, w_3),     // (model, hidden): the up projection
        (tensor<T, Hidden, Model>, w_2));    // (hidden, model): the down projection
    // The RMSNorms' epsilon, in float even in a bf16 layer: LLaMA's 1e-5 (Llama 3 and Mistral
    // too; some checkpoints say 1e-6). Not a weight: no file holds it.
    double epsilon = 1e-5;

    // The attention's projections and the three feed-forward matrices packed once for the
    // CPU's products, as multi_head_attention::prepack(): again after changing or loading them.
    void prepack() {
        attention.prepack();
        w_1_panels_ = pack_panels(tensor_view<const T, Model, Hidden>(w_1.view()));
        w_3_panels_ = pack_panels(tensor_view<const T, Model, Hidden>(w_3.view()));
        w_2_panels_ = pack_panels(tensor_view<const T, Hidden, Model>(w_2.view()));
    }
    void unpack() {
        attention.unpack();
        w_1_panels_.reset();
        w_3_panels_.reset();
        w_2_panels_.reset();
    }
    std::size_t packed_bytes() const {
        return attention.packed_bytes() +
               (w_1_panels_ ? w_1_panels_->bytes() + w_3_panels_->bytes() + w_2_panels_->bytes() : 0);
    }

    // y (batch, seq=n, model) for the n new rows x (batch, seq, model) of each sequence, a
    // tensor, a view or a formula: their keys and values join `cache` (this layer's), each row
    // attends to its sequence's positions up to its own, turned by `rope` (a rotary over the
    // head axis, or no_rotary). A padded batch says where its tokens lie (step_padding); see
    // multi_head_attention's call over a cache. x's axes are named like the cache's.
    template <rows_of_width<Model> X, key_value_cache Cache, class Rope = no_rotary_t>
    tensor<T, batch_of<X>, rows_of<X>, Model> operator()(const X& x, Cache& cache, const Rope& rope = no_rotary,
                                                         const step_padding& padding = {},
                                                         call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        tensor<T, batch_of<X>, rows_of<X>, Model> y(batch_of<X>{x.shape().extent(0)}, rows_of<X>{x.shape().extent(1)},
                                                    Model{Model::static_extent});
        forward(x, cache, y.view(), rope, padding, caller);
        return y;
    }

    // Without a cache: the whole sequences x (batch, seq, model) at once (scoring, a prompt
    // whose keys are not kept), each row attending to its sequence's rows up to its own, padded
    // as `padding` says. The keys and values are held for the call only.
    template <rows_of_width<Model> X, class Rope = no_rotary_t>
        requires(!key_value_cache<Rope>)
    tensor<T, batch_of<X>, rows_of<X>, Model> operator()(const X& x, const Rope& rope = no_rotary,
                                                         const step_padding& padding = {},
                                                         call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        kv_cache<T, batch_of<X>, KvHeads, rows_of<X>, Head> cache(x.shape().extent(0), x.shape().extent(1));
        return (*this)(x, cache, rope, padding, caller);
    }

    // The same into y, a view of x's shape that x does not overlap: a decoding loop allocates
    // nothing after its first step of each size (but a padded step's positions). The normalised
    // rows and the residual stream between the attention and the feed-forward are held per
    // thread, for their memory.
    template <rows_of_width<Model> X, key_value_cache Cache, class Rope = no_rotary_t>
    void forward(const X& x, Cache& cache, const tensor_view<T, batch_of<X>, rows_of<X>, Model>& y,
                 const Rope& rope = no_rotary, const step_padding& padding = {},
                 call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        using Batch = batch_of<X>;
        using Seq = rows_of<X>;
        // rms_norm(x), computed once for the three projections; x + attention(rms_norm(x))
        thread_local tensor<T, Batch, Seq, Model> normed, h;
        if (h.extent(0) != x.shape().extent(0) || h.extent(1) != x.shape().extent(1)) {
            const Batch batch{x.shape().extent(0)};
            const Seq rows{x.shape().extent(1)};
            normed = tensor<T, Batch, Seq, Model>(batch, rows, Model{Model::static_extent});
            h = tensor<T, Batch, Seq, Model>(batch, rows, Model{Model::static_extent});
        }
        assign(normed.view(), rms_norm(x, attention_norm, epsilon));
        attention.forward_adding(normed, cache, h.view(), x, rope, padding, caller);
        const packed_view<T, Model, Hidden> gate(w_1.view(), w_1_panels_.get()), up(w_3.view(), w_3_panels_.get());
        const packed_view<T, Hidden, Model> down(w_2.view(), w_2_panels_.get());
        assign(y, h + swiglu(rms_norm(h, ffn_norm, epsilon), gate, up, down));
    }

    // The layer as one formula of whole sequences x (batch, seq, model), a named tensor, a view
    // or a formula, to train it (a ds::tape records it; ds::backward differentiates it): what a
    // call without a cache computes (causal, keys and queries turned by `rope` at positions 0,
    // 1, ...). It reads the weights themselves (never prepack()'s packing) and the attention's
    // w_q, w_k and w_v or w_qkv (multi_head_attention::formula).
    template <class X, class Rope = no_rotary_t>
        requires rows_of_width<std::remove_cvref_t<X>, Model>
    auto formula(X&& x, const Rope& rope = no_rotary, call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        static_assert(!detail::is_temporary_tensor<X>,
                      "dimsum: decoder_layer::formula reads x where it lies: give it a named tensor or a formula, not a temporary tensor");
        auto normed = rms_norm(x, attention_norm, epsilon);
        auto h = x + attention.formula(normed, normed, causal_scores, rope);
        return h + swiglu(rms_norm(h, ffn_norm, epsilon), w_1, w_3, w_2);
    }

private:
    std::shared_ptr<const matrix_panels<compute_type_t<T>>> w_1_panels_, w_3_panels_, w_2_panels_;  // prepack()'s, or none
};

}  // namespace dimsum::nn
