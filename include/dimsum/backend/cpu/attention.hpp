#pragma once
// Attention without the queries x keys matrix: FlashAttention's idea on a CPU. For a block of
// queries the keys are visited a block at a time; each block of scores S = Q K^T lives only
// in a tile of this thread's scratch, and an online softmax keeps, per query, the running
// maximum m and normaliser l of the weights seen so far and rescales the running output when
// m grows:
//     m' = max(m, max_j s_j),  p_j = exp(s_j - m'),  l' = l e^(m - m') + sum_j p_j,
//     O' = O e^(m - m') + P V_block,               and finally O / l.
// Both products go through the GEMM's micro-kernel (gemm.hpp): Q is packed (and scaled) once
// per block of queries, K^T once per item, or once per visit when an item's blocks of queries
// go to different threads; P and a row-major V are read in place. A block of one or two
// queries (decoding) takes dot products instead, with no packing.
//
// Work: with items (batch x heads) enough for every thread, a task is an item. Otherwise tasks
// are (item, block of queries), the most expensive first (with a causal mask the last queries
// see the most keys), handed out one at a time so that the threads finish together; and when
// there are fewer of those than threads (decoding one sequence), each task's keys are split
// too, and the partial results (O, m, l) merged.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>

#include "dimsum/backend/cpu/gemm.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/rowwise.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/backend/cpu/workspace.hpp"
#include "dimsum/core/functors.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

template <class T>
struct attention_tiling {
    // Queries per block, a whole number of the micro-kernel's row panels: larger blocks pack
    // each K block for more queries, smaller ones waste less on a causal diagonal and leave
    // more tasks to share. The block's scores (96 x 256) and output (96 x d_v) stay in L2.
    static constexpr std::size_t queries = 8 * gemm_tiling<T>::mr;
    // Keys per block, a whole number of the micro-kernel's column panels: 256 rather than 128
    // halves the online softmax's rescaling of O and doubles the depth of each P V product
    // (3 to 10% faster side by side, seq 2048, one thread).
    static constexpr std::size_t keys = 8 * gemm_tiling<T>::nr;
    // Blocks of at most this many queries take dot products instead of the micro-kernel,
    // whose panels of mr rows would be mostly padding.
    static constexpr std::size_t few_queries = 2;
    // Below this many multiply-adds a problem runs on one thread: a team costs more.
    static constexpr double parallel_work = 1 << 18;
    // The most parts one task's keys are split into (two per thread balance them well enough).
    static constexpr std::size_t max_splits = 16;
};

namespace detail {

// The operands' places in attention_problem::batch.
enum operand : std::size_t { q_operand, k_operand, v_operand, o_operand };

// How many keys query q sees: those not in its future (evaluation::in_future).
inline std::size_t visible_keys(std::size_t query, std::size_t queries, std::size_t keys) {
    return query + keys + 1 > queries ? std::min(keys, query + keys + 1 - queries) : 0;
}

// What a task leaves when its keys are split: its unnormalised output and, per query, m and l.
template <class T>
struct partial_result {
    T* out;  // (rows, dv_pad)
    T* max;  // (rows)
    T* sum;  // (rows)
};

// For a block of few queries (decoding: one), the micro-kernel's panels of mr rows would
// mostly multiply padding. Such blocks take each score as one dot product, and each output
// row as a sum of value rows, with no packing.

// scores[i * ld + j] = q_i . k_j for i < queries and j < cols; q's rows contiguous (d values,
// `q_stride` apart), k's rows `k_row` apart with their values `k_col` apart, of T or bf16.
template <class T, class U>
void scores_by_rows(const T* q, std::size_t q_stride, std::size_t queries, const U* k, std::ptrdiff_t k_row,
                    std::ptrdiff_t k_col, std::size_t cols, std::size_t d, T* scores, std::size_t ld) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size, keys_at_once = 4;  // four independent sums hide the FMA latency
    const std::size_t vector_d = k_col == 1 ? d / width * width : 0;
    for (std::size_t i = 0; i < queries; ++i) {
        const T* qi = q + i * q_stride;
        T* row = scores + i * ld;
        for (std::size_t j = 0; j < cols; j += keys_at_once) {
            const std::size_t group = std::min(keys_at_once, cols - j);
            const U* kj[keys_at_once];
            for (std::size_t g = 0; g < keys_at_once; ++g) kj[g] = k + static_cast<std::ptrdiff_t>(j + std::min(g, group - 1)) * k_row;
            batch sum[keys_at_once] = {batch(T(0)), batch(T(0)), batch(T(0)), batch(T(0))};
            for (std::size_t c = 0; c < vector_d; c += width) {
                batch qc = batch::load_unaligned(qi + c);
                for (std::size_t g = 0; g < keys_at_once; ++g) sum[g] = xsimd::fma(qc, load_widened<T>(kj[g] + c), sum[g]);
            }
            for (std::size_t g = 0; g < group; ++g) {
                T total = xsimd::hadd(sum[g]);
                for (std::size_t c = vector_d; c < d; ++c) total += qi[c] * static_cast<T>(kj[g][static_cast<std::ptrdiff_t>(c) * k_col]);
                row[j + g] = total;
            }
        }
    }
}

