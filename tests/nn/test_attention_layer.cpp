// nn::multi_head_attention against PyTorch's outputs (tests/reference/generate.py) and
// against plain loops in double: self- and cross-attention, fused and separate projections,
// biases, value heads of another width than key heads, causal and padding masks, and the
// attention weights returned; the layers' formulas (for training) against their calls.
#include "support.hpp"

#include <dimsum/interop/parameters.hpp>
#include <dimsum/nn/checkpoint_names.hpp>
#include <xtensor/xnpy.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "multi_head_attention.hpp"

namespace {

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Model = ds::axis<"model", 24>;
using Source = ds::axis<"source", 10>;
using Heads = ds::axis<"heads", 3>;
using Head = ds::axis<"head", 8>;
using ValueHead = ds::axis<"value_head", 5>;

using layer = ds::nn::multi_head_attention<float, Model, Heads, Head, ValueHead, Source>;

template <class Tensor>
std::vector<double> values(const Tensor& t) {
    return std::vector<double>(t.data(), t.data() + t.size());
}

// x W + b for row-major x (rows, in) and W (in, out).
std::vector<double> project(const std::vector<double>& x, std::size_t rows, std::size_t in, const std::vector<double>& w,
                            std::size_t out, const std::vector<double>& b) {
    std::vector<double> y(rows * out);
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < out; ++o) {
            double sum = b.empty() ? 0.0 : b[o];
            for (std::size_t i = 0; i < in; ++i) sum += x[r * in + i] * w[i * out + o];
            y[r * out + o] = sum;
        }
    }
    return y;
}

// The layer in plain loops: per sequence, per head, softmax over the keys each query sees.
std::vector<double> by_loops(const layer& l, const ds::tensor<float, Batch, Query, Model>& x,
                             const ds::tensor<float, Batch, Key, Source>& c, bool causal,
                             const std::vector<std::size_t>& lengths, std::vector<double>* weights_out = nullptr) {
    const std::size_t batch = x.shape().extent(0), queries = x.shape().extent(1), keys = c.shape().extent(1);
    const std::size_t model = 24, source = 10, heads = 3, head = 8, value_head = 5;
    auto bias = [](const auto& b) { return b ? values(*b) : std::vector<double>{}; };
    std::vector<double> xs = values(x), cs = values(c), y(batch * queries * model);
    if (weights_out) weights_out->assign(batch * heads * queries * keys, 0.0);
    for (std::size_t s = 0; s < batch; ++s) {
        std::vector<double> xb(xs.begin() + s * queries * model, xs.begin() + (s + 1) * queries * model);
        std::vector<double> cb(cs.begin() + s * keys * source, cs.begin() + (s + 1) * keys * source);
        auto q = project(xb, queries, model, values(*l.w_q), heads * head, bias(l.b_q));
        auto k = project(cb, keys, source, values(*l.w_k), heads * head, bias(l.b_k));
        auto v = project(cb, keys, source, values(*l.w_v), heads * value_head, bias(l.b_v));
        std::vector<double> concat(queries * heads * value_head, 0.0);
        std::size_t length = lengths.empty() ? keys : lengths[s];
        for (std::size_t h = 0; h < heads; ++h) {
            for (std::size_t i = 0; i < queries; ++i) {
                std::vector<double> score(keys, -std::numeric_limits<double>::infinity());
                double top = -std::numeric_limits<double>::infinity();
                for (std::size_t j = 0; j < keys; ++j) {
                    bool seen = j < length && (!causal || j + queries <= i + keys);
                    if (!seen) continue;
                    double dot = 0;
                    for (std::size_t e = 0; e < head; ++e) dot += q[i * heads * head + h * head + e] * k[j * heads * head + h * head + e];
                    score[j] = dot / std::sqrt(double(head));
                    top = std::max(top, score[j]);
                }
                double total = 0;
                for (std::size_t j = 0; j < keys; ++j) total += std::isinf(score[j]) ? 0.0 : std::exp(score[j] - top);
                for (std::size_t j = 0; j < keys; ++j) {
                    double p = std::isinf(score[j]) ? 0.0 : std::exp(score[j] - top) / total;
                    if (weights_out) (*weights_out)[((s * heads + h) * queries + i) * keys + j] = p;
                    for (std::size_t e = 0; e < value_head; ++e) {
                        concat[i * heads * value_head + h * value_head + e] += p * v[j * heads * value_head + h * value_head + e];
                    }
                }
            }
        }
        auto yb = project(concat, queries, heads * value_head, values(l.w_o), model, bias(l.b_o));
        std::copy(yb.begin(), yb.end(), y.begin() + s * queries * model);
    }
    return y;
}

