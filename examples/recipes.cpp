// Recipes: what research code writes, with today's vocabulary (docs/recipes.md quotes them).
// Each recipe computes something with dimsum and checks it against plain loops in double,
// written apart from dimsum; main returns non-zero if any check fails, so that ctest can.
#include <dimsum/dimsum.hpp>
#include <dimsum/interop/parameters.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ds = dimsum;

// ---------------------------------------------------------------------------------------
// The independent side: plain loops in double over row-major copies of the tensors.

namespace reference {

constexpr double infinity = std::numeric_limits<double>::infinity();

// A contiguous tensor's elements, in row-major order, as doubles.
template <class Tensor>
std::vector<double> values(const Tensor& t) {
    return std::vector<double>(t.data(), t.data() + t.size());
}

// x W for x (rows, in) and W (in, out), both row-major.
inline std::vector<double> matmul(const std::vector<double>& x, std::size_t rows, std::size_t in,
                                  const std::vector<double>& w, std::size_t out) {
    std::vector<double> y(rows * out, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < out; ++o) {
            double sum = 0;
            for (std::size_t i = 0; i < in; ++i) sum += x[r * in + i] * w[i * out + o];
            y[r * out + o] = sum;
        }
    }
    return y;
}

// One head of softmax(q k^T / sqrt(d)) v: q(i, e), k(j, e), v(j, e) read through accessors,
// seen(i, j) whether query i sees key j, out(i, e) written. A query that sees no key gets 0.
template <class Q, class K, class V, class Seen, class Out>
void attention_head(std::size_t queries, std::size_t keys, std::size_t d, std::size_t dv, Q q, K k, V v, Seen seen,
                    Out out) {
    for (std::size_t i = 0; i < queries; ++i) {
        std::vector<double> score(keys, -infinity);
        double top = -infinity;
        for (std::size_t j = 0; j < keys; ++j) {
            if (!seen(i, j)) continue;
            double dot = 0;
            for (std::size_t e = 0; e < d; ++e) dot += q(i, e) * k(j, e);
            score[j] = dot / std::sqrt(double(d));
            top = std::max(top, score[j]);
        }
        double total = 0;
        for (std::size_t j = 0; j < keys; ++j) total += score[j] == -infinity ? 0.0 : std::exp(score[j] - top);
        for (std::size_t e = 0; e < dv; ++e) {
            double sum = 0;
            for (std::size_t j = 0; j < keys; ++j) {
                if (score[j] != -infinity) sum += std::exp(score[j] - top) / total * v(j, e);
            }
            out(i, e) = sum;
        }
    }
}

// Multi-head attention of rows x (queries, model) to rows c (keys, source), projections
// w_q (model, heads d), w_k (source, heads d), w_v (source, heads d), w_o (heads d, model),
// no biases; key j is seen when j < length. Returns (queries, model).
inline std::vector<double> multi_head(const std::vector<double>& x, std::size_t queries, std::size_t model,
                                      const std::vector<double>& c, std::size_t keys, std::size_t source,
                                      const std::vector<double>& w_q, const std::vector<double>& w_k,
                                      const std::vector<double>& w_v, const std::vector<double>& w_o,
                                      std::size_t heads, std::size_t d, std::size_t length) {
    const std::size_t inner = heads * d;
    auto q = matmul(x, queries, model, w_q, inner), k = matmul(c, keys, source, w_k, inner),
         v = matmul(c, keys, source, w_v, inner);
    std::vector<double> concat(queries * inner);
    for (std::size_t h = 0; h < heads; ++h) {
        attention_head(
            queries, keys, d, d, [&](std::size_t i, std::size_t e) { return q[i * inner + h * d + e]; },
            [&](std::size_t j, std::size_t e) { return k[j * inner + h * d + e]; },
            [&](std::size_t j, std::size_t e) { return v[j * inner + h * d + e]; },
            [&](std::size_t, std::size_t j) { return j < length; },
            [&](std::size_t i, std::size_t e) -> double& { return concat[i * inner + h * d + e]; });
    }
    return matmul(concat, queries, inner, w_o, model);
}

}  // namespace reference

// Whether every element of `got` (contiguous) is within `tolerance` of `want`; says so.
template <class Tensor>
bool check(const char* what, const Tensor& got, const std::vector<double>& want, double tolerance = 1e-4) {
    double worst = got.size() == want.size() ? 0.0 : reference::infinity;
    for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(got.data()[i]) - want[i]));
    }
    bool ok = worst <= tolerance;
    std::cout << (ok ? "ok    " : "FAILED") << "  " << what << ": largest difference " << worst << '\n';
    return ok;
}

// ---------------------------------------------------------------------------------------
// Grouped-query attention (Ainslie et al. 2023): 8 query heads share 2 key/value heads.

