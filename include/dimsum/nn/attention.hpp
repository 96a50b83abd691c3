#pragma once
// Attention, as formulas over ops/: scaled dot-product attention (Vaswani et al. 2017, eq. 1)
// and a multi-head attention layer. Part of <dimsum/dimsum.hpp>, which brings the backend
// that the layer's evaluations need. The formulas are what a reader checks against the paper;
// evaluated on the CPU backend, attention runs fused (backend/cpu/attention.hpp) and never
// holds the query x key matrix, unless the attention weights are asked for.

#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>

#include <boost/hana/define_struct.hpp>

#include "dimsum/backend/cpu/prepack.hpp"
#include "dimsum/core/message.hpp"
#include "dimsum/core/shape_error.hpp"
#include "dimsum/evaluation/assign.hpp"
#include "dimsum/nn/kv_cache.hpp"
#include "dimsum/nn/layers.hpp"
#include "dimsum/nn/rotary.hpp"
#include "dimsum/ops/cast.hpp"
#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/mask.hpp"
#include "dimsum/ops/matmul.hpp"
#include "dimsum/ops/softmax.hpp"
#include "dimsum/ops/transpose.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum::nn {

// Q K^T / sqrt(d_k): q (..., query, d_k), k (..., key, d_k) -> (..., query, key).
template <class Q, class K>
auto attention_scores(Q&& q, K&& k, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    using T = compute_type_t<value_type_of<Q>>;  // float for bf16: the scale is not rounded to bf16
    const auto d_k = static_cast<T>(q.shape().extent(shape_of<Q>::rank - 1));
    return matmul(std::forward<Q>(q), transpose(std::forward<K>(k))) / std::sqrt(d_k);
}

// The scores with -infinity wherever a key lies in its query's future (causal_mask).
template <class S>
auto causal(S&& scores, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    using shape_type = shape_of<S>;
    using Query = typename shape_type::template axis_at<shape_type::rank - 2>;
    using Key = typename shape_type::template axis_at<shape_type::rank - 1>;
    Query queries{scores.shape().extent(shape_type::rank - 2)};
    Key keys{scores.shape().extent(shape_type::rank - 1)};
    return masked_fill(std::forward<S>(scores), causal_mask(queries, keys),
                       -std::numeric_limits<value_type_of<S>>::infinity());
}

// Score functions for multi_head_attention::formula: the scores as they are, or causal(scores).
struct unmasked_t {
    template <class S>
    std::remove_cvref_t<S> operator()(S&& scores) const {
        return std::forward<S>(scores);
    }
};
inline constexpr unmasked_t unmasked{};
struct causal_scores_t {
    template <class S>
    auto operator()(S&& scores) const {
        return causal(std::forward<S>(scores));
    }
};
inline constexpr causal_scores_t causal_scores{};

// softmax(Q K^T / sqrt(d_k)) V, the softmax along the keys:
// q (..., query, d_k), k (..., key, d_k), v (..., key, d_v) -> (..., query, d_v).
template <class Q, class K, class V>
auto attention(Q&& q, K&& k, V&& v, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    return matmul(softmax(attention_scores(std::forward<Q>(q), std::forward<K>(k))), std::forward<V>(v));
}

// The same where no query sees a key in its future.
template <class Q, class K, class V>
auto causal_attention(Q&& q, K&& k, V&& v, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    return matmul(softmax(causal(attention_scores(std::forward<Q>(q), std::forward<K>(k)))), std::forward<V>(v));
}

// softmax(Q K^T / sqrt(d_k) + mask) V, with an additive mask (0 where a key is seen,
// -infinity where it is not, or any bias) that broadcasts to the scores.
template <class Q, class K, class V, class Mask>
auto masked_attention(Q&& q, K&& k, V&& v, Mask&& mask, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    return matmul(softmax(attention_scores(std::forward<Q>(q), std::forward<K>(k)) + std::forward<Mask>(mask)),
                  std::forward<V>(v));
}

// What a multi-head attention call may ask for beyond the plain layer.
struct attention_options {
    bool causal = false;
    // Per sequence of the batch, how many of its keys are real: keys at or past this length
    // are padding, which no query sees. Empty: every key is real.
    std::span<const std::size_t> key_lengths = {};
};