xt::xarray<double> as_xt(const std::vector<double>& v, std::vector<std::size_t> shape) {
    xt::xarray<double> a(shape);
    std::copy(v.begin(), v.end(), a.begin());
    return a;
}

layer random_layer(bool biases) {
    layer l;
    l.w_q.emplace();
    l.w_k.emplace();
    l.w_v.emplace();
    ds::fill_uniform(*l.w_q, 1, -0.4, 0.4);
    ds::fill_uniform(*l.w_k, 2, -0.4, 0.4);
    ds::fill_uniform(*l.w_v, 3, -0.4, 0.4);
    ds::fill_uniform(l.w_o, 4, -0.4, 0.4);
    if (biases) {  // else zero
        ds::fill_uniform(l.b_q.emplace(), 5);
        ds::fill_uniform(l.b_k.emplace(), 6);
        ds::fill_uniform(l.b_v.emplace(), 7);
        ds::fill_uniform(l.b_o.emplace(), 8);
    }
    return l;
}

}  // namespace

TEST_CASE("cross-attention with biases and value heads narrower than key heads, every mask, and as one formula") {
    const layer l = random_layer(true);
    for (auto [queries, keys] : {std::array<std::size_t, 2>{7, 13}, {1, 130}, {33, 5}}) {
        INFO("queries " << queries << " keys " << keys);
        ds::tensor<float, Batch, Query, Model> x(Batch{2}, Query{queries});
        ds::tensor<float, Batch, Key, Source> c(Batch{2}, Key{keys});
        ds::fill_normal(x, 10 + queries);
        ds::fill_normal(c, 20 + keys);
        std::vector<std::size_t> lengths{keys, keys / 2 + 1};
        // the layer as one formula (to train it): the call's values, unmasked and causal
        test::require_close(ds::eval(l.formula(x, c)), test::to_xt(l(x, c)), 1e-5, 1e-6);
        test::require_close(ds::eval(l.formula(x, c, ds::nn::causal_scores)), test::to_xt(l(x, c, {.causal = true})), 1e-5, 1e-6);
        for (bool causal : {false, true}) {
            for (bool padded : {false, true}) {
                INFO("causal " << causal << " padded " << padded);
                ds::nn::attention_options options{.causal = causal};
                if (padded) options.key_lengths = lengths;
                auto want = by_loops(l, x, c, causal, padded ? lengths : std::vector<std::size_t>{});
                test::require_close(l(x, c, options), as_xt(want, {2, queries, 24}), 1e-4, 1e-5);
            }
        }
    }
}

