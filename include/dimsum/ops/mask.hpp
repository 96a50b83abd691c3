#pragma once
// Values computed from their indices, lazily (no memory until evaluated): arange along an
// axis, the causal mask, and a sequence mask from lengths.

#include "dimsum/ops/common.hpp"
#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/view.hpp"

namespace dimsum {

// causal_mask(queries, keys): a boolean mask, true where attention must not look, queries
// and keys aligned at their ends. E.g. masked_fill(scores, causal_mask(Seq{n}, Seq{n}), -infinity).
template <axis_type Query, axis_type Key>
auto causal_mask(Query queries, Key keys, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    using S = shape<Query, Key>;
    return expr::causal_mask<Query, Key>{{}, S::from_extents({queries.extent, keys.extent}, "causal_mask")};
}

// causal_mask(lengths, Query{n}, Key{m}): the causal mask of a padded batch, per sequence:
// its n queries are the last n of its lengths[...] real keys (decoding: the new positions),
// and key j is hidden from query i when it lies in i's future or past the sequence, that is
// when j > lengths - n + i. The mask has lengths' axes, then (query, key); a query before
// its sequence's start (lengths < n) sees nothing (its softmax row is 0).
template <operand Lengths, axis_type Query, axis_type Key>
auto causal_mask(Lengths&& lengths, Query queries, Key keys, call_site caller = call_site::current());

// arange<T>(Axis{n}): 0, 1, ..., n - 1 along the axis, as values of T (float unless asked),
// e.g. positions for rotary embeddings, or arange(Key{n}) < lengths for a mask.
template <class T = float, axis_type Axis>
auto arange(Axis positions) {
    return expr::arange<Axis, T>{{}, shape<Axis>::from_extents({positions.extent}, "arange")};
}

// sequence_mask(lengths, Key{n}): true at the positions j < lengths[...] of a key axis of n,
// for lengths of any shape (batch, ...): the mask has lengths' axes and then Key. Where a key
// is padding, !sequence_mask(...) holds; masked_fill(scores, !mask, -infinity) hides it.
template <operand Lengths, axis_type Key>
auto sequence_mask(Lengths&& lengths, Key keys, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    return arange<value_type_of<Lengths>>(keys) < unsqueeze<axis<Key::name, 1>, shape_of<Lengths>::rank>(std::forward<Lengths>(lengths));
}

template <operand Lengths, axis_type Query, axis_type Key>
auto causal_mask(Lengths&& lengths, Query queries, Key keys, call_site caller) {
    detail::operation_site site(caller);
    using T = value_type_of<Lengths>;
    constexpr std::size_t rank = shape_of<Lengths>::rank;
    using OneQuery = axis<Query::name, 1>;
    using OneKey = axis<Key::name, 1>;
    // the position of each query in its sequence: (lengths..., query, 1)
    auto last = unsqueeze<OneQuery, rank>(std::forward<Lengths>(lengths)) - static_cast<T>(queries.extent);
    auto position = unsqueeze<OneKey, rank + 1>(last + arange<T>(queries));
    return arange<T>(keys) > position;
}

}  // namespace dimsum