namespace gqa {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 32>;      // 8 query heads x 4
using KvModel = ds::axis<"kv_model", 8>;  // 2 key/value heads x 4
using KvHeads = ds::axis<"kv_heads", 2>;
using Group = ds::axis<"group", 4>;       // query heads per key/value head
using OneGroup = ds::axis<"group", 1>;    // the same axis at extent 1: broadcasts over the group
using Head = ds::axis<"head", 4>;

// (batch, seq, model) -> (batch, kv_heads, group, seq, head): query head h is (h / 4, h % 4),
// the order of PyTorch's repeat_interleave of the key/value heads.
auto query_heads(auto&& q) {
    return ds::permute<Batch, KvHeads, Group, Seq, Head>(ds::view<Batch, Seq, KvHeads, Group, Head>(q));
}
// (batch, seq, kv_model) -> (batch, kv_heads, group=1, seq, head)
auto kv_heads(auto&& k) {
    return ds::permute<Batch, KvHeads, OneGroup, Seq, Head>(ds::view<Batch, Seq, KvHeads, OneGroup, Head>(k));
}

bool run() {
    // the projections x W_Q (batch, seq, model) and x W_K, x W_V (batch, seq, kv_model)
    ds::tensor<float, Batch, Seq, Model> q(Batch{2}, Seq{5});
    ds::tensor<float, Batch, Seq, KvModel> k(Batch{2}, Seq{5}), v(Batch{2}, Seq{5});
    ds::fill_uniform(q, 1);
    ds::fill_uniform(k, 2);
    ds::fill_uniform(v, 3);

    // The matmuls' batch axes (batch, kv_heads, group) broadcast group=1 to group=4: each
    // key/value head serves its 4 query heads without being copied.
    auto z = ds::nn::attention(query_heads(q), kv_heads(k), kv_heads(v));  // (batch, kv_heads, group, seq, head)
    ds::tensor<float, Batch, Seq, Model> y = ds::view<Batch, Seq, Model>(ds::permute<Batch, Seq, KvHeads, Group, Head>(z));
    std::cout << ds::explain(z);

    std::vector<double> want(y.size());
    auto qs = reference::values(q), ks = reference::values(k), vs = reference::values(v);
    for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t h = 0; h < 8; ++h) {
            std::size_t kv = h / 4;
            reference::attention_head(
                5, 5, 4, 4, [&](std::size_t i, std::size_t e) { return qs[(b * 5 + i) * 32 + h * 4 + e]; },
                [&](std::size_t j, std::size_t e) { return ks[(b * 5 + j) * 8 + kv * 4 + e]; },
                [&](std::size_t j, std::size_t e) { return vs[(b * 5 + j) * 8 + kv * 4 + e]; },
                [](std::size_t, std::size_t) { return true; },
                [&](std::size_t i, std::size_t e) -> double& { return want[(b * 5 + i) * 32 + h * 4 + e]; });
        }
    }
    return check("grouped-query attention", y, want);
}

}  // namespace gqa

// ---------------------------------------------------------------------------------------
// Rotary position embedding (Su et al. 2021), in the rotate-half convention (GPT-NeoX, LLaMA):
// element i of a head is paired with element i + head/2.

namespace rope {

using Batch = ds::axis<"batch">;
using Heads = ds::axis<"heads", 2>;
using Seq = ds::axis<"seq">;
using Head = ds::axis<"head", 8>;
using HalfHead = ds::axis<"head", 4>;  // the rotated pairs: each half of a head

bool run() {
    const std::size_t batch = 2, seq = 6;
    ds::tensor<float, Batch, Heads, Seq, Head> q(Batch{batch}, Seq{seq});  // (batch, heads, seq, head)
    ds::fill_uniform(q, 4);

    // The angles, (seq, head=4): position p turns pair i by p / 10000^(2i / head).
    auto position = ds::view<Seq, ds::dim<1>>(ds::arange(Seq{seq}));                // (seq, 1)
    auto frequency = ds::pow(10000.0f, ds::arange(HalfHead{}) * (-2.0f / 8.0f));    // (head=4)
    auto cos = ds::eval(ds::cos(position * frequency)), sin = ds::eval(ds::sin(position * frequency));

    // The two halves of each head are slices of q; the rotated halves are joined again.
    auto x1 = ds::slice<Head, 0, 4>(q), x2 = ds::slice<Head, 4, 8>(q);  // (batch, heads, seq, head=4)
    auto rotated = ds::eval(ds::concat<Head>(x1 * cos - x2 * sin, x2 * cos + x1 * sin));  // (..., head=8)

    // In double: pair i of each head is its elements first(i) and second(i).
    auto qs = reference::values(q);
    auto reference_rotation = [&](auto first, auto second) {
        std::vector<double> want(q.size());
        for (std::size_t bh = 0; bh < batch * 2; ++bh) {
            for (std::size_t p = 0; p < seq; ++p) {
                const double* row = &qs[(bh * seq + p) * 8];
                double* result = &want[(bh * seq + p) * 8];
                for (std::size_t i = 0; i < 4; ++i) {
                    double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / 8.0);
                    const std::size_t a = first(i), b = second(i);
                    result[a] = row[a] * std::cos(angle) - row[b] * std::sin(angle);
                    result[b] = row[b] * std::cos(angle) + row[a] * std::sin(angle);
                }
            }
        }
        return want;
    };
    bool ok = check("rotary position embedding", rotated,
                    reference_rotation([](std::size_t i) { return i; }, [](std::size_t i) { return i + 4; }), 1e-6);

    // The interleaved convention pairs elements 2i and 2i + 1: slices with a step, joined
    // along a new last axis of two and viewed back to head=8.
    using Pair = ds::axis<"pair", 2>;
    auto even = ds::slice<Head, 0, 8, 2>(q), odd = ds::slice<Head, 1, 8, 2>(q);
    auto interleaved = ds::eval(ds::view<Batch, Heads, Seq, Head>(
        ds::stack<Pair, 4>(even * cos - odd * sin, odd * cos + even * sin)));
    auto want = reference_rotation([](std::size_t i) { return 2 * i; }, [](std::size_t i) { return 2 * i + 1; });
    ok = check("rotary position embedding, interleaved", interleaved, want, 1e-6) && ok;

    // Long contexts: the angles and tables in double, each table rounded to float once.
    const std::size_t long_seq = 4096;
    auto long_position = ds::view<Seq, ds::dim<1>>(ds::arange<double>(Seq{long_seq}));
    auto long_frequency = ds::pow(10000.0, ds::arange<double>(HalfHead{}) * (-2.0 / 8.0));
    ds::tensor<double, Seq, HalfHead> cos_in_double = ds::cos(long_position * long_frequency);
    ds::tensor<float, Seq, HalfHead> long_cos = ds::cast<float>(cos_in_double);

