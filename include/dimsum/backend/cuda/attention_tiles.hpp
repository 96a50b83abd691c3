#pragma once
// The tiled fused attention (FlashAttention-2's structure, in plain float arithmetic), as the
// body of one thread of a block: compiled by nvcc into src/cuda/attention.cu's kernel, and by
// g++ into the host stand-in (tests/cuda/host_device.cpp), which runs a block's 256 threads
// as fibers that meet at every barrier, so that the tile logic (masks, edges, the online softmax, the
// barriers and every shuffle being reached by all threads) is tested where no GPU is.
//
// One block per (batch item, 64 queries). The block keeps its queries in shared memory and
// walks the keys in tiles of 64: each tile of K and V is read from device memory once for all
// 64 queries, the 64 x 64 scores are computed from shared memory in registers, each thread
// owning 4 queries x 4 keys, and the online softmax and O += P V follow in the same tile.
//
// It computes what device::attention_row computes (device_functions.hpp): keys in a causal
// query's future are never read, a tile in which a query sees only -infinity leaves that query
// unchanged (its values are not read), a query that sees no key gets 0, NaN propagates. It
// takes float passes whose heads fit a tile (d, dv <= 128) with the keys not split.
// Not yet: tensor cores (3xTF32 or bf16), cp.async double buffering.

#include "dimsum/backend/cuda/device_functions.hpp"

namespace dimsum::backend::cuda::tiles {

inline constexpr int tile_queries = 64, tile_keys = 64;
inline constexpr int group = 16;                    // threads per query: the block is 16 x 16
inline constexpr int block_threads = group * group;  // thread (ty, tx) owns queries 4ty .. 4ty+3
inline constexpr int rows_per_thread = tile_queries / group, keys_per_thread = tile_keys / group;
inline constexpr std::size_t max_head = 128;

DIMSUM_HD inline bool accepts(const attention_pass& p) {
    return p.type == element_type::float32 && p.key_splits == 1 && p.d >= 1 && p.d <= max_head && p.dv >= 1 &&
           p.dv <= max_head && p.queries > 0;
}

// Shared memory, in this order: the offsets (8-byte aligned, first), then the float tiles.
struct layout {
    int q_stride = 0, k_stride = 0, p_stride = tile_keys + 1, dv = 0;
    std::size_t score_inputs = 0;
    std::size_t q_floats = 0, kp_floats = 0, v_floats = 0;
    std::size_t offset_bytes = 0;