// out[i * ld_out + c] += sum_j p[i * ld_p + j] v_j[c] for i < queries, c < dv; v's rows `v_row`
// apart with their values `v_col` apart, of T or bf16.
template <class T, class U>
void values_by_rows(const T* p, std::size_t ld_p, std::size_t queries, const U* v, std::ptrdiff_t v_row,
                    std::ptrdiff_t v_col, std::size_t cols, std::size_t dv, T* out, std::size_t ld_out) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    const std::size_t vector_dv = v_col == 1 ? dv / width * width : 0;
    for (std::size_t i = 0; i < queries; ++i) {
        T* o = out + i * ld_out;
        for (std::size_t j = 0; j < cols; ++j) {
            const T weight = p[i * ld_p + j];
            const U* vj = v + static_cast<std::ptrdiff_t>(j) * v_row;
            for (std::size_t c = 0; c < vector_dv; c += width) {
                xsimd::fma(batch(weight), load_widened<T>(vj + c), batch::load_aligned(o + c)).store_aligned(o + c);
            }
            for (std::size_t c = vector_dv; c < dv; ++c) o[c] += weight * static_cast<T>(vj[static_cast<std::ptrdiff_t>(c) * v_col]);
        }
    }
}

// Q, K and V of batch item `item`, of T or bf16 (gemm.hpp's source).
template <class T>
struct item_inputs {
    source<T> q, k, v;
};
template <class T>
item_inputs<T> inputs_of(const attention_problem<T>& p, std::size_t item) {
    const auto at = p.batch.offsets(item);
    item_inputs<T> r{{p.q, p.q_bf16}, {p.k, p.k_bf16}, {p.v, p.v_bf16}};
    r.q.advance(at[q_operand]);
    r.k.advance(at[k_operand]);
    r.v.advance(at[v_operand]);
    return r;
}

// Keys [first, first + count) of k (keys, d) transposed, (d, count), into the micro-kernel's
// column panels: key j's d values at out + (j / nr) * nr * d.
template <class T>
void pack_keys(const source<T>& k, std::size_t first, std::size_t count, T* out) {
    constexpr std::size_t nr = gemm_tiling<T>::nr;
    const std::size_t d = k.m.cols;
    k.visit([&](const auto& keys) {
        auto kt = transposed(sub(keys, first, 0));  // (d, count)
        for (std::size_t j = 0; j < count; j += nr) pack_b_panel<T>(sub(kt, 0, j), std::min(nr, count - j), d, out + j * d);
    });
}

// One task: queries [first_query, first_query + queries) of batch item `item`, against keys
// [first_key, last_key). Writes O to the problem's output, or, when `partial` is given, the
// unnormalised result there. `item_keys`, if given, holds the item's K^T already packed in
// column panels (pack_keys), shared by its blocks of queries.
// The sizes of attend_block's tiles for a block of `queries` queries, each rounded to whole
// cache lines (the row passes use aligned loads).
struct block_tiles {
    std::size_t q, k, v, s, o, rows;
    std::size_t total() const { return q + k + v + s + o + 2 * rows; }
};
template <class T>
block_tiles tiles_for(const attention_problem<T>& p, std::size_t queries) {
    constexpr std::size_t line = 64 / sizeof(T), block_keys = attention_tiling<T>::keys;
    const std::size_t d = p.q.cols, rows = round_up(queries, gemm_tiling<T>::mr);
    const std::size_t dv_pad = round_up(p.v.cols, gemm_tiling<T>::nr);
    return {round_up(rows * d, line), round_up(block_keys * d, line), block_keys * dv_pad, rows * block_keys,
            rows * dv_pad, rows};
}

