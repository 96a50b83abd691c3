#pragma once
// Tensor parallelism over MPI, part 2: the split of Megatron-LM (Shoeybi et al. 2019) for
// multi-head attention and a transformer encoder layer. Each rank owns heads / ranks heads:
// their columns of W_Q, W_K and W_V (column-parallel: no communication) and their rows of W_O
// (row-parallel: each rank's product is a part of the sum, joined by one all-reduce). The
// feed-forward splits the same way along its hidden axis: columns of W_1, rows of W_2, one
// all-reduce. The output bias is added once, by rank 0, inside its product's epilogue.
//
// On a group of one rank these are the formulas of nn::multi_head_attention and of the BERT
// layer, with nothing communicated.

#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "dimsum/backend/cpu/prepack.hpp"
#include "dimsum/dist/group.hpp"
#include "dimsum/interop/parameters.hpp"
#include "dimsum/nn/attention.hpp"
#include "dimsum/nn/encoder.hpp"
#include "dimsum/nn/layers.hpp"

namespace dimsum::dist {

using LocalHeads = axis<"heads">;       // the heads of one rank: heads / ranks of them
using LocalInner = axis<"heads*head">;  // their columns of W_Q, W_K, W_V and rows of W_O
using LocalHidden = axis<"hidden">;     // one rank's part of the feed-forward's hidden axis

namespace detail {

// Columns [first, first + count) of w (rows, columns), as a tensor of (rows, To).
template <axis_type To, class T, axis_type Rows, axis_type Columns>
tensor<T, Rows, To> columns(const tensor_view<const T, Rows, Columns>& w, std::size_t first, std::size_t count) {
    return rename<Columns, To>(slice<Columns>(w, first, first + count));
}
// Rows [first, first + count) of w (rows, columns), as a tensor of (To, columns).
template <axis_type To, class T, axis_type Rows, axis_type Columns>
tensor<T, To, Columns> rows(const tensor_view<const T, Rows, Columns>& w, std::size_t first, std::size_t count) {
    return rename<Rows, To>(slice<Rows>(w, first, first + count));
}
// Elements [first, first + count) of a bias, or zeros where it is absent.
template <axis_type To, class T, axis_type Axis>
tensor<T, To> part(const std::optional<tensor<T, Axis>>& bias, std::size_t first, std::size_t count) {
    if (!bias) return tensor<T, To>(To{count});
    return rename<Axis, To>(slice<Axis>(bias->view(), first, first + count));
}
template <axis_type To, class T, axis_type Axis>
tensor<T, To> part(const tensor<T, Axis>& bias, std::size_t first, std::size_t count) {
    return rename<Axis, To>(slice<Axis>(bias.view(), first, first + count));
}

// An output bias as rank `rank` adds it to its part of a row-parallel product: the bias on
// rank 0 (so that the sum over ranks counts it once), elsewhere, or where there is none, a
// view of one constant zero (stride 0) of the same extent, so that every rank runs one formula.
template <class T>
inline constexpr T zero_value = T(0);
template <class T, axis_type Axis>
tensor_view<const T, Axis> bias_on_rank_0(int rank, const tensor<T, Axis>* bias, std::size_t extent) {
    if (rank == 0 && bias) return bias->view();
    return {&zero_value<T>, shape<Axis>(Axis{extent}), {0}};
}

// Positions [first, first + count) along axis Axis (at `position`) of the array `name`, whose
// whole extent there must be the full layer's `whole`: a file of another layer is a shape_error,
// never a wrong slice.
template <axis_type Axis, class T, axis_type... Axes>
void read_part(checkpoint& file, const std::string& name, std::size_t position, std::size_t whole, std::size_t first,
               std::size_t count, tensor<T, Axes...>& into) {
    const std::optional<stored_array> stored = file.find(name);
    if (stored && stored->shape.size() == sizeof...(Axes) && stored->shape[position] != whole) {
        throw shape_error("dimsum: dist: load_shard: " + file.path() + ", parameter '" + name + "': axis " +
                          std::to_string(position) + " is " + std::to_string(stored->shape[position]) +
                          " in the file, " + std::to_string(whole) + " in the layer");
    }
    file.read_slice<Axis>(name, first, count, into);
}

}  // namespace detail

// Self-attention split over the ranks of a group by heads (kv_heads = heads; grouped-query
// layers are not split yet). Made from the full layer by shard(); every rank calls it with
// the same x, and every rank receives the whole output.
template <class T, axis_type Model, axis_type Heads, axis_type Head>
struct multi_head_attention {
    static_assert(Heads::is_static && Head::is_static, "dimsum: dist::multi_head_attention: heads and head need static extents");
    using full_layer = nn::multi_head_attention<T, Model, Heads, Head>;

