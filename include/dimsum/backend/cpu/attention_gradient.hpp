#pragma once
// The backward of attention without the queries x keys matrix, in the manner of
// FlashAttention-2: P = softmax(f(Q K^T)) is never held whole, but recomputed a tile at a
// time from one log-sum-exp per query, and each tile adds its share to the three gradients:
//     P   = e^(f(Q K^T) - lse)              (lse = log sum_j e^(f(Q K^T))_ij, per query i)
//     dV += P^T dO
//     dP  = dO V^T
//     dS  = slope P (dP - D),  D_i = sum_c dO_ic O_ic   (= sum_j P_ij dP_ij)
//     dK += dS^T Q,   dQ += dS K
// where `slope` is the score function's derivative where a score has weight (evaluation::
// attention_backward says which score functions have one), and lse is what the forward kept
// (attention_problem::lse). The
// tiles are keys x queries (S^T, P^T, dP^T, dS^T), so that all five products read their
// operands in place, row-major copies padded to the GEMM micro-kernel's panels (gemm.hpp),
// none packed: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, dQ^T += K^T dS^T.
// Tiles a causal mask empties are skipped.
//
// Two phases: first D for every (item, block of queries), into the caller's scratch; then, per task, one item's keys or a part of them:
// for each block of keys, its dK and dV are summed over the blocks of queries that see it
// and written once; dQ^T is summed over the task's blocks of keys, into the item's dQ, or,
// when an item's keys are split between tasks (fewer items than threads), into a partial
// dQ per task, added up in a fixed order at the end, so that the result does not depend on
// the threads. Memory: the tiles, copies of an item's Q, dO and dQ, and a number or two per
// query: O(sequence), never O(queries x keys).
//
// A gradient nobody reads (its matrix's data null: a ds::grad with respect to V alone, say)
// is not computed: its product is skipped, and with neither dQ nor dK wanted, dP, dS and D
// are too, which leaves two of the five products.
//
// The scores go through the same steps as in the forward kernel (attention.hpp): the scale,
// then the rest of the score function (on a row-major copy of the tile), then the causal
// mask. A query that sees no key (all masked) has P = 0, as its O is 0 in the forward, and
// a NaN among a query's scores makes its row of P NaN. Q, K and V are read as stored, of the
// program's type or bf16 (a mixed-precision layer's, which its forward read as bf16), and
// widened as they are copied; the products are the program's type's (no bf16 products here
// yet).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "dimsum/backend/cpu/attention.hpp"
#include "dimsum/backend/cpu/gemm.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/backend/cpu/workspace.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

template <class T>
struct attention_gradient_tiling {
    // Queries per block: the forward's, a whole number of the micro-kernel's row panels.
    static constexpr std::size_t queries = attention_tiling<T>::queries;
    // Keys per block, a whole number of column panels: a block's dK and dV (keys x d each)
    // stay in L2 with the two tiles of scores.
    static constexpr std::size_t keys = 4 * gemm_tiling<T>::nr;
    // The most tasks one item's keys are split into.
    static constexpr std::size_t max_splits = 16;
    // (a block of queries is whole column panels of the tiles of keys x queries)
    static_assert(queries % gemm_tiling<T>::nr == 0);
};

