#pragma once
// The gather kernel: out[prefix, ids index, suffix] = table[prefix, ids[ids index], suffix];
// and its adjoint, scatter_add.
// Each (prefix, ids index) is one block of the table's trailing axes, copied with the
// innermost axis as a contiguous copy where both sides allow (around the caches for a large
// result, as the fused pass writes one), rows split across the team.
// The ids were checked before the plan ran (evaluation/integers.hpp).

#include <algorithm>
#include <array>
#include <cstddef>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/core/next_index.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

namespace detail {

// Copies a block of `rank` axes from one strided place to another.
template <class T>
void copy_block(const T* from, const std::ptrdiff_t* from_strides, T* to, const std::ptrdiff_t* to_strides,
                const std::size_t* extents, std::size_t rank, bool stream) {
    if (rank == 0) {
        *to = *from;
        return;
    }
    const std::size_t inner = extents[rank - 1];
    const std::ptrdiff_t inner_from = from_strides[rank - 1], inner_to = to_strides[rank - 1];
    std::array<std::size_t, evaluation::max_rank> index{};
    for (std::size_t i = 0; i + 1 < rank; ++i) {
        if (extents[i] == 0) return;
    }
    do {
        std::ptrdiff_t a = 0, b = 0;
        for (std::size_t i = 0; i + 1 < rank; ++i) {
            a += static_cast<std::ptrdiff_t>(index[i]) * from_strides[i];
            b += static_cast<std::ptrdiff_t>(index[i]) * to_strides[i];
        }
        if (inner_from == 1 && inner_to == 1) {
            if (stream) copy_streaming(from + a, to + b, inner);
            else std::copy_n(from + a, inner, to + b);
        } else {
            for (std::size_t j = 0; j < inner; ++j) {
                to[b + static_cast<std::ptrdiff_t>(j) * inner_to] = from[a + static_cast<std::ptrdiff_t>(j) * inner_from];
            }
        }
    } while (dimsum::detail::next_index(index.data(), extents, rank - 1));
}

}  // namespace detail

// (kernels.hpp)
template <class T>
void gather(const evaluation::strided<const T>& table, std::size_t axis, const evaluation::integers& ids,
            const evaluation::strided<T>& out) {
    const std::size_t before = axis, count = ids.where().rank, after = table.where.rank - axis - 1;
    const std::size_t row_rank = before + count;
    std::array<std::size_t, evaluation::max_rank> rows_extents{};
    std::size_t rows = 1, block = 1;
    for (std::size_t i = 0; i < row_rank; ++i) {
        rows_extents[i] = out.where.extents[i];
        rows *= out.where.extents[i];
    }
    for (std::size_t i = 0; i < after; ++i) block *= table.where.extents[axis + 1 + i];
    if (rows == 0 || block == 0) return;
    const bool stream = rows * block * sizeof(T) >= streaming_bytes;
    // Where the table's block for a row starts: the ids make these jumps unpredictable for
    // the hardware, so each copy asks for the block `ahead` rows on first (measured: random
    // rows of 3 KiB from a 134 MB table went from 0.35 to 0.44-0.49 of memcpy on one thread).
    const bool contiguous_block = after > 0 && table.where.strides[table.where.rank - 1] == 1 && block * sizeof(T) <= 16384;
    auto source = [&](const std::size_t* row) {
        std::ptrdiff_t from = 0;
        for (std::size_t i = 0; i < before; ++i) from += static_cast<std::ptrdiff_t>(row[i]) * table.where.strides[i];
        return from + static_cast<std::ptrdiff_t>(ids.at(row + before)) * table.where.strides[axis];
    };
    constexpr std::size_t ahead = 2;
    auto copy_rows = [&](std::size_t first, std::size_t last) {
        std::array<std::size_t, evaluation::max_rank> row{}, next{};
        for (std::size_t i = row_rank, rest = first; i-- > 0;) {  // row `first` as an index
            row[i] = rest % rows_extents[i];
            rest /= rows_extents[i];
        }
        next = row;
        for (std::size_t k = 0; k < ahead; ++k) dimsum::detail::next_index(next.data(), rows_extents.data(), row_rank);
        for (std::size_t r = first; r < last; ++r) {
            if (contiguous_block && r + ahead < last) {
                const char* soon = reinterpret_cast<const char*>(table.data + source(next.data()));
                for (std::size_t byte = 0; byte < block * sizeof(T); byte += 64) __builtin_prefetch(soon + byte);
                dimsum::detail::next_index(next.data(), rows_extents.data(), row_rank);
            }
            std::ptrdiff_t to = 0;
            for (std::size_t i = 0; i < row_rank; ++i) to += static_cast<std::ptrdiff_t>(row[i]) * out.where.strides[i];
            detail::copy_block(table.data + source(row.data()), table.where.strides.data() + axis + 1, out.data + to,
                               out.where.strides.data() + row_rank, table.where.extents.data() + axis + 1, after, stream);
            dimsum::detail::next_index(row.data(), rows_extents.data(), row_rank);
        }
        if (stream) streaming_fence();
    };
    split_range(rows * block >= parallel_elements ? num_threads() : 1, rows, [] {}, copy_rows);
}