    group team = group::world();
    share owned{};                         // this rank's heads
    tensor<T, Model, LocalInner> w_q, w_k, w_v;  // (model, owned heads x head)
    tensor<T, LocalInner> b_q, b_k, b_v;
    tensor<T, LocalInner, Model> w_o;      // its rows of W_O
    std::optional<tensor<T, Model>> b_o;   // the whole output bias; rank 0 adds it

    // This rank's part of `full`: a shape_error (the same on every rank) when the ranks do not
    // divide the heads.
    static multi_head_attention shard(const full_layer& full, const group& g) {
        multi_head_attention layer;
        layer.team = g;
        layer.owned = g.split(Heads::static_extent, "heads");
        const std::size_t head = Head::static_extent, first = layer.owned.first * head, count = layer.owned.count * head;
        using Inner = typename full_layer::Inner;
        if (full.w_qkv) {  // columns [W_Q | W_K | W_V]
            using Fused = typename full_layer::Fused;
            const auto w = full.w_qkv->view();
            const std::size_t inner = Inner::static_extent;
            layer.w_q = detail::columns<LocalInner>(tensor_view<const T, Model, Fused>(w), first, count);
            layer.w_k = detail::columns<LocalInner>(tensor_view<const T, Model, Fused>(w), inner + first, count);
            layer.w_v = detail::columns<LocalInner>(tensor_view<const T, Model, Fused>(w), 2 * inner + first, count);
            layer.b_q = detail::part<LocalInner>(full.b_qkv, first, count);
            layer.b_k = detail::part<LocalInner>(full.b_qkv, inner + first, count);
            layer.b_v = detail::part<LocalInner>(full.b_qkv, 2 * inner + first, count);
        } else {
            if (!full.w_q || !full.w_k || !full.w_v) {
                throw shape_error("dimsum: dist::multi_head_attention: neither w_qkv nor w_q, w_k and w_v are set");
            }
            layer.w_q = detail::columns<LocalInner>(tensor_view<const T, Model, Inner>(full.w_q->view()), first, count);
            layer.w_k = detail::columns<LocalInner>(tensor_view<const T, Model, Inner>(full.w_k->view()), first, count);
            layer.w_v = detail::columns<LocalInner>(tensor_view<const T, Model, Inner>(full.w_v->view()), first, count);
            layer.b_q = detail::part<LocalInner>(full.b_q, first, count);
            layer.b_k = detail::part<LocalInner>(full.b_k, first, count);
            layer.b_v = detail::part<LocalInner>(full.b_v, first, count);
        }
        layer.w_o = detail::rows<LocalInner>(tensor_view<const T, Inner, Model>(full.w_o.view()), first, count);
        layer.b_o = full.b_o;
        return layer;
    }