    std::vector<double> want_cos(long_seq * 4);
    for (std::size_t p = 0; p < long_seq; ++p) {
        for (std::size_t i = 0; i < 4; ++i) want_cos[p * 4 + i] = std::cos(double(p) * std::pow(10000.0, -2.0 * double(i) / 8.0));
    }
    return check("rotary tables for 4096 positions, computed in double", long_cos, want_cos, 1e-7) && ok;
}

}  // namespace rope

// ---------------------------------------------------------------------------------------
// One decoder step with a KV cache: the cache is allocated once for the longest sequence, and
// each step attends to a view of its first t + 1 positions.

namespace kv_cache {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 16>;
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 8>;

auto split_heads(auto&& t) { return ds::transpose<Seq, Heads>(ds::view<Batch, Seq, Heads, Head>(std::forward<decltype(t)>(t))); }
auto merge_heads(auto&& z) { return ds::view<Batch, Seq, Model>(ds::transpose<Heads, Seq>(z)); }

struct decoder {
    ds::tensor<float, Model, Model> w_q, w_k, w_v;
    ds::tensor<float, Batch, Heads, Seq, Head> k_cache, v_cache;  // (batch, heads, max_seq, head)

    decoder(std::size_t batch, std::size_t max_seq)
        : k_cache(Batch{batch}, Seq{max_seq}), v_cache(Batch{batch}, Seq{max_seq}) {}

    // y (batch, seq=1, model) for the token x (batch, seq=1, model) at position t.
    void step(const ds::tensor<float, Batch, Seq, Model>& x, std::size_t t, ds::tensor<float, Batch, Seq, Model>& y) {
        // the first t + 1 positions of each cache: views, no copy (batch, heads, seq=t+1, head)
        auto keys = ds::slice<Seq>(k_cache, 0, t + 1), values = ds::slice<Seq>(v_cache, 0, t + 1);
        ds::select<Seq>(keys, t) = ds::select<Seq>(split_heads(ds::matmul(x, w_k)), 0);  // (batch, heads, head)
        ds::select<Seq>(values, t) = ds::select<Seq>(split_heads(ds::matmul(x, w_v)), 0);
        // One query (seq=1) against t + 1 keys (seq=t+1): the two seq axes are never compared.
        y = merge_heads(ds::nn::attention(split_heads(ds::matmul(x, w_q)), keys, values));
    }
};

bool run() {
    const std::size_t batch = 2, steps = 6;
    decoder d(batch, /*max_seq=*/8);
    ds::fill_uniform(d.w_q, 5, -0.5, 0.5);
    ds::fill_uniform(d.w_k, 6, -0.5, 0.5);
    ds::fill_uniform(d.w_v, 7, -0.5, 0.5);
    ds::tensor<float, Batch, Seq, Model> tokens(Batch{batch}, Seq{steps});  // the whole sequence, for the check
    ds::fill_uniform(tokens, 8);

    ds::tensor<float, Batch, Seq, Model> x(Batch{batch}, Seq{1}), y(Batch{batch}, Seq{1}), all(Batch{batch}, Seq{steps});
    for (std::size_t t = 0; t < steps; ++t) {
        x = ds::view<Batch, Seq, Model>(ds::select<Seq>(tokens, t));  // seq inferred: 1
        d.step(x, t, y);
        ds::select<Seq>(all, t) = ds::select<Seq>(y, 0);
    }

    // Causal self-attention over the whole sequence, per sequence and head.
    std::vector<double> want(all.size());
    auto xs = reference::values(tokens);
    for (std::size_t b = 0; b < batch; ++b) {
        std::vector<double> rows(xs.begin() + b * steps * 16, xs.begin() + (b + 1) * steps * 16);
        auto q = reference::matmul(rows, steps, 16, reference::values(d.w_q), 16);
        auto k = reference::matmul(rows, steps, 16, reference::values(d.w_k), 16);
        auto v = reference::matmul(rows, steps, 16, reference::values(d.w_v), 16);
        for (std::size_t h = 0; h < 2; ++h) {
            reference::attention_head(
                steps, steps, 8, 8, [&](std::size_t i, std::size_t e) { return q[i * 16 + h * 8 + e]; },
                [&](std::size_t j, std::size_t e) { return k[j * 16 + h * 8 + e]; },
                [&](std::size_t j, std::size_t e) { return v[j * 16 + h * 8 + e]; },
                [](std::size_t i, std::size_t j) { return j <= i; },
                [&](std::size_t i, std::size_t e) -> double& { return want[(b * steps + i) * 16 + h * 8 + e]; });
        }
    }
    return check("KV-cache decoding, step by step", all, want);
}

}  // namespace kv_cache

// ---------------------------------------------------------------------------------------
// A padding mask from sequence lengths, in a formula.

namespace padding {

using Batch = ds::axis<"batch">;
using Heads = ds::axis<"heads", 2>;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head", 8>;

bool run() {
    const std::size_t batch = 2, queries = 3, keys = 5;
    ds::tensor<float, Batch, Heads, Query, Head> q(Batch{batch}, Query{queries});
    ds::tensor<float, Batch, Heads, Key, Head> k(Batch{batch}, Key{keys}), v(Batch{batch}, Key{keys});
    ds::fill_uniform(q, 9);
    ds::fill_uniform(k, 10);
    ds::fill_uniform(v, 11);
    ds::tensor<float, Batch> lengths(Batch{batch});  // of each sequence: the second has two padded keys
    lengths(0) = 5;
    lengths(1) = 3;

    // true for padding, shape (batch, 1, 1, key): the unnamed extent-1 axes broadcast over
    // heads and queries
    auto padding = ds::view<Batch, ds::dim<1>, ds::dim<1>, Key>(!ds::sequence_mask(lengths, Key{keys}));
    auto scores = ds::nn::attention_scores(q, k);
    auto z = ds::eval(ds::matmul(ds::softmax(ds::masked_fill(scores, padding, -INFINITY)), v));

    std::vector<double> want(z.size());
    auto qs = reference::values(q), ks = reference::values(k), vs = reference::values(v);
    for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t h = 0; h < 2; ++h) {
            std::size_t bh = b * 2 + h;
            reference::attention_head(
                queries, keys, 8, 8, [&](std::size_t i, std::size_t e) { return qs[(bh * queries + i) * 8 + e]; },
                [&](std::size_t j, std::size_t e) { return ks[(bh * keys + j) * 8 + e]; },
                [&](std::size_t j, std::size_t e) { return vs[(bh * keys + j) * 8 + e]; },
                [&](std::size_t, std::size_t j) { return static_cast<float>(j) < lengths(b); },
                [&](std::size_t i, std::size_t e) -> double& { return want[(bh * queries + i) * 8 + e]; });
        }
    }
    return check("padding mask from lengths", z, want);
}

}  // namespace padding

