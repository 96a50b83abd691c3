#pragma once
// A BERT encoder layer (Devlin et al. 2019; post-norm, as torch.nn.TransformerEncoderLayer):
//     h = layer_norm(x + attention(x))
//     y = layer_norm(h + gelu(h W_1 + b_1) W_2 + b_2)
// of model width 128 and 2 heads of 64, as the committed tests/reference/bert/ checkpoint
// holds it (tests/reference/generate_bert.py made it), in float or bf16. bert_layer.cpp runs
// it on one process, tensor_parallel.cpp split over MPI ranks.

#include <dimsum/dimsum.hpp>
#include <dimsum/interop/parameters.hpp>

#include <algorithm>
#include <cmath>

namespace ds = dimsum;

namespace bert {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 128>;
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 64>;
using Hidden = ds::axis<"hidden", 512>;  // the feed-forward width

template <class T>
using basic_activations = ds::tensor<T, Batch, Seq, Model>;
using activations = basic_activations<float>;

// Of float or bf16 tensors; a bf16 layer loads the same float32 checkpoint, each weight rounded.
template <class T>
struct basic_encoder_layer {
    BOOST_HANA_DEFINE_STRUCT(basic_encoder_layer,
        (ds::nn::multi_head_attention<T, Model, Heads, Head>, attention),
        (ds::tensor<T, Model>, ln1_weight),
        (ds::tensor<T, Model>, ln1_bias),
        (ds::tensor<T, Model, Hidden>, w_ff1),  // (model, hidden)
        (ds::tensor<T, Hidden>, b_ff1),
        (ds::tensor<T, Hidden, Model>, w_ff2),  // (hidden, model)
        (ds::tensor<T, Model>, b_ff2),
        (ds::tensor<T, Model>, ln2_weight),
        (ds::tensor<T, Model>, ln2_bias));
    static constexpr double epsilon = 1e-12;  // BERT's LayerNorm

    // y (batch, seq, model) for x (batch, seq, model)
    basic_activations<T> operator()(const basic_activations<T>& x, const ds::nn::attention_options& options = {}) const {
        basic_activations<T> h = ds::nn::layer_norm(x + attention(x, options), ln1_weight, ln1_bias, epsilon);
        auto feed_forward = ds::matmul(ds::nn::gelu(ds::matmul(h, w_ff1) + b_ff1), w_ff2) + b_ff2;
        return ds::nn::layer_norm(h + feed_forward, ln2_weight, ln2_bias, epsilon);
    }
};
using encoder_layer = basic_encoder_layer<float>;

// The largest |got - want| / (1 + |want|).
template <class T>
double difference(const basic_activations<T>& got, const ds::tensor<double, Batch, Seq, Model>& want) {
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        double d = std::abs(double(got.data()[i]) - want.data()[i]) / (1.0 + std::abs(want.data()[i]));
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    return worst;
}

}  // namespace bert
