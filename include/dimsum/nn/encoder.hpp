#pragma once
// A Transformer encoder layer, post-norm as in BERT (Devlin et al. 2019) and
// torch.nn.TransformerEncoderLayer(activation="gelu"):
//     h = layer_norm(x + attention(x))
//     y = layer_norm(h + gelu(h W_1 + b_1) W_2 + b_2)
// Its weights by name for ds::load and ds::save; dist::encoder_layer splits one over ranks.

#include <cstddef>
#include <memory>

#include <boost/hana/define_struct.hpp>

#include "dimsum/backend/cpu/prepack.hpp"
#include "dimsum/nn/attention.hpp"
#include "dimsum/nn/layers.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum::nn {

template <class T, axis_type Model, axis_type Heads, axis_type Head, axis_type Hidden>
struct encoder_layer {
    BOOST_HANA_DEFINE_STRUCT(encoder_layer,
        (multi_head_attention<T, Model, Heads, Head>, attention),
        (tensor<T, Model>, ln1_weight),
        (tensor<T, Model>, ln1_bias),
        (tensor<T, Model, Hidden>, w_ff1),  // (model, hidden)
        (tensor<T, Hidden>, b_ff1),
        (tensor<T, Hidden, Model>, w_ff2),  // (hidden, model)
        (tensor<T, Model>, b_ff2),
        (tensor<T, Model>, ln2_weight),
        (tensor<T, Model>, ln2_bias));
    // The layer norms' epsilon: PyTorch's default; BERT's is 1e-12. Not a weight: no file
    // holds it.
    double epsilon = 1e-5;

    // The attention's projections and W_1, W_2 packed once for the CPU's products, as
    // multi_head_attention::prepack(): again after changing or loading the weights.
    void prepack() {
        attention.prepack();
        w_ff1_panels_ = pack_panels(tensor_view<const T, Model, Hidden>(w_ff1.view()));
        w_ff2_panels_ = pack_panels(tensor_view<const T, Hidden, Model>(w_ff2.view()));
    }
    void unpack() {
        attention.unpack();
        w_ff1_panels_.reset();
        w_ff2_panels_.reset();
    }
    std::size_t packed_bytes() const {
        return attention.packed_bytes() + (w_ff1_panels_ ? w_ff1_panels_->bytes() + w_ff2_panels_->bytes() : 0);
    }

    // y (batch, seq, model) for x (batch, seq, model): a tensor, a view or a formula.
    template <rows_of_width<Model> X>
    tensor<T, batch_of<X>, rows_of<X>, Model> operator()(const X& x, const attention_options& options = {},
                                                         call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        tensor<T, batch_of<X>, rows_of<X>, Model> h = layer_norm(x + attention(x, options), ln1_weight, ln1_bias, epsilon);
        const packed_view<T, Model, Hidden> w_1(w_ff1.view(), w_ff1_panels_.get());
        const packed_view<T, Hidden, Model> w_2(w_ff2.view(), w_ff2_panels_.get());
        return layer_norm(h + gelu_feed_forward(h, w_1, b_ff1, w_2, b_ff2), ln2_weight, ln2_bias, epsilon);
    }

    // The layer as one formula of x (batch, seq, model), a named tensor, a view or a formula,
    // to train it (a ds::tape records it; ds::backward differentiates it): what a call
    // computes, `mask` applied to the attention's scores (unmasked, causal_scores, or a function
    // of the scores of one's own). It reads the weights themselves (never prepack()'s packing)
    // and the attention's w_q, w_k and w_v or w_qkv (multi_head_attention::formula).
    template <class X, class Mask = unmasked_t>
        requires rows_of_width<std::remove_cvref_t<X>, Model>
    auto formula(X&& x, Mask mask = {}, call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        static_assert(!detail::is_temporary_tensor<X>,
                      "dimsum: encoder_layer::formula reads x where it lies: give it a named tensor or a formula, not a temporary tensor");
        auto h = layer_norm(x + attention.formula(x, x, mask), ln1_weight, ln1_bias, epsilon);
        return layer_norm(h + gelu_feed_forward(h, w_ff1, b_ff1, w_ff2, b_ff2), ln2_weight, ln2_bias, epsilon);
    }

private:
    std::shared_ptr<const matrix_panels<compute_type_t<T>>> w_ff1_panels_, w_ff2_panels_;  // prepack()'s, or none
};

}  // namespace dimsum::nn
