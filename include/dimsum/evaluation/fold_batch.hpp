#pragma once
// A batch of products that is one taller product: the last thing the planner decides about a
// gemm entry (plan.hpp: fold_product_batches), so that every executor runs the product as it
// stands.

#include <cstddef>
#include <span>

#include "dimsum/evaluation/layout.hpp"

namespace dimsum::evaluation {

// Drops axis `axis` of l.
inline void drop_axis(layout& l, std::size_t axis) {
    for (std::size_t i = axis; i + 1 < l.rank; ++i) {
        l.extents[i] = l.extents[i + 1];
        l.strides[i] = l.strides[i + 1];
    }
    --l.rank;
    l.extents[l.rank] = 0;
    l.strides[l.rank] = 0;
}
// Drops axis `axis` of l, folding it into the next one (the rows), whose extent becomes
// `rows`; the strides of the rows stay.
inline void fold_into_rows(layout& l, std::size_t axis, std::size_t rows) {
    drop_axis(l, axis);
    l.extents[axis] = rows;
}

// (..., batch, m, k) x (k, n), with B the same for every item and the items' rows one after
// the other in A, in C and in everything laid out alongside C (`with_c`: an epilogue's
// inputs, the memory C is rounded into), is one taller product (batch m, k) x (k, n): B is
// then read once for all rows, instead of again for each item (x W for x of
// (batch, seq, model) is the common case). Folds the innermost batch axes while that holds.
// a, b, c and every layout of with_c have c's rank; they keep equal ranks.
inline void fold_batch_into_rows(layout& a, layout& b, layout& c, std::span<layout* const> with_c) {
    while (c.rank > 2) {
        const std::size_t axis = c.rank - 3, m = c.extents[axis + 1];
        const auto rows_continue = [&](const layout& l) {
            return c.extents[axis] == 1 || l.strides[axis] == l.strides[axis + 1] * static_cast<std::ptrdiff_t>(m);
        };
        bool folds = (b.strides[axis] == 0 || c.extents[axis] == 1) && a.extents[axis + 1] == m && rows_continue(a) &&
                     rows_continue(c);
        for (const layout* l : with_c) folds = folds && rows_continue(*l);
        if (!folds) return;
        const std::size_t rows = c.extents[axis] * m;
        fold_into_rows(a, axis, rows);
        fold_into_rows(c, axis, rows);
        drop_axis(b, axis);  // B: the batch axis simply goes
        for (layout* l : with_c) fold_into_rows(*l, axis, rows);
    }
}

}  // namespace dimsum::evaluation