    // The same part read from a checkpoint holding the full layer under `prefix` (the names
    // nn::multi_head_attention saves: w_qkv and b_qkv, or w_q, w_k, w_v, b_q, b_k, b_v; w_o, b_o):
    // each rank reads only its columns and rows, never the whole layer.
    static multi_head_attention load_shard(checkpoint& file, const group& g, const std::string& prefix = "") {
        multi_head_attention layer;
        layer.team = g;
        layer.owned = g.split(Heads::static_extent, "heads");
        const std::size_t head = Head::static_extent, first = layer.owned.first * head, count = layer.owned.count * head;
        const std::size_t inner = full_layer::Inner::static_extent;
        auto columns = [&](const std::string& name, std::size_t whole, std::size_t offset, auto& w) {
            detail::read_part<LocalInner>(file, prefix + name, 1, whole, offset + first, count, w);
        };
        auto bias = [&](const std::string& name, std::size_t whole, std::size_t offset, auto& b) {  // absent: zeros
            if (!file.contains(prefix + name)) b = tensor<T, LocalInner>(LocalInner{count});
            else detail::read_part<LocalInner>(file, prefix + name, 0, whole, offset + first, count, b);
        };
        if (file.contains(prefix + "w_qkv")) {  // columns [W_Q | W_K | W_V]
            columns("w_qkv", 3 * inner, 0, layer.w_q);
            columns("w_qkv", 3 * inner, inner, layer.w_k);
            columns("w_qkv", 3 * inner, 2 * inner, layer.w_v);
            bias("b_qkv", 3 * inner, 0, layer.b_q);
            bias("b_qkv", 3 * inner, inner, layer.b_k);
            bias("b_qkv", 3 * inner, 2 * inner, layer.b_v);
        } else {
            columns("w_q", inner, 0, layer.w_q);
            columns("w_k", inner, 0, layer.w_k);
            columns("w_v", inner, 0, layer.w_v);
            bias("b_q", inner, 0, layer.b_q);
            bias("b_k", inner, 0, layer.b_k);
            bias("b_v", inner, 0, layer.b_v);
        }
        detail::read_part<LocalInner>(file, prefix + "w_o", 0, inner, first, count, layer.w_o);
        if (file.contains(prefix + "b_o")) file.read(prefix + "b_o", layer.b_o.emplace());
        return layer;
    }

    // This rank's projections packed once for the CPU's products, as
    // nn::multi_head_attention::prepack(): again after changing or loading them.
    void prepack() {
        using Projection = tensor_view<const T, Model, LocalInner>;
        panels_ = pack_projections(Projection(w_q.view()), Projection(w_k.view()), Projection(w_v.view()),
                                   tensor_view<const T, LocalInner, Model>(w_o.view()));
    }
    void unpack() { panels_.reset(); }
    std::size_t packed_bytes() const { return panels_ ? panels_->bytes() : 0; }

    // y (batch, seq, model) for x (batch, seq, model), on every rank.
    template <nn::rows_of_width<Model> X>
    tensor<T, nn::batch_of<X>, nn::rows_of<X>, Model> operator()(const X& x, const nn::attention_options& options = {},
                                                                 call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        tensor<T, nn::batch_of<X>, nn::rows_of<X>, Model> y(nn::batch_of<X>{x.shape().extent(0)},
                                                           nn::rows_of<X>{x.shape().extent(1)}, Model{w_o.extent(1)});
        forward(x, y.view(), options);
        return y;
    }

    // The same into y. Rank r computes its heads' part of concat(heads) W_O (rank 0 adding
    // b_O), then one all-reduce sums the parts on every rank.
    template <nn::rows_of_width<Model> X>
    void forward(const X& x, const tensor_view<T, nn::batch_of<X>, nn::rows_of<X>, Model>& y,
                 const nn::attention_options& options = {}, call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        compute_part(x, y, options);
        all_reduce(team, y);
    }