// ---------------------------------------------------------------------------------------
// Cross-attention: queries from a decoder, keys and values from an encoder's output of
// another length and width. As a formula, then with the layer and padded encoder outputs.

namespace cross {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 16>;
using Source = ds::axis<"source", 12>;  // the encoder's width
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 8>;

auto split_heads(auto&& t) { return ds::transpose<Seq, Heads>(ds::view<Batch, Seq, Heads, Head>(std::forward<decltype(t)>(t))); }
auto merge_heads(auto&& z) { return ds::view<Batch, Seq, Model>(ds::transpose<Heads, Seq>(z)); }

bool run() {
    const std::size_t batch = 2, queries = 7, keys = 13;
    ds::tensor<float, Batch, Seq, Model> x(Batch{batch}, Seq{queries});     // the decoder's rows
    ds::tensor<float, Batch, Seq, Source> memory(Batch{batch}, Seq{keys});  // the encoder's output
    ds::tensor<float, Model, Model> w_q, w_o;
    ds::tensor<float, Source, Model> w_k, w_v;
    ds::fill_uniform(x, 12);
    ds::fill_uniform(memory, 13);
    ds::fill_uniform(w_q, 14, -0.5, 0.5);
    ds::fill_uniform(w_k, 15, -0.5, 0.5);
    ds::fill_uniform(w_v, 16, -0.5, 0.5);
    ds::fill_uniform(w_o, 17, -0.5, 0.5);

    // 7 queries and 13 keys, both called seq: the queries' seq is never compared with the
    // keys'; the keys' seq is compared with the values' (the contracted axis of weights x V).
    auto q = split_heads(ds::matmul(x, w_q));       // (batch, heads, seq=7, head)
    auto k = split_heads(ds::matmul(memory, w_k));  // (batch, heads, seq=13, head)
    auto v = split_heads(ds::matmul(memory, w_v));
    ds::tensor<float, Batch, Seq, Model> y = ds::matmul(merge_heads(ds::nn::attention(q, k, v)), w_o);

    // The layer does the same; key_lengths marks the encoder's padding, which no query sees.
    ds::nn::multi_head_attention<float, Model, Heads, Head, Head, Source> layer;
    using Inner = decltype(layer)::Inner;  // heads x head, the layer's name for those columns
    layer.w_q = ds::view<Model, Inner>(w_q);
    layer.w_k = ds::view<Source, Inner>(w_k);
    layer.w_v = ds::view<Source, Inner>(w_v);
    layer.w_o = ds::view<Inner, Model>(w_o);
    const std::vector<std::size_t> lengths{13, 9};
    auto padded = layer(x, memory, {.key_lengths = lengths});  // (batch, seq=7, model)

    std::vector<double> want(y.size()), want_padded(y.size());
    auto xs = reference::values(x), cs = reference::values(memory);
    for (std::size_t b = 0; b < batch; ++b) {
        std::vector<double> xb(xs.begin() + b * queries * 16, xs.begin() + (b + 1) * queries * 16);
        std::vector<double> cb(cs.begin() + b * keys * 12, cs.begin() + (b + 1) * keys * 12);
        for (bool pad : {false, true}) {
            auto yb = reference::multi_head(xb, queries, 16, cb, keys, 12, reference::values(w_q), reference::values(w_k),
                                            reference::values(w_v), reference::values(w_o), 2, 8,
                                            pad ? lengths[b] : keys);
            std::copy(yb.begin(), yb.end(), (pad ? want_padded : want).begin() + b * queries * 16);
        }
    }
    bool ok = check("cross-attention, formula", y, want);
    return check("cross-attention, layer with key_lengths", padded, want_padded) && ok;
}

}  // namespace cross

// ---------------------------------------------------------------------------------------
// RMSNorm (Zhang and Sennrich 2019) and the SwiGLU feed-forward (Shazeer 2020), as in LLaMA.

