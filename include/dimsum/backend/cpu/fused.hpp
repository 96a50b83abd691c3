#pragma once
// The fused elementwise pass: a small program of block functions over strided inputs,
// evaluated in one sweep over the result. The result is cut into blocks of a few hundred
// values along its innermost axis; each block of every intermediate value lives in L1, so
// a chain of operations costs one pass over memory, not one per operation. Broadcast and
// strided inputs are gathered into the block, contiguous ones are read in place. Inputs
// stored narrower (bf16) are widened into the block, and a result stored narrower is rounded
// from it: a pass over bf16 moves half float's bytes.

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/backend/cpu/workspace.hpp"
#include "dimsum/runtime/member_memory.hpp"
#include "dimsum/evaluation/layout.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::backend::cpu {

namespace detail {

// Values per block: 2 KiB, so that a dozen intermediate blocks stay in L1; measured better than
// 1 KiB or 4 KiB for arrays beyond the caches.
template <class T>
inline constexpr std::size_t block_length = 2048 / sizeof(T);
// The pass's arrays (the result first, then the inputs) with their axes merged wherever every
// array is contiguous across them, and axes of extent 1 dropped; at least one axis remains.
struct merged_layout {
    std::size_t rank = 0, arrays = 0;
    std::array<std::size_t, max_rank> extents{};
    std::vector<evaluation::strides_t> strides;  // per array
    std::vector<std::ptrdiff_t> origin;          // per array: where the region starts
};

template <class T>
void merge_axes(const strided<T>& result, const std::vector<source_array<T>>& inputs, const box* region,
                merged_layout& out) {
    out.arrays = inputs.size() + 1;
    out.strides.resize(out.arrays);
    out.origin.assign(out.arrays, 0);
    out.extents = region ? region->extents : result.where.extents;
    for (std::size_t a = 0; a < out.arrays; ++a) {
        const evaluation::layout& where = a == 0 ? result.where : inputs[a - 1].where;  // of the result's rank
        out.strides[a] = where.strides;
        if (region) out.origin[a] = evaluation::offset_in(where, *region);
    }
    out.rank = evaluation::coalesce_together(result.where.rank, out.extents, out.arrays,
                                             [&](std::size_t a) -> evaluation::strides_t& { return out.strides[a]; });
    if (out.rank == 0) {  // a single value
        out.rank = 1;
        out.extents[0] = 1;
        for (std::size_t a = 0; a < out.arrays; ++a) out.strides[a][0] = 0;
    }
}

// One thread's memory for fused passes, kept from one pass to the next.
template <class T>
struct fused_thread_memory {
    merged_layout layout;                     // of the pass this thread starts
    std::vector<const T*> value;              // per node: where this block's values are
    std::vector<std::ptrdiff_t> here, ahead;  // per array: where this block and the next start
};
template <class T>
fused_thread_memory<T>& fused_memory() {
    return runtime::member_local<fused_thread_memory<T>>();  // this member's (runtime/member_memory.hpp)
}

}  // namespace detail


// (kernels.hpp)
template <class T>
void prepare_fused(const fused_program<T>& program) {
    auto& memory = detail::fused_memory<T>();
    const std::size_t nodes = program.nodes.size(), arrays = program.inputs.size() + 1;
    scratch<T>(scratch_use::elementwise, nodes * detail::block_length<T>);
    memory.layout.strides.reserve(arrays);
    memory.layout.origin.reserve(arrays);
    memory.value.reserve(nodes);
    memory.here.reserve(arrays);
    memory.ahead.reserve(arrays);
}

