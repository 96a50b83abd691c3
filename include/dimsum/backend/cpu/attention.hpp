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
//
// Q, K and V all stored as bf16, on the amx or avx512_bf16 path (bf16_paths.hpp), take the
// same steps on the bf16 dot-product kernels (bf16_gemm.hpp) instead: Q's rows and K's pairs
// give S in float, the online softmax runs in float, and P, rounded to bf16 (as FlashAttention
// rounds it on tensor cores), times V's pairs adds to O in float. V cannot be read in place
// there (its keys go in pairs), so a task that is a whole item packs it once, as it packs K^T.
// Only the products and the softmax's e^x differ (a shorter one, good to 1.7e-7, since P is
// rounded next: bf16_weights): the tasks, the masks, the softmax and the merging are the
// float kernel's.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>

#include "dimsum/backend/cpu/bf16_gemm.hpp"
#include "dimsum/backend/cpu/bf16_paths.hpp"
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

// Q, K and V of batch item `item`, as stored.
template <class T>
struct item_inputs {
    source_matrix<T> q, k, v;
};
template <class T>
item_inputs<T> inputs_of(const attention_problem<T>& p, std::size_t item) {
    const auto at = p.batch.offsets(item);
    item_inputs<T> r{p.q, p.k, p.v};
    r.q.advance(at[q_operand]);
    r.k.advance(at[k_operand]);
    r.v.advance(at[v_operand]);
    return r;
}

// Keys [first, first + count) of k (keys, d) transposed, (d, count), into the micro-kernel's
// column panels: key j's d values at out + (j / nr) * nr * d.
template <class T>
void pack_keys(const source_matrix<T>& k, std::size_t first, std::size_t count, T* out) {
    constexpr std::size_t nr = gemm_tiling<T>::nr;
    const std::size_t d = k.cols;
    k.visit([&](const auto& keys) {
        auto kt = transposed(sub(keys, first, 0));  // (d, count)
        for (std::size_t j = 0; j < count; j += nr) pack_b_panel<T>(sub(kt, 0, j), std::min(nr, count - j), d, out + j * d);
    });
}

// The largest of a row's live scores, after row[j] *= scale (unless scaled is false) for j <
// live and row[j] = -infinity for the rest of the batch that holds row[live - 1]: the batches
// past it are online_softmax's to zero. row aligned to a batch. NaN if any live score is NaN.
template <class T, bool scaled>
T scaled_row_max(T* row, std::size_t live, T scale) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    batch top(-std::numeric_limits<T>::infinity());
    auto nan = xsimd::isnan(top);
    std::size_t j = 0;
    for (; j + width <= live; j += width) {
        batch v = batch::load_aligned(row + j);
        if constexpr (scaled) {
            v *= batch(scale);
            v.store_aligned(row + j);
        }
        nan = nan || xsimd::isnan(v);
        top = xsimd::max(top, v);
    }
    T result = xsimd::any(nan) ? std::numeric_limits<T>::quiet_NaN() : lanes_max(top);
    for (; j < live; ++j) {  // the batch a mask cuts
        if constexpr (scaled) row[j] *= scale;
        result = fn::maximum{}(result, row[j]);
    }
    std::fill(row + live, row + round_up(live, width), -std::numeric_limits<T>::infinity());
    return result;
}

// e^(x - top) for a row's scaled scores x, whose maximum is top: the weights of the online
// softmax. On the float kernel, float's e^x (exponential, within 2 ulp).
template <class T>
struct float_weights {
    simd<T> top;
    explicit float_weights(T row_top) : top(row_top) {}
    simd<T> operator()(const simd<T>& x) const { return exponential<T>(x - top); }
};