// The layer's inputs: a tensor, a view or a formula of (batch, rows, Width), Width named like
// the layer's model or source axis; batch_of and rows_of name their first two axes.
template <class X, class Width>
concept rows_of_width = expression<X> && shape_of<X>::rank == 3 &&
                        shape_of<X>::axes[2].name == describe_axis<Width>.name;
template <class X>
using batch_of = typename shape_of<X>::template axis_at<0>;
template <class X>
using rows_of = typename shape_of<X>::template axis_at<1>;

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_key_length_count(std::size_t given, std::size_t batch) {
    message m;
    m << "dimsum: multi_head_attention: " << given << " key lengths given for a batch of " << batch;
    throw shape_error(m);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_key_length(std::size_t length, std::size_t keys) {
    message m;
    m << "dimsum: multi_head_attention: key length " << length << " exceeds the " << keys << " keys";
    throw shape_error(m);
}

// (batch, 1, ..., 1, key), with the axes `Ones` of extent 1 between: 0 for the keys within each
// sequence's length, -infinity past it, what a layer adds to its scores for
// attention_options::key_lengths; none without lengths.
template <class T, axis_type Batch, axis_type Key, axis_type... Ones>
std::optional<tensor<T, Batch, Ones..., Key>> padding_mask(std::size_t batch, std::size_t keys,
                                                          std::span<const std::size_t> lengths) {
    if (lengths.empty()) return std::nullopt;
    if (lengths.size() != batch) throw_key_length_count(lengths.size(), batch);
    tensor<T, Batch, Ones..., Key> mask(Batch{batch}, Ones{}..., Key{keys});
    for (std::size_t b = 0; b < batch; ++b) {
        if (lengths[b] > keys) throw_key_length(lengths[b], keys);
        T* row = mask.data() + b * keys;
        for (std::size_t j = 0; j < keys; ++j) row[j] = j < lengths[b] ? T(0) : -std::numeric_limits<T>::infinity();
    }
    return mask;
}
}  // namespace detail

// A multi-head attention layer (Vaswani et al. 2017, section 3.2.2), inputs as rows (x W):
//     head_i = attention(x W_Q_i + b_Q_i, c W_K_j + b_K_j, c W_V_j + b_V_j),  j = i / group
//     y      = concat(head_1, ..., head_h) W_O + b_O
// for queries x (batch, query, model) and a context c (batch, key, source): c = x in
// self-attention. With fewer key/value heads than query heads (KvHeads, grouped-query
// attention, Ainslie et al. 2023; one: multi-query attention), each key/value head serves a
// group of heads / kv_heads consecutive query heads, as PyTorch's repeat_interleave orders
// them, read in place for every query head of its group (never copied). Queries and keys have
// head columns per head, values value_head. The query, key and value projections are either
// separate (w_q, w_k, w_v) or one fused matrix w_qkv (self-attention with value_head = head),
// whose columns are [W_Q | W_K | W_V]. Biases are zero unless set.
//
// A call evaluates one formula, projections to output projection, so that its intermediate
// values live in the evaluator's temporaries, reused from one call to the next.
template <class T, axis_type Model, axis_type Heads, axis_type Head, axis_type ValueHead = Head,
          axis_type Source = Model, axis_type KvHeads = Heads>
struct multi_head_attention {
    static_assert(Heads::is_static && Head::is_static && ValueHead::is_static && KvHeads::is_static,
                  "dimsum: multi_head_attention: heads, head, value_head and kv_heads need static extents");
    static_assert(KvHeads::static_extent > 0 && Heads::static_extent % KvHeads::static_extent == 0,
                  "dimsum: multi_head_attention: the query heads must be a multiple of the key/value heads");
    static constexpr std::size_t heads = Heads::static_extent, kv_heads = KvHeads::static_extent;
    using Group = axis<"group", heads / kv_heads>;  // query heads per key/value head
    using OneGroup = axis<"group", 1>;              // keys and values, broadcast over the group
    using Inner = axis<"heads*head", heads * Head::static_extent>;  // the queries' columns
    using ValueInner = std::conditional_t<std::is_same_v<ValueHead, Head>, Inner,
                                          axis<"heads*value_head", heads * ValueHead::static_extent>>;  // W_O's rows
    // the keys' and values' columns: the same as the queries' without grouping
    using KvInner = std::conditional_t<kv_heads == heads, Inner, axis<"kv_heads*head", kv_heads * Head::static_extent>>;
    using KvValueInner =
        std::conditional_t<kv_heads == heads, ValueInner,
                           std::conditional_t<std::is_same_v<ValueHead, Head>, KvInner,
                                              axis<"kv_heads*value_head", kv_heads * ValueHead::static_extent>>>;
    using Fused = axis<"qkv", Inner::static_extent + 2 * KvInner::static_extent>;  // [W_Q | W_K | W_V]