namespace llama {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 16>;
using Hidden = ds::axis<"hidden", 40>;

// x / sqrt(mean(x^2) + epsilon) g, along model: (batch, seq, model)
auto rms_norm(auto&& x, auto&& g, float epsilon) {
    auto mean_square = ds::mean<Model>(x * x, ds::keep_axis);  // (batch, seq, model=1)
    return x / ds::sqrt(mean_square + epsilon) * g;
}

bool run() {
    const std::size_t batch = 2, seq = 3;
    ds::tensor<float, Batch, Seq, Model> x(Batch{batch}, Seq{seq});
    ds::tensor<float, Model> g;
    ds::tensor<float, Model, Hidden> w_1, w_3;
    ds::tensor<float, Hidden, Model> w_2;
    ds::fill_uniform(x, 18);
    ds::fill_uniform(g, 19, 0.5, 1.5);
    ds::fill_uniform(w_1, 20, -0.3, 0.3);
    ds::fill_uniform(w_3, 21, -0.3, 0.3);
    ds::fill_uniform(w_2, 22, -0.3, 0.3);

    // The normalised rows are read by two products: one formula, computed once.
    ds::tensor<float, Batch, Seq, Model> y = x + ds::nn::swiglu(ds::nn::rms_norm(x, g), w_1, w_3, w_2);

    const std::size_t rows = batch * seq;
    auto xs = reference::values(x), gs = reference::values(g);
    std::vector<double> hs(xs.size());
    for (std::size_t r = 0; r < rows; ++r) {
        double square = 0;
        for (std::size_t m = 0; m < 16; ++m) square += xs[r * 16 + m] * xs[r * 16 + m];
        for (std::size_t m = 0; m < 16; ++m) hs[r * 16 + m] = xs[r * 16 + m] / std::sqrt(square / 16 + 1e-6) * gs[m];
    }
    auto a = reference::matmul(hs, rows, 16, reference::values(w_1), 40);
    auto b = reference::matmul(hs, rows, 16, reference::values(w_3), 40);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
    auto want = reference::matmul(a, rows, 40, reference::values(w_2), 16);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += xs[i];
    bool ok = check("RMSNorm, by hand", ds::eval(rms_norm(x, g, 1e-6f)), hs, 1e-5);
    ok = check("nn::rms_norm", ds::eval(ds::nn::rms_norm(x, g, 1e-6)), hs, 1e-5) && ok;
    return check("SwiGLU feed-forward with a residual", y, want) && ok;
}

}  // namespace llama

// ---------------------------------------------------------------------------------------
// keepdims and unsqueeze: a reduction drops its axis; a view puts it back at extent 1.

namespace keepdims {

using Batch = ds::axis<"batch">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;

bool run() {
    ds::tensor<double, Rows, Cols> x(Rows{3}, Cols{5});
    ds::fill_uniform(x, 23);

    // keepdims: the row maxima as (rows, cols=1), which broadcasts against cols.
    ds::tensor<double, Rows, Cols> centred = x - ds::max<Cols>(x, ds::keep_axis);
    // Along the first axis it is not needed: (cols) meets (rows, cols) as a missing leading axis.
    ds::tensor<double, Rows, Cols> demeaned = x - ds::mean<Rows>(x);
    // unsqueeze: a new axis of extent 1 before position 0, a view of the same memory.
    auto batched = ds::unsqueeze<Batch, 0>(x);  // (batch=1, rows, cols)

    std::vector<double> want_centred(15), want_demeaned(15);
    auto xs = reference::values(x);
    for (std::size_t r = 0; r < 3; ++r) {
        double top = -reference::infinity;
        for (std::size_t c = 0; c < 5; ++c) top = std::max(top, xs[r * 5 + c]);
        for (std::size_t c = 0; c < 5; ++c) want_centred[r * 5 + c] = xs[r * 5 + c] - top;
    }
    for (std::size_t c = 0; c < 5; ++c) {
        double mean = (xs[c] + xs[5 + c] + xs[10 + c]) / 3;
        for (std::size_t r = 0; r < 3; ++r) want_demeaned[r * 5 + c] = xs[r * 5 + c] - mean;
    }
    bool ok = check("keepdims: x - max along cols", centred, want_centred, 1e-12);
    ok = check("keepdims: x - mean along rows", demeaned, want_demeaned, 1e-12) && ok;
    return check("unsqueeze: a view with a leading axis of extent 1", batched, xs, 0) && ok;
}

}  // namespace keepdims

// ---------------------------------------------------------------------------------------
// A function of one's own, ds::map: fake quantisation (quantisation-aware training) rounds to
// one of 255 levels in [-1, 1], a rounding dimsum has no name for.

namespace own_function {

using Rows = ds::axis<"rows">;
using In = ds::axis<"in">;
using Out = ds::axis<"out">;

double fake_quantise(double v) { return std::nearbyint(std::clamp(v, -1.0, 1.0) * 127.0) / 127.0; }

bool run() {
    ds::tensor<double, Rows, In> x(Rows{5}, In{24});
    ds::tensor<double, In, Out> w(In{24}, Out{9});
    ds::fill_uniform(x, 40);
    ds::fill_uniform(w, 41);
    // quantised in the product's epilogue, each block as the GEMM finishes it
    ds::tensor<double, Rows, Out> y = ds::map(fake_quantise, ds::matmul(x, w) * 0.5);
    // a lambda, of two operands: the error that the quantisation made
    ds::tensor<double, Rows, Out> error = ds::map([](double q, double v) { return q - 0.5 * v; }, y, ds::matmul(x, w));

    std::vector<double> want = reference::matmul(reference::values(x), 5, 24, reference::values(w), 9);
    std::vector<double> want_error(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double q = fake_quantise(0.5 * want[i]);
        want_error[i] = q - 0.5 * want[i];
        want[i] = q;
    }
    bool ok = check("map: fake quantisation in a GEMM epilogue", y, want, 1e-12);
    return check("map: a lambda of two operands", error, want_error, 1e-12) && ok;
}

}  // namespace own_function

// ---------------------------------------------------------------------------------------
// Static and run-time extents together: what the architecture fixes is static, what a file or
// a configuration decides is known at run time; where they meet, they are compared then.