// (kernels.hpp)
template <class T>
void run_fused(const fused_program<T>& program, const strided<T>& result, bool parallel, const box* region,
               const rounded_memory<T>& rounded) {
    std::size_t size = 1;
    for (std::size_t i = 0; i < result.where.rank; ++i) size *= region ? region->extents[i] : result.where.extents[i];
    if (size == 0) return;
    prepare_fused(program);  // the caller's memory; its team's members take theirs below
    detail::merged_layout& layout = detail::fused_memory<T>().layout;  // the caller's, read by the team
    detail::merge_axes(result, program.inputs, region, layout);
    const std::size_t inner_axis = layout.rank - 1, length = layout.extents[inner_axis];
    const std::size_t block = std::min(length, detail::block_length<T>);
    const std::size_t chunks = (length + block - 1) / block;
    std::size_t lines = 1;
    for (std::size_t i = 0; i < inner_axis; ++i) lines *= layout.extents[i];
    const std::size_t items = lines * chunks, nodes = program.nodes.size();
    const auto& nodes_of = program.nodes;
    // A large contiguous result is written around the caches (simd.hpp); a GEMM epilogue
    // (a region) rewrites C while it is in cache, and keeps it there.
    const std::size_t out_bytes = size * (rounded ? evaluation::size_of(rounded.type) : sizeof(T));
    const bool stream = !region && out_bytes >= streaming_bytes && layout.strides[0][inner_axis] == 1;

    auto sweep = [&](std::size_t first_item, std::size_t last_item) {
        // this thread's memory, taken by prepare_fused: nothing below allocates
        T* slots = scratch<T>(scratch_use::elementwise, nodes * block);
        auto& memory = detail::fused_memory<T>();
        std::vector<const T*>& value = memory.value;
        value.resize(nodes);
        for (std::size_t k = 0; k < nodes; ++k) {  // constants: filled once per sweep
            if (nodes_of[k].what == fused_node<T>::kind::constant) std::fill_n(slots + k * block, block, nodes_of[k].value);
        }
        // where item's block starts in each array (the result first, then the inputs)
        auto place = [&](std::size_t item, std::ptrdiff_t* at) {
            std::copy_n(layout.origin.data(), layout.arrays, at);
            for (std::size_t axis = inner_axis, rest = item / chunks; axis-- > 0;) {
                auto index = static_cast<std::ptrdiff_t>(rest % layout.extents[axis]);
                rest /= layout.extents[axis];
                for (std::size_t a = 0; a < layout.arrays; ++a) at[a] += index * layout.strides[a][axis];
            }
            auto offset = static_cast<std::ptrdiff_t>(item % chunks * block);
            for (std::size_t a = 0; a < layout.arrays; ++a) at[a] += offset * layout.strides[a][inner_axis];
        };
        std::vector<std::ptrdiff_t>& here = memory.here;
        std::vector<std::ptrdiff_t>& ahead = memory.ahead;
        here.resize(layout.arrays);
        ahead.resize(layout.arrays);
        const std::ptrdiff_t out_stride = layout.strides[0][inner_axis];
        const bool in_place_result = out_stride == 1 && !stream && !rounded;  // the last function writes out itself
        if (first_item < last_item) place(first_item, ahead.data());
        for (std::size_t item = first_item; item < last_item; ++item) {
            std::size_t offset = item % chunks * block, n = std::min(block, length - offset);
            std::swap(here, ahead);  // `ahead` held this item's offsets; now find the next one's
            std::ptrdiff_t* at = here.data();
            if (item + 1 < last_item) {
                place(item + 1, ahead.data());
                // ask for the next item's contiguous inputs now: memory works while we compute
                std::size_t next_n = std::min(block, length - (item + 1) % chunks * block);
                for (std::size_t k = 0; k < program.inputs.size(); ++k) {
                    if (layout.strides[k + 1][inner_axis] != 1) continue;
                    const source_array<T>& input = program.inputs[k];
                    const std::size_t size_of = evaluation::size_of(input.type);
                    const char* next = static_cast<const char*>(input.data) + ahead[k + 1] * static_cast<std::ptrdiff_t>(size_of);
                    for (std::size_t i = 0; i < next_n * size_of; i += 64) __builtin_prefetch(next + i);
                }
            }

            T* out = rounded ? nullptr : result.data + at[0];
            for (std::size_t k = 0; k < nodes; ++k) {
                const fused_node<T>& node = nodes_of[k];
                T* slot = slots + k * block;
                switch (node.what) {
                    case fused_node<T>::kind::constant: value[k] = slot; break;
                    case fused_node<T>::kind::input: {
                        std::ptrdiff_t stride = layout.strides[node.input + 1][inner_axis];
                        const source_array<T>& input = program.inputs[node.input];
                        if (!input.holds_own()) {
                            input.visit([&](const auto& stored) { widen_block(stored.data + at[node.input + 1], stride, n, slot); });
                            value[k] = slot;
                            break;
                        }
                        const T* from = static_cast<const T*>(input.data) + at[node.input + 1];
                        if (stride == 1) {
                            value[k] = from;
                        } else {
                            for (std::size_t i = 0; i < n; ++i) slot[i] = from[static_cast<std::ptrdiff_t>(i) * stride];
                            value[k] = slot;
                        }
                        break;
                    }
                    case fused_node<T>::kind::function: {
                        const T* arguments[max_function_operands];
                        for (std::size_t o = 0; o < node.operand_count; ++o) arguments[o] = value[node.operands[o]];
                        T* target = k + 1 == nodes && in_place_result ? out : slot;
                        if (node.host) (*node.host)(n, arguments, target);
                        else node.function(n, arguments, target);
                        value[k] = target;
                        break;
                    }
                }
            }
            const T* last = value[nodes - 1];
            if (rounded) {
                round_values(last, rounded, at[0], out_stride, n, stream);
            } else if (last != out) {
                if (stream) copy_streaming(last, out, n);
                else for (std::size_t i = 0; i < n; ++i) out[static_cast<std::ptrdiff_t>(i) * out_stride] = last[i];
            }
        }
        if (stream) streaming_fence();
    };

    split_range(parallel && size >= parallel_elements ? num_threads() : 1, items, [&] { prepare_fused(program); }, sweep);
}