    // The weights, by name for ds::load and ds::save (<dimsum/interop/parameters.hpp>). A
    // bias left empty is zero; a file without it leaves it empty.
    BOOST_HANA_DEFINE_STRUCT(multi_head_attention,
        (std::optional<tensor<T, Model, Fused>>, w_qkv),        // (model, (heads + 2 kv_heads) x head)
        (std::optional<tensor<T, Fused>>, b_qkv),               // ((heads + 2 kv_heads) x head)
        (std::optional<tensor<T, Model, Inner>>, w_q),          // (model, heads x head)
        (std::optional<tensor<T, Source, KvInner>>, w_k),       // (source, kv_heads x head)
        (std::optional<tensor<T, Source, KvValueInner>>, w_v),  // (source, kv_heads x value_head)
        (std::optional<tensor<T, Inner>>, b_q),
        (std::optional<tensor<T, KvInner>>, b_k),
        (std::optional<tensor<T, KvValueInner>>, b_v),
        (tensor<T, ValueInner, Model>, w_o),                    // (heads x value_head, model)
        (std::optional<tensor<T, Model>>, b_o));

    // Packs the projections (W_Q, W_K, W_V and W_O) once for the CPU's products (ds::prepack),
    // so that a call neither packs them again nor, for bf16, widens them first. The packing
    // holds about the weights' size in float, and is a copy of their values: after changing
    // or loading the weights, call prepack() again, or unpack().
    void prepack() {
        const projection_views p = projections();
        panels_ = pack_projections(p.w_q.values(), p.w_k.values(), p.w_v.values(),
                                   tensor_view<const T, ValueInner, Model>(w_o.view()));
    }
    void unpack() { panels_.reset(); }
    // The bytes the packing holds: 0 without one.
    std::size_t packed_bytes() const { return panels_ ? panels_->bytes() : 0; }

    // The inputs x (batch, query, model) and c (batch, key, source) are tensors, views or
    // formulas (a formula is computed once, inside the layer's own formula).

    // Self-attention: y (batch, seq, model) for x (batch, seq, model); `weights`, if given,
    // receives the attention weights (batch, heads, seq, seq), which are then not fused away.
    template <rows_of_width<Model> X>
    tensor<T, batch_of<X>, rows_of<X>, Model> operator()(const X& x, const attention_options& options = {},
                                                         tensor<T, batch_of<X>, Heads, rows_of<X>, rows_of<X>>* weights = nullptr,
                                                         call_site caller = call_site::current()) const
        requires std::is_same_v<Source, Model>
    {
        return (*this)(x, x, options, weights, caller);
    }

    // Attention of queries x (batch, query, model) to a context c (batch, key, source).
    template <rows_of_width<Model> X, rows_of_width<Source> C>
    tensor<T, batch_of<X>, rows_of<X>, Model> operator()(const X& x, const C& c, const attention_options& options = {},
                                                         tensor<T, batch_of<X>, Heads, rows_of<X>, rows_of<C>>* weights = nullptr,
                                                         call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        tensor<T, batch_of<X>, rows_of<X>, Model> y(batch_of<X>{x.shape().extent(0)}, rows_of<X>{x.shape().extent(1)},
                                                    Model{w_o.shape().extent(1)});
        forward(x, c, y.view(), options, weights);
        return y;
    }

    // The same into y, a view of x's shape: a call in a loop allocates nothing.
    template <rows_of_width<Model> X, rows_of_width<Source> C>
    void forward(const X& x, const C& c, const tensor_view<T, batch_of<X>, rows_of<X>, Model>& y,
                 const attention_options& options = {},
                 tensor<T, batch_of<X>, Heads, rows_of<X>, rows_of<C>>* weights = nullptr,
                 call_site caller = call_site::current()) const {
        forward_on(default_evaluation{}, x, c, y, options, weights, caller);
    }

