#pragma once
// The bodies of the CUDA passes (kernels.hpp), one element or one line at a time, compiled by
// nvcc into the kernels of src/cuda/ and by g++ into the host stand-in of the tests
// (tests/cuda/host_device.cpp), which runs the same bodies in plain loops against the
// reference backend where no GPU is. Only launch configuration, memory and cuBLAS are not
// shared. Needs nvcc's --expt-relaxed-constexpr (layout.hpp and core/bf16.hpp are constexpr
// host code).
//
// Semantics are the CPU backend's: op codes as core/functors.hpp defines them (max and min
// propagate NaN, pow as std::pow, gelu with erf), a softmax line of -infinity only gives 0.

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dimsum/backend/cuda/kernels.hpp"
#include "dimsum/core/bf16.hpp"
#include "dimsum/core/functors.hpp"
#include "dimsum/core/host_device.hpp"
#include "dimsum/core/next_index.hpp"

namespace dimsum::backend::cuda::device {

// Element `offset` of memory of element type `type`, as T (bf16 and integers widened).
template <class T>
DIMSUM_HD inline T load(const void* data, element_type type, std::ptrdiff_t offset) {
    switch (type) {
        case element_type::float32: return static_cast<T>(static_cast<const float*>(data)[offset]);
        case element_type::float64: return static_cast<T>(static_cast<const double*>(data)[offset]);
        case element_type::bf16: {
            const std::uint32_t bits = std::uint32_t(static_cast<const std::uint16_t*>(data)[offset]) << 16;
            float f;
            memcpy(&f, &bits, sizeof f);
            return static_cast<T>(f);
        }
        case element_type::int32: return static_cast<T>(static_cast<const std::int32_t*>(data)[offset]);
        case element_type::int64: return static_cast<T>(static_cast<const std::int64_t*>(data)[offset]);
    }
    return T(0);
}

// The offset of the index whose row-major number is `linear`, over `rank` axes of `extents`,
// for `count` arrays of these strides at once.
DIMSUM_HD inline void offsets_of(std::size_t linear, std::size_t rank, const extents_t& extents, std::size_t count,
                                 const strides_t* const* strides, std::ptrdiff_t* offsets) {
    for (std::size_t a = 0; a < count; ++a) offsets[a] = 0;
    if (linear < 0xffffffffu) {  // 32-bit division, several times cheaper on a GPU than 64-bit
        auto rest = static_cast<std::uint32_t>(linear);
        for (std::size_t i = rank; i-- > 0;) {
            const auto extent = static_cast<std::uint32_t>(extents[i] < 0xffffffffu ? extents[i] : 0xffffffffu);
            const std::uint32_t index = rest % extent;
            rest /= extent;
            for (std::size_t a = 0; a < count; ++a) offsets[a] += static_cast<std::ptrdiff_t>(index) * (*strides[a])[i];
        }
        return;
    }
    for (std::size_t i = rank; i-- > 0;) {
        const std::size_t index = linear % extents[i];
        linear /= extents[i];
        for (std::size_t a = 0; a < count; ++a) offsets[a] += static_cast<std::ptrdiff_t>(index) * (*strides[a])[i];
    }
}

// The value of a fused pass's last node, its inputs read at these offsets; input `in_place`
// (if < input_count) is not read but takes the value `given` (attention's score).
template <class T>
DIMSUM_HD inline T evaluate_nodes(const fused_pass& p, const std::ptrdiff_t* offsets, std::size_t in_place = max_fused_inputs,
                                  T given = T(0)) {
    T values[max_fused_nodes];
    for (std::size_t n = 0; n < p.node_count; ++n) {
        const fused_node& node = p.nodes[n];
        switch (node.what) {
            case fused_node::kind::input: {
                const fused_input& in = p.inputs[node.input];
                values[n] = node.input == in_place ? given : load<T>(in.data, in.type, offsets[node.input]);
                break;
            }
            case fused_node::kind::constant: values[n] = static_cast<T>(node.value); break;
            case fused_node::kind::function: {
                T arguments[3] = {T(0), T(0), T(0)};
                for (std::size_t o = 0; o < node.operand_count; ++o) arguments[o] = values[node.operands[o]];
                values[n] = fn::apply(node.op, arguments);
                break;
            }
        }
    }
    return values[p.node_count - 1];
}

// `count` elements of a fused pass: element numbers first, first + step, ... (row-major) of the
// result. The offsets are found once and then moved along the last axis, found again only
// where a step leaves the row (a kernel's lanes take every 32nd element, so that a warp reads
// and writes whole lines).
template <class T>
DIMSUM_HD inline void fused_elements(const fused_pass& p, std::size_t first, std::size_t count, std::size_t step) {
    const strides_t* strides[max_fused_inputs + 1];
    std::ptrdiff_t offsets[max_fused_inputs + 1];
    strides[0] = &p.out_strides;
    for (std::size_t i = 0; i < p.input_count; ++i) strides[i + 1] = &p.inputs[i].strides;
    const std::size_t arrays = p.input_count + 1, last = p.rank == 0 ? 1 : p.extents[p.rank - 1];
    std::size_t column = first % last;
    offsets_of(first, p.rank, p.extents, arrays, strides, offsets);
    for (std::size_t e = 0; e < count; ++e) {
        if (e > 0) {
            column += step;
            if (column < last) {
                for (std::size_t a = 0; a < arrays; ++a) offsets[a] += static_cast<std::ptrdiff_t>(step) * (*strides[a])[p.rank - 1];
            } else {
                column = (first + e * step) % last;
                offsets_of(first + e * step, p.rank, p.extents, arrays, strides, offsets);
            }
        }
        const T value = evaluate_nodes<T>(p, offsets + 1);
        if (p.out_type == element_type::bf16) static_cast<std::uint16_t*>(p.out)[offsets[0]] = dimsum::detail::bf16_bits_of(value);
        else static_cast<T*>(p.out)[offsets[0]] = value;
    }
}

// How many items each pass has, one body call each: elements, lines or queries.
DIMSUM_HD inline std::size_t elements_of(std::size_t rank, const extents_t& extents) {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= extents[i];
    return n;
}
DIMSUM_HD inline std::size_t item_count(const fused_pass& p) { return elements_of(p.rank, p.extents); }

// A fused pass by lanes of warps: warp w's 32 lanes take its span of 128 elements, lane i
// elements i, i + 32, i + 64, i + 96 of it, so that every read and write of the warp is of 32
// neighbours, and the offsets are found once per lane rather than per element.
inline constexpr std::size_t fused_lanes = 32, fused_per_lane = 4;
DIMSUM_HD inline std::size_t lane_count(const fused_pass& p) {
    const std::size_t span = fused_lanes * fused_per_lane;
    return (item_count(p) + span - 1) / span * fused_lanes;
}
template <class T>
DIMSUM_HD inline void fused_lane(const fused_pass& p, std::size_t lane) {
    const std::size_t n = item_count(p), first = lane / fused_lanes * fused_lanes * fused_per_lane + lane % fused_lanes;
    if (first >= n) return;
    const std::size_t left = (n - first + fused_lanes - 1) / fused_lanes;
    fused_elements<T>(p, first, left < fused_per_lane ? left : fused_per_lane, fused_lanes);
}
DIMSUM_HD inline std::size_t item_count(const indices_pass& p) { return elements_of(p.rank, p.extents); }
DIMSUM_HD inline std::size_t item_count(const gather_pass& p) { return elements_of(p.out_rank, p.out_extents); }
DIMSUM_HD inline std::size_t item_count(const scatter_pass& p) {  // every extent of out but the table's axis
    std::size_t n = 1;
    for (std::size_t i = 0; i < p.out_rank; ++i) n *= i == p.axis ? 1 : p.out_extents[i];
    return n;
}
DIMSUM_HD inline std::size_t item_count(const rowwise_pass& p) {  // every extent but the line's own
    std::size_t n = 1;
    for (std::size_t i = 0; i < p.rank; ++i) n *= i == p.axis ? 1 : p.extents[i];
    return n;
}

// One line of a rowwise pass: line number `line` (row-major over the other axes). Accumulates
// in T, as the CPU backend does.
template <class T>
DIMSUM_HD inline void rowwise_line(const rowwise_pass& p, std::size_t line) {
    // the first element of the line in x and in y
    std::ptrdiff_t at_x = 0, at_y = 0;
    const bool reduces = p.op == line_op::sum || p.op == line_op::max || p.op == line_op::mean;
    for (std::size_t i = p.rank; i-- > 0;) {
        if (i == p.axis) continue;
        const std::size_t index = line % p.extents[i];
        line /= p.extents[i];
        const std::size_t y_axis = reduces && i > p.axis ? i - 1 : i;  // a reduction's y lacks the axis
        at_x += static_cast<std::ptrdiff_t>(index) * p.x_strides[i];
        at_y += static_cast<std::ptrdiff_t>(index) * p.y_strides[y_axis];
    }
    const T* x = static_cast<const T*>(p.x) + at_x;
    T* y = static_cast<T*>(p.y) + at_y;
    const std::ptrdiff_t xs = p.x_strides[p.axis], ys = reduces ? 0 : p.y_strides[p.axis];
    const auto n = static_cast<std::ptrdiff_t>(p.extents[p.axis]);
    switch (p.op) {
        case line_op::softmax: {
            // pass 1: the maximum, so that exp never overflows
            T top = -static_cast<T>(INFINITY);
            for (std::ptrdiff_t j = 0; j < n; ++j) top = fn::maximum{}(top, x[j * xs]);
            if (top == -static_cast<T>(INFINITY)) {  // every value masked: no weight anywhere
                for (std::ptrdiff_t j = 0; j < n; ++j) y[j * ys] = T(0);
                return;
            }
            // pass 2: the normaliser; pass 3: the weights
            T total = 0;
            for (std::ptrdiff_t j = 0; j < n; ++j) total += ::exp(x[j * xs] - top);
            for (std::ptrdiff_t j = 0; j < n; ++j) y[j * ys] = ::exp(x[j * xs] - top) / total;
            return;
        }
        case line_op::layer_norm: {
            T mean = 0, variance = 0;
            for (std::ptrdiff_t j = 0; j < n; ++j) mean += x[j * xs];
            mean /= static_cast<T>(n);
            for (std::ptrdiff_t j = 0; j < n; ++j) variance += (x[j * xs] - mean) * (x[j * xs] - mean);
            variance /= static_cast<T>(n);
            const T inverse = T(1) / ::sqrt(variance + static_cast<T>(p.epsilon));
            for (std::ptrdiff_t j = 0; j < n; ++j) y[j * ys] = (x[j * xs] - mean) * inverse;
            return;
        }
        case line_op::sum: case line_op::mean: {
            T total = 0;
            for (std::ptrdiff_t j = 0; j < n; ++j) total += x[j * xs];
            *y = p.op == line_op::mean ? total / static_cast<T>(n) : total;
            return;
        }
        case line_op::max: {
            T top = -static_cast<T>(INFINITY);
            for (std::ptrdiff_t j = 0; j < n; ++j) top = fn::maximum{}(top, x[j * xs]);
            *y = top;
            return;
        }
    }
}

// One element of an indices pass.
template <class T>
DIMSUM_HD inline void indices_element(const indices_pass& p, std::size_t linear) {
    if (!p.causal) {
        static_cast<T*>(p.out)[static_cast<std::ptrdiff_t>(linear) * p.out_strides[0]] = static_cast<T>(linear);
        return;
    }
    const std::size_t queries = p.extents[0], keys = p.extents[1], q = linear / keys, k = linear % keys;
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(q) * p.out_strides[0] + static_cast<std::ptrdiff_t>(k) * p.out_strides[1];
    static_cast<T*>(p.out)[at] = evaluation::in_future(q, k, queries, keys) ? T(1) : T(0);
}

// One element of a gather pass: element number `linear` (row-major) of out.
template <class T>
DIMSUM_HD inline void gather_element(const gather_pass& p, std::size_t linear) {
    std::size_t index[max_rank];
    for (std::size_t i = p.out_rank; i-- > 0;) {
        index[i] = linear % p.out_extents[i];
        linear /= p.out_extents[i];
    }
    std::ptrdiff_t at_out = 0, at_id = 0, at_table = 0;
    for (std::size_t i = 0; i < p.out_rank; ++i) at_out += static_cast<std::ptrdiff_t>(index[i]) * p.out_strides[i];
    for (std::size_t i = 0; i < p.id_rank; ++i) at_id += static_cast<std::ptrdiff_t>(index[p.axis + i]) * p.id_strides[i];
    const auto id = load<std::int64_t>(p.ids, p.id_type, at_id);
    for (std::size_t i = 0; i < p.axis; ++i) at_table += static_cast<std::ptrdiff_t>(index[i]) * p.table_strides[i];
    at_table += static_cast<std::ptrdiff_t>(id) * p.table_strides[p.axis];
    for (std::size_t i = p.axis + 1; i < p.table_rank; ++i) {
        at_table += static_cast<std::ptrdiff_t>(index[i - 1 + p.id_rank]) * p.table_strides[i];
    }
    static_cast<T*>(p.out)[at_out] = static_cast<const T*>(p.table)[at_table];
}

// One line of a scatter pass: out's line along the axis at position `linear` (row-major over
// out's other axes), zeroed, then every value of that position added at its id, in order.
template <class T>
DIMSUM_HD inline void scatter_line(const scatter_pass& p, std::size_t linear) {
    std::size_t index[max_rank] = {};  // out's, its entry along the axis unused
    for (std::size_t i = p.out_rank; i-- > 0;) {
        if (i == p.axis) continue;
        index[i] = linear % p.out_extents[i];
        linear /= p.out_extents[i];
    }
    std::ptrdiff_t at_out = 0, at_values = 0;  // the position in out, and in values at ids index 0
    for (std::size_t i = 0; i < p.out_rank; ++i) {
        if (i == p.axis) continue;
        at_out += static_cast<std::ptrdiff_t>(index[i]) * p.out_strides[i];
        const std::size_t values_axis = i < p.axis ? i : i - 1 + p.id_rank;
        at_values += static_cast<std::ptrdiff_t>(index[i]) * p.values_strides[values_axis];
    }
    T* out = static_cast<T*>(p.out) + at_out;
    const std::ptrdiff_t along = p.out_strides[p.axis];
    for (std::size_t r = 0; r < p.out_extents[p.axis]; ++r) out[static_cast<std::ptrdiff_t>(r) * along] = T(0);
    const std::size_t count = elements_of(p.id_rank, p.id_extents);
    std::size_t j[max_rank] = {};  // the ids' index, row-major
    for (std::size_t n = 0; n < count; ++n) {
        std::ptrdiff_t at_id = 0, at_value = at_values;
        for (std::size_t i = 0; i < p.id_rank; ++i) {
            at_id += static_cast<std::ptrdiff_t>(j[i]) * p.id_strides[i];
            at_value += static_cast<std::ptrdiff_t>(j[i]) * p.values_strides[p.axis + i];
        }
        const auto id = load<std::int64_t>(p.ids, p.id_type, at_id);
        out[static_cast<std::ptrdiff_t>(id) * along] += static_cast<const T*>(p.values)[at_value];
        dimsum::detail::next_index(j, p.id_extents.data(), p.id_rank);
    }
}

// How many of `keys` keys query `query` of `queries` sees under a causal mask (in_future).
DIMSUM_HD inline std::size_t visible_keys(std::size_t query, std::size_t queries, std::size_t keys) {
    if (query + keys + 1 <= queries) return 0;
    const std::size_t visible = query + keys + 1 - queries;
    return visible < keys ? visible : keys;
}

// Where one query's operands start: q's and o's row, k's and v's first key, and each score
// function input at (query, key 0). Rows are numbered batch item by batch item, then query.
struct attention_start {
    std::ptrdiff_t q = 0, k = 0, v = 0, o = 0;
    std::ptrdiff_t score[max_fused_inputs] = {};
};
DIMSUM_HD inline attention_start attention_start_of(const attention_pass& p, std::size_t row) {
    attention_start at;
    const std::size_t query = row % p.queries;
    std::size_t item = row / p.queries;
    const fused_pass& f = p.score;
    for (std::size_t i = p.batch_rank; i-- > 0;) {
        const auto index = static_cast<std::ptrdiff_t>(item % p.batch_extents[i]);
        item /= p.batch_extents[i];
        at.q += index * p.q.batch[i];
        at.k += index * p.k.batch[i];
        at.v += index * p.v.batch[i];
        at.o += index * p.o.batch[i];
        for (std::size_t n = 0; n < f.input_count; ++n) at.score[n] += index * f.inputs[n].strides[i];
    }
    at.q += static_cast<std::ptrdiff_t>(query) * p.q.rows;
    at.o += static_cast<std::ptrdiff_t>(query) * p.o.rows;
    for (std::size_t n = 0; n < f.input_count; ++n) at.score[n] += static_cast<std::ptrdiff_t>(query) * f.inputs[n].strides[p.batch_rank];
    return at;
}

// The rows of an attention pass (queries of every batch item), and its items: a row per
// thread, or a (row, key range) per thread when the keys are split.
DIMSUM_HD inline std::size_t attention_rows(const attention_pass& p) { return p.queries * elements_of(p.batch_rank, p.batch_extents); }
DIMSUM_HD inline std::size_t item_count(const attention_pass& p) { return attention_rows(p) * p.key_splits; }
// Keys per range of a split: a whole number of key blocks.
DIMSUM_HD inline std::size_t keys_per_split(const attention_pass& p) {
    constexpr std::size_t block = attention_pass::key_block;
    const std::size_t keys = (p.keys + p.key_splits - 1) / p.key_splits;
    return (keys + block - 1) / block * block;
}

// One query of the fused attention: o = softmax(f(scale q K^T)) V for item `item` (a row, or
// with split keys a row's key range), with the online softmax: per block of keys,
//     m' = max(m, max_j s_j),  p_j = exp(s_j - m'),  l' = l e^(m - m') + sum_j p_j,
//     o' = o e^(m - m') + sum_j p_j v_j,
// and o / l at the end. Keys in the future of a causal query are never read; a query that
// sees no key (or only -infinity scores) gets 0; NaN propagates. The output columns go in
// chunks of attention_pass::chunk, each chunk walking the keys again, so that the running
// output fits in a thread's registers and local memory. With split keys, (m, l, o) of the
// range go to the partials unnormalised, for attention_combine.
template <class T>
DIMSUM_HD inline void attention_row(const attention_pass& p, std::size_t item) {
    const std::size_t row = item / p.key_splits, split = item % p.key_splits;
    const std::size_t query = row % p.queries;
    const attention_start at = attention_start_of(p, row);
    const fused_pass& f = p.score;
    const T* q = static_cast<const T*>(p.q.data) + at.q;
    const T* k = static_cast<const T*>(p.k.data) + at.k;
    const T* v = static_cast<const T*>(p.v.data) + at.v;
    T* o = static_cast<T*>(const_cast<void*>(p.o.data)) + at.o;  // the one operand written
    T* partial = p.key_splits > 1 ? static_cast<T*>(p.partials) + static_cast<std::ptrdiff_t>(item * (2 + p.dv)) : nullptr;
    // this item's keys: [first, last) of those the query sees
    const std::size_t visible = p.causal ? visible_keys(query, p.queries, p.keys) : p.keys;
    const std::size_t per_split = keys_per_split(p);  // all the keys when they are not split
    const std::size_t first = split * per_split < visible ? split * per_split : visible;
    const std::size_t last = visible - first < per_split ? visible : first + per_split;
    const T scale = static_cast<T>(p.scale), minus_infinity = -static_cast<T>(INFINITY);
    constexpr std::size_t block = attention_pass::key_block, chunk = attention_pass::chunk;
    for (std::size_t c0 = 0; c0 < p.dv; c0 += chunk) {
        const std::size_t width = p.dv - c0 < chunk ? p.dv - c0 : chunk;
        T out[chunk];
        for (std::size_t c = 0; c < chunk; ++c) out[c] = T(0);
        T m = minus_infinity, l = T(0);
        for (std::size_t k0 = first; k0 < last; k0 += block) {
            const std::size_t count = last - k0 < block ? last - k0 : block;
            // pass 1: the scores of this block of keys, and the score function on each
            T s[block];
            T top = m;
            for (std::size_t j = 0; j < count; ++j) {
                const auto key = static_cast<std::ptrdiff_t>(k0 + j);
                T dot = T(0);
                for (std::size_t t = 0; t < p.d; ++t) {
                    const auto at_d = static_cast<std::ptrdiff_t>(t);
                    dot += q[at_d * p.q.cols] * k[key * p.k.rows + at_d * p.k.cols];
                }
                T score = dot * scale;
                if (p.has_score_function) {
                    std::ptrdiff_t offsets[max_fused_inputs];
                    for (std::size_t n = 0; n < f.input_count; ++n) offsets[n] = at.score[n] + key * f.inputs[n].strides[p.batch_rank + 1];
                    score = evaluate_nodes<T>(f, offsets, p.score_input, score);
                }
                s[j] = score;
                top = fn::maximum{}(top, score);
            }
            if (top == minus_infinity) continue;  // nothing visible yet: m and l unchanged
            // pass 2: the online softmax; pass 3: out += p V for this chunk of columns
            const T rescale = ::exp(m - top);  // 0 while m is -infinity
            m = top;
            l *= rescale;
            for (std::size_t c = 0; c < width; ++c) out[c] *= rescale;
            for (std::size_t j = 0; j < count; ++j) {
                const T weight = ::exp(s[j] - top);
                l += weight;
                const T* v_row = v + static_cast<std::ptrdiff_t>(k0 + j) * p.v.rows;
                for (std::size_t c = 0; c < width; ++c) out[c] += weight * v_row[static_cast<std::ptrdiff_t>(c0 + c) * p.v.cols];
            }
        }
        if (p.key_splits > 1) {
            partial[0] = m;  // the same in every chunk
            partial[1] = l;
            for (std::size_t c = 0; c < width; ++c) partial[2 + c0 + c] = out[c];
            continue;
        }
        for (std::size_t c = 0; c < width; ++c) {
            o[static_cast<std::ptrdiff_t>(c0 + c) * p.o.cols] = l == T(0) ? T(0) : out[c] / l;
        }
    }
}

// Split-key attention combined from its ranges' partials (m_s, l_s, o_s):
//     m = max_s m_s,  l = sum_s l_s e^(m_s - m),  o = sum_s o_s e^(m_s - m) / l,
// where a range that saw no key (m_s = -infinity) adds nothing; a row that saw none gets 0.
// One output element per item (row-major over rows, then columns), so that a decoding step's
// few rows still make many threads: each finds m and l again, from 2 reads per range.
DIMSUM_HD inline std::size_t combine_count(const attention_pass& p) { return attention_rows(p) * p.dv; }
template <class T>
DIMSUM_HD inline void attention_combine(const attention_pass& p, std::size_t item) {
    const std::size_t row = item / p.dv, column = item % p.dv, width = 2 + p.dv;
    const T* partial = static_cast<const T*>(p.partials) + static_cast<std::ptrdiff_t>(row * p.key_splits * width);
    const T minus_infinity = -static_cast<T>(INFINITY);
    T m = minus_infinity;
    for (std::size_t s = 0; s < p.key_splits; ++s) m = fn::maximum{}(m, partial[s * width]);
    T l = T(0), sum = T(0);
    for (std::size_t s = 0; s < p.key_splits; ++s) {
        const T* range = partial + s * width;
        if (range[0] == minus_infinity) continue;
        const T weight = ::exp(range[0] - m);
        l += range[1] * weight;
        sum += range[2 + column] * weight;
    }
    T* o = static_cast<T*>(const_cast<void*>(p.o.data)) + attention_start_of(p, row).o;
    o[static_cast<std::ptrdiff_t>(column) * p.o.cols] = l == T(0) ? T(0) : sum / l;
}

}  // namespace dimsum::backend::cuda::device