namespace detail {

// The operands' places in attention_gradient_problem::batch.
enum gradient_operand : std::size_t { q_at, k_at, v_at, o_at, d_o_at, dq_at, dk_at, dv_at };

// dst (cols x rows, its rows ld_dst apart) = src (rows x cols, its rows ld_src apart)
// transposed, src of T or of bf16 (widened). In tiles of 16 x 16, through registers with
// AVX-512 and float (transpose_tile_16): element by element, each value of a column of src
// is on a line of its own, and when src's rows lie a multiple of 1 KiB apart (a head's rows in
// a (seq, heads x head) activation, 3 KiB) those lines fall in a few sets of L1 and evict each
// other before the next column reads them again (a BERT layer's attention backward took 6.3
// ms so, 3.9 in tiles).
template <class T, class U>
void transpose_copy(const U* src, std::ptrdiff_t ld_src, std::size_t rows, std::size_t cols, T* dst, std::ptrdiff_t ld_dst) {
    constexpr std::size_t tile = 16;
    for (std::size_t i0 = 0; i0 < rows; i0 += tile) {
        const std::size_t live_rows = std::min(tile, rows - i0);
        for (std::size_t j0 = 0; j0 < cols; j0 += tile) {
            const std::size_t live_cols = std::min(tile, cols - j0);
            const U* from = src + static_cast<std::ptrdiff_t>(i0) * ld_src + static_cast<std::ptrdiff_t>(j0);
            T* to = dst + static_cast<std::ptrdiff_t>(j0) * ld_dst + static_cast<std::ptrdiff_t>(i0);
#if defined(__AVX512F__)
            if constexpr (std::is_same_v<T, float> && simd<T>::size == 16) {
                transpose_tile_16(from, ld_src, live_rows, live_cols, to, ld_dst, live_rows);
                continue;
            }
#endif
            for (std::size_t i = 0; i < live_rows; ++i) {
                for (std::size_t j = 0; j < live_cols; ++j) {
                    to[static_cast<std::ptrdiff_t>(j) * ld_dst + static_cast<std::ptrdiff_t>(i)] =
                        widened<T>(from[static_cast<std::ptrdiff_t>(i) * ld_src + static_cast<std::ptrdiff_t>(j)]);
                }
            }
        }
    }
}

// rows x cols of m (of T, or of bf16, widened) copied into `out` (row-major, `ld` apart),
// zeros up to `rows_pad` x ld. A transposed m (its columns contiguous: Q^T of a row-major Q)
// goes in tiles (transpose_copy).
template <class T, class U>
void copy_padded(const matrix<const U>& m, std::size_t rows, std::size_t cols, std::size_t rows_pad, std::size_t ld, T* out) {
    const auto at = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
    if (m.row_stride == 1 && m.col_stride != 1) {
        transpose_copy(m.data, m.col_stride, cols, rows, out, at(ld));
    } else {
        for (std::size_t i = 0; i < rows; ++i) {
            const U* from = m.data + at(i) * m.row_stride;
            T* row = out + i * ld;
            if (m.col_stride == 1) {
                std::transform(from, from + cols, row, [](U x) { return widened<T>(x); });
            } else {
                for (std::size_t j = 0; j < cols; ++j) row[j] = widened<T>(from[at(j) * m.col_stride]);
            }
        }
    }
    for (std::size_t i = 0; i < rows; ++i) std::fill(out + i * ld + cols, out + (i + 1) * ld, T(0));
    std::fill(out + rows * ld, out + rows_pad * ld, T(0));
}

// rows x cols of `from` (row-major, `ld` apart) into m, whatever its strides: row by row, or
// in tiles where m's columns are contiguous (transpose_copy).
template <class T>
void store_rows(const T* from, std::size_t ld, std::size_t rows, std::size_t cols, const matrix<T>& m) {
    const auto at = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
    if (m.row_stride == 1 && m.col_stride != 1) return transpose_copy(from, at(ld), rows, cols, m.data, m.col_stride);
    for (std::size_t i = 0; i < rows; ++i) {
        T* row = m.data + at(i) * m.row_stride;
        if (m.col_stride == 1) {
            std::copy(from + i * ld, from + i * ld + cols, row);
        } else {
            for (std::size_t j = 0; j < cols; ++j) row[at(j) * m.col_stride] = from[i * ld + j];
        }
    }
}

// The part of a problem one item's call sees: its operands from item 0 moved to `item`.
template <class T>
struct item_view {
    source_matrix<T> q, k, v;
    matrix<const T> o, d_o;
    matrix<T> dq, dk, dv;
};
template <class T>
item_view<T> item_of(const attention_gradient_problem<T>& p, std::size_t item) {
    const auto at = p.batch.offsets(item);
    item_view<T> r{p.q, p.k, p.v, p.o, p.d_o, p.dq, p.dk, p.dv};
    r.q.advance(at[q_at]);
    r.k.advance(at[k_at]);
    r.v.advance(at[v_at]);
    r.o.data += at[o_at];
    r.d_o.data += at[d_o_at];
    if (r.dq.data) r.dq.data += at[dq_at];  // (null: not wanted)
    if (r.dk.data) r.dk.data += at[dk_at];
    if (r.dv.data) r.dv.data += at[dv_at];
    return r;
}

// A tile of scores S (queries x cols of the block of keys from `key`, row-major, `ld`
// apart) scaled, then the rest of the score function applied, as the forward does before its
// causal mask (which key_range applies to P).
template <class T>
void apply_score_function(const attention_gradient_problem<T>& p, std::size_t item, std::size_t first_query,
                          std::size_t queries, std::size_t key, std::size_t cols, T* scores, std::size_t ld) {
    if (p.scale != T(1)) {
        for (std::size_t i = 0; i < queries; ++i) scale_line(scores + i * ld, cols, p.scale);
    }
    p.scores.apply(p.scores.context, item, first_query, key, queries, cols, scores, ld);
}

// The sizes of a task's copies and tiles (key_range), padded to the micro-kernel's panels:
// row panels of mr where a matrix is a product's left operand, column panels of nr where it
// is a right operand or a result.
struct task_sizes {
    std::size_t m_cols;  // queries, in column panels (Q^T, dO^T, dQ^T)
    std::size_t dp, dvp;  // d and dv in column panels (Q, K, dK; dO, V, dV)
    std::size_t d_rows;  // d in row panels (K^T)
    std::size_t bq;      // queries per block
    std::size_t bk;      // keys per block, in column panels (K^T)
    std::size_t bk_rows;  // keys per block in row panels (K, V, the tiles, dK, dV)
    std::size_t m;       // queries
    // the item's Q (m, dp), dO (m, dvp), Q^T (dp, m_cols), dO^T (dvp, m_cols) and dQ^T
    // (d_rows, m_cols); a block of keys' K (bk_rows, dp), V (bk_rows, dvp), K^T (d_rows, bk),
    // dK (bk_rows, dp) and dV (bk_rows, dvp); two tiles (bk_rows, bq) and a row-major one
    // (bq, bk) for the score function.
    std::size_t total() const {
        return up(m * dp) + up(m * dvp) + up(dp * m_cols) + up(dvp * m_cols) + up(d_rows * m_cols) + up(bk_rows * dp) * 2 +
               up(bk_rows * dvp) * 2 + up(d_rows * bk) + up(bk_rows * bq) * 2 + up(bq * bk);
    }
    static std::size_t up(std::size_t x) { return round_up(x, 16); }  // a cache line of float
};
template <class T>
task_sizes sizes_of(const attention_gradient_problem<T>& p) {
    using tiling = attention_gradient_tiling<T>;
    constexpr std::size_t mr = gemm_tiling<T>::mr, nr = gemm_tiling<T>::nr;
    return {round_up(p.q.rows, nr), round_up(p.q.cols, nr), round_up(p.v.cols, nr), round_up(p.q.cols, mr), tiling::queries,
            tiling::keys, round_up(tiling::keys, mr), p.q.rows};
}
// Takes memory from `base` in cache lines, in order.
template <class T>
struct carver {
    T* base;
    T* take(std::size_t size) {
        T* at = base;
        base += task_sizes::up(size);
        return at;
    }
};

// D_i = dO_i . O_i for queries [first, first + queries) of `item`, into rows_d (from the first).
template <class T>
void output_dots(const attention_gradient_problem<T>& p, std::size_t item, std::size_t first, std::size_t queries, T* rows_d) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    const item_view<T> in = item_of(p, item);
    const std::size_t dv = p.v.cols;
    for (std::size_t i = 0; i < queries; ++i) {
        const T* d_o = in.d_o.data + in.d_o.at(first + i, 0);
        const T* o = in.o.data + in.o.at(first + i, 0);
        std::size_t c = 0;
        T sum = 0;
        if (in.d_o.col_stride == 1 && in.o.col_stride == 1) {  // rows in place: a vector at a time
            batch sums(T(0));
            for (; c + width <= dv; c += width) sums = xsimd::fma(batch::load_unaligned(d_o + c), batch::load_unaligned(o + c), sums);
            sum = xsimd::hadd(sums);
        }
        for (; c < dv; ++c) sum += d_o[static_cast<std::ptrdiff_t>(c) * in.d_o.col_stride] * o[static_cast<std::ptrdiff_t>(c) * in.o.col_stride];
        rows_d[i] = sum;
    }
}