template <class T>
void attend_block(const attention_problem<T>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                  std::size_t first_key, std::size_t last_key, const partial_result<T>* partial, const T* item_keys) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size, mr = gemm_tiling<T>::mr, nr = gemm_tiling<T>::nr;
    constexpr std::size_t block_keys = attention_tiling<T>::keys;
    constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
    const std::size_t d = p.q.cols, dv = p.v.cols, m = p.q.rows, n = p.k.rows;
    const std::size_t rows = round_up(queries, mr), dv_pad = round_up(dv, nr);

    // this item's operands: q (queries, d), k (keys, d), v (keys, dv)
    const auto at = p.batch.offsets(item);
    const item_inputs<T> in = inputs_of(p, item);

    // this thread's tiles, taken before the team's work began (attention's prepare)
    const block_tiles size = tiles_for(p, queries);
    T* packed_q = scratch<T>(scratch_use::attention, size.total());
    T* packed_k = packed_q + size.q;  // (d, block_keys) in column panels
    T* packed_v = packed_k + size.k;  // (block_keys, dv_pad) in column panels
    T* scores = packed_v + size.v;    // (rows, block_keys): S, then P
    T* out = scores + size.s;         // (rows, dv_pad): O
    T* row_max = out + size.o;        // (rows): m
    T* row_sum = row_max + rows;      // (rows): l
    // Q: in panels for the micro-kernel, or, for few queries, as contiguous rows
    const bool by_rows = queries <= attention_tiling<T>::few_queries;
    in.q.visit([&](const auto& all) {
        const auto q = sub(all, first_query, 0, queries, d);
        if (by_rows) copy_rows<T>(q, packed_q);
        else pack_a<T>(q, queries, d, packed_q);
    });
    if (p.scale != T(1)) scale_line(packed_q, rows * d, p.scale);  // (scale Q) K^T: once per query, not per score
    std::fill(out, out + rows * dv_pad, T(0));
    std::fill(row_max, row_max + rows, minus_infinity);
    std::fill(row_sum, row_sum + rows, T(0));

    // With a causal mask, no query of the block sees past what its last query sees.
    std::size_t end = last_key;
    if (p.causal) end = std::min(end, visible_keys(first_query + queries - 1, m, n));
    const bool v_in_place = !p.v_bf16 && p.v.col_stride == 1 && dv % nr == 0;

    for (std::size_t key = first_key; key < end; key += block_keys) {
        const std::size_t cols = std::min(block_keys, end - key), cols_pad = round_up(cols, nr);
        // pass 1: S = Q K^T for this block of keys; K^T (d, cols) is K read across
        if (by_rows) {
            in.k.visit([&](const auto& k) {
                scores_by_rows(packed_q, d, queries, sub(k, key, 0).data, k.row_stride, k.col_stride, cols, d, scores, block_keys);
            });
        } else {
            const T* panels = item_keys ? item_keys + key * d : packed_k;
            if (!item_keys) pack_keys(in.k, key, cols, packed_k);
            macro_kernel<T>({.a = {.packed = packed_q},
                             .b = {.packed = panels},
                             .depth = d,
                             .c = matrix<T>{scores, rows, cols_pad, static_cast<std::ptrdiff_t>(block_keys), 1}});
        }

        // pass 2: the score function, the masks, the online softmax; P replaces S
        if (p.scores.apply) p.scores.apply(p.scores.context, item, first_query, key, queries, cols, scores, block_keys);
        for (std::size_t i = 0; i < queries; ++i) {
            T* row = scores + i * block_keys;
            std::size_t live = cols;
            if (p.causal) {
                std::size_t visible = visible_keys(first_query + i, m, n);
                live = visible <= key ? 0 : std::min(cols, visible - key);
            }
            std::fill(row + live, row + cols_pad, minus_infinity);  // masked, and the padding
            const T top = fn::maximum{}(row_max[i], line_max(row, cols_pad));
            if (top == minus_infinity) {  // nothing visible yet: weights 0, m and l unchanged
                std::fill(row, row + cols_pad, T(0));
                continue;
            }
            const T rescale = std::exp(row_max[i] - top);  // 0 when m was -infinity
            row_max[i] = top;
            batch total(T(0));
            for (std::size_t j = 0; j < cols_pad; j += width) {
                batch e = xsimd::exp(batch::load_aligned(row + j) - batch(top));
                e.store_aligned(row + j);
                total += e;
            }
            row_sum[i] = row_sum[i] * rescale + xsimd::hadd(total);
            if (rescale != T(1)) scale_line(out + i * dv_pad, dv_pad, rescale);
        }

        // pass 3: O += P V_block, V read in place when its rows are whole panels (and of T)
        if (by_rows) {
            in.v.visit([&](const auto& v) {
                values_by_rows(scores, block_keys, queries, sub(v, key, 0).data, v.row_stride, v.col_stride, cols, dv, out, dv_pad);
            });
            continue;
        }
        if (!v_in_place) {
            in.v.visit([&](const auto& v) {
                auto block = sub(v, key, 0);  // (cols, dv)
                for (std::size_t c = 0; c < dv; c += nr) pack_b_panel<T>(sub(block, 0, c), std::min(nr, dv - c), cols, packed_v + c * cols);
            });
        }
        macro_kernel<T>({.a = {.direct = scores, .ld = static_cast<std::ptrdiff_t>(block_keys)},
                         .b = {.packed = packed_v, .direct = v_in_place ? sub(in.v.m, key, 0).data : nullptr, .ld = p.v.row_stride},
                         .depth = cols,
                         .c = matrix<T>{out, rows, dv_pad, static_cast<std::ptrdiff_t>(dv_pad), 1},
                         .accumulate = true});
    }

    if (partial) {
        std::copy(out, out + queries * dv_pad, partial->out);
        std::copy(row_max, row_max + queries, partial->max);
        std::copy(row_sum, row_sum + queries, partial->sum);
        return;
    }
    matrix<T> o = sub(matrix<T>{p.o.data + at[o_operand], m, dv, p.o.row_stride, p.o.col_stride}, first_query, 0);
    for (std::size_t i = 0; i < queries; ++i) {
        const T inverse = row_sum[i] == T(0) ? T(0) : T(1) / row_sum[i];  // 0: every key masked
        T* row = out + i * dv_pad;
        scale_line(row, dv, inverse);
        T* target = o.data + static_cast<std::ptrdiff_t>(i) * o.row_stride;
        if (o.col_stride == 1) std::copy(row, row + dv, target);
        else for (std::size_t c = 0; c < dv; ++c) target[static_cast<std::ptrdiff_t>(c) * o.col_stride] = row[c];
    }
}

