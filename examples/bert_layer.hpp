#pragma once
// The BERT encoder layer (ds::nn::encoder_layer, post-norm, as torch.nn.TransformerEncoderLayer)
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

// The library's layer (ds::nn::encoder_layer), of float or bf16 tensors; a bf16 layer loads
// the same float32 checkpoint, each weight rounded. Its epsilon is BERT's, set before use.
template <class T>
using basic_encoder_layer = ds::nn::encoder_layer<T, Model, Heads, Head, Hidden>;
using encoder_layer = basic_encoder_layer<float>;
inline constexpr double epsilon = 1e-12;  // BERT's LayerNorm

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