    // The same on a backend of the caller's choice, e.g.
    // `ds::backend::cpu::evaluator{.fuse_attention = false}`.
    template <class Backend, rows_of_width<Model> X, rows_of_width<Source> C>
    void forward_on(Backend backend, const X& x, const C& c, const tensor_view<T, batch_of<X>, rows_of<X>, Model>& y,
                    const attention_options& options = {},
                    tensor<T, batch_of<X>, Heads, rows_of<X>, rows_of<C>>* weights = nullptr,
                    call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        using Batch = batch_of<X>;
        using Query = rows_of<X>;
        using Key = rows_of<C>;
        auto store = [&](const auto& dst, const auto& formula) {
            if constexpr (std::is_same_v<Backend, default_evaluation>) assign(dst, formula);
            else evaluation::assign_with(backend, dst, formula);
        };
        const projection_views p = projections();
        // x and c as the layer holds them: rounded where their values are bf16 (detail::as_stored)
        auto&& queries_from = detail::as_stored(x);
        auto&& keys_from = detail::as_stored(c);
        // the heads, query head h as (h / group, h % group): (batch, kv_heads, group, query, head),
        // and (batch, kv_heads, group=1, key, head or value_head), broadcast over the group.
        // In bf16, Q, K, V and the heads' output are held in bf16 (cast<T> rounds them; in
        // float it is nothing), as PyTorch's bf16 holds them, so that the attention and the
        // output projection run on the bf16 kernels where the CPU has them.
        auto q = permute<Batch, KvHeads, Group, Query, Head>(
            view<Batch, Query, KvHeads, Group, Head>(cast<T>(matmul(queries_from, p.w_q) + p.b_q)));
        auto k = permute<Batch, KvHeads, OneGroup, Key, Head>(
            view<Batch, Key, KvHeads, OneGroup, Head>(cast<T>(matmul(keys_from, p.w_k) + p.b_k)));
        auto v = permute<Batch, KvHeads, OneGroup, Key, ValueHead>(
            view<Batch, Key, KvHeads, OneGroup, ValueHead>(cast<T>(matmul(keys_from, p.w_v) + p.b_v)));
        // concat(heads) W_O + b_O, for z (batch, kv_heads, group, query, value_head)
        auto output = [&](auto&& z) {
            store(y, matmul(view<Batch, Query, ValueInner>(permute<Batch, Query, KvHeads, Group, ValueHead>(cast<T>(z))),
                            packed_view<T, ValueInner, Model>(w_o.view(), panels::of(panels_, &panels::w_o))) +
                         bias_or_zero(b_o, w_o.shape().extent(1)));
        };
        // softmax(mask(Q K^T / sqrt(d_k))) V, the mask one of four formulas
        auto run = [&](auto mask) {
            auto weights_of = [&] { return softmax(mask(attention_scores(q, k))); };  // (batch, kv_heads, group, query, key)
            if (!weights) return output(matmul(weights_of(), v));
            // asked for: held, and the output computed from them
            auto formula = weights_of();
            *weights = tensor<T, Batch, Heads, Query, Key>(Batch{formula.shape().extent(0)}, Heads{},
                                                           Query{formula.shape().extent(3)}, Key{formula.shape().extent(4)});
            auto grouped = view<Batch, KvHeads, Group, Query, Key>(*weights);
            store(grouped, formula);
            output(matmul(grouped, v));
        };
        auto padding = detail::padding_mask<T, Batch, Key, dim<1>, dim<1>, dim<1>>(x.shape().extent(0), c.shape().extent(1),
                                                                               options.key_lengths);
        if (options.causal && padding) return run([&](auto&& s) { return causal(s + *padding); });
        if (options.causal) return run(causal_scores);
        if (padding) return run([&](auto&& s) { return s + *padding; });
        run(unmasked);
    }