TEST_CASE("multi_head_attention::formula with a fused w_qkv: the call's values, and w_qkv's gradient the separate weights' side by side") {
    using self = ds::nn::multi_head_attention<double, Model, Heads, Head>;
    self fused;
    ds::fill_uniform(fused.w_qkv.emplace(), 1, -0.4, 0.4);
    ds::fill_uniform(fused.b_qkv.emplace(), 2, -0.4, 0.4);
    ds::fill_uniform(fused.w_o, 3, -0.4, 0.4);
    ds::tensor<double, Batch, Query, Model> x(Batch{2}, Query{5}), target(Batch{2}, Query{5});
    ds::fill_uniform(x, 4);
    ds::fill_uniform(target, 5);
    test::require_close(ds::eval(fused.formula(x, ds::nn::causal_scores)), test::to_xt(fused(x, {.causal = true})), 1e-13, 1e-13);

    // the same weights apart: w_qkv's column blocks and b_qkv's pieces
    self separate;
    separate.w_o = fused.w_o;
    auto& w_q = separate.w_q.emplace();
    auto& w_k = separate.w_k.emplace();
    auto& w_v = separate.w_v.emplace();
    auto& b_q = separate.b_q.emplace();
    auto& b_k = separate.b_k.emplace();
    auto& b_v = separate.b_v.emplace();
    const std::size_t inner = Heads::static_extent * Head::static_extent;
    for (std::size_t j = 0; j < inner; ++j) {
        for (std::size_t m = 0; m < Model::static_extent; ++m) {
            w_q(m, j) = (*fused.w_qkv)(m, j);
            w_k(m, j) = (*fused.w_qkv)(m, inner + j);
            w_v(m, j) = (*fused.w_qkv)(m, 2 * inner + j);
        }
        b_q(j) = (*fused.b_qkv)(j);
        b_k(j) = (*fused.b_qkv)(inner + j);
        b_v(j) = (*fused.b_qkv)(2 * inner + j);
    }
    auto loss = [&](const self& l) { return ds::nn::mean_squared_error(l.formula(x, ds::nn::causal_scores), target); };
    self fused_gradients = fused, separate_gradients = separate;
    const double fused_loss = ds::backward(loss(fused), fused, fused_gradients);
    CHECK(std::abs(fused_loss - ds::backward(loss(separate), separate, separate_gradients)) <= 1e-14);
    double worst = 0;
    for (std::size_t j = 0; j < inner; ++j) {
        for (std::size_t m = 0; m < Model::static_extent; ++m) {
            const auto& g = *fused_gradients.w_qkv;
            worst = std::max({worst, std::abs(g(m, j) - (*separate_gradients.w_q)(m, j)),
                              std::abs(g(m, inner + j) - (*separate_gradients.w_k)(m, j)),
                              std::abs(g(m, 2 * inner + j) - (*separate_gradients.w_v)(m, j))});
        }
        const auto& g = *fused_gradients.b_qkv;
        worst = std::max({worst, std::abs(g(j) - (*separate_gradients.b_q)(j)), std::abs(g(inner + j) - (*separate_gradients.b_k)(j)),
                          std::abs(g(2 * inner + j) - (*separate_gradients.b_v)(j))});
    }
    CHECK(worst <= 1e-14);
    CHECK(std::abs((*fused_gradients.w_qkv)(3, 2)) > 1e-6);  // not zeros on both sides
    test::require_close(fused_gradients.w_o, test::to_xt(separate_gradients.w_o), 1e-13, 1e-15);
}

TEST_CASE("the attention weights, when asked for, are the softmax the output used") {
    const layer l = random_layer(true);
    ds::tensor<float, Batch, Query, Model> x(Batch{2}, Query{9});
    ds::tensor<float, Batch, Key, Source> c(Batch{2}, Key{11});
    ds::fill_normal(x, 31);
    ds::fill_normal(c, 32);
    std::vector<std::size_t> lengths{11, 4};
    ds::nn::attention_options options{.causal = true, .key_lengths = lengths};
    ds::tensor<float, Batch, Heads, Query, Key> weights;
    auto y = l(x, c, options, &weights);
    std::vector<double> want_weights;
    auto want = by_loops(l, x, c, true, lengths, &want_weights);
    test::require_close(y, as_xt(want, {2, 9, 24}), 1e-4, 1e-5);
    test::require_close(weights, as_xt(want_weights, {2, 3, 9, 11}), 1e-5, 1e-6);
    test::require_close(l(x, c, options), test::to_xt(y), 1e-5, 1e-6);  // fused, the same
    // on the reference backend, and on the CPU backend step by step
    ds::tensor<float, Batch, Query, Model> on_reference(Batch{2}, Query{9}), separate(Batch{2}, Query{9});
    l.forward_on(ds::backend::reference::evaluator{}, x, c, on_reference.view(), options);
    l.forward_on(ds::backend::cpu::evaluator{.fuse_attention = false}, x, c, separate.view(), options);
    test::require_close(on_reference, as_xt(want, {2, 9, 24}), 1e-4, 1e-5);
    test::require_close(separate, as_xt(want, {2, 9, 24}), 1e-4, 1e-5);
}

