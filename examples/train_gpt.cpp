// A small decoder-only transformer trained from scratch: RMSNorm, rotary position embedding,
// grouped-query attention and SwiGLU, two layers, each layer one formula. Its task is
// made here and its answer known: read 8 random digits and a separator, then write the digits
// reversed. The forward through a tape (ds::tape: each layer's output kept, its formula
// recorded), the loss (cross-entropy on the reversed digits) and every gradient (the tape's
// backward: one program a layer), clipping and AdamW make a training step; a line per step says
// the loss and the tokens per second. Training stops once 99% of the digits of held-out
// sequences, generated one token at a time, are right, and saves the model (ds::save), which
// `train_gpt --generate FILE` loads to reverse new sequences. With --bf16, in mixed precision:
// the model computes in bf16 (its weights and each layer's output held in bf16), its gradients
// and the parameters AdamW steps are float, and each step rounds them into the model.
//
//   train_gpt [--steps N] [--minutes M] [--save FILE] [--threads N] [--bf16 1]    train
//   train_gpt --generate FILE                                                      load and generate
//
// It returns non-zero if training ends short of 99% (with --steps: if the loss did not fall
// to a fifth of its first value, or at all in fewer than 200 steps).
#include <dimsum/dimsum.hpp>
#include <dimsum/interop/parameters.hpp>

#include <boost/hana/define_struct.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Vocab = ds::axis<"vocab", 11>;  // the digits 0 to 9, and the separator
using Model = ds::axis<"model", 64>;
using KvHeads = ds::axis<"kv_heads", 2>;
using Group = ds::axis<"group", 2>;     // query heads per key/value head: 4 query heads
using OneGroup = ds::axis<"group", 1>;  // the same axis at extent 1: broadcasts over the group
using Head = ds::axis<"head", 16>;
using KvModel = ds::axis<"kv_model", 32>;
using Hidden = ds::axis<"hidden", 128>;

constexpr std::size_t digits = 8;
constexpr std::size_t length = 2 * digits;  // a sequence's tokens read: the digits, the separator, the first 7 answers
constexpr std::int64_t separator = 10;

// The weights, of T: float, or bf16 (the model a mixed-precision step computes with).
template <class T>
struct layer {
    BOOST_HANA_DEFINE_STRUCT(layer,
        (ds::tensor<T, Model>, attention_norm),
        (ds::tensor<T, Model, Model>, w_q),
        (ds::tensor<T, Model, KvModel>, w_k),
        (ds::tensor<T, Model, KvModel>, w_v),
        (ds::tensor<T, Model, Model>, w_o),
        (ds::tensor<T, Model>, feed_forward_norm),
        (ds::tensor<T, Model, Hidden>, w_1),
        (ds::tensor<T, Model, Hidden>, w_3),
        (ds::tensor<T, Hidden, Model>, w_2));
};

template <class T>
struct gpt {
    BOOST_HANA_DEFINE_STRUCT(gpt,
        (ds::tensor<T, Vocab, Model>, embedding),
        (layer<T>, layer_0),
        (layer<T>, layer_1),
        (ds::tensor<T, Model>, final_norm),
        (ds::tensor<T, Model, Vocab>, w_out));
};

layer<float> new_layer(std::uint64_t seed) {
    layer<float> l;
    l.attention_norm.fill(1);
    l.feed_forward_norm.fill(1);
    ds::fill_normal(l.w_q, seed + 1, 0.0, 0.02);
    ds::fill_normal(l.w_k, seed + 2, 0.0, 0.02);
    ds::fill_normal(l.w_v, seed + 3, 0.0, 0.02);
    ds::fill_normal(l.w_o, seed + 4, 0.0, 0.02);
    ds::fill_normal(l.w_1, seed + 5, 0.0, 0.02);
    ds::fill_normal(l.w_3, seed + 6, 0.0, 0.02);
    ds::fill_normal(l.w_2, seed + 7, 0.0, 0.02);
    return l;
}

gpt<float> new_gpt() {
    gpt<float> m{ds::tensor<float, Vocab, Model>(), new_layer(10), new_layer(20), ds::tensor<float, Model>(),
                 ds::tensor<float, Model, Vocab>()};
    ds::fill_normal(m.embedding, 1, 0.0, 0.02);
    m.final_norm.fill(1);
    ds::fill_normal(m.w_out, 2, 0.0, 0.02);
    return m;
}

// (batch, seq, model) -> (batch, kv_heads, group, seq, head): query head h is (h / 2, h % 2)
auto query_heads(auto&& q) {
    return ds::permute<Batch, KvHeads, Group, Seq, Head>(ds::view<Batch, Seq, KvHeads, Group, Head>(std::forward<decltype(q)>(q)));
}
// (batch, seq, kv_model) -> (batch, kv_heads, group=1, seq, head)
auto kv_heads(auto&& k) {
    return ds::permute<Batch, KvHeads, OneGroup, Seq, Head>(ds::view<Batch, Seq, KvHeads, OneGroup, Head>(std::forward<decltype(k)>(k)));
}