// On the bf16 kernels, whose P is rounded to bf16 next (by up to 2^-8 of itself), in about
// two thirds of exponential's instructions: e^(x - top) = 2^y with y = (x - top) log2(e),
// 2^y = 2^k 2^r with k the integer nearest y and r = y - k (exact, |r| <= 1/2), 2^r by a
// degree-5 polynomial (a minimax fit of relative error 1.7e-7 in float's arithmetic, measured
// on 2e6 points), and 2^k by vscalefps. y's roundings add 3 2^-24 |y| (test_bf16_attention
// derives its bound with both). y is held above -200, where 2^y is 0 in float, so that a
// masked score (-infinity) gives 0, not NaN; a NaN stays NaN (the max takes y second).
struct bf16_weights {
#if defined(__AVX512F__)
    __m512 top;
    explicit bf16_weights(float row_top) : top(_mm512_set1_ps(row_top)) {}
    simd<float> operator()(const simd<float>& x) const {
        const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
        const __m512 y = _mm512_max_ps(_mm512_set1_ps(-200.0f), _mm512_mul_ps(_mm512_sub_ps(x, top), log2e));
        const __m512 k = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 r = _mm512_sub_ps(y, k);
        __m512 p = _mm512_set1_ps(1.3264631852507591e-3f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.671486914157867e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550733581185341e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022242426872253e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931470036506653e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
        return _mm512_scalef_ps(p, k);
    }
#else
    float_weights<float> exact;  // elsewhere float's own
    explicit bf16_weights(float row_top) : exact(row_top) {}
    simd<float> operator()(const simd<float>& x) const { return exact(x); }
#endif
};

// pass 2 of a block of keys, whichever kernel multiplies: the scale (where the kernel did not
// scale Q), the score function, the masks, the online softmax with Weights (above). scores
// (queries, cols_pad), `ld` apart: S in, P out (0 past the live keys), each row handed to
// row_done(i, row) while it is still in L1 (the bf16 kernels round it there; a pass over the
// whole tile afterwards read it back from L2); out (queries, ld_out): O, rescaled where a row's
// maximum grew.
template <class T, class Weights, class RowDone>
void online_softmax(const attention_problem<T>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                    std::size_t key, std::size_t cols, std::size_t cols_pad, T scale, T* scores, std::size_t ld, T* row_max,
                    T* row_sum, T* out, std::size_t ld_out, RowDone&& row_done) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
    const std::size_t m = p.q.rows, n = p.k.rows;
    if (p.scores.apply) {  // the function sees scaled scores
        if (scale != T(1)) {
            for (std::size_t i = 0; i < queries; ++i) scale_line(scores + i * ld, cols_pad, scale);
        }
        scale = T(1);
        p.scores.apply(p.scores.context, item, first_query, key, queries, cols, scores, ld);
    }
    // Rows a batch's lanes at a time: their maxima first (independent chains, whose latencies
    // overlap), then their rescalings e^(m - top) in one exponential, then each row's weights.
    // Row by row, each row waited on its own maximum and its e^x (measured on a Zen 5).
    constexpr std::size_t group = width;
    for (std::size_t first = 0; first < queries; first += group) {
        const std::size_t rows = std::min(group, queries - first);
        alignas(64) T old_max[group] = {}, top[group] = {}, rescale[group];
        std::size_t live[group];
        for (std::size_t g = 0; g < rows; ++g) {
            T* row = scores + (first + g) * ld;
            live[g] = cols;
            if (p.causal) {
                const std::size_t visible = visible_keys(first + g + first_query, m, n);
                live[g] = visible <= key ? 0 : std::min(cols, visible - key);
            }
            const T largest =
                scale == T(1) ? scaled_row_max<T, false>(row, live[g], scale) : scaled_row_max<T, true>(row, live[g], scale);
            old_max[g] = row_max[first + g];
            top[g] = fn::maximum{}(old_max[g], largest);
        }
        // 0 where m was -infinity, 1 where the maximum stayed (NaN for a row with nothing
        // visible yet, which takes none)
        exponential<T>(batch::load_aligned(old_max) - batch::load_aligned(top)).store_aligned(rescale);
        for (std::size_t g = 0; g < rows; ++g) {
            const std::size_t i = first + g;
            T* row = scores + i * ld;
            if (top[g] == minus_infinity) {  // nothing visible yet: weights 0, m and l unchanged
                std::fill(row, row + cols_pad, T(0));
                row_done(i, row);
                continue;
            }
            row_max[i] = top[g];
            // the weights of the batches with a live score, in two sums (one would be a chain of
            // dependent additions as long as the row), and 0 past them
            const Weights weight(top[g]);
            const std::size_t live_pad = round_up(live[g], width);
            batch total[2] = {batch(T(0)), batch(T(0))};
            std::size_t j = 0;
            for (; j + 2 * width <= live_pad; j += 2 * width) {
                const batch e0 = weight(batch::load_aligned(row + j)), e1 = weight(batch::load_aligned(row + j + width));
                e0.store_aligned(row + j);
                e1.store_aligned(row + j + width);
                total[0] += e0;
                total[1] += e1;
            }
            if (j < live_pad) {
                const batch e = weight(batch::load_aligned(row + j));
                e.store_aligned(row + j);
                total[0] += e;
            }
            std::fill(row + live_pad, row + cols_pad, T(0));
            row_sum[i] = row_sum[i] * rescale[g] + xsimd::hadd(total[0] + total[1]);
            if (rescale[g] != T(1)) scale_line(out + i * ld_out, ld_out, rescale[g]);
            row_done(i, row);
        }
    }
}