TEST_CASE("self-attention layer, separate or fused projections, matches PyTorch") {
    using M = mha::Model;
    using H = mha::Heads;
    using D = mha::Head;
    auto x = mha::make_input(2, 10);
    auto w_q = mha::make_weight(2), w_k = mha::make_weight(3), w_v = mha::make_weight(4), w_o = mha::make_weight(5);
    auto load = [](const std::string& name) { return xt::load_npy<double>(test::data_path(name)); };
    using self_layer = ds::nn::multi_head_attention<float, M, H, D>;
    using Inner = self_layer::Inner;  // heads x head: the same columns under the layer's name
    self_layer separate;
    separate.w_q.emplace(ds::view<M, Inner>(w_q));
    separate.w_k.emplace(ds::view<M, Inner>(w_k));
    separate.w_v.emplace(ds::view<M, Inner>(w_v));
    separate.w_o = ds::view<Inner, M>(w_o);
    self_layer fused;
    fused.w_qkv.emplace(mha::fuse(w_q, w_k, w_v));
    fused.w_o = separate.w_o;
    for (const auto& l : {separate, fused}) {
        test::require_close(l(x), load("multi_head_out.npy"), 1e-4, 1e-6);
        test::require_close(l(x, {.causal = true}), load("multi_head_causal_out.npy"), 1e-4, 1e-6);
    }
}

TEST_CASE("bad key lengths are a shape_error naming the counts") {
    const layer l = random_layer(false);
    ds::tensor<float, Batch, Query, Model> x(Batch{2}, Query{3});
    ds::tensor<float, Batch, Key, Source> c(Batch{2}, Key{4});
    std::vector<std::size_t> three{1, 2, 3}, too_long{4, 5};
    REQUIRE(test::error_of([&] { l(x, c, {.key_lengths = three}); }) ==
            "dimsum: multi_head_attention: 3 key lengths given for a batch of 2");
    REQUIRE(test::error_of([&] { l(x, c, {.key_lengths = too_long}); }) ==
            "dimsum: multi_head_attention: key length 5 exceeds the 4 keys");
    layer missing = random_layer(false);
    missing.w_k.reset();
    REQUIRE(test::error_of([&] { missing(x, c); }) == "dimsum: multi_head_attention: neither w_qkv nor w_q, w_k and w_v are set");
}

TEST_CASE("a layer whose model width is known only at run time works as called, with no biases set") {
    // It once failed to compile as l(x), and its default output bias was an empty tensor
    // that could not broadcast with the model axis.
    using M = mha::Model;
    using Width = ds::axis<"model">;  // the same axis, its extent at run time
    using static_layer = ds::nn::multi_head_attention<float, M, mha::Heads, mha::Head>;
    using run_time_layer = ds::nn::multi_head_attention<float, Width, mha::Heads, mha::Head>;
    using Inner = static_layer::Inner;
    const std::size_t width = M::static_extent;
    auto x = mha::make_input(2, 10);
    static_layer known;
    known.w_qkv.emplace(mha::fuse(mha::make_weight(2), mha::make_weight(3), mha::make_weight(4)));
    known.w_o = ds::view<Inner, M>(mha::make_weight(5));

    run_time_layer unknown;
    unknown.w_qkv.emplace(Width{width});
    unknown.w_o = ds::tensor<float, Inner, Width>(Width{width});
    std::copy_n(known.w_qkv->data(), known.w_qkv->size(), unknown.w_qkv->data());
    std::copy_n(known.w_o.data(), known.w_o.size(), unknown.w_o.data());
    ds::tensor<float, mha::Batch, mha::Seq, Width> x_run_time(mha::Batch{2}, mha::Seq{10}, Width{width});
    std::copy_n(x.data(), x.size(), x_run_time.data());

    const auto want = test::to_xt(known(x));
    test::require_close(unknown(x_run_time), want, 1e-6, 1e-7);
    auto y = x_run_time;
    unknown.forward(x_run_time, x_run_time, y.view());
    test::require_close(y, want, 1e-6, 1e-7);
}