// Phase 2: the keys [first_key, last_key) of `item`: their dK and dV, and their share of dQ
// into `dq` (the item's output, or a partial). The tiles are keys x queries (S^T, P^T, dP^T,
// dS^T), so that every product reads its operands in place, none packed: S^T = K Q^T,
// dP^T = V dO^T, dV += P^T dO, dK += dS^T Q and dQ^T += K^T dS^T. Only the wanted gradients
// (data not null) are computed, and what they need.
template <class T>
void key_range(const attention_gradient_problem<T>& p, std::size_t item, std::size_t first_key, std::size_t last_key,
               const T* lse, const T* rows_d, const matrix<T>& dq) {
    using batch = simd<T>;
    using tiling = attention_gradient_tiling<T>;
    constexpr std::size_t width = batch::size, nr = gemm_tiling<T>::nr;
    constexpr T infinity = std::numeric_limits<T>::infinity();
    const task_sizes size = sizes_of(p);
    const std::size_t m = p.q.rows, n = p.k.rows, d = p.q.cols, dv = p.v.cols;
    const std::size_t dp = size.dp, dvp = size.dvp, m_cols = size.m_cols, bq = size.bq, bk = size.bk, bk_rows = size.bk_rows;
    const auto ld = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
    const item_view<T> in = item_of(p, item);
    const bool want_dq = dq.data, want_dk = in.dk.data, want_dv = in.dv.data, want_ds = want_dq || want_dk;
    carver<T> memory{scratch<T>(scratch_use::attention_gradient, size.total())};
    T* q = memory.take(m * dp);
    T* d_o = memory.take(m * dvp);
    T* qt = memory.take(dp * m_cols);
    T* d_ot = memory.take(dvp * m_cols);
    T* dqt = memory.take(size.d_rows * m_cols);
    T* k = memory.take(bk_rows * dp);
    T* dk = memory.take(bk_rows * dp);
    T* v = memory.take(bk_rows * dvp);
    T* dv_sums = memory.take(bk_rows * dvp);
    T* kt = memory.take(size.d_rows * bk);
    T* st = memory.take(bk_rows * bq);   // S^T, then P^T
    T* dst = memory.take(bk_rows * bq);  // dP^T, then dS^T
    T* s = memory.take(bq * bk);         // S, for the score function
    in.q.visit([&](const auto& stored_q) {
        if (want_dk) copy_padded(stored_q, m, d, m, dp, q);
        copy_padded(transposed(stored_q), d, m, d, m_cols, qt);
    });
    if (want_dv) copy_padded(in.d_o, m, dv, m, dvp, d_o);
    if (want_ds) copy_padded(transposed(in.d_o), dv, m, dv, m_cols, d_ot);
    if (want_dq) std::fill(dqt, dqt + size.d_rows * m_cols, T(0));
    alignas(64) T shift[tiling::queries], row_d[tiling::queries];
    for (std::size_t key = first_key; key < last_key; key += bk) {
        // this block's keys, in whole row panels: a short sequence computes no more rows than it has
        const std::size_t cols = std::min(bk, last_key - key), rows_k = round_up(cols, gemm_tiling<T>::mr);
        in.k.visit([&](const auto& stored_k) {
            copy_padded(sub(stored_k, key, 0, cols, d), cols, d, rows_k, dp, k);
            if (want_dq) copy_padded(transposed(sub(stored_k, key, 0, cols, d)), d, cols, size.d_rows, bk, kt);
        });
        if (want_ds) in.v.visit([&](const auto& stored_v) { copy_padded(sub(stored_v, key, 0, cols, dv), cols, dv, rows_k, dvp, v); });
        if (want_dk) std::fill(dk, dk + rows_k * dp, T(0));
        if (want_dv) std::fill(dv_sums, dv_sums + rows_k * dvp, T(0));
        // the first block of queries that sees a key of this block (a causal mask hides it from the earlier ones)
        std::size_t first = 0;
        if (p.causal) {
            while (first < m && visible_keys(std::min(m, first + bq) - 1, m, n) <= key) first += bq;
        }
        for (; first < m; first += bq) {
            const std::size_t queries = std::min(bq, m - first), q_cols = round_up(queries, nr);
            const matrix<T> s_t{st, rows_k, q_cols, ld(bq), 1}, ds_t{dst, rows_k, q_cols, ld(bq), 1};
            // S^T = K Q^T, then P^T = e^(scale S^T - lse) (or of the score function's S^T), 0
            // where a key is masked, past the keys, and for a query that sees none
            macro_kernel<T>({.a = {.direct = k, .ld = ld(dp)}, .b = {.direct = qt + first, .ld = ld(m_cols)}, .depth = d, .c = s_t});
            T scale = p.scale;
            if (p.scores.apply) {  // the score function reads S row-major: through s, scaled there
                transpose_copy(st, ld(bq), cols, queries, s, ld(bk));
                apply_score_function(p, item, first, queries, key, cols, s, bk);
                transpose_copy(s, ld(bk), queries, cols, st, ld(bq));
                scale = T(1);
            }
            for (std::size_t i = 0; i < q_cols; ++i) {
                const bool sees = i < queries && lse[first + i] != -infinity;
                shift[i] = sees ? lse[first + i] : infinity;
                row_d[i] = i < queries ? rows_d[first + i] : T(0);
            }
            for (std::size_t j = 0; j < rows_k; ++j) {
                T* row = st + j * bq;
                // the queries that see key + j: from the first whose visible keys (visible_keys) pass it
                std::size_t from = j < cols ? 0 : q_cols;
                if (p.causal && j < cols) {
                    const auto earliest = static_cast<std::ptrdiff_t>(key + j + m) - static_cast<std::ptrdiff_t>(n + first);
                    from = static_cast<std::size_t>(std::clamp<std::ptrdiff_t>(earliest, 0, static_cast<std::ptrdiff_t>(q_cols)));
                }
                std::fill(row, row + from, T(0));
                std::size_t i = from;
                for (; i < q_cols && i % width != 0; ++i) row[i] = std::exp(row[i] * scale - shift[i]);  // the batch the mask cuts
                for (; i < q_cols; i += width) {
                    const batch x = batch::load_aligned(row + i) * batch(scale) - batch::load_aligned(shift + i);
                    exponential<T>(x).store_aligned(row + i);
                }
            }
            // dV += P^T dO
            if (want_dv) {
                macro_kernel<T>({.a = {.direct = st, .ld = ld(bq)}, .b = {.direct = d_o + first * dvp, .ld = ld(dvp)},
                                 .depth = queries, .c = matrix<T>{dv_sums, rows_k, dvp, ld(dvp), 1}, .accumulate = true});
            }
            if (!want_ds) continue;
            // dP^T = V dO^T, then dS^T = slope P^T (dP^T - D)
            macro_kernel<T>({.a = {.direct = v, .ld = ld(dvp)}, .b = {.direct = d_ot + first, .ld = ld(m_cols)}, .depth = dv, .c = ds_t});
            const batch slope(p.slope);
            for (std::size_t j = 0; j < rows_k; ++j) {
                const T* weights = st + j * bq;
                T* row = dst + j * bq;
                for (std::size_t i = 0; i < q_cols; i += width) {
                    const batch weight = batch::load_aligned(weights + i);
                    (slope * weight * (batch::load_aligned(row + i) - batch::load_aligned(row_d + i))).store_aligned(row + i);
                }
            }
            // dK += dS^T Q, dQ^T += K^T dS^T
            if (want_dk) {
                macro_kernel<T>({.a = {.direct = dst, .ld = ld(bq)}, .b = {.direct = q + first * dp, .ld = ld(dp)}, .depth = queries,
                                 .c = matrix<T>{dk, rows_k, dp, ld(dp), 1}, .accumulate = true});
            }
            if (want_dq) {
                macro_kernel<T>({.a = {.direct = kt, .ld = ld(bk)}, .b = {.direct = dst, .ld = ld(bq)}, .depth = cols,
                                 .c = matrix<T>{dqt + first, size.d_rows, q_cols, ld(m_cols), 1}, .accumulate = true});
            }
        }
        if (want_dk) store_rows(dk, dp, cols, d, sub(in.dk, key, 0));
        if (want_dv) store_rows(dv_sums, dvp, cols, dv, sub(in.dv, key, 0));
    }
    if (want_dq) store_rows(dqt, m_cols, d, m, transposed(dq));
}

}  // namespace detail