// Row `row` of O, final (dv contiguous values), written to the problem's output at `target`
// (its values `stride` apart): as float, unless no one reads those (o_unread), and rounded into
// o_rounded at the same offsets, if the problem has it.
template <class T>
void write_row_of_o(const attention_problem<T>& p, const T* row, T* target, std::ptrdiff_t stride, std::size_t dv) {
    if (!p.o_rounded || !p.o_unread) {
        if (stride == 1) std::copy(row, row + dv, target);
        else for (std::size_t c = 0; c < dv; ++c) target[static_cast<std::ptrdiff_t>(c) * stride] = row[c];
    }
    if (p.o_rounded) round_line(row, 1, p.o_rounded, target - p.o.data, stride, dv);
}

// The end of a task, whichever kernel multiplied: O / l into the problem's output, or, with
// `partial`, O, m and l as they are, for merge_partials. out (queries, ld_out).
template <class T>
void finish_block(const attention_problem<T>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                  const partial_result<T>* partial, T* out, std::size_t ld_out, const T* row_max, const T* row_sum) {
    if (partial) {
        std::copy(out, out + queries * ld_out, partial->out);
        std::copy(row_max, row_max + queries, partial->max);
        std::copy(row_sum, row_sum + queries, partial->sum);
        return;
    }
    const std::size_t dv = p.v.cols;
    const matrix<T> o = sub(matrix<T>{p.o.data + p.batch.offsets(item)[o_operand], p.q.rows, dv, p.o.row_stride, p.o.col_stride},
                            first_query, 0);
    if (p.lse) {  // log(l e^m): -infinity where every key is masked (l = 0)
        for (std::size_t i = 0; i < queries; ++i) p.lse[item * p.q.rows + first_query + i] = row_max[i] + std::log(row_sum[i]);
    }
    for (std::size_t i = 0; i < queries; ++i) {
        const T inverse = row_sum[i] == T(0) ? T(0) : T(1) / row_sum[i];  // 0: every key masked
        T* row = out + i * ld_out;
        scale_line(row, dv, inverse);
        write_row_of_o(p, row, o.data + static_cast<std::ptrdiff_t>(i) * o.row_stride, o.col_stride, dv);
    }
}

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