TEST_CASE("nn::encoder_layer is the post-norm layer written out, packed or not, and loads back what it saved") {
    using Hidden = ds::axis<"hidden", 40>;
    using Seq = ds::axis<"seq">;
    using encoder = ds::nn::encoder_layer<double, Model, Heads, Head, Hidden>;
    encoder e;
    ds::fill_uniform(e.attention.w_qkv.emplace(), 1, -0.3, 0.3);
    ds::fill_uniform(e.attention.b_qkv.emplace(), 2);
    ds::fill_uniform(e.attention.w_o, 3, -0.3, 0.3);
    ds::fill_uniform(e.ln1_weight, 4, 0.5, 1.5);
    ds::fill_uniform(e.ln1_bias, 5);
    ds::fill_uniform(e.w_ff1, 6, -0.3, 0.3);
    ds::fill_uniform(e.b_ff1, 7);
    ds::fill_uniform(e.w_ff2, 8, -0.3, 0.3);
    ds::fill_uniform(e.b_ff2, 9);
    ds::fill_uniform(e.ln2_weight, 10, 0.5, 1.5);
    ds::fill_uniform(e.ln2_bias, 11);
    ds::tensor<double, Batch, Seq, Model> x(Batch{2}, Seq{7});
    ds::fill_normal(x, 12);
    std::vector<std::size_t> lengths{7, 3};

    for (double epsilon : {1e-5, 1e-12}) {  // outputs about 5e-6 apart: a layer that ignored it fails one
        e.epsilon = epsilon;
        for (const ds::nn::attention_options& options :
             {ds::nn::attention_options{}, ds::nn::attention_options{.causal = true}, ds::nn::attention_options{.key_lengths = lengths}}) {
            ds::tensor<double, Batch, Seq, Model> h =
                ds::nn::layer_norm(x + e.attention(x, options), e.ln1_weight, e.ln1_bias, epsilon);
            ds::tensor<double, Batch, Seq, Model> want = ds::nn::layer_norm(
                h + (ds::matmul(ds::gelu(ds::matmul(h, e.w_ff1) + e.b_ff1), e.w_ff2) + e.b_ff2), e.ln2_weight, e.ln2_bias, epsilon);
            test::require_close(e(x, options), test::to_xt(want), 1e-13, 1e-13);
        }
    }
    // the layer as one formula, which a tape records to train it (separate projections)
    encoder separate = e;
    separate.attention.w_qkv.reset();
    separate.attention.b_qkv.reset();
    ds::fill_uniform(separate.attention.w_q.emplace(), 13, -0.3, 0.3);
    ds::fill_uniform(separate.attention.w_k.emplace(), 14, -0.3, 0.3);
    ds::fill_uniform(separate.attention.w_v.emplace(), 15, -0.3, 0.3);
    ds::fill_uniform(separate.attention.b_k.emplace(), 16);
    test::require_close(ds::eval(separate.formula(x)), test::to_xt(separate(x)), 1e-13, 1e-13);
    test::require_close(ds::eval(separate.formula(x, ds::nn::causal_scores)), test::to_xt(separate(x, {.causal = true})), 1e-13, 1e-13);
    // The same bits with the projections and W_1, W_2 packed once.
    const auto y = e(x);
    REQUIRE(e.packed_bytes() == 0);
    e.prepack();
    CHECK(e.packed_bytes() >= (e.w_ff1.size() + e.w_ff2.size()) * sizeof(double));
    const auto packed = e(x);
    CHECK(std::memcmp(packed.data(), y.data(), y.size() * sizeof(double)) == 0);
    e.unpack();
    CHECK(e.packed_bytes() == 0);
    // By name through a file: every weight, so the same output (epsilon is not a weight).
    test::temp_dir tmp;
    ds::save(e, tmp.path("encoder.safetensors"));
    encoder loaded;
    loaded.epsilon = e.epsilon;
    ds::load(loaded, tmp.path("encoder.safetensors"));
    const auto again = loaded(x);
    CHECK(std::memcmp(again.data(), y.data(), y.size() * sizeof(double)) == 0);
}