template <class T>
void attention_gradient(const attention_gradient_problem<T>& p) {
    using namespace detail;
    using tiling = attention_gradient_tiling<T>;
    const std::size_t m = p.q.rows, n = p.k.rows, d = p.q.cols, dv = p.v.cols, items = p.batch.count();
    if (items == 0) return;
    if (!p.lse) throw std::logic_error("dimsum: attention_gradient: the forward's log-sum-exps are missing");
    if (m == 0 || n == 0) {  // no queries or no keys: no weights, every gradient 0
        auto zero = [](const matrix<T>& x) {
            for (std::size_t i = 0; i < x.rows; ++i) {
                for (std::size_t j = 0; j < x.cols; ++j) x.data[x.at(i, j)] = T(0);
            }
        };
        for (std::size_t item = 0; item < items; ++item) {
            const item_view<T> at = item_of(p, item);
            for (const matrix<T>* x : {&at.dq, &at.dk, &at.dv}) {
                if (x->data) zero(*x);
            }
        }
        return;
    }
    const double work = double(items) * double(m) * double(n) * double(d + dv);
    const int threads = work < attention_tiling<T>::parallel_work ? 1 : num_threads();
    const std::size_t query_blocks = (m + tiling::queries - 1) / tiling::queries;
    const std::size_t key_blocks = (n + tiling::keys - 1) / tiling::keys;
    // fewer items than threads: each item's keys split between tasks, in whole blocks
    std::size_t splits = 1;
    if (items < std::size_t(threads)) {
        splits = std::clamp<std::size_t>((2 * std::size_t(threads) + items - 1) / items, 1, std::min(key_blocks, tiling::max_splits));
    }
    const std::size_t blocks_per_split = (key_blocks + splits - 1) / splits;
    splits = (key_blocks + blocks_per_split - 1) / blocks_per_split;  // none empty
    const bool want_dq = p.dq.data, want_ds = want_dq || p.dk.data;  // (see at the top)
    const std::size_t partial_size = splits > 1 && want_dq ? m * d : 0;  // per task

    // The caller's scratch, shared by the team: D per query, the partial dQs.
    T* rows_d = scratch<T>(scratch_use::attention_rows, items * m + items * splits * partial_size);
    T* partials = rows_d + items * m;
    const task_sizes size = sizes_of(p);
    auto prepare = [&] {
        scratch<T>(scratch_use::attention_gradient, size.total());
        p.scores.prepare();
    };
    if (want_ds) {
        for_each_index(threads, items * query_blocks, prepare, [&](std::size_t unit) {
            const std::size_t item = unit % items, first = unit / items * tiling::queries, queries = std::min(tiling::queries, m - first);
            output_dots(p, item, first, queries, rows_d + item * m + first);
        });
    }
    for_each_index(threads, items * splits, prepare, [&](std::size_t task) {
        const std::size_t item = task / splits, split = task % splits;
        const std::size_t first_key = split * blocks_per_split * tiling::keys;
        const std::size_t last_key = std::min(n, (split + 1) * blocks_per_split * tiling::keys);
        const matrix<T> dq = splits > 1 && want_dq ? matrix<T>{partials + task * partial_size, m, d, static_cast<std::ptrdiff_t>(d), 1}
                                                   : item_of(p, item).dq;  // (null: not wanted)
        key_range(p, item, first_key, last_key, p.lse + item * m, rows_d + item * m, dq);
    });
    if (splits == 1 || !want_dq) return;
    for (std::size_t item = 0; item < items; ++item) {  // the partial dQs, added in order
        const matrix<T> dq = item_of(p, item).dq;
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t c = 0; c < d; ++c) {
                T sum = 0;
                for (std::size_t s = 0; s < splits; ++s) sum += partials[(item * splits + s) * partial_size + i * d + c];
                dq.data[dq.at(i, c)] = sum;
            }
        }
    }
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