// One task on the float micro-kernel: queries [first_query, first_query + queries) of batch
// item `item`, against keys [first_key, last_key). Writes O to the problem's output, or, when
// `partial` is given, the unnormalised result there. `item_keys`, if given, holds the item's
// K^T already packed in column panels (pack_keys), shared by its blocks of queries.
template <class T>
void attend_block(const attention_problem<T>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                  std::size_t first_key, std::size_t last_key, const partial_result<T>* partial, const T* item_keys) {
    constexpr std::size_t nr = gemm_tiling<T>::nr, block_keys = attention_tiling<T>::keys;
    const std::size_t d = p.q.cols, dv = p.v.cols, m = p.q.rows, n = p.k.rows;
    const std::size_t rows = round_up(queries, gemm_tiling<T>::mr), dv_pad = round_up(dv, nr);

    // this item's operands: q (queries, d), k (keys, d), v (keys, dv)
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
    std::fill(row_max, row_max + rows, -std::numeric_limits<T>::infinity());
    std::fill(row_sum, row_sum + rows, T(0));

    // With a causal mask, no query of the block sees past what its last query sees.
    std::size_t end = last_key;
    if (p.causal) end = std::min(end, visible_keys(first_query + queries - 1, m, n));
    const bool v_in_place = p.v.holds_own() && p.v.col_stride == 1 && dv % nr == 0;

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

        // pass 2: P replaces S
        online_softmax<T, float_weights<T>>(p, item, first_query, queries, key, cols, cols_pad, T(1), scores, block_keys, row_max,
                                            row_sum, out, dv_pad, [](std::size_t, const T*) {});

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
                         .b = {.packed = packed_v, .direct = v_in_place ? sub(in.v.own(), key, 0).data : nullptr, .ld = p.v.row_stride},
                         .depth = cols,
                         .c = matrix<T>{out, rows, dv_pad, static_cast<std::ptrdiff_t>(dv_pad), 1},
                         .accumulate = true});
    }
    finish_block(p, item, first_query, queries, partial, out, dv_pad, row_max, row_sum);
}

// ---- the blocks on the bf16 dot-product kernels (Q, K and V stored as bf16)

// An item's K^T and V in pairs, packed once for all its blocks of queries (pair_blocks).
struct packed_pairs {
    const bf16* keys = nullptr;    // K^T: pack_bf16_b over every key, one depth block of d
    const bf16* values = nullptr;  // V: a block of keys at a time, as attend_pairs packs it
};
// Where, in packed_pairs::values, the block of keys that starts at `key` lies: each block
// holds its keys (padded to 32) x V's columns padded to 32 (dv_pad), so the blocks before
// it hold key x dv_pad.
inline std::size_t value_block_offset(std::size_t key, std::size_t dv_pad) {
    return key * dv_pad;
}

// The tiles of attend_pairs for a block of `queries` queries, in bytes from the start, each
// at a cache line: Q's rows, a block of K's pairs, of V's pairs and of P in bf16; S (then P),
// O, m and l in float.
struct pair_tiles {
    std::size_t q, k, v, p, s, o, max, sum, total;
};
template <class Kernel>
pair_tiles pair_tiles_for(const attention_problem<float>& p, std::size_t queries, std::size_t block_keys) {
    constexpr std::size_t line = 64, step = bf16_blocking::depth_step, cols = bf16_blocking::cols;
    const std::size_t rows = round_up(queries, Kernel::rows), dp = round_up(p.q.cols, step);
    const std::size_t dv_pad = round_up(p.v.cols, cols);
    pair_tiles t{};
    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
        const std::size_t here = at;
        at += round_up(bytes, line);
        return here;
    };
    t.q = take(rows * dp * sizeof(bf16));
    t.k = take(block_keys * dp * sizeof(bf16));
    t.v = take(dv_pad * block_keys * sizeof(bf16));
    t.p = take(rows * block_keys * sizeof(bf16));
    t.s = take(rows * block_keys * sizeof(float));
    t.o = take(rows * dv_pad * sizeof(float));
    t.max = take(rows * sizeof(float));
    t.sum = take(rows * sizeof(float));
    t.total = at;
    return t;
}