// (kernels.hpp) The suffix's elements are split across the team: each thread adds into its
// own columns, over every (prefix, ids index) in order.
template <class T>
void scatter_add(const strided<const T>& values, std::size_t axis, const evaluation::integers& ids, const strided<T>& out) {
    const std::size_t before = axis, count = ids.where().rank, after = out.where.rank - axis - 1;
    std::array<std::size_t, evaluation::max_rank> rows_extents{}, block_extents{};
    std::size_t rows = 1, block = 1;
    for (std::size_t i = 0; i < before + count; ++i) {
        rows_extents[i] = values.where.extents[i];
        rows *= values.where.extents[i];
    }
    for (std::size_t i = 0; i < after; ++i) {
        block_extents[i] = out.where.extents[axis + 1 + i];
        block *= block_extents[i];
    }
    const std::size_t total = out.where.size();
    // zeros first
    std::array<std::size_t, evaluation::max_rank> index{};
    for (std::size_t k = 0; k < total; ++k) {
        out.at(index.data()) = T(0);
        dimsum::detail::next_index(index.data(), out.where.extents.data(), out.where.rank);
    }
    if (rows == 0 || block == 0) return;
    auto add_columns = [&](std::size_t first, std::size_t last) {
        std::array<std::size_t, evaluation::max_rank> row{}, column{};
        for (std::size_t r = 0; r < rows; ++r) {
            std::ptrdiff_t from = 0, to = 0;
            for (std::size_t i = 0; i < before + count; ++i) from += static_cast<std::ptrdiff_t>(row[i]) * values.where.strides[i];
            for (std::size_t i = 0; i < before; ++i) to += static_cast<std::ptrdiff_t>(row[i]) * out.where.strides[i];
            to += static_cast<std::ptrdiff_t>(ids.at(row.data() + before)) * out.where.strides[axis];
            for (std::size_t i = after, rest = first; i-- > 0;) {  // column `first` as an index
                column[i] = rest % block_extents[i];
                rest /= block_extents[i];
            }
            for (std::size_t c = first; c < last; ++c) {
                std::ptrdiff_t a = from, b = to;
                for (std::size_t i = 0; i < after; ++i) {
                    a += static_cast<std::ptrdiff_t>(column[i]) * values.where.strides[before + count + i];
                    b += static_cast<std::ptrdiff_t>(column[i]) * out.where.strides[axis + 1 + i];
                }
                out.data[b] += values.data[a];
                dimsum::detail::next_index(column.data(), block_extents.data(), after);
            }
            dimsum::detail::next_index(row.data(), rows_extents.data(), before + count);
        }
    };
    split_range(rows * block >= parallel_elements ? num_threads() : 1, block, [] {}, add_columns);
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