// ---- a fused program as the epilogue of a kernel's regions

// A fused program that a kernel runs on each finished region of its result (a gemm's blocks
// of C, attention's tiles of scores), in place: input `own` reads the kernel's values there,
// every other input its own values at the region's place. The kernels get it through
// gemm_epilogue and score_epilogue (gemm_epilogue_of, score_epilogue_of), which call the
// functions below; it must outlive the kernel's call.
template <class T>
struct region_program {
    const fused_program<T>* program = nullptr;  // null: none (a gemm that only rounds)
    std::size_t own = detail::no_input;
    strided<T> result;          // the kernel's whole result: C (attention: the scores' extents, data null)
    rounded_memory<T> rounded{};  // gemm: each region also rounded into this memory, at C's offsets
};

namespace regions {

// The box of an array of `shape`'s extents that a kernel's tile covers: batch item `item`
// (numbered in row-major order over the leading axes), rows [row, row + rows) and columns
// [col, col + cols).
template <class T>
box tile_of(const strided<T>& shape, std::size_t item, std::size_t row, std::size_t col, std::size_t rows, std::size_t cols) {
    box tile;
    const std::size_t r = shape.where.rank;
    for (std::size_t axis = r - 2; axis-- > 0;) {
        tile.first[axis] = item % shape.where.extents[axis];
        item /= shape.where.extents[axis];
        tile.extents[axis] = 1;
    }
    tile.first[r - 2] = row;
    tile.first[r - 1] = col;
    tile.extents[r - 2] = rows;
    tile.extents[r - 1] = cols;
    return tile;
}
template <class T>
fused_program<T>& moved_program() {  // this member's (runtime/member_memory.hpp)
    return runtime::member_local<fused_program<T>>();
}
// `program` moved to one block of its result, `place`: its input `in_block` read from
// `block`, every other from the block's place in it. Per thread, since the team runs blocks
// at once, in the capacity reserve_moved took.
template <class T>
const fused_program<T>& moved_to(const fused_program<T>& program, std::size_t in_block, const box& place,
                                 const strided<const T>& block) {
    fused_program<T>& local = moved_program<T>();
    local.nodes = program.nodes;
    local.inputs = program.inputs;
    for (std::size_t i = 0; i < local.inputs.size(); ++i) {
        source_array<T>& input = local.inputs[i];
        if (i == in_block) input = block;
        else input.advance(evaluation::offset_in(input.where, place));
    }
    return local;
}
template <class T>
void reserve_moved(const fused_program<T>& program) {
    moved_program<T>().nodes.reserve(program.nodes.size());
    moved_program<T>().inputs.reserve(program.inputs.size());
    prepare_fused<T>(program);
}

// gemm_epilogue::apply: the program over a finished region of C, then the region rounded.
template <class T>
void apply_to_c(const void* context, std::size_t item, std::size_t row, std::size_t col, std::size_t rows, std::size_t cols) {
    const auto& c = *static_cast<const region_program<T>*>(context);
    const box region = tile_of(c.result, item, row, col, rows, cols);
    if (c.program) run_fused<T>(*c.program, c.result, false, &region);
    if (!c.rounded) return;
    const std::size_t r = c.result.where.rank;
    const std::ptrdiff_t first = evaluation::offset_in(c.result.where, region);
    for (std::size_t i = 0; i < rows; ++i) {  // into memory of C's layout: the same offsets
        const std::ptrdiff_t at = first + static_cast<std::ptrdiff_t>(i) * c.result.where.strides[r - 2];
        round_line(c.result.data + at, c.result.where.strides[r - 1], c.rounded, at, c.result.where.strides[r - 1], cols);
    }
}
// gemm_epilogue::apply_to_block, for a block whose sums the kernel holds in its own buffer, C
// unread (gemm_problem::c_unread): the program moved to the block, as the score function is
// to its tile, and its result, the only one, rounded into c.rounded.
template <class T>
void apply_to_sums(const void* context, std::size_t item, std::size_t row, std::size_t col, std::size_t rows,
                   std::size_t cols, float* block, std::ptrdiff_t ld) {
    if constexpr (!std::is_same_v<T, float>) {
        throw std::logic_error("dimsum: a product of float sums for an evaluation in another type");
    } else {
        const auto& c = *static_cast<const region_program<T>*>(context);
        const box region = tile_of(c.result, item, row, col, rows, cols);
        const std::size_t r = c.result.where.rank;
        const std::ptrdiff_t first = evaluation::offset_in(c.result.where, region);
        strided<const T> sums{block, r, region.extents, {}};  // batch axes of extent 1
        sums.where.strides[r - 2] = ld;
        sums.where.strides[r - 1] = 1;
        const strided<T> out{c.result.data + first, r, region.extents, c.result.where.strides};  // its layout; only the rounded result is written
        if (!c.program) throw std::logic_error("dimsum: a product's sums handed to an epilogue that only rounds (gemm_rounding's)");
        rounded_memory<T> rounded = c.rounded;
        rounded.advance(first);
        run_fused<T>(moved_to(*c.program, c.own, region, sums), out, false, nullptr, rounded);
    }
}
template <class T>
void reserve_region(const void* context) {
    const auto& c = *static_cast<const region_program<T>*>(context);
    if (c.program) reserve_moved(*c.program);
}

// score_epilogue::apply: the program on one tile of scores, its scores read from the tile itself.
template <class T>
void apply_to_scores(const void* context, std::size_t item, std::size_t query, std::size_t key, std::size_t queries,
                     std::size_t keys, T* tile, std::ptrdiff_t query_stride) {
    const auto& c = *static_cast<const region_program<T>*>(context);
    const std::size_t r = c.result.where.rank;
    const box place = tile_of(c.result, item, query, key, queries, keys);
    strided<T> result{tile, {r, place.extents, {}, 0}};  // the tile itself: batch axes of extent 1
    result.where.strides[r - 2] = query_stride;
    result.where.strides[r - 1] = 1;
    run_fused<T>(moved_to(*c.program, c.own, place, {tile, result.where}), result, false);
}

}  // namespace regions

// The epilogue that runs `program` on C's regions and rounds them into program.rounded if set;
// with C unread, on the kernel's buffer of sums (apply_to_block).
template <class T>
gemm_epilogue gemm_epilogue_of(const region_program<T>& program) {
    gemm_epilogue epilogue{&regions::apply_to_c<T>, &regions::reserve_region<T>, &program};
    if (program.rounded) epilogue.apply_to_block = &regions::apply_to_sums<T>;
    return epilogue;
}
// The score function that runs `program` on attention's tiles of scores.
template <class T>
score_epilogue<T> score_epilogue_of(const region_program<T>& program) {
    return {&regions::apply_to_scores<T>, &regions::reserve_region<T>, &program};
}


}  // namespace dimsum::backend::cpu