// One task as attend_block's, on a bf16 kernel (bf16_gemm.hpp): Q in panels of the kernel's
// rows, K^T and each block of V in pairs (32 columns a panel), all depths padded with zero to
// 32; S and O in float. `packed`, if given, holds the item's K^T and V in pairs (pair_blocks).
template <class Kernel>
void attend_pairs(const attention_problem<float>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                  std::size_t first_key, std::size_t last_key, const partial_result<float>* partial,
                  const packed_pairs& packed, std::size_t block_keys) {
    constexpr std::size_t tile_rows = Kernel::rows, tile_cols = bf16_blocking::cols;
    const std::size_t d = p.q.cols, dv = p.v.cols, m = p.q.rows, n = p.k.rows;
    const std::size_t rows = round_up(queries, tile_rows), dp = round_up(d, bf16_blocking::depth_step);
    const std::size_t dv_pad = round_up(dv, tile_cols);

    // this item's operands: q (queries, d), k (keys, d), v (keys, dv), each of bf16
    const item_inputs<float> in = inputs_of(p, item);
    const matrix<const bf16> q = in.q.stored<bf16>(), k = in.k.stored<bf16>(), v = in.v.stored<bf16>();

    // this thread's tiles, taken before the team's work began (attention's prepare)
    const pair_tiles at = pair_tiles_for<Kernel>(p, queries, block_keys);
    unsigned char* base = scratch<unsigned char>(scratch_use::attention, at.total);
    bf16* packed_q = reinterpret_cast<bf16*>(base + at.q);   // (rows, dp)
    bf16* packed_k = reinterpret_cast<bf16*>(base + at.k);   // (dp, block_keys) in pairs
    bf16* packed_v = reinterpret_cast<bf16*>(base + at.v);   // (block_keys, dv_pad) in pairs
    bf16* packed_p = reinterpret_cast<bf16*>(base + at.p);   // (rows, cols_pad)
    float* scores = reinterpret_cast<float*>(base + at.s);   // (rows, block_keys): S, then P
    float* out = reinterpret_cast<float*>(base + at.o);      // (rows, dv_pad): O
    float* row_max = reinterpret_cast<float*>(base + at.max);
    float* row_sum = reinterpret_cast<float*>(base + at.sum);
    pack_bf16_a<tile_rows>(sub(q, first_query, 0, queries, d), queries, d, dp, packed_q);
    std::fill(out, out + rows * dv_pad, 0.0f);
    std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
    std::fill(row_sum, row_sum + rows, 0.0f);

    // the kernel configured for this task, released however it ends (AMX: this thread's tiles;
    // the score function is an elementwise pass and never touches them)
    configured_kernel<Kernel> configured;
    Kernel& kernel = configured.kernel;

    std::size_t end = last_key;
    if (p.causal) end = std::min(end, visible_keys(first_query + queries - 1, m, n));
    for (std::size_t key = first_key; key < end; key += block_keys) {
        const std::size_t cols = std::min(block_keys, end - key), cols_pad = round_up(cols, tile_cols);
        // pass 1: S = Q K^T, scaled in pass 2 (in float: Q scaled first would round again in bf16)
        const bf16* panels = packed.keys ? packed.keys + key * dp : packed_k;
        if (!packed.keys) pack_bf16_b(transposed(sub(k, key, 0, cols, d)), cols, d, dp, packed_k);
        for (std::size_t jr = 0; jr < cols_pad; jr += tile_cols) {
            for (std::size_t ir = 0; ir < rows; ir += tile_rows) {
                // the live rows only: a short last panel takes fewer rows' work (bf16_gemm.hpp)
                const matrix<float> tile{scores + ir * block_keys + jr, std::min(tile_rows, queries - ir), tile_cols,
                                         static_cast<std::ptrdiff_t>(block_keys), 1};
                kernel.block(packed_q + ir * dp, static_cast<std::ptrdiff_t>(dp), panels + jr * dp, dp, tile, false);
            }
        }

        // pass 2: P replaces S, each row rounded to bf16 as it is done
        auto round_p = [&](std::size_t i, const float* row) { Kernel::round_row(row, packed_p + i * cols_pad, cols_pad); };
        online_softmax<float, bf16_weights>(p, item, first_query, queries, key, cols, cols_pad, p.scale, scores, block_keys, row_max,
                                            row_sum, out, dv_pad, round_p);
        std::fill(packed_p + queries * cols_pad, packed_p + rows * cols_pad, bf16{});

        // pass 3: O += P V_block, V's block (cols, dv) in pairs of keys: the item's, packed
        // once, unless a causal mask cut the block short, whose depth past the last key seen
        // must be zero (P is 0 there, and 0 V is NaN where V is infinite)
        const bool item_block = packed.values && cols == std::min(block_keys, n - key);
        const bf16* values = item_block ? packed.values + value_block_offset(key, dv_pad) : packed_v;
        if (!item_block) pack_bf16_b(sub(v, key, 0, cols, dv), dv, cols, cols_pad, packed_v);
        for (std::size_t jr = 0; jr < dv_pad; jr += tile_cols) {
            for (std::size_t ir = 0; ir < rows; ir += tile_rows) {
                const matrix<float> tile{out + ir * dv_pad + jr, std::min(tile_rows, queries - ir), tile_cols,
                                         static_cast<std::ptrdiff_t>(dv_pad), 1};
                kernel.block(packed_p + ir * cols_pad, static_cast<std::ptrdiff_t>(cols_pad), values + jr * cols_pad, cols_pad, tile, true);
            }
        }
    }
    finish_block(p, item, first_query, queries, partial, out, dv_pad, row_max, row_sum);
}