    DIMSUM_HD explicit layout(const attention_pass& p) {
        // odd strides: 16 threads reading one column of 16 rows hit 16 banks
        q_stride = static_cast<int>(p.d | 1);
        k_stride = static_cast<int>(p.d | 1);
        dv = static_cast<int>(p.dv);
        score_inputs = p.has_score_function ? p.score.input_count : 0;
        q_floats = std::size_t(tile_queries) * static_cast<std::size_t>(q_stride);
        const std::size_t k_floats = std::size_t(tile_keys) * static_cast<std::size_t>(k_stride);
        const std::size_t p_floats = std::size_t(tile_queries) * static_cast<std::size_t>(p_stride);
        kp_floats = k_floats > p_floats ? k_floats : p_floats;  // K's tile, then the weights P in its place
        v_floats = std::size_t(tile_keys) * p.dv;
        // q's and o's offset per query, k's and v's of the item, each score input's per query
        offset_bytes = (2 * tile_queries + 2 + tile_queries * score_inputs) * sizeof(std::ptrdiff_t);
    }
    DIMSUM_HD std::size_t bytes() const { return offset_bytes + (q_floats + kp_floats + v_floats) * sizeof(float); }
};

DIMSUM_HD inline std::size_t query_tiles(const attention_pass& p) { return (p.queries + tile_queries - 1) / tile_queries; }
DIMSUM_HD inline std::size_t blocks(const attention_pass& p) { return device::elements_of(p.batch_rank, p.batch_extents) * query_tiles(p); }

// The maximum and the sum over the 16 threads of a query: a butterfly of 4 steps, each thread
// combining its value with that of the thread whose number differs by 8, 4, 2, then 1
// (the block's group_reduce: shuffles on the device). Every thread of the block calls them
// the same number of times: a warp's shuffle waits for all 32 of its threads.
struct group_max {
    DIMSUM_HD float operator()(float own, float other) const { return fn::maximum{}(own, other); }
};
struct group_sum {
    DIMSUM_HD float operator()(float own, float other) const { return own + other; }
};
template <class Block>
DIMSUM_HD inline float max_over_group(Block& block, float value) { return block.group_reduce(value, group_max{}); }
template <class Block>
DIMSUM_HD inline float sum_over_group(Block& block, float value) { return block.group_reduce(value, group_sum{}); }

// Thread block.thread of block `block_index`. Block: thread (0..255), sync() (a barrier of the
// block), group_reduce(value, op) (the butterfly above over the thread's group of 16),
// shared (the block's shared memory, layout.bytes()). columns: dv / 16 rounded up (4 or 8).
template <int columns, class Block>
DIMSUM_HD inline void attention_tile(const attention_pass& p, const layout& shape, std::size_t block_index, Block& block) {
    unsigned char* shared = block.shared;
    auto* q_at = reinterpret_cast<std::ptrdiff_t*>(shared);
    std::ptrdiff_t* o_at = q_at + tile_queries;
    std::ptrdiff_t* kv_at = o_at + tile_queries;  // k's, then v's
    std::ptrdiff_t* score_at = kv_at + 2;           // [query][input]
    auto* qs = reinterpret_cast<float*>(shared + shape.offset_bytes);
    float* ks = qs + shape.q_floats;  // K's tile, then P's
    float* vs = ks + shape.kp_floats;

    const int tid = block.thread, ty = tid / group, tx = tid % group;
    const std::size_t tiles = query_tiles(p);
    const std::size_t item = block_index / tiles, first_query = block_index % tiles * tile_queries;
    const std::size_t left = p.queries - first_query;
    const int queries_here = static_cast<int>(left < std::size_t(tile_queries) ? left : tile_queries);
    const int d = static_cast<int>(p.d), dv = shape.dv;
    const fused_pass& f = p.score;
    const std::size_t inputs = shape.score_inputs;

    // where each query's operands start
    if (tid < queries_here) {
        const device::attention_start at = device::attention_start_of(p, item * p.queries + first_query + std::size_t(tid));
        q_at[tid] = at.q;
        o_at[tid] = at.o;
        for (std::size_t n = 0; n < inputs; ++n) score_at[std::size_t(tid) * inputs + n] = at.score[n];
        if (tid == 0) {
            kv_at[0] = at.k;
            kv_at[1] = at.v;
        }
    }
    block.sync();
    const auto* q = static_cast<const float*>(p.q.data);
    for (int at = tid; at < queries_here * d; at += block_threads) {
        const int r = at / d, t = at - r * d;
        qs[r * shape.q_stride + t] = q[q_at[r] + t * p.q.cols];
    }
    const float* k = static_cast<const float*>(p.k.data) + kv_at[0];
    const float* v = static_cast<const float*>(p.v.data) + kv_at[1];

    // this thread's queries: how many keys each sees, its running maximum m and sum l, its output
    std::size_t visible[rows_per_thread];
    float m[rows_per_thread], l[rows_per_thread], out[rows_per_thread][columns];
    for (int i = 0; i < rows_per_thread; ++i) {
        const int r = ty * rows_per_thread + i;
        visible[i] = r >= queries_here ? 0
                     : p.causal        ? device::visible_keys(first_query + std::size_t(r), p.queries, p.keys)
                                       : p.keys;
        m[i] = -INFINITY;
        l[i] = 0;
        for (int c = 0; c < columns; ++c) out[i][c] = 0;
    }
    // the most keys a query of this tile sees: the last query's
    const std::size_t last_visible =
        p.causal ? device::visible_keys(first_query + std::size_t(queries_here) - 1, p.queries, p.keys) : p.keys;
    const auto scale = static_cast<float>(p.scale);

    for (std::size_t k0 = 0; k0 < last_visible; k0 += tile_keys) {
        const int count = last_visible - k0 < std::size_t(tile_keys) ? static_cast<int>(last_visible - k0) : tile_keys;
        block.sync();  // the last tile's P and V read by every thread
        for (int at = tid; at < count * d; at += block_threads) {
            const int j = at / d, t = at - j * d;
            ks[j * shape.k_stride + t] = k[static_cast<std::ptrdiff_t>(k0 + std::size_t(j)) * p.k.rows + t * p.k.cols];
        }
        for (int at = tid; at < count * dv; at += block_threads) {
            const int j = at / dv, c = at - j * dv;
            vs[j * dv + c] = v[static_cast<std::ptrdiff_t>(k0 + std::size_t(j)) * p.v.rows + c * p.v.cols];
        }
        block.sync();

        // the scores of this thread's 4 queries x 4 keys (keys tx, tx + 16, ...); rows and keys
        // past the tile's end read memory no one wrote, and are never used
        float s[rows_per_thread][keys_per_thread] = {};
        for (int t = 0; t < d; ++t) {
            float a[rows_per_thread], b[keys_per_thread];
            for (int i = 0; i < rows_per_thread; ++i) a[i] = qs[(ty * rows_per_thread + i) * shape.q_stride + t];
            for (int j = 0; j < keys_per_thread; ++j) b[j] = ks[(tx + group * j) * shape.k_stride + t];
            for (int i = 0; i < rows_per_thread; ++i) {
                for (int j = 0; j < keys_per_thread; ++j) s[i][j] = fmaf(a[i], b[j], s[i][j]);
            }
        }
        block.sync();  // K read by every thread: P takes its place

        // the online softmax per query, over the 16 threads that share it
        int limit[rows_per_thread];  // keys 0 .. limit-1 of this tile enter this query's output
        for (int i = 0; i < rows_per_thread; ++i) {
            const int r = ty * rows_per_thread + i;
            const std::size_t seen = visible[i] > k0 ? visible[i] - k0 : 0;
            limit[i] = seen < std::size_t(count) ? static_cast<int>(seen) : count;
            float top = m[i];
            for (int j = 0; j < keys_per_thread; ++j) {
                const int key_in_tile = tx + group * j;
                if (key_in_tile >= limit[i]) continue;
                float score = s[i][j] * scale;
                if (p.has_score_function) {
                    const auto key = static_cast<std::ptrdiff_t>(k0 + std::size_t(key_in_tile));
                    std::ptrdiff_t offsets[max_fused_inputs];
                    for (std::size_t n = 0; n < inputs; ++n) {
                        offsets[n] = score_at[std::size_t(r) * inputs + n] + key * f.inputs[n].strides[p.batch_rank + 1];
                    }
                    score = device::evaluate_nodes<float>(f, offsets, p.score_input, score);
                }
                s[i][j] = score;
                top = fn::maximum{}(top, score);
            }
            top = max_over_group(block, top);
            // nothing visible in this tile yet (top -infinity): m, l and the output unchanged
            const bool skip = top == -INFINITY;
            if (skip) limit[i] = 0;
            const float rescale = skip ? 1.0f : expf(m[i] - top);  // 0 while m is -infinity
            float total = 0;
            for (int j = 0; j < keys_per_thread; ++j) {
                s[i][j] = tx + group * j < limit[i] ? expf(s[i][j] - top) : 0.0f;
                total += s[i][j];
            }
            total = sum_over_group(block, total);  // by every thread: see max_over_group
            if (!skip) {
                m[i] = top;
                l[i] = l[i] * rescale + total;
                for (int c = 0; c < columns; ++c) out[i][c] *= rescale;
            }
            for (int j = 0; j < keys_per_thread; ++j) ks[r * shape.p_stride + tx + group * j] = s[i][j];
        }
        block.sync();

        // out += P V over this tile's keys; where a query takes fewer keys than the tile has (the
        // causal diagonal, a tile it skips), the keys past its limit are not read: no 0 x NaN
        bool whole = true;
        for (int i = 0; i < rows_per_thread; ++i) whole = whole && limit[i] == count;
        if (whole) {
            for (int j = 0; j < count; ++j) {
                float weight[rows_per_thread];
                for (int i = 0; i < rows_per_thread; ++i) weight[i] = ks[(ty * rows_per_thread + i) * shape.p_stride + j];
                for (int c = 0; c < columns; ++c) {
                    const int column = tx + group * c;
                    if (column >= dv) continue;
                    const float value = vs[j * dv + column];
                    for (int i = 0; i < rows_per_thread; ++i) out[i][c] = fmaf(weight[i], value, out[i][c]);
                }
            }
        } else {
            for (int j = 0; j < count; ++j) {
                for (int c = 0; c < columns; ++c) {
                    const int column = tx + group * c;
                    if (column >= dv) continue;
                    const float value = vs[j * dv + column];
                    for (int i = 0; i < rows_per_thread; ++i) {
                        if (j < limit[i]) out[i][c] = fmaf(ks[(ty * rows_per_thread + i) * shape.p_stride + j], value, out[i][c]);
                    }
                }
            }
        }
    }

    auto* o = static_cast<float*>(const_cast<void*>(p.o.data));
    for (int i = 0; i < rows_per_thread; ++i) {
        const int r = ty * rows_per_thread + i;
        if (r >= queries_here) break;
        for (int c = 0; c < columns; ++c) {
            const int column = tx + group * c;
            if (column < dv) o[o_at[r] + column * p.o.cols] = l[i] == 0 ? 0.0f : out[i][c] / l[i];
        }
    }
}

}  // namespace dimsum::backend::cuda::tiles