    // The layer as one formula, to train it (a ds::tape records it, ds::backward differentiates
    // it): queries x (batch, query, model) attending to a context c (batch, key, source), both
    // tensors, views or formulas; `mask` a function of the scores (batch, kv_heads, group,
    // query, key), e.g. causal_scores or a lambda adding a padding mask; `rope` turning the
    // queries and keys at positions 0, 1, ... (a rotary, or no_rotary). It reads the weights
    // themselves, never prepack()'s packing, so that each weight's gradient reaches it: the
    // separate w_q, w_k and w_v, or w_qkv's column blocks (strided views of it, which
    // differentiation reads as slices of w_qkv, so that its gradient is one tensor too). The
    // formula reads x, c (if tensors), the weights and the rotary's tables where they lie:
    // they must outlive it.
    template <class X, class C, class Mask = unmasked_t, class Rope = no_rotary_t>
        requires rows_of_width<std::remove_cvref_t<X>, Model> && rows_of_width<std::remove_cvref_t<C>, Source>
    auto formula(X&& x, C&& c, Mask mask = {}, const Rope& rope = no_rotary, call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        static_assert(!detail::is_temporary_tensor<X> && !detail::is_temporary_tensor<C>,
                      "dimsum: multi_head_attention::formula reads x and c where they lie: give it named tensors or formulas, "
                      "not temporary tensors");
        using Batch = batch_of<X>;
        using Query = rows_of<X>;
        using Key = rows_of<C>;
        const projection_views w = projections();  // their values, never their panels
        auto&& queries_from = detail::as_stored(x);  // rounded where bf16, as in forward_on
        auto&& keys_from = detail::as_stored(c);
        auto q = permute<Batch, KvHeads, Group, Query, Head>(
            view<Batch, Query, KvHeads, Group, Head>(cast<T>(matmul(queries_from, w.w_q.values()) + w.b_q)));
        auto k = permute<Batch, KvHeads, OneGroup, Key, Head>(
            view<Batch, Key, KvHeads, OneGroup, Head>(cast<T>(matmul(keys_from, w.w_k.values()) + w.b_k)));
        auto v = permute<Batch, KvHeads, OneGroup, Key, ValueHead>(
            view<Batch, Key, KvHeads, OneGroup, ValueHead>(cast<T>(matmul(keys_from, w.w_v.values()) + w.b_v)));
        auto z = matmul(softmax(mask(attention_scores(rope(q, 0), rope(k, 0)))), v);  // (batch, kv_heads, group, query, value_head)
        return matmul(view<Batch, Query, ValueInner>(permute<Batch, Query, KvHeads, Group, ValueHead>(cast<T>(z))), w_o) +
               bias_or_zero(b_o, w_o.shape().extent(1));
    }

    // Self-attention as one formula: formula(x, x, mask, rope).
    template <class X, class Mask = unmasked_t, class Rope = no_rotary_t>
        requires rows_of_width<std::remove_cvref_t<X>, Model> && (!rows_of_width<std::remove_cvref_t<Mask>, Source>) &&
                 std::is_same_v<Source, Model>
    auto formula(X&& x, Mask mask = {}, const Rope& rope = no_rotary, call_site caller = call_site::current()) const {
        static_assert(!detail::is_temporary_tensor<X>,
                      "dimsum: multi_head_attention::formula reads x where it lies: give it a named tensor or a formula, "
                      "not a temporary tensor");
        return formula(x, x, mask, rope, caller);
    }

    // Self-attention of a step of new rows x (batch, seq=n, model) over a key/value cache:
    // prefill (the prompt) and decoding (one or more new tokens) alike. The rows' keys and
    // values, their keys and queries turned by `rope` (a rotary of the head axis, or
    // no_rotary) at their positions, are appended to the cache, and each row attends to its
    // sequence's positions up to its own. A padded batch says which of its rows are tokens
    // (step_padding, left or right): each sequence's rows then begin at its own length, its
    // keys land after its own positions, and the output of a padding row means nothing.
    // x's axes are named like the cache's batch and seq axes.
    template <rows_of_width<Model> X, key_value_cache Cache, class Rope = no_rotary_t>
    tensor<T, batch_of<X>, rows_of<X>, Model> operator()(const X& x, Cache& cache, const Rope& rope = no_rotary,
                                                         const step_padding& padding = {},
                                                         call_site caller = call_site::current()) const
        requires std::is_same_v<Source, Model>
    {
        ::dimsum::detail::operation_site site(caller);
        tensor<T, batch_of<X>, rows_of<X>, Model> y(batch_of<X>{x.shape().extent(0)}, rows_of<X>{x.shape().extent(1)},
                                                    Model{w_o.shape().extent(1)});
        forward(x, cache, y.view(), rope, padding, caller);
        return y;
    }