// O for queries [first_query, first_query + queries) of `item` from the partial results of
// `splits` tasks over consecutive ranges of keys, each row of O `ld` apart in them.
template <class T>
void merge_partials(const attention_problem<T>& p, std::size_t item, std::size_t first_query, std::size_t queries,
                    const partial_result<T>* parts, std::size_t splits, std::size_t ld) {
    const std::size_t dv = p.v.cols;
    matrix<T> o = sub(matrix<T>{p.o.data + p.batch.offsets(item)[o_operand], p.q.rows, dv, p.o.row_stride, p.o.col_stride},
                      first_query, 0);
    for (std::size_t i = 0; i < queries; ++i) {
        T top = -std::numeric_limits<T>::infinity();
        for (std::size_t s = 0; s < splits; ++s) top = fn::maximum{}(top, parts[s].max[i]);
        T total = 0;
        for (std::size_t s = 0; s < splits; ++s) total += parts[s].max[i] == top ? parts[s].sum[i] : parts[s].sum[i] * std::exp(parts[s].max[i] - top);
        const T inverse = total == T(0) ? T(0) : T(1) / total;
        if (p.lse) p.lse[item * p.q.rows + first_query + i] = top + std::log(total);
        T* merged = parts[0].out + i * ld;  // each column read by its own sum first
        for (std::size_t c = 0; c < dv; ++c) {
            T value = 0;
            for (std::size_t s = 0; s < splits; ++s) {
                T weight = parts[s].max[i] == top ? T(1) : std::exp(parts[s].max[i] - top);
                value += weight * parts[s].out[i * ld + c];
            }
            merged[c] = value * inverse;
        }
        write_row_of_o(p, merged, o.data + static_cast<std::ptrdiff_t>(i) * o.row_stride, o.col_stride, dv);
    }
}

// The two kinds of task run_attention hands out. Each says its block sizes, the width its O
// rows are padded to, how it takes its tiles, and how it packs once what all blocks of an
// item's queries read (K^T; on the bf16 kernels V too).

// On the float micro-kernel (gemm.hpp), Q, K and V of T or widened from bf16.
template <class T>
struct float_blocks {
    using tiling = attention_tiling<T>;
    using packed_item = const T*;  // K^T
    static constexpr std::size_t queries = tiling::queries, keys = tiling::keys, row_step = gemm_tiling<T>::mr;
    const attention_problem<T>& p;

    std::size_t out_columns() const { return round_up(p.v.cols, gemm_tiling<T>::nr); }
    std::size_t keys_size() const { return round_up(p.k.rows, gemm_tiling<T>::nr) * p.q.cols; }
    void take_tiles(std::size_t block_queries) const { scratch<T>(scratch_use::attention, tiles_for(p, block_queries).total()); }
    void take_item() const { scratch<T>(scratch_use::attention_keys, keys_size()); }
    packed_item pack_item(std::size_t item) const {
        T* keys = scratch<T>(scratch_use::attention_keys, keys_size());
        pack_keys(inputs_of(p, item).k, 0, p.k.rows, keys);
        return keys;
    }
    void attend(std::size_t item, std::size_t first_query, std::size_t block_queries, std::size_t first_key, std::size_t last_key,
                const partial_result<T>* partial, packed_item item_keys) const {
        attend_block<T>(p, item, first_query, block_queries, first_key, last_key, partial, item_keys);
    }
};

