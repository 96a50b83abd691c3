// A BERT encoder layer (bert_layer.hpp) with its weights loaded by name from a checkpoint,
// checked against PyTorch's output for the same weights (tests/reference/generate_bert.py made
// both).
//
//     bert_layer [--weights PATH] [--input FILE]
//
// PATH is a .safetensors file, an .npz or a folder of .npy files holding the layer's
// parameters under the names of its struct (by default the committed
// tests/reference/bert/weights.safetensors, a layer of model width 128 and 2 heads of 64).
// FILE is the input (by default x.npy beside it), and PyTorch's out.npy and out_padded.npy lie
// beside it too. It prints the largest difference from PyTorch with and without key padding,
// for the layer in float and in bf16 (the same weights and input rounded to bf16), and fails
// beyond 1e-4 in float or 3e-2 in bf16 (see below); a missing, malformed or mis-shaped file
// is a one-line error.

#include <dimsum/dimsum.hpp>
#include <dimsum/interop/npy.hpp>
#include <dimsum/interop/parameters.hpp>

#include "bert_layer.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

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
        layer.epsilon = epsilon;
        ds::load(layer, weights);
        activations x = ds::load_npy<float, Batch, Seq, Model>(input);  // (batch, seq, model)
        auto want = ds::load_npy<double, Batch, Seq, Model>(dir + "/out.npy");
        auto want_padded = ds::load_npy<double, Batch, Seq, Model>(dir + "/out_padded.npy");
        auto lengths_file = ds::load_npy<double, Batch>(dir + "/lengths.npy");
        std::vector<std::size_t> lengths(lengths_file.data(), lengths_file.data() + lengths_file.size());

        double plain = bert::difference(layer(x), want);
        double padded = bert::difference(layer(x, {.key_lengths = lengths}), want_padded);
        std::printf("BERT encoder layer, x (batch=%zu, seq=%zu, model=128), weights from %s\n", x.shape().extent(0),
                    x.shape().extent(1), weights.c_str());
        std::printf("largest difference from torch.nn.TransformerEncoderLayer: %.2e; with key padding: %.2e\n", plain,
                    padded);

        // The same layer in bf16: weights rounded as they load, the input rounded by a cast.
        // Each rounding moves a value by up to 2^-9 of itself; the layer rounds x, every weight
        // and its stored intermediates (the attention's output, h, y), and sums of 128 and 512
        // such products feed two layer norms. Measured: 7.4e-3 and 9.4e-3, about one bf16 ulp
        // at 1 (2^-7 = 7.8e-3); the bound, 3e-2, is four.
        basic_encoder_layer<ds::bf16> layer16;
        layer16.epsilon = epsilon;
        ds::load(layer16, weights);
        basic_activations<ds::bf16> x16 = ds::cast<ds::bf16>(x);
        const basic_activations<ds::bf16> y16 = layer16(x16);
        double plain16 = bert::difference(y16, want);
        double padded16 = bert::difference(layer16(x16, {.key_lengths = lengths}), want_padded);
        std::printf("in bf16: %.2e; with key padding: %.2e\n", plain16, padded16);

        // Calls in a loop pack the attention's projections once (ds::prepack), here in float
        // panels: no bf16 weight is widened again, and the values are the same, bit for bit.
        layer16.attention.prepack();
        const basic_activations<ds::bf16> packed16 = layer16(x16);
        const bool same = std::memcmp(packed16.data(), y16.data(), y16.size() * sizeof(ds::bf16)) == 0;
        std::printf("in bf16, projections packed once (%zu bytes): %s\n", layer16.attention.packed_bytes(),
                    same ? "the same values" : "DIFFERENT values");
        return plain <= 1e-4 && padded <= 1e-4 && plain16 <= 3e-2 && padded16 <= 3e-2 && same ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bert_layer: %s\n", e.what());
        return 1;
    }
}
