// A small Llama-style decoder (decoder.hpp) generating tokens step by step. The weights, the
// prompt and the expected logits and tokens come from PyTorch in float64
// (tests/reference/generate_decoder.py); the example prints the largest difference of the
// logits at every step and fails if a token differs or a logit is off by more than 1e-4.
//
// Usage: decoder [--data DIR] (DIR holds weights.safetensors, prompt.npy, tokens.npy and
// logits.npy; by default tests/reference/decoder).
#include <dimsum/interop/npy.hpp>
#include <dimsum/interop/parameters.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "decoder.hpp"

namespace ds = dimsum;
using llama::Batch;
using llama::Seq;

using llama::tiny;
using Vocab = tiny::Vocab;

int main(int argc, char** argv) {
    std::string dir = DIMSUM_DECODER_DATA;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--data") dir = argv[i + 1];
    }
    try {
        llama::decoder_weights<tiny> w;
        ds::load(w, dir + "/weights.safetensors");
        auto prompt = ds::load_npy<std::int64_t, Batch, Seq>(dir + "/prompt.npy");
        auto expected = ds::load_npy<std::int64_t, Batch, Seq>(dir + "/tokens.npy");
        using Step = ds::axis<"step">;
        auto expected_logits = ds::load_npy<double, Step, Batch, Vocab>(dir + "/logits.npy");
        const std::size_t batch = prompt.extent(0), steps = expected_logits.extent(0);

        llama::decoder<tiny> d(w, batch, prompt.extent(1) + steps);
        ds::tensor<float, Batch, Vocab> logits(Batch{batch});
        ds::tensor<std::int64_t, Batch, Seq> next(Batch{batch}, Seq{1});
        bool ok = true;
        for (std::size_t s = 0; s < steps; ++s) {
            d.step(s == 0 ? prompt : next, logits);  // the whole prompt first, then one token at a time
            double worst = 0;
            for (std::size_t b = 0; b < batch; ++b) {
                const float* row = logits.data() + b * Vocab::static_extent;
                next(b, 0) = std::max_element(row, row + Vocab::static_extent) - row;  // greedy
                for (std::size_t t = 0; t < Vocab::static_extent; ++t) {
                    worst = std::max(worst, std::abs(double(row[t]) - expected_logits(s, b, t)));
                }
                ok = ok && next(b, 0) == expected(b, prompt.extent(1) + s);
            }
            ok = ok && worst <= 1e-4;
            std::printf("step %zu (%zu positions): tokens", s, d.size());
            for (std::size_t b = 0; b < batch; ++b) std::printf(" %lld", static_cast<long long>(next(b, 0)));
            std::printf(", logits within %.2e of PyTorch float64\n", worst);
        }
        std::printf(ok ? "every token and logit as PyTorch's\n" : "MISMATCH with PyTorch\n");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "decoder: %s\n", e.what());
        return 1;
    }
}