    // Only this rank's part, without the all-reduce: what forward() sums (for a caller that
    // overlaps the sum with other work, all_reduce_start).
    template <nn::rows_of_width<Model> X>
    void compute_part(const X& x, const tensor_view<T, nn::batch_of<X>, nn::rows_of<X>, Model>& y,
                      const nn::attention_options& options = {}) const {
        using Batch = nn::batch_of<X>;
        using Seq = nn::rows_of<X>;
        using Key = axis<"key">;
        auto heads = [&](const auto& w, const auto& b) {  // (batch, local heads, seq, head)
            return permute<Batch, LocalHeads, Seq, Head>(view<Batch, Seq, LocalHeads, Head>(matmul(x, w) + b));
        };
        auto q = heads(packed(w_q, &panels::w_q), b_q);
        auto k = rename<Seq, Key>(heads(packed(w_k, &panels::w_k), b_k));
        auto v = rename<Seq, Key>(heads(packed(w_v, &panels::w_v), b_v));
        const std::size_t batch = x.shape().extent(0), keys = x.shape().extent(1);
        const tensor_view<const T, Model> bias = detail::bias_on_rank_0(team.rank(), b_o ? &*b_o : nullptr, y.extent(2));
        auto output = [&](auto&& z) {  // z (batch, local heads, seq, head)
            assign(y, matmul(view<Batch, Seq, LocalInner>(permute<Batch, Seq, LocalHeads, Head>(z)),
                             packed(w_o, &panels::w_o)) +
                          bias);
        };
        auto run = [&](auto mask) { output(matmul(softmax(mask(nn::attention_scores(q, k))), v)); };
        const auto padding = nn::detail::padding_mask<T, Batch, Key, dim<1>, dim<1>>(batch, keys, options.key_lengths);
        if (options.causal && padding) return run([&](auto&& s) { return nn::causal(s + *padding); });
        if (options.causal) return run([](auto&& s) { return nn::causal(s); });
        if (padding) return run([&](auto&& s) { return s + *padding; });
        run([](auto&& s) { return s; });
    }

private:
    // prepack()'s panels, shared by copies of the layer, or none
    using panels = projection_panels<compute_type_t<T>>;
    std::shared_ptr<const panels> panels_;

    // w as a formula reads it: with its panels when packed
    template <class R, class C>
    packed_view<T, R, C> packed(const tensor<T, R, C>& w,
                                std::shared_ptr<const matrix_panels<compute_type_t<T>>> panels::*which) const {
        return {w.view(), panels::of(panels_, which)};
    }
};

// nn::encoder_layer (post-norm, as BERT and torch.nn.TransformerEncoderLayer) split over the ranks:
//     h = layer_norm(x + attention(x))                    attention split by heads
//     y = layer_norm(h + gelu(h W_1 + b_1) W_2 + b_2)     W_1 by columns, W_2 by rows
// two all-reduces per call; the layer norms run on every rank on the whole width.
template <class T, axis_type Model, axis_type Heads, axis_type Head, axis_type Hidden>
struct encoder_layer {
    multi_head_attention<T, Model, Heads, Head> attention;
    tensor<T, Model> ln1_weight, ln1_bias;
    tensor<T, Model, LocalHidden> w_ff1;  // its columns of W_1
    tensor<T, LocalHidden> b_ff1;
    tensor<T, LocalHidden, Model> w_ff2;  // its rows of W_2
    tensor<T, Model> b_ff2;               // rank 0 adds it
    tensor<T, Model> ln2_weight, ln2_bias;
    double epsilon = 1e-5;  // the layer norms', as nn::encoder_layer's

    // This rank's projections (the attention's, W_1's columns and W_2's rows) packed once for
    // the CPU's products, as nn::multi_head_attention::prepack(): again after changing them.
    void prepack() {
        attention.prepack();
        w_ff1_panels = pack_panels(tensor_view<const T, Model, LocalHidden>(w_ff1.view()));
        w_ff2_panels = pack_panels(tensor_view<const T, LocalHidden, Model>(w_ff2.view()));
    }
    void unpack() {
        attention.unpack();
        w_ff1_panels.reset();
        w_ff2_panels.reset();
    }
    std::size_t packed_bytes() const {
        return attention.packed_bytes() + (w_ff1_panels ? w_ff1_panels->bytes() + w_ff2_panels->bytes() : 0);
    }