// On a bf16 kernel (bf16_gemm.hpp), Q, K and V stored as bf16.
struct bf16_attention_tiling {
    // Queries per block: a whole number of both kernels' rows (12 on pairs, 32 on tiles), as
    // many as the float kernel's on AVX-512.
    static constexpr std::size_t queries = 96;
    // Keys per block: whole 32-column panels of S and 32-depth steps of P V.
    static constexpr std::size_t keys = 256;
};
template <class Kernel>
struct pair_blocks {
    using packed_item = packed_pairs;
    static constexpr std::size_t queries = bf16_attention_tiling::queries, keys = bf16_attention_tiling::keys;
    static constexpr std::size_t row_step = Kernel::rows;
    static_assert(queries % Kernel::rows == 0 && keys % bf16_blocking::cols == 0);
    const attention_problem<float>& p;

    std::size_t depth() const { return round_up(p.q.cols, bf16_blocking::depth_step); }
    std::size_t out_columns() const { return round_up(p.v.cols, bf16_blocking::cols); }
    std::size_t keys_size() const { return round_up(p.k.rows, bf16_blocking::cols) * depth(); }
    // V's blocks of keys, each as attend_pairs packs it (value_block_offset)
    std::size_t values_size() const { return round_up(p.k.rows, bf16_blocking::cols) * out_columns(); }
    void take_tiles(std::size_t block_queries) const {
        scratch<unsigned char>(scratch_use::attention, pair_tiles_for<Kernel>(p, block_queries, keys).total);
    }
    void take_item() const { scratch<bf16>(scratch_use::attention_keys, keys_size() + values_size()); }
    packed_item pack_item(std::size_t item) const {
        bf16* packed_k = scratch<bf16>(scratch_use::attention_keys, keys_size() + values_size());
        bf16* packed_v = packed_k + keys_size();
        const item_inputs<float> in = inputs_of(p, item);
        const matrix<const bf16> k = in.k.stored<bf16>(), v = in.v.stored<bf16>();  // (keys, d), (keys, dv)
        pack_bf16_b(transposed(k), k.rows, k.cols, depth(), packed_k);
        for (std::size_t key = 0; key < v.rows; key += keys) {
            const std::size_t cols = std::min(keys, v.rows - key);
            pack_bf16_b(sub(v, key, 0, cols, v.cols), v.cols, cols, round_up(cols, bf16_blocking::cols),
                        packed_v + value_block_offset(key, out_columns()));
        }
        return {packed_k, packed_v};
    }
    void attend(std::size_t item, std::size_t first_query, std::size_t block_queries, std::size_t first_key, std::size_t last_key,
                const partial_result<float>* partial, const packed_item& packed) const {
        attend_pairs<Kernel>(p, item, first_query, block_queries, first_key, last_key, partial, packed, keys);
    }
};