// O for queries [first_query, first_query + queries) of `item` from the partial results of
// `splits` tasks over consecutive ranges of keys.
template <class T>
void merge_partials(const attention_problem<T>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                    const partial_result<T>* parts, std::size_t splits) {
    const std::size_t dv = p.v.cols, dv_pad = round_up(dv, gemm_tiling<T>::nr);
    matrix<T> o = sub(matrix<T>{p.o.data + p.batch.offsets(item)[o_operand], p.q.rows, dv, p.o.row_stride, p.o.col_stride},
                      first_query, 0);
    for (std::size_t i = 0; i < queries; ++i) {
        T top = -std::numeric_limits<T>::infinity();
        for (std::size_t s = 0; s < splits; ++s) top = fn::maximum{}(top, parts[s].max[i]);
        T total = 0;
        for (std::size_t s = 0; s < splits; ++s) total += parts[s].max[i] == top ? parts[s].sum[i] : parts[s].sum[i] * std::exp(parts[s].max[i] - top);
        const T inverse = total == T(0) ? T(0) : T(1) / total;
        T* target = o.data + static_cast<std::ptrdiff_t>(i) * o.row_stride;
        for (std::size_t c = 0; c < dv; ++c) {
            T value = 0;
            for (std::size_t s = 0; s < splits; ++s) {
                T weight = parts[s].max[i] == top ? T(1) : std::exp(parts[s].max[i] - top);
                value += weight * parts[s].out[i * dv_pad + c];
            }
            target[static_cast<std::ptrdiff_t>(c) * o.col_stride] = value * inverse;
        }
    }
}

}  // namespace detail