    // The same into y, a view of x's shape: a decoding loop allocates nothing (but a padded
    // step's positions).
    template <rows_of_width<Model> X, key_value_cache Cache, class Rope = no_rotary_t>
    void forward(const X& x, Cache& cache, const tensor_view<T, batch_of<X>, rows_of<X>, Model>& y,
                 const Rope& rope = no_rotary, const step_padding& padding = {},
                 call_site caller = call_site::current()) const
        requires std::is_same_v<Source, Model>
    {
        forward_adding(x, cache, y, no_residual{}, rope, padding, caller);
    }

    // y = residual + the same, in the pass of the output projection: the residual stream of a
    // pre-norm layer (decoder_layer), residual a tensor, view or formula of y's shape.
    template <rows_of_width<Model> X, key_value_cache Cache, class Residual, class Rope = no_rotary_t>
    void forward_adding(const X& x, Cache& cache, const tensor_view<T, batch_of<X>, rows_of<X>, Model>& y,
                        const Residual& residual, const Rope& rope = no_rotary, const step_padding& padding = {},
                        call_site caller = call_site::current()) const
        requires std::is_same_v<Source, Model>
    {
        ::dimsum::detail::operation_site site(caller);
        using Batch = batch_of<X>;
        using Seq = rows_of<X>;
        static_assert(describe_axis<Batch>.name == describe_axis<typename Cache::batch_axis>.name &&
                          describe_axis<Seq>.name == describe_axis<typename Cache::seq_axis>.name,
                      "dimsum: multi_head_attention: x's batch and seq axes must be named like the cache's");
        static_assert(std::is_same_v<typename Cache::kv_heads_axis, KvHeads> && std::is_same_v<typename Cache::head_axis, Head> &&
                          std::is_same_v<typename Cache::value_head_axis, ValueHead> &&
                          std::is_same_v<typename Cache::value_type, T>,
                      "dimsum: multi_head_attention: the cache's element type, kv_heads, head and value_head must be the layer's");
        using CacheSeq = typename Cache::seq_axis;
        const projection_views p = projections();
        const std::size_t n = x.shape().extent(1);
        // An absent bias is no pass at all here (not a zero added, as in the calls above):
        // decoding is many small calls, whose every operand counts.
        const bool projections_biased = b_qkv || b_q || b_k || b_v;
        auto&& rows = detail::as_stored(x);  // rounded where bf16, as in forward_on
        with_flags(projections_biased, b_o.has_value(), [&](auto projection_bias, auto output_bias) {
            // the rows' keys and values (batch, kv_heads, seq=n, head), queries (batch, kv_heads, group, seq, head)
            auto k = transpose<Seq, KvHeads>(
                view<Batch, Seq, KvHeads, Head>(cast<T>(plus<decltype(projection_bias)::value>(matmul(rows, p.w_k), p.b_k))));
            auto v = transpose<Seq, KvHeads>(
                view<Batch, Seq, KvHeads, ValueHead>(cast<T>(plus<decltype(projection_bias)::value>(matmul(rows, p.w_v), p.b_v))));
            auto q = permute<Batch, KvHeads, Group, Seq, Head>(
                view<Batch, Seq, KvHeads, Group, Head>(cast<T>(plus<decltype(projection_bias)::value>(matmul(rows, p.w_q), p.b_q))));
            // softmax(mask(Q K^T / sqrt(d_k))) V over the cache, broadcast over each group, then W_O
            auto attend = [&](auto&& rotated_q, auto mask) {
                auto keys = unsqueeze<OneGroup, 2>(cache.keys()), values = unsqueeze<OneGroup, 2>(cache.values());
                auto heads = view<Batch, Seq, ValueInner>(permute<Batch, Seq, KvHeads, Group, ValueHead>(
                    cast<T>(matmul(softmax(mask(attention_scores(cast<T>(rotated_q), keys))), values))));
                auto out = plus<decltype(output_bias)::value>(
                    matmul(heads, packed_view<T, ValueInner, Model>(w_o.view(), panels::of(panels_, &panels::w_o))),
                    bias_or_zero(b_o, w_o.shape().extent(1)));
                if constexpr (std::is_same_v<Residual, no_residual>) assign(y, out);
                else assign(y, residual + out);
            };
            if (padding.real.empty() && cache.uniform()) {
                // every sequence's rows at the same positions: the causal mask aligned at the ends
                const std::size_t first = cache.size();
                cache.append(rope(k, first), v);
                return attend(rope(q, first), causal_scores);
            }
            // each sequence's rows at its own positions
            step_positions<Batch, Seq> at;
            cache.step_positions(n, padding, at);
            cache.append(rope(k, at.rows), v, padding);
            const std::size_t m = cache.size();
            auto ends = view<Batch, dim<1>, dim<1>>(at.ends);
            auto lengths = view<Batch, dim<1>, dim<1>, dim<1>>(at.lengths);
            attend(rope(q, at.rows), [&](auto&& s) {
                return masked_fill(s, causal_mask(ends, Seq{n}, CacheSeq{m}) || !sequence_mask(lengths, CacheSeq{m}),
                                   -std::numeric_limits<compute_type_t<T>>::infinity());
            });
        });
    }

private:
    struct default_evaluation {};  // evaluate with dimsum's default backend
    struct no_residual {};