template <class T>
using rope = ds::nn::rotary<T, Seq, Head>;

// One pre-norm layer: x + attention(rms_norm(x)), then + SwiGLU(rms_norm(.)).
template <class T>
auto decoder_layer(const layer<T>& p, const rope<T>& rotary, auto&& x) {
    auto h = ds::nn::rms_norm(x, p.attention_norm, 1e-5);
    auto q = rotary(query_heads(ds::matmul(h, p.w_q)));
    auto k = rotary(kv_heads(ds::matmul(h, p.w_k)));
    auto v = kv_heads(ds::matmul(h, p.w_v));
    auto z = ds::nn::causal_attention(q, k, v);  // (batch, kv_heads, group, seq, head)
    auto r = x + ds::matmul(ds::view<Batch, Seq, Model>(ds::permute<Batch, Seq, KvHeads, Group, Head>(z)), p.w_o);
    return r + ds::nn::swiglu(ds::nn::rms_norm(r, p.feed_forward_norm, 1e-5), p.w_1, p.w_3, p.w_2);
}

template <class T>
auto embed(const gpt<T>& m, const ds::tensor<std::int64_t, Batch, Seq>& tokens) { return ds::gather<Vocab>(m.embedding, tokens); }
// the logits, in float
template <class T>
auto head(const gpt<T>& m, ds::tensor_view<const T, Batch, Seq, Model> x) {
    auto logits = ds::matmul(ds::nn::rms_norm(x, m.final_norm, 1e-5), m.w_out);
    if constexpr (std::is_same_v<T, float>) return logits;
    else return ds::cast<float>(logits);
}

// The forward, one formula a layer, through a tape: each layer's output is evaluated and its
// formula recorded for the backward. Returns the last layer's output (a view of the tape's).
template <class T>
ds::tensor_view<const T, Batch, Seq, Model> forward(const gpt<T>& m, const rope<T>& rotary, const ds::tensor<std::int64_t, Batch, Seq>& tokens,
                                                    ds::tape<T>& tape) {
    const auto x0 = tape.eval(embed(m, tokens));
    const auto x1 = tape.eval(decoder_layer(m.layer_0, rotary, x0));
    return tape.eval(decoder_layer(m.layer_1, rotary, x1));
}

// The logits (batch, seq, vocab) of the next token after each of `tokens` (batch, seq).
template <class T>
ds::tensor<float, Batch, Seq, Vocab> logits_of(const gpt<T>& m, const rope<T>& rotary, const ds::tensor<std::int64_t, Batch, Seq>& tokens) {
    ds::tape<T> tape;  // no backward follows: dropped with its records
    return ds::eval(head(m, forward(m, rotary, tokens, tape)));
}

// One training step's loss and gradients: the forward, then the backward through the tape,
// from the loss down to the embedding, one program a layer (ds::tape::backward). The gradients
// are float whatever T is.
template <class T>
double loss_and_gradients(const gpt<T>& m, const rope<T>& rotary, const ds::tensor<std::int64_t, Batch, Seq>& tokens,
                          const ds::tensor<std::int64_t, Batch, Seq>& targets, ds::tape<T>& tape, gpt<float>& g) {
    const auto top = forward(m, rotary, tokens, tape);
    return tape.backward(ds::nn::cross_entropy<Vocab>(head(m, top), targets), m, g);
}

// `count` sequences: the tokens read (digits, separator, the answer but its last digit) and
// the targets (the next token where it is an answer digit, else ignored: -100).
struct sequences {
    ds::tensor<std::int64_t, Batch, Seq> tokens, targets;
};
sequences make_sequences(std::size_t count, std::mt19937_64& random) {
    sequences s{ds::tensor<std::int64_t, Batch, Seq>(Batch{count}, Seq{length}),
                ds::tensor<std::int64_t, Batch, Seq>(Batch{count}, Seq{length})};
    std::uniform_int_distribution<std::int64_t> digit(0, 9);
    for (std::size_t b = 0; b < count; ++b) {
        std::int64_t full[2 * digits + 1];
        for (std::size_t i = 0; i < digits; ++i) full[i] = digit(random);
        full[digits] = separator;
        for (std::size_t i = 0; i < digits; ++i) full[digits + 1 + i] = full[digits - 1 - i];
        for (std::size_t t = 0; t < length; ++t) {
            s.tokens(b, t) = full[t];
            s.targets(b, t) = t >= digits ? full[t + 1] : -100;
        }
    }
    return s;
}