// nn::decoder_layer against PyTorch float64 (tests/reference/generate_decoder_layer.py): three
// sequences of different lengths fed step by step through a KV cache as a padded batch, left-
// and right-padded, several new tokens per step; and an unpadded batch (prefill, a multi-token
// step, one token), in float and in bf16.
namespace decoder_data {
using Seq = ds::axis<"seq">;
using DModel = ds::axis<"model", 32>;
using DHeads = ds::axis<"heads", 4>;
using DKvHeads = ds::axis<"kv_heads", 2>;
using DHead = ds::axis<"head", 8>;
using DHidden = ds::axis<"hidden", 48>;
template <class T>
using decoder_layer = ds::nn::decoder_layer<T, DModel, DHeads, DKvHeads, DHead, DHidden>;
template <class T>
using cache = ds::nn::kv_cache<T, Batch, DKvHeads, Seq, DHead>;

std::string path(const std::string& name) { return test::data_path("decoder_layer/", name); }

// The largest difference between y and PyTorch's rows, skipping padding rows (NaN there).
template <class T>
double worst_difference(const ds::tensor<T, Batch, Seq, DModel>& y, const std::string& expected) {
    auto want = ds::load_npy<double, Batch, Seq, DModel>(path(expected));
    REQUIRE(want.shape().extents() == y.shape().extents());
    double worst = 0;
    std::size_t compared = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
        if (std::isnan(want.data()[i])) continue;
        worst = std::max(worst, std::abs(double(y.data()[i]) - want.data()[i]));
        ++compared;
    }
    REQUIRE(compared > 0);
    return worst;
}

// Every step of one of the data's batches through `layer`: the worst difference over them.
template <class T>
double run_steps(const decoder_layer<T>& layer, const std::string& batch_name, ds::nn::padding_side side) {
    const bool padded = batch_name != "even";
    const auto real = ds::load_npy<std::int64_t, ds::axis<"step">, Batch>(path("real.npy"));
    const std::size_t steps = padded ? real.extent(0) : 3, batch = padded ? real.extent(1) : 2;
    cache<T> kv(batch, 16);
    ds::nn::rotary<T, Seq, DHead> rope(16);
    double worst = 0;
    for (std::size_t s = 0; s < steps; ++s) {
        INFO(batch_name << " step " << s);
        const std::string suffix = batch_name + "_" + std::to_string(s) + ".npy";
        auto x = ds::load_npy<float, Batch, Seq, DModel>(path("x_" + suffix));
        std::vector<std::size_t> counts;
        for (std::size_t b = 0; padded && b < batch; ++b) counts.push_back(static_cast<std::size_t>(real(s, b)));
        ds::tensor<T, Batch, Seq, DModel> y = [&] {
            if constexpr (std::is_same_v<T, float>) {
                return layer(x, kv, rope, {.real = counts, .side = side});
            } else {
                ds::tensor<T, Batch, Seq, DModel> rounded = ds::cast<T>(x);
                return layer(rounded, kv, rope, {.real = counts, .side = side});
            }
        }();
        worst = std::max(worst, worst_difference(y, "y_" + suffix));
    }
    if (padded) {
        for (std::size_t b = 0; b < batch; ++b) {
            std::size_t total = 0;
            for (std::size_t s = 0; s < steps; ++s) total += static_cast<std::size_t>(real(s, b));
            CHECK(kv.lengths()[b] == total);
        }
    }
    return worst;
}
}  // namespace decoder_data

TEST_CASE("nn::decoder_layer over a KV cache matches PyTorch: padded left and right, several tokens a step, GQA") {
    using namespace decoder_data;
    decoder_layer<float> layer;
    ds::load(layer, path("weights.safetensors"));
    CHECK(!layer.attention.w_qkv);
    for (bool packed : {false, true}) {
        INFO("packed: " << packed);
        if (packed) layer.prepack();
        CHECK(run_steps(layer, "left", ds::nn::padding_side::left) < 1e-6);
        CHECK(run_steps(layer, "right", ds::nn::padding_side::right) < 1e-6);
        CHECK(run_steps(layer, "even", ds::nn::padding_side::left) < 1e-6);
    }
}

