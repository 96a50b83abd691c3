#pragma once
// A batch of products that is one taller product: what every executor's gemm does first.
// Works on anything with rank, extents and strides (strided arrays, layouts), so that the CPU
// and the GPU executors fold alike.

#include <cstddef>

namespace dimsum::evaluation {

// Drops axis `axis` of s, folding it into the next one (the rows), whose extent becomes
// `rows`; the strides of the rows stay.
template <class S>
void fold_into_rows(S& s, std::size_t axis, std::size_t rows) {
    for (std::size_t i = axis; i + 1 < s.rank; ++i) {
        s.extents[i] = s.extents[i + 1];
        s.strides[i] = s.strides[i + 1];
    }
    --s.rank;
    s.extents[axis] = rows;
}

// (..., batch, m, k) x (k, n), with B the same for every item and the items' rows one after
// the other in A, in C and in every input of the epilogue, is one taller product
// (batch m, k) x (k, n): B is then read once for all rows, instead of again for each item
// (x W for x of (batch, seq, model) is the common case). Folds the innermost batch axes while
// that holds. a, b, c and the `count` inputs have c's rank.
template <class A, class B, class C, class Input>
void fold_batch_into_rows(A& a, B& b, C& c, Input* inputs, std::size_t count) {
    while (c.rank > 2) {
        const std::size_t axis = c.rank - 3, m = c.extents[axis + 1];
        const auto rows_continue = [&](const auto& s) {
            return c.extents[axis] == 1 || s.strides[axis] == s.strides[axis + 1] * static_cast<std::ptrdiff_t>(m);
        };
        bool folds = (b.strides[axis] == 0 || c.extents[axis] == 1) && a.extents[axis + 1] == m && rows_continue(a) &&
                     rows_continue(c);
        for (std::size_t i = 0; folds && i < count; ++i) folds = rows_continue(inputs[i]);
        if (!folds) return;
        const std::size_t rows = c.extents[axis] * m;
        fold_into_rows(a, axis, rows);
        fold_into_rows(c, axis, rows);
        for (std::size_t i = axis; i + 1 < b.rank; ++i) {  // B: the batch axis simply goes
            b.extents[i] = b.extents[i + 1];
            b.strides[i] = b.strides[i + 1];
        }
        --b.rank;
        for (std::size_t i = 0; i < count; ++i) fold_into_rows(inputs[i], axis, rows);
    }
}

}  // namespace dimsum::evaluation