// (kernels.hpp)
template <class T>
void attention(const attention_problem<T>& p) {
    using tiling = attention_tiling<T>;
    const std::size_t m = p.q.rows, n = p.k.rows, d = p.q.cols, dv = p.v.cols, items = p.batch.count();
    if (m == 0 || dv == 0 || items == 0) return;
    const std::size_t query_blocks = (m + tiling::queries - 1) / tiling::queries;
    const std::size_t key_blocks = (n + tiling::keys - 1) / tiling::keys;
    const std::size_t units = items * query_blocks;
    const double work = double(items) * double(m) * double(n) * double(d + dv);
    const int threads = work < tiling::parallel_work ? 1 : num_threads();

    // Few tasks for the threads: split each task's keys too, in whole key blocks.
    std::size_t splits = 1;
    if (units < std::size_t(threads)) {
        splits = std::min({key_blocks, tiling::max_splits, (2 * std::size_t(threads) + units - 1) / units});
        splits = std::max<std::size_t>(splits, 1);
    }
    const std::size_t blocks_per_split = (key_blocks + splits - 1) / splits;

    // The partial results live in the caller's scratch, shared by the team.
    const std::size_t rows = detail::round_up(tiling::queries, gemm_tiling<T>::mr);
    const std::size_t dv_pad = detail::round_up(dv, gemm_tiling<T>::nr), part_size = rows * (dv_pad + 2);
    T* parts = splits > 1 ? scratch<T>(scratch_use::attention_partials, units * splits * part_size) : nullptr;
    auto part = [&](std::size_t task) {
        T* base = parts + task * part_size;
        return detail::partial_result<T>{base, base + rows * dv_pad, base + rows * dv_pad + rows};
    };

    // Task t: the query blocks from the last (the most keys under a causal mask) to the first.
    auto unit_of = [&](std::size_t unit, std::size_t& item, std::size_t& first_query, std::size_t& queries) {
        std::size_t block = query_blocks - 1 - unit / items;
        item = unit % items;
        first_query = block * tiling::queries;
        queries = std::min(tiling::queries, m - first_query);
    };
    // With items enough for every thread, a task is a whole item: its K packed once for all
    // its blocks of queries.
    const bool whole_items = query_blocks > 1 && m > tiling::few_queries && items >= 2 * std::size_t(threads);
    // What a thread needs before it writes anything (threads.hpp): its tiles for the largest
    // block, an item's packed K, the score function's memory. A failed allocation then leaves O
    // untouched.
    const std::size_t keys_size = detail::round_up(n, gemm_tiling<T>::nr) * d;
    auto prepare = [&] {
        scratch<T>(scratch_use::attention, detail::tiles_for(p, std::min(tiling::queries, m)).total());
        if (whole_items) scratch<T>(scratch_use::attention_keys, keys_size);
        p.scores.prepare();
    };
    auto run_task = [&](std::size_t task) {
        if (whole_items) {
            T* keys = scratch<T>(scratch_use::attention_keys, keys_size);
            detail::pack_keys(detail::inputs_of(p, task).k, 0, n, keys);
            for (std::size_t block = query_blocks; block-- > 0;) {
                std::size_t first_query = block * tiling::queries;
                detail::attend_block<T>(p, task, first_query, std::min(tiling::queries, m - first_query), 0, n, nullptr, keys);
            }
            return;
        }
        std::size_t item, first_query, queries;
        unit_of(task / splits, item, first_query, queries);
        std::size_t split = task % splits;
        std::size_t first_key = std::min(n, split * blocks_per_split * tiling::keys);
        std::size_t last_key = std::min(n, (split + 1) * blocks_per_split * tiling::keys);
        if (splits == 1) return detail::attend_block<T>(p, item, first_query, queries, 0, n, nullptr, nullptr);
        auto partial = part(task);
        detail::attend_block<T>(p, item, first_query, queries, first_key, last_key, &partial, nullptr);
    };
    const std::size_t tasks = whole_items ? items : units * splits;
    if (threads == 1) {
        prepare();
        for (std::size_t task = 0; task < tasks; ++task) run_task(task);
    } else {
        std::atomic<std::size_t> next{0};
        auto prepare_member = [&](std::size_t, std::size_t) { prepare(); };
        run_parallel(int(std::min<std::size_t>(std::size_t(threads), tasks)), prepare_member, [&](std::size_t, std::size_t) {
            for (std::size_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) run_task(task);
        });
    }
    if (splits == 1) return;
    for (std::size_t unit = 0; unit < units; ++unit) {
        std::size_t item, first_query, queries;
        unit_of(unit, item, first_query, queries);
        detail::partial_result<T> split_parts[tiling::max_splits];
        for (std::size_t s = 0; s < splits; ++s) split_parts[s] = part(unit * splits + s);
        detail::merge_partials(p, item, first_query, queries, split_parts, splits);
    }
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