namespace mixed {

using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 16>;   // fixed by the architecture
using AnyModel = ds::axis<"model">;    // the same axis, its extent read at run time
using Vocab = ds::axis<"vocab">;       // known once the tokenizer is loaded

bool run() {
    const std::size_t vocab = 50;  // e.g. from a configuration file
    ds::tensor<float, Seq, Model> x(Seq{4});                                  // (seq=4, model=16)
    ds::tensor<float, AnyModel, Vocab> unembed(AnyModel{16}, Vocab{vocab});  // (model=16, vocab=50)
    ds::fill_uniform(x, 24);
    ds::fill_uniform(unembed, 25);

    // model=16 (static) against model=? (run time): compared when the product is built.
    auto logits = ds::eval(ds::matmul(x, unembed));  // (seq=4, vocab=50)

    bool caught = false;
    try {
        ds::tensor<float, AnyModel, Vocab> wrong(AnyModel{12}, Vocab{vocab});
        auto never = ds::matmul(x, wrong);  // throws: model=16 vs model=12
        std::cout << never.shape() << '\n';
    } catch (const ds::shape_error& e) {
        caught = std::string(e.what()).starts_with(
            "dimsum: matmul: contracted axes differ: model=16 vs model=12 in (seq=4, model=16) x (model=12, vocab=50) (at ");
    }

    auto want = reference::matmul(reference::values(x), 4, 16, reference::values(unembed), vocab);
    std::cout << (caught ? "ok    " : "FAILED") << "  mixed extents: a run-time mismatch is a shape_error\n";
    return check("mixed extents: static model x run-time model", logits, want) && caught;
}

}  // namespace mixed

// ---------------------------------------------------------------------------------------
// Reading a shape error: a mismatch of run-time extents throws when the formula is built.

namespace errors {

using Seq = ds::axis<"seq">;
using Key = ds::axis<"key">;
using Model = ds::axis<"model", 8>;

bool run() {
    ds::tensor<float, Seq, Key> weights(Seq{4}, Key{5});
    ds::tensor<float, Key, Model> values(Key{6});
    std::string message;
    unsigned line = 0;
    const unsigned matmul_line = __LINE__ + 2;
    try {
        auto z = ds::eval(ds::matmul(weights, values));  // 5 keys against 6: throws, evaluates nothing
        std::cout << z << '\n';
    } catch (const ds::shape_error& e) {
        message = e.what();  // ends with " (at FILE:LINE)", the line of the matmul
        if (e.site()) line = e.site()->line();
        std::cout << message << '\n';
    }
    bool ok = message.starts_with("dimsum: matmul: contracted axes differ: key=5 vs key=6 in (seq=4, key=5) x (key=6, model=8) (at ") &&
              line == matmul_line;
    std::cout << (ok ? "ok    " : "FAILED") << "  reading a shape error\n";
    return ok;
}

}  // namespace errors

// ---------------------------------------------------------------------------------------
// A sub-formula used several times in one formula is computed once.

namespace reuse {

using Tokens = ds::axis<"tokens">;
using Model = ds::axis<"model", 16>;
using Hidden = ds::axis<"hidden", 32>;

// How many products a plan runs.
std::size_t products(const std::string& plan) {
    std::size_t count = 0;
    for (std::size_t at = plan.find(" gemm "); at != std::string::npos; at = plan.find(" gemm ", at + 1)) ++count;
    return count;
}

bool run() {
    ds::tensor<float, Tokens, Model> x(Tokens{5});
    ds::tensor<float, Model, Hidden> w;
    ds::fill_uniform(x, 26);
    ds::fill_uniform(w, 27, -0.5, 0.5);

    auto h = ds::tanh(ds::matmul(x, w));  // a formula: nothing computed yet
    std::size_t in_formula = products(ds::explain(h * h + h));  // h read three times: one product
    ds::tensor<float, Tokens, Hidden> y = h * h + h;

    auto h_value = ds::eval(h);  // a tensor, to share h across formulas
    std::size_t evaluated = products(ds::explain(h_value * h_value + h_value));  // no product at all

    auto want = reference::matmul(reference::values(x), 5, 16, reference::values(w), 32);
    for (double& a : want) a = std::tanh(a) * std::tanh(a) + std::tanh(a);
    bool ok = in_formula == 1 && evaluated == 0;
    std::cout << (ok ? "ok    " : "FAILED") << "  products computed: " << in_formula << " for a formula read three times, "
              << evaluated << " once evaluated\n";
    return check("a sub-formula read three times", y, want) && ok;
}

}  // namespace reuse

// ---------------------------------------------------------------------------------------
// Threads: 1 or 2 for dimsum's kernels, and evaluations from several threads at once.

namespace threads {

using Tokens = ds::axis<"tokens">;
using Model = ds::axis<"model", 64>;
using Hidden = ds::axis<"hidden", 256>;

bool run() {
    ds::tensor<float, Tokens, Model> x(Tokens{300});
    ds::tensor<float, Model, Hidden> w;
    ds::fill_uniform(x, 28);
    ds::fill_uniform(w, 29, -0.1, 0.1);
    auto want = reference::matmul(reference::values(x), 300, 64, reference::values(w), 256);

    ds::set_num_threads(1);  // every kernel on the calling thread
    ds::tensor<float, Tokens, Hidden> one = ds::matmul(x, w);
    ds::set_num_threads(2);  // up to 2, where the work is large enough to pay for a second
    ds::tensor<float, Tokens, Hidden> two = ds::matmul(x, w);
    ds::set_num_threads(0);  // back to the default: OMP_NUM_THREADS, else the CPUs this process may use

    // Each std::thread evaluates with its own workspace; they share only what they read.
    ds::tensor<float, Tokens, Hidden> first(Tokens{300}), second(Tokens{300});
    std::thread a([&] { first = ds::matmul(x, w); });
    std::thread b([&] { second = ds::matmul(x, w); });
    a.join();
    b.join();

    bool ok = check("1 thread", one, want);
    ok = check("2 threads", two, want) && ok;
    ok = check("two std::threads at once, first", first, want) && ok;
    return check("two std::threads at once, second", second, want) && ok;
}

}  // namespace threads

// ---------------------------------------------------------------------------------------
// A checkpoint: a layer's weights declared once, loaded and saved by name.