    // f + bias, or f alone.
    template <bool Biased, class F, class B>
    static auto plus(F&& f, const B& bias) {
        if constexpr (Biased) return std::forward<F>(f) + bias;
        else return std::forward<F>(f);
    }
    // f(first, second) with each flag as a std::bool_constant: one formula per combination.
    template <class F>
    static void with_flags(bool first, bool second, F&& f) {
        auto then = [&](auto a) {
            if (second) f(a, std::true_type{});
            else f(a, std::false_type{});
        };
        if (first) then(std::true_type{});
        else then(std::false_type{});
    }

    // The packing prepack() made, shared by copies of the layer (each reads its own weights
    // everywhere else), or none.
    using panels = projection_panels<compute_type_t<T>>;
    std::shared_ptr<const panels> panels_;

    // The projections as views, whether fused or separate, packed or not: one type, so one formula.
    struct projection_views {
        packed_view<T, Model, Inner> w_q;
        packed_view<T, Source, KvInner> w_k;
        packed_view<T, Source, KvValueInner> w_v;
        tensor_view<const T, Inner> b_q;
        tensor_view<const T, KvInner> b_k;
        tensor_view<const T, KvValueInner> b_v;
    };
    projection_views projections() const {
        const auto q = panels::of(panels_, &panels::w_q), k = panels::of(panels_, &panels::w_k), v = panels::of(panels_, &panels::w_v);
        if constexpr (std::is_same_v<Source, Model> && std::is_same_v<ValueHead, Head>) {
            if (w_qkv) {
                constexpr std::size_t key = Inner::static_extent, value = key + KvInner::static_extent;
                return {{fused_columns<Inner>(0), q}, {fused_columns<KvInner>(key), k}, {fused_columns<KvInner>(value), v},
                        fused_bias<Inner>(0), fused_bias<KvInner>(key), fused_bias<KvInner>(value)};
            }
        }
        if (!w_q || !w_k || !w_v) throw shape_error("dimsum: multi_head_attention: neither w_qkv nor w_q, w_k and w_v are set");
        return {{w_q->view(), q}, {w_k->view(), k}, {w_v->view(), v}, bias_or_zero(b_q), bias_or_zero(b_k), bias_or_zero(b_v)};
    }

    // Columns [first, first + Columns) of w_qkv, (model, columns), and of b_qkv (or zeros).
    template <axis_type Columns>
    tensor_view<const T, Model, Columns> fused_columns(std::size_t first) const {
        const std::size_t rows = w_qkv->extent(0);
        return {w_qkv->data() + first, shape<Model, Columns>::from_extents({rows, Columns::static_extent}, "w_qkv"),
                {static_cast<std::ptrdiff_t>(Fused::static_extent), 1}};
    }
    template <axis_type Columns>
    tensor_view<const T, Columns> fused_bias(std::size_t first) const {
        return b_qkv ? tensor_view<const T, Columns>(b_qkv->data() + first, shape<Columns>{}, {1}) : zero<Columns>();
    }

    // An absent bias reads as zeros: a view whose one element, stride 0, is a constant zero,
    // so that a layer with and without biases is one formula and allocates nothing.
    static constexpr T zero_value = T(0);
    template <axis_type Axis>
    static tensor_view<const T, Axis> zero(std::size_t extent = Axis::static_extent) {
        return {&zero_value, shape<Axis>(Axis{extent}), {0}};
    }
    template <axis_type Axis>
    static tensor_view<const T, Axis> bias_or_zero(const std::optional<tensor<T, Axis>>& bias,
                                                   std::size_t extent = Axis::static_extent) {
        return bias ? bias->view() : zero<Axis>(extent);
    }
};

}  // namespace dimsum::nn
