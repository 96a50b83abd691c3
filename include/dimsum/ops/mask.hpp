#pragma once
// causal_mask(queries, keys): a lazy boolean mask, true where attention must not look.

#include "dimsum/ops/common.hpp"

namespace dimsum {

// E.g. masked_fill(scores, causal_mask(Seq{n}, Seq{n}), -infinity).
template <axis_type Query, axis_type Key>
auto causal_mask(Query queries, Key keys) {
    using S = shape<Query, Key>;
    return expr::causal_mask<Query, Key>{{}, S::from_extents({queries.extent, keys.extent}, "causal_mask")};
}

}  // namespace dimsum