namespace checkpoint {

using Model = ds::axis<"model", 16>;
using Hidden = ds::axis<"hidden">;  // run-time: its extent comes from the file
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 8>;

struct feed_forward {
    BOOST_HANA_DEFINE_STRUCT(feed_forward,
        (ds::tensor<float, Model, Hidden>, w_1),
        (ds::tensor<float, Hidden, Model>, w_2),
        (std::optional<ds::tensor<float, Model>>, b_2));  // may be absent from a file
};

struct block {
    BOOST_HANA_DEFINE_STRUCT(block,
        (ds::nn::multi_head_attention<float, Model, Heads, Head>, attention),  // a struct of its own
        (feed_forward, ffn),
        (ds::tensor<float, Model>, norm));
};

bool run() {
    block trained;
    ds::fill_uniform(trained.attention.w_qkv.emplace(), 30);
    ds::fill_uniform(trained.attention.w_o, 31);
    trained.ffn.w_1 = ds::tensor<float, Model, Hidden>(Hidden{64});
    trained.ffn.w_2 = ds::tensor<float, Hidden, Model>(Hidden{64});
    ds::fill_uniform(trained.ffn.w_1, 32);
    ds::fill_uniform(trained.ffn.w_2, 33);
    ds::fill_uniform(trained.norm, 34);

    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "dimsum_recipe_checkpoint";
    std::filesystem::create_directories(dir);
    bool ok = true;
    for (const char* name : {"block.safetensors", "block.npz", "block_npy"}) {  // a folder of .npy files
        ds::save(trained, dir / name);
        block loaded;
        ds::load(loaded, dir / name);
        ok = check(name, loaded.ffn.w_2, reference::values(trained.ffn.w_2), 0.0) && ok;
    }
    for (const ds::parameter_info& p : ds::parameters(trained)) std::cout << "        " << p << '\n';

    // A file of another layer: one error naming the file, the parameter and both shapes;
    // the layer keeps its values.
    struct wider {
        BOOST_HANA_DEFINE_STRUCT(wider, (ds::tensor<float, ds::axis<"model", 32>>, norm));
    } other;
    ds::save(other, dir / "other.safetensors");
    struct norm_only {
        BOOST_HANA_DEFINE_STRUCT(norm_only, (ds::tensor<float, Model>, norm));
    } layer;
    ds::fill_uniform(layer.norm, 35);
    const std::vector<double> before = reference::values(layer.norm);
    try {
        ds::load(layer, dir / "other.safetensors");
        ok = false;
    } catch (const ds::shape_error& e) {
        std::cout << "        " << e.what() << '\n';
    }
    std::filesystem::remove_all(dir);
    return check("a failed load leaves the layer as it was", layer.norm, before, 0.0) && ok;
}

}  // namespace checkpoint

// ---------------------------------------------------------------------------------------
// bf16: weights and activations stored in half the memory, computed in float. The same
// formula as in float; the values are read widened and the result rounded once when stored.

namespace bfloat16 {

using Rows = ds::axis<"rows">;
using Model = ds::axis<"model", 64>;
using Hidden = ds::axis<"hidden", 256>;

bool run() {
    ds::tensor<float, Rows, Model> x(Rows{12});
    ds::tensor<float, Model, Hidden> w(Model{}, Hidden{});
    ds::fill_normal(x, 50);
    ds::fill_uniform(w, 51, -0.125, 0.125);

    ds::tensor<ds::bf16, Rows, Model> x16 = ds::cast<ds::bf16>(x);  // rounded to nearest even
    ds::tensor<ds::bf16, Model, Hidden> w16 = ds::cast<ds::bf16>(w);
    ds::tensor<ds::bf16, Rows, Hidden> h = ds::nn::gelu(ds::matmul(x16, w16));  // a bf16 formula
    ds::tensor<float, Rows, Hidden> wide = ds::cast<float>(h) * 2.0f;           // back to float, exactly

    // against the float formula on the unrounded values: bf16 keeps 8 significant bits, so each
    // input is off by at most 2^-9 of itself, each product by 2^-8 and the sum by 2^-8 sum |x||w|
    // (about 0.013 here); rounding h adds 2^-9 |h| (h < 4); gelu' <= 1.13 and the factor 2: < 0.05
    std::vector<double> want = reference::matmul(reference::values(x), 12, 64, reference::values(w), 256);
    for (double& v : want) v = 2.0 * 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    bool ok = check("bf16: gelu(x W) from bf16 tensors", wide, want, 0.05);

    // The kernels that multiply two bf16 operands: the best this CPU runs (amx, avx512_bf16,
    // else widen: the float kernels), unless DIMSUM_BF16_PATH or set_bf16_path names another.
    namespace cpu = ds::backend::cpu;
    std::cout << "bf16 products run on: " << cpu::name(cpu::current_bf16_path()) << '\n';
    {
        const cpu::scoped_bf16_path widen(cpu::bf16_path::widen);  // until the end of this scope
        ds::tensor<ds::bf16, Rows, Hidden> h_widened = ds::nn::gelu(ds::matmul(x16, w16));
        ds::tensor<float, Rows, Hidden> wide_widened = ds::cast<float>(h_widened) * 2.0f;
        ok = check("bf16: the same on the widen path", wide_widened, want, 0.05) && ok;
    }

    // An intermediate value held in bf16, as PyTorch's bf16 holds every one: cast<bf16> of a
    // bf16 formula rounds it there. A product that reads it reads it as bf16 (on the bf16
    // path's kernels), from a bf16 temporary the plan keeps: no tensor to declare, and the same
    // values as storing it in one first.
    ds::tensor<ds::bf16, Hidden, Model> w16_out = ds::cast<ds::bf16>(ds::transpose(w));
    ds::tensor<ds::bf16, Rows, Model> y = ds::matmul(ds::cast<ds::bf16>(ds::nn::gelu(ds::matmul(x16, w16))), w16_out);
    ds::tensor<ds::bf16, Rows, Model> y_stored = ds::matmul(h, w16_out);  // h: the same values, stored
    ok = check("bf16: an intermediate held in bf16", y, reference::values(y_stored), 0.0) && ok;
    return ok;
}

}  // namespace bfloat16