// The tasks of one attention problem, on the threads, each run by `blocks` (float_blocks or
// pair_blocks): see the top of this file.
template <class T, class Blocks>
void run_attention(const attention_problem<T>& p, const Blocks& blocks) {
    using tiling = attention_tiling<T>;
    constexpr std::size_t block_queries = Blocks::queries, block_keys = Blocks::keys;
    const std::size_t m = p.q.rows, n = p.k.rows, d = p.q.cols, dv = p.v.cols, items = p.batch.count();
    const std::size_t query_blocks = (m + block_queries - 1) / block_queries;
    const std::size_t key_blocks = (n + block_keys - 1) / block_keys;
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
    const std::size_t rows = round_up(block_queries, Blocks::row_step), ld = blocks.out_columns();
    const std::size_t part_size = rows * (ld + 2);
    T* parts = splits > 1 ? scratch<T>(scratch_use::attention_partials, units * splits * part_size) : nullptr;
    auto part = [&](std::size_t task) {
        T* base = parts + task * part_size;
        return partial_result<T>{base, base + rows * ld, base + rows * ld + rows};
    };

    // Task t: the query blocks from the last (the most keys under a causal mask) to the first.
    auto unit_of = [&](std::size_t unit, std::size_t& item, std::size_t& first_query, std::size_t& queries) {
        std::size_t block = query_blocks - 1 - unit / items;
        item = unit % items;
        first_query = block * block_queries;
        queries = std::min(block_queries, m - first_query);
    };
    // With items enough for every thread, a task is a whole item: its K (and, on the bf16
    // kernels, V) packed once for all its blocks of queries.
    const bool whole_items = query_blocks > 1 && m > tiling::few_queries && items >= 2 * std::size_t(threads);
    // What a thread needs before it writes anything (threads.hpp): its tiles for the largest
    // block, an item's packed K (and V), the score function's memory. A failed allocation
    // then leaves O untouched.
    auto prepare = [&] {
        blocks.take_tiles(std::min(block_queries, m));
        if (whole_items) blocks.take_item();
        p.scores.prepare();
    };
    const typename Blocks::packed_item not_packed{};  // each visit packs its own blocks
    auto run_task = [&](std::size_t task) {
        if (whole_items) {
            const auto packed = blocks.pack_item(task);
            for (std::size_t block = query_blocks; block-- > 0;) {
                std::size_t first_query = block * block_queries;
                blocks.attend(task, first_query, std::min(block_queries, m - first_query), 0, n, nullptr, packed);
            }
            return;
        }
        std::size_t item, first_query, queries;
        unit_of(task / splits, item, first_query, queries);
        std::size_t split = task % splits;
        std::size_t first_key = std::min(n, split * blocks_per_split * block_keys);
        std::size_t last_key = std::min(n, (split + 1) * blocks_per_split * block_keys);
        if (splits == 1) return blocks.attend(item, first_query, queries, 0, n, nullptr, not_packed);
        auto partial = part(task);
        blocks.attend(item, first_query, queries, first_key, last_key, &partial, not_packed);
    };
    const std::size_t tasks = whole_items ? items : units * splits;
    for_each_index(threads, tasks, prepare, run_task);
    if (splits == 1) return;
    for (std::size_t unit = 0; unit < units; ++unit) {
        std::size_t item, first_query, queries;
        unit_of(unit, item, first_query, queries);
        partial_result<T> split_parts[tiling::max_splits];
        for (std::size_t s = 0; s < splits; ++s) split_parts[s] = part(unit * splits + s);
        merge_partials(p, item, first_query, queries, split_parts, splits, ld);
    }
}

}  // namespace detail

// Whether Q, K and V are all stored as bf16.
inline bool stored_as_bf16(const attention_problem<float>& p) {
    return p.q.type == element_type::bf16 && p.k.type == element_type::bf16 && p.v.type == element_type::bf16;
}

// Attention with Q, K and V of bf16 on `Kernel` (bf16_gemm.hpp's tile_kernel or pair_kernel,
// over the instructions or the tests' stand-ins), whatever the path in use.
template <class Kernel>
void bf16_attention(const attention_problem<float>& p) {
    if (!stored_as_bf16(p)) throw std::logic_error("dimsum: bf16_attention: Q, K and V must all be of bf16");
    if (p.q.rows == 0 || p.v.cols == 0 || p.batch.count() == 0) return;
    detail::run_attention(p, detail::pair_blocks<Kernel>{p});
}

// (kernels.hpp) Q, K and V all of bf16 go to the bf16 kernels where the path in use has them
// (bf16_paths.hpp), unless the queries are so few that their products are dot products
// (decoding): those stay on the float kernel, bound by reading K and V.
template <class T>
void attention(const attention_problem<T>& p) {
    if (p.q.rows == 0 || p.v.cols == 0 || p.batch.count() == 0) return;
    if constexpr (std::is_same_v<T, float>) {
        if (stored_as_bf16(p)) {
            const bf16_path path = p.q.rows <= attention_tiling<T>::few_queries ? bf16_path::widen : current_bf16_path();
            detail::attentions_on(path).fetch_add(1, std::memory_order_relaxed);
            if (with_bf16_kernel(path, "attention", [&]<class Kernel>() { bf16_attention<Kernel>(p); })) return;
        }
    }
    detail::run_attention(p, detail::float_blocks<T>{p});
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
