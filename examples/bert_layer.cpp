// A BERT encoder layer (Devlin et al. 2019; post-norm, as torch.nn.TransformerEncoderLayer):
//     h = layer_norm(x + attention(x))
//     y = layer_norm(h + gelu(h W_1 + b_1) W_2 + b_2)
// with its weights loaded by name from a checkpoint, checked against PyTorch's output for the
// same weights (tests/reference/generate_bert.py made both).
//
//     bert_layer [--weights PATH] [--input FILE]
//
// PATH is a .safetensors file, an .npz or a folder of .npy files holding the layer's
// parameters under the names of its struct below (by default the committed
// tests/reference/bert/weights.safetensors, a layer of model width 128 and 2 heads of 64).
// FILE is the input (by default x.npy beside it), and PyTorch's out.npy and out_padded.npy lie
// beside it too. It prints the largest difference from PyTorch with and without key padding
// and fails beyond 1e-4; a missing, malformed or mis-shaped file is a one-line error.

#include <dimsum/dimsum.hpp>
#include <dimsum/interop/npy.hpp>
#include <dimsum/interop/parameters.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace ds = dimsum;

namespace bert {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 128>;
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 64>;
using Hidden = ds::axis<"hidden", 512>;  // the feed-forward width

using activations = ds::tensor<float, Batch, Seq, Model>;

struct encoder_layer {
    BOOST_HANA_DEFINE_STRUCT(encoder_layer,
        (ds::nn::multi_head_attention<float, Model, Heads, Head>, attention),
        (ds::tensor<float, Model>, ln1_weight),
        (ds::tensor<float, Model>, ln1_bias),
        (ds::tensor<float, Model, Hidden>, w_ff1),  // (model, hidden)
        (ds::tensor<float, Hidden>, b_ff1),
        (ds::tensor<float, Hidden, Model>, w_ff2),  // (hidden, model)
        (ds::tensor<float, Model>, b_ff2),
        (ds::tensor<float, Model>, ln2_weight),
        (ds::tensor<float, Model>, ln2_bias));
    static constexpr double epsilon = 1e-12;  // BERT's LayerNorm

    // y (batch, seq, model) for x (batch, seq, model)
    activations operator()(const activations& x, const ds::nn::attention_options& options = {}) const {
        activations h = ds::nn::layer_norm(x + attention(x, options), ln1_weight, ln1_bias, epsilon);
        auto feed_forward = ds::matmul(ds::nn::gelu(ds::matmul(h, w_ff1) + b_ff1), w_ff2) + b_ff2;
        return ds::nn::layer_norm(h + feed_forward, ln2_weight, ln2_bias, epsilon);
    }
};

}  // namespace bert

// The largest |got - want| / (1 + |want|).
double difference(const bert::activations& got, const ds::tensor<double, bert::Batch, bert::Seq, bert::Model>& want) {
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        double d = std::abs(double(got.data()[i]) - want.data()[i]) / (1.0 + std::abs(want.data()[i]));
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    return worst;
}

int main(int argc, char** argv) {
    std::string weights = DIMSUM_BERT_DATA "/weights.safetensors", input;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--weights") weights = argv[i + 1];
        else if (flag == "--input") input = argv[i + 1];
    }
    const std::string dir = DIMSUM_BERT_DATA;
    if (input.empty()) input = dir + "/x.npy";
    try {
        using namespace bert;
        encoder_layer layer;
        ds::load(layer, weights);
        activations x = ds::load_npy<float, Batch, Seq, Model>(input);  // (batch, seq, model)
        auto want = ds::load_npy<double, Batch, Seq, Model>(dir + "/out.npy");
        auto want_padded = ds::load_npy<double, Batch, Seq, Model>(dir + "/out_padded.npy");
        auto lengths_file = ds::load_npy<double, Batch>(dir + "/lengths.npy");
        std::vector<std::size_t> lengths(lengths_file.data(), lengths_file.data() + lengths_file.size());

        double plain = difference(layer(x), want);
        double padded = difference(layer(x, {.key_lengths = lengths}), want_padded);
        std::printf("BERT encoder layer, x (batch=%zu, seq=%zu, model=128), weights from %s\n", x.shape().extent(0),
                    x.shape().extent(1), weights.c_str());
        std::printf("largest difference from torch.nn.TransformerEncoderLayer: %.2e; with key padding: %.2e\n", plain,
                    padded);
        return plain <= 1e-4 && padded <= 1e-4 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bert_layer: %s\n", e.what());
        return 1;
    }
}