TEST_CASE("nn::decoder_layer without a cache: whole sequences at once, as PyTorch") {
    using namespace decoder_data;
    decoder_layer<float> layer;
    ds::load(layer, path("weights.safetensors"));
    auto part = [](const std::string& name, std::size_t s) {
        return ds::load_npy<float, Batch, Seq, DModel>(path(name + "_" + std::to_string(s) + ".npy"));
    };
    const auto x0 = part("x_even", 0), x1 = part("x_even", 1), x2 = part("x_even", 2);
    ds::tensor<float, Batch, Seq, DModel> whole = ds::concat<Seq>(x0, x1, x2);
    ds::nn::rotary<float, Seq, DHead> rope(16);
    ds::tensor<float, Batch, Seq, DModel> y = layer(whole, rope);
    // the layer as one formula, which a tape records to train it: the same values
    test::require_close(ds::eval(layer.formula(whole, rope)), test::to_xt(y), 1e-6, 1e-7);
    std::size_t done = 0;
    double worst = 0;
    for (std::size_t s = 0; s < 3; ++s) {
        auto want = ds::load_npy<double, Batch, Seq, DModel>(path("y_even_" + std::to_string(s) + ".npy"));
        const std::size_t rows = want.extent(1);
        ds::tensor<float, Batch, Seq, DModel> got = ds::slice<Seq>(y, done, done + rows);
        for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got.data()[i]) - want.data()[i]));
        done += rows;
    }
    CHECK(done == whole.extent(1));
    CHECK(worst < 1e-6);
}

TEST_CASE("nn::decoder_layer in bf16 stays within bf16's precision of PyTorch float64") {
    using namespace decoder_data;
    decoder_layer<ds::bf16> layer;
    ds::load(layer, path("weights.safetensors"));  // float32 values, rounded
    // outputs of about 1 to 3 in magnitude: bf16's rounding moves them by under 8e-3 here; a
    // padding row seen or a position off by one moves them by tenths
    CHECK(run_steps(layer, "left", ds::nn::padding_side::left) < 2e-2);
    CHECK(run_steps(layer, "right", ds::nn::padding_side::right) < 2e-2);
    CHECK(run_steps(layer, "even", ds::nn::padding_side::left) < 2e-2);
}

TEST_CASE("a padded step that does not fit is a shape_error, and leaves the cache as it was") {
    using namespace decoder_data;
    decoder_layer<float> layer;
    ds::load(layer, path("weights.safetensors"));
    cache<float> kv(2, 4);
    ds::nn::rotary<float, Seq, DHead> rope(4);
    ds::tensor<float, Batch, Seq, DModel> x(Batch{2}, Seq{3});
    ds::fill_uniform(x, 5);
    const std::vector<std::size_t> real{3, 1}, too_many{4, 1}, short_list{3};
    layer(x, kv, rope, {.real = real});
    CHECK(kv.lengths()[0] == 3);
    CHECK(kv.lengths()[1] == 1);
    CHECK(test::error_of([&] { layer(x, kv, rope, {.real = real}); }) ==
          "dimsum: kv_cache: 3 more positions after 3 do not fit in its 4");
    CHECK(test::error_of([&] { layer(x, kv, rope, {.real = too_many}); }) == "dimsum: kv_cache: 4 real rows in a step of 3");
    CHECK(test::error_of([&] { layer(x, kv, rope, {.real = short_list}); }) ==
          "dimsum: kv_cache: 1 real-row counts given for a batch of 2");
    CHECK(kv.lengths()[0] == 3);
    CHECK(kv.lengths()[1] == 1);
    CHECK(kv.size() == 3);
}