// ---------------------------------------------------------------------------------------
// Weights packed once: a product packs its right operand into panels on every call; in a
// loop over the same weights, ds::prepack does it once (and for bf16 weights, also widens
// them once, not at every call).

namespace packed_weights {

using Rows = ds::axis<"rows">;
using Model = ds::axis<"model", 64>;
using Hidden = ds::axis<"hidden", 256>;

bool run() {
    ds::tensor<float, Rows, Model> x(Rows{300});
    ds::tensor<float, Model, Hidden> w_1(Model{}, Hidden{});
    ds::tensor<float, Hidden, Model> w_2(Hidden{}, Model{});
    ds::fill_normal(x, 60);
    ds::fill_uniform(w_1, 61, -0.125, 0.125);
    ds::fill_uniform(w_2, 62, -0.0625, 0.0625);
    ds::tensor<float, Rows, Model> y(Rows{300});

    const auto packed_1 = ds::prepack(w_1);  // w_1 must outlive it and keep its values
    const auto packed_2 = ds::prepack(w_2);
    for (int step = 0; step < 3; ++step) {
        ds::assign(y, ds::matmul(ds::nn::gelu(ds::matmul(x, packed_1)), packed_2) + x);  // packs nothing
    }
    std::cout << "        " << packed_1.bytes() + packed_2.bytes() << " bytes of panels\n";

    const ds::tensor<float, Rows, Model> want = ds::matmul(ds::nn::gelu(ds::matmul(x, w_1)), w_2) + x;
    return check("weights packed once: the same values", y, reference::values(want), 0.0);
}

}  // namespace packed_weights

// ---------------------------------------------------------------------------------------
// Gradients: the cross-entropy of a softmax classifier, its gradient with respect to the
// logits' weights (softmax minus the one-hot targets, through the matmul), and a training
// loop of plain gradient descent that learns the classes.

namespace gradients {

using Rows = ds::axis<"rows">;
using In = ds::axis<"in">;
using Classes = ds::axis<"classes">;

// The mean over rows of -log softmax(x W)[target]: the targets as a one-hot mask, which carries
// no gradient. The mask compares class positions with each row's target (integers read as values).
auto cross_entropy(const ds::tensor<double, Rows, In>& x, const ds::tensor<double, In, Classes>& w,
                   const ds::tensor<std::int64_t, Rows>& targets) {
    const std::size_t classes = w.shape().extent(1);
    auto one_hot = ds::arange<double>(Classes{classes}) == ds::unsqueeze<Classes, 1>(ds::cast<double>(targets));
    auto log_p = ds::log(ds::softmax(ds::matmul(x, w)));
    return -ds::mean<Rows>(ds::sum<Classes>(ds::where(one_hot, log_p, 0.0)));
}

bool run() {
    const std::size_t rows = 24, in = 5, classes = 3;
    ds::tensor<double, Rows, In> x(Rows{rows}, In{in});
    ds::tensor<double, In, Classes> w(In{in}, Classes{classes});
    ds::tensor<std::int64_t, Rows> targets(Rows{rows});
    ds::fill_uniform(x, 31, -1.0, 1.0);
    for (std::size_t r = 0; r < rows; ++r) {  // the class is where the row's first features point
        targets(r) = x(r, 0) > 0.3 ? 0 : x(r, 1) > 0 ? 1 : 2;
    }

    // The gradient with respect to W: a formula of W's shape, (in, classes).
    ds::tensor<double, In, Classes> g = ds::grad(cross_entropy(x, w, targets), w);
    // by hand: x^T (softmax(x W) - one_hot) / rows
    auto xs = reference::values(x), ws = reference::values(w);
    auto logits = reference::matmul(xs, rows, in, ws, classes);
    std::vector<double> want(in * classes, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
        double top = -reference::infinity, total = 0;
        for (std::size_t c = 0; c < classes; ++c) top = std::max(top, logits[r * classes + c]);
        for (std::size_t c = 0; c < classes; ++c) total += std::exp(logits[r * classes + c] - top);
        for (std::size_t c = 0; c < classes; ++c) {
            const double p = std::exp(logits[r * classes + c] - top) / total - (targets(r) == std::int64_t(c) ? 1 : 0);
            for (std::size_t i = 0; i < in; ++i) want[i * classes + c] += xs[r * in + i] * p / rows;
        }
    }
    bool ok = check("the gradient of a cross-entropy", g, want, 1e-12);

    // Gradient descent: the gradient evaluated into g, then W updated in place.
    const double first = ds::eval(cross_entropy(x, w, targets)).data()[0];
    for (int step = 0; step < 300; ++step) {
        ds::assign(g, ds::grad(cross_entropy(x, w, targets), w));
        ds::assign(w, w - 2.0 * g);
    }
    const double last = ds::eval(cross_entropy(x, w, targets)).data()[0];
    std::cout << (last < first / 4 ? "ok    " : "FAILED") << "  gradient descent: cross-entropy " << first << " -> " << last
              << '\n';
    return last < first / 4 && ok;
}

}  // namespace gradients

int main() {
    int failed = 0;
    for (bool (*recipe)() : {gqa::run, rope::run, kv_cache::run, padding::run, cross::run, llama::run, keepdims::run,
                             own_function::run, mixed::run, errors::run, reuse::run, threads::run, checkpoint::run,
                             bfloat16::run, packed_weights::run, gradients::run}) {
        failed += recipe() ? 0 : 1;
    }
    std::cout << (failed ? "some recipes FAILED\n" : "every recipe checked\n");
    return failed ? 1 : 0;
}