// The answers generated one token at a time from the digits and the separator; the fraction
// of answer digits that are right. With `show`, each sequence and its answer printed.
template <class T>
double generated_accuracy(const gpt<T>& m, const rope<T>& rotary, const sequences& s, bool show = false) {
    const std::size_t count = s.tokens.shape().extent(0);
    ds::tensor<std::int64_t, Batch, Seq> tokens = s.tokens;
    std::vector<std::int64_t> answers(count * digits);
    std::size_t right = 0;
    for (std::size_t t = digits; t < length; ++t) {  // tokens[..., 0, t] are read; predict t + 1
        const ds::tensor<float, Batch, Seq, Vocab> logits = logits_of(m, rotary, tokens);
        for (std::size_t b = 0; b < count; ++b) {
            std::int64_t best = 0;
            for (std::size_t c = 1; c < Vocab::static_extent; ++c) {
                if (logits(b, t, c) > logits(b, t, std::size_t(best))) best = std::int64_t(c);
            }
            right += best == s.targets(b, t);
            answers[b * digits + t - digits] = best;
            if (t + 1 < length) tokens(b, t + 1) = best;  // the model reads its own answer
        }
    }
    for (std::size_t b = 0; show && b < count; ++b) {
        for (std::size_t i = 0; i < digits; ++i) std::cout << s.tokens(b, i);
        std::cout << " -> ";
        for (std::size_t i = 0; i < digits; ++i) std::cout << answers[b * digits + i];
        std::cout << '\n';
    }
    return double(right) / double(count * digits);
}

int generate(const std::string& path) {
    gpt<float> m = new_gpt();
    ds::load(m, path);
    const rope<float> rotary(length);
    std::mt19937_64 random(7);
    const sequences s = make_sequences(4, random);
    const double accuracy = generated_accuracy(m, rotary, s, true);
    std::cout << "4 new sequences, generated: " << 100 * accuracy << "% of the answer digits right\n";
    return 0;
}

struct options {
    std::size_t steps = 0;  // 0: until 99%, or the time is up
    double minutes = 5;
    std::string save_to = "train_gpt.npz";
};

// Trains a model computing in T (float, or bf16 in mixed precision) from new float parameters.
template <class T>
int train(const options& o) {
    constexpr bool mixed = !std::is_same_v<T, float>;
    using clock = std::chrono::steady_clock;
    const std::size_t batch = 32;
    const rope<T> rotary(length);
    gpt<float> params = new_gpt();  // what AdamW steps
    gpt<float> grads = params;      // overwritten by each backward
    gpt<T> rounded;                 // mixed precision: the bf16 model, params rounded at each step
    if constexpr (mixed) ds::nn::sgd(params, {.learning_rate = 0}).step(params, grads, rounded);
    const gpt<T>& model = [&]() -> const gpt<T>& {
        if constexpr (mixed) return rounded;
        else return params;
    }();
    ds::nn::adamw optimizer(params, {.learning_rate = 3e-3, .weight_decay = 0.0});
    std::mt19937_64 random(2026), held_out_random(99);
    const sequences held_out = make_sequences(128, held_out_random);
    ds::tape<T> tape;  // its memory reused from one step to the next
    const auto start = clock::now();
    double first_loss = 0, loss = 0, accuracy = 0;
    for (std::size_t step = 1;; ++step) {
        const sequences s = make_sequences(batch, random);
        const auto before = clock::now();
        loss = loss_and_gradients(model, rotary, s.tokens, s.targets, tape, grads);
        ds::nn::clip_grad_norm(grads, 1.0);
        if constexpr (mixed) optimizer.step(params, grads, rounded);
        else optimizer.step(params, grads);
        const double took = std::chrono::duration<double>(clock::now() - before).count();
        const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
        if (step == 1) first_loss = loss;
        std::printf("step %4zu  loss %.4f  %6.0f tokens/s  %5.1f s\n", step, loss, double(batch * length) / took, elapsed);
        const bool last = o.steps ? step == o.steps : elapsed > o.minutes * 60;
        if (step % 50 == 0 || last) {
            accuracy = generated_accuracy(model, rotary, held_out);
            std::printf("held-out sequences, generated: %.2f%% of the answer digits right\n", 100 * accuracy);
            if (!o.steps && accuracy >= 0.99) break;
        }
        if (last) break;
    }
    std::fflush(stdout);
    ds::save(params, o.save_to);  // float, either way
    std::cout << "saved to " << o.save_to << '\n';
    if (o.steps) return loss < (o.steps >= 200 ? first_loss / 5 : first_loss) ? 0 : 1;
    return accuracy >= 0.99 ? 0 : 1;
}

int main(int argc, char** argv) {
    options o;
    bool bf16 = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string option = argv[i], value = argv[i + 1];
        if (option == "--steps") o.steps = std::stoul(value);
        else if (option == "--minutes") o.minutes = std::stod(value);
        else if (option == "--save") o.save_to = value;
        else if (option == "--threads") ds::set_num_threads(std::stoi(value));
        else if (option == "--bf16") bf16 = value != "0";
        else if (option == "--generate") return generate(value);
        else {
            std::cerr << "train_gpt: unknown option " << option << '\n';
            return 2;
        }
    }
    return bf16 ? train<ds::bf16>(o) : train<float>(o);
}