    // This rank's part of a full layer, its epsilon included: a shape_error, the same on every
    // rank, when the ranks divide neither the heads nor the hidden axis.
    static encoder_layer shard(const nn::encoder_layer<T, Model, Heads, Head, Hidden>& full, const group& g) {
        encoder_layer layer;
        layer.attention = multi_head_attention<T, Model, Heads, Head>::shard(full.attention, g);
        const share hidden = g.split(Hidden::static_extent, "hidden units");
        layer.ln1_weight = full.ln1_weight;
        layer.ln1_bias = full.ln1_bias;
        layer.w_ff1 = detail::columns<LocalHidden>(tensor_view<const T, Model, Hidden>(full.w_ff1.view()), hidden.first, hidden.count);
        layer.b_ff1 = detail::part<LocalHidden>(full.b_ff1, hidden.first, hidden.count);
        layer.w_ff2 = detail::rows<LocalHidden>(tensor_view<const T, Hidden, Model>(full.w_ff2.view()), hidden.first, hidden.count);
        layer.b_ff2 = full.b_ff2;
        layer.ln2_weight = full.ln2_weight;
        layer.ln2_bias = full.ln2_bias;
        layer.epsilon = full.epsilon;
        return layer;
    }

    // The same part read from a checkpoint holding the full layer under `prefix`, with
    // nn::encoder_layer's names (the attention's under `attention.`): each rank reads only its
    // columns and rows of the projections and the whole of the layer norms and output biases.
    static encoder_layer load_shard(checkpoint& file, const group& g, const std::string& prefix = "",
                                    double epsilon = 1e-5) {
        encoder_layer layer;
        layer.attention = multi_head_attention<T, Model, Heads, Head>::load_shard(file, g, prefix + "attention.");
        const share hidden = g.split(Hidden::static_extent, "hidden units");
        const std::size_t whole = Hidden::static_extent;
        file.read(prefix + "ln1_weight", layer.ln1_weight);
        file.read(prefix + "ln1_bias", layer.ln1_bias);
        detail::read_part<LocalHidden>(file, prefix + "w_ff1", 1, whole, hidden.first, hidden.count, layer.w_ff1);
        detail::read_part<LocalHidden>(file, prefix + "b_ff1", 0, whole, hidden.first, hidden.count, layer.b_ff1);
        detail::read_part<LocalHidden>(file, prefix + "w_ff2", 0, whole, hidden.first, hidden.count, layer.w_ff2);
        file.read(prefix + "b_ff2", layer.b_ff2);
        file.read(prefix + "ln2_weight", layer.ln2_weight);
        file.read(prefix + "ln2_bias", layer.ln2_bias);
        layer.epsilon = epsilon;
        return layer;
    }

    // y (batch, seq, model) for x (batch, seq, model), on every rank.
    template <nn::rows_of_width<Model> X>
    tensor<T, nn::batch_of<X>, nn::rows_of<X>, Model> operator()(const X& x, const nn::attention_options& options = {},
                                                                 call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        using Out = tensor<T, nn::batch_of<X>, nn::rows_of<X>, Model>;
        Out a = attention(x, options);
        Out h = nn::layer_norm(x + a, ln1_weight, ln1_bias, epsilon);
        const tensor_view<const T, Model> bias = detail::bias_on_rank_0(attention.team.rank(), &b_ff2, b_ff2.extent(0));
        const packed_view<T, Model, LocalHidden> w_1(w_ff1.view(), w_ff1_panels.get());
        const packed_view<T, LocalHidden, Model> w_2(w_ff2.view(), w_ff2_panels.get());
        Out f = nn::gelu_feed_forward(h, w_1, b_ff1, w_2, bias);  // this rank's part
        all_reduce(attention.team, f);
        return nn::layer_norm(h + f, ln2_weight, ln2_bias, epsilon);
    }

private:
    std::shared_ptr<const matrix_panels<compute_type_t<T>>> w_ff1_panels, w_ff2_panels;  // prepack()'s, or none
};

}  // namespace dimsum::dist
