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
auto causal_mask(Query queries, Key keys) {
    using S = shape<Query, Key>;
    return expr::causal_mask<Query, Key>{{}, S::from_extents({queries.extent, keys.extent}, "causal_mask")};
}

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
auto sequence_mask(Lengths&& lengths, Key keys) {
    return arange<value_type_of<Lengths>>(keys) < unsqueeze<axis<Key::name, 1>, shape_of<Lengths>::rank>(std::forward<Lengths>(lengths));
}

}  // namespace dimsum