TEST_CASE("multi_head_attention over a KV cache, with biases and no rotary embedding, equals the causal layer on the whole sequence") {
    using Seq = ds::axis<"seq">;
    using Heads4 = ds::axis<"heads", 4>;
    using KvHeads2 = ds::axis<"kv_heads", 2>;
    using gqa = ds::nn::multi_head_attention<float, Model, Heads4, Head, Head, Model, KvHeads2>;
    gqa attention;
    ds::fill_uniform(attention.w_q.emplace(), 1, -0.3, 0.3);
    ds::fill_uniform(attention.w_k.emplace(), 2, -0.3, 0.3);
    ds::fill_uniform(attention.w_v.emplace(), 3, -0.3, 0.3);
    ds::fill_uniform(attention.w_o, 4, -0.3, 0.3);
    const std::size_t batch = 2, total = 9;
    ds::tensor<float, Batch, Seq, Model> x(Batch{batch}, Seq{total});
    ds::fill_uniform(x, 5);
    for (int biases = 0; biases < 3; ++biases) {  // none; on Q, K and V (as Qwen); and on the output too
        INFO("biases: " << biases);
        if (biases >= 1) {
            ds::fill_uniform(attention.b_q.emplace(), 6);
            ds::fill_uniform(attention.b_k.emplace(), 7);
            ds::fill_uniform(attention.b_v.emplace(), 8);
        }
        if (biases == 2) ds::fill_uniform(attention.b_o.emplace(), 9);
        auto whole = attention(x, {.causal = true});
        ds::nn::kv_cache<float, Batch, KvHeads2, Seq, Head> cache(batch, total);
        std::size_t done = 0;
        for (std::size_t rows : {5, 3, 1}) {  // prefill, several tokens, one
            auto step = attention(ds::slice<Seq>(x, done, done + rows), cache);
            test::require_close(step, test::to_xt(ds::eval(ds::slice<Seq>(whole, done, done + rows))), 1e-5, 1e-6);
            done += rows;
        }
        CHECK(cache.size() == total);
    }
}

TEST_CASE("nn::decoder_layer loads Hugging Face's and Meta's checkpoint layouts: other names, matrices transposed") {
    using namespace decoder_data;
    decoder_layer<float> own, hugging_face, meta;
    ds::load(own, path("weights.safetensors"));
    ds::load(hugging_face, path("hugging_face.safetensors"),
             {.prefix = "model.layers.1.", .names = ds::nn::hugging_face_llama_names});
    ds::load(meta, path("meta.safetensors"), {.prefix = "layers.1.", .names = ds::nn::meta_llama_names});
    const auto want = ds::parameters(own);
    for (const auto* loaded : {&hugging_face, &meta}) {
        REQUIRE(ds::parameters(*loaded).size() == want.size());
        auto same = [](const auto& a, const auto& b) {
            REQUIRE(a.shape().extents() == b.shape().extents());
            return std::equal(a.data(), a.data() + a.size(), b.data());
        };
        CHECK(same(loaded->attention_norm, own.attention_norm));
        CHECK(same(*loaded->attention.w_q, *own.attention.w_q));
        CHECK(same(*loaded->attention.w_k, *own.attention.w_k));
        CHECK(same(*loaded->attention.w_v, *own.attention.w_v));
        CHECK(same(loaded->attention.w_o, own.attention.w_o));
        CHECK(same(loaded->ffn_norm, own.ffn_norm));
        CHECK(same(loaded->w_1, own.w_1));
        CHECK(same(loaded->w_3, own.w_3));
        CHECK(same(loaded->w_2, own.w_2));
        CHECK(!loaded->attention.b_q);
    }
    // the wrong layout's names: one error naming the file's name and the layer's, the layer unchanged
    const std::string error = test::error_of([&] {
        ds::load(meta, path("meta.safetensors"), {.prefix = "layers.1.", .names = ds::nn::hugging_face_llama_names});
    });
    CHECK_THAT(error, Catch::Contains("the file has no parameter 'layers.1.input_layernorm.weight' (the layer's "
                                      "'layers.1.attention_norm')"));
    CHECK(std::equal(meta.w_2.data(), meta.w_2.data() + meta.w_2.size(), own.w_2.data()));
    // only a matrix can be read transposed
    std::vector<ds::stored_as> vector_transposed(ds::nn::hugging_face_llama_names.begin(),
                                                  ds::nn::hugging_face_llama_names.end());
    vector_transposed.insert(vector_transposed.begin(), {"ffn_norm", "post_attention_layernorm.weight", true});
    CHECK_THAT(test::error_of([&] {
                   ds::load(hugging_face, path("hugging_face.safetensors"),
                            {.prefix = "model.layers.1.", .names = vector_transposed});
               }),
               Catch::Contains("only a matrix can be stored transposed, not a tensor of 1 axes"));
}
