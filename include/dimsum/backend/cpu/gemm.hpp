#pragma once
// Matrix products: C = A B for every item of a batch, in the structure of BLIS (Goto's
// algorithm). A and B are read through any strides while they are packed into contiguous
// panels, so a transposed or permuted operand is never copied first; a register-blocked
// micro-kernel multiplies one panel of A by one panel of B; blocks sized for the caches keep
// each panel where the micro-kernel reads it. The caller may pass an epilogue, which is
// applied to each finished region of C while it is still in cache.
//
// An operand that a product uses too little to repay its packing (a row-major B times few
// rows, a row-major A times few columns) is read in place instead.
//
// Threads: a batch of many products gives each thread whole products; a few large products
// are each shared by all threads, which pack each block of B together, then share its tiles
// (blocks of rows by groups of columns).
//
// A B packed once (ds::prepack: weights used by every call) holds every block's panels in
// the order product_share reads them, and is never packed again.

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <type_traits>

#include "dimsum/backend/cpu/bf16_gemm.hpp"
#include "dimsum/backend/cpu/bf16_paths.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/backend/cpu/workspace.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

// The blocking, per element type. The micro-kernel keeps an mr x nr tile of C in registers:
// nr is two SIMD vectors, and 2 mr accumulators plus two B vectors and one broadcast A value
// fit the register file (32 registers with AVX-512, 16 below it).
template <class T>
struct gemm_tiling {
    static constexpr std::size_t width = simd<T>::size;
    static constexpr std::size_t nr = 2 * width;
    static constexpr std::size_t mr = width * sizeof(T) >= 64 ? 12 : 6;
    // A micro-panel (mr x kc) and a B micro-panel (kc x nr) stay in L1 (48 KiB here) while
    // the micro-kernel streams them: 12 + 32 KiB for float with AVX-512.
    static constexpr std::size_t kc = 256;
    // An A block (mc x kc) stays in L2 (2 MiB here, shared with the packed B traffic).
    static constexpr std::size_t mc = 24 * mr;
    // A B block (kc x nc), packed once for all the rows of C: 4 MiB for float, in L3.
    static constexpr std::size_t nc = 4096 / sizeof(T) * 4 / nr * nr;
    // The micro-kernel asks for one cache line (`line` values) of the next panel of B every
    // `prefetch_every` depths: a tile of `depth` depths, depth / prefetch_every lines.
    static constexpr std::size_t prefetch_every = 8;
    static constexpr std::size_t line = 64 / sizeof(T);
};

namespace detail {

// Packs `lines` lines of `depth` contiguous values each (line l at src + l * line_stride)
// into out[p * width + l], zero past the last line: the transposition that turns the rows
// of a row-major A, or the columns of a transposed B, into a panel. With AVX-512 and float,
// 16 x 16 blocks are transposed in registers (transpose_tile_16); otherwise it goes through
// a small buffer a vector at a time, which is about twice as fast as element by element.
// Values of bf16 are widened as they are loaded.
template <class T, std::size_t width, class U>
void pack_lines(const U* src, std::ptrdiff_t line_stride, std::size_t lines, std::size_t depth, T* out) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float> && simd<T>::size == 16) {
        const auto depths = [&](std::size_t p, std::size_t count) {  // [p, p + count), count at most 16
            for (std::size_t first = 0; first < width; first += 16) {
                const std::size_t live = first < lines ? std::min<std::size_t>(16, lines - first) : 0;  // then zeros
                const U* from = live ? src + static_cast<std::ptrdiff_t>(first) * line_stride + static_cast<std::ptrdiff_t>(p) : src;
                transpose_tile_16(from, line_stride, live, count, out + p * width + first, width, std::min<std::size_t>(16, width - first));
            }
        };
        std::size_t p = 0;
        for (; p + 16 <= depth; p += 16) depths(p, 16);  // whole tiles, their loops of constant bounds
        if (p < depth) depths(p, depth - p);
        return;
    }
#endif
    using batch = simd<T>;
    constexpr std::size_t step = batch::size;
    alignas(64) T block[width * step];
    std::size_t p = 0;
    for (; p + step <= depth; p += step) {
        for (std::size_t l = 0; l < lines; ++l) {
            load_widened<T>(src + static_cast<std::ptrdiff_t>(l) * line_stride + static_cast<std::ptrdiff_t>(p))
                .store_aligned(block + l * step);
        }
        for (std::size_t l = lines; l < width; ++l) batch(T(0)).store_aligned(block + l * step);
        for (std::size_t q = 0; q < step; ++q) {
            for (std::size_t l = 0; l < width; ++l) out[(p + q) * width + l] = block[l * step + q];
        }
    }
    for (; p < depth; ++p) {
        for (std::size_t l = 0; l < width; ++l) {
            out[p * width + l] = l < lines ? static_cast<T>(src[static_cast<std::ptrdiff_t>(l) * line_stride + static_cast<std::ptrdiff_t>(p)]) : T(0);
        }
    }
}

// Packs one panel of `width` lines along the first axis of m (depths [0, depth) along the
// second), depth by depth: out[p * width + l] = m(l, p), zero past `lines`. Values of bf16
// (an operand stored so, or a weight packed once into float panels) are widened as they go.
template <class T, std::size_t width, class U>
void pack_panel(const U* src, std::ptrdiff_t line_stride, std::ptrdiff_t depth_stride, std::size_t lines,
                std::size_t depth, T* out) {
    if (depth_stride == 1) return pack_lines<T, width>(src, line_stride, lines, depth, out);
    if (line_stride == 1 && lines == width && width % simd<T>::size == 0) {  // laid out as the panel wants
        for (std::size_t p = 0; p < depth; ++p) {
            const U* from = src + static_cast<std::ptrdiff_t>(p) * depth_stride;
#pragma GCC unroll 4
            for (std::size_t l = 0; l < width; l += simd<T>::size) load_widened<T>(from + l).store_aligned(out + p * width + l);
        }
        return;
    }
    if constexpr (std::is_same_v<T, U>) {
        // The same with a panel narrower than a whole number of vectors (mr = 12 rows of a
        // transposed A, X^T in a weight's gradient X^T dY): a copy of a constant size per depth,
        // which the compiler makes a few vector moves (element by element, such packing took
        // 4% of a BERT layer's training step).
        if (line_stride == 1 && lines == width) {
            for (std::size_t p = 0; p < depth; ++p) {
                std::memcpy(out + p * width, src + static_cast<std::ptrdiff_t>(p) * depth_stride, width * sizeof(T));
            }
            return;
        }
    }
    for (std::size_t p = 0; p < depth; ++p) {
        const U* at = src + static_cast<std::ptrdiff_t>(p) * depth_stride;
        for (std::size_t l = 0; l < width; ++l) {
            out[p * width + l] = l < lines ? static_cast<T>(at[static_cast<std::ptrdiff_t>(l) * line_stride]) : T(0);
        }
    }
}

// Packs rows [0, rows) and depths [0, depth) of a (of T or bf16) into panels of mr rows.
template <class T, class U>
void pack_a(const matrix<const U>& a, std::size_t rows, std::size_t depth, T* out) {
    constexpr std::size_t mr = gemm_tiling<T>::mr;
    for (std::size_t panel = 0; panel < rows; panel += mr) {
        pack_panel<T, mr>(a.data + static_cast<std::ptrdiff_t>(panel) * a.row_stride, a.row_stride, a.col_stride,
                          std::min(mr, rows - panel), depth, out);
        out += mr * depth;
    }
}

// Packs one panel of nr columns of b (of T or bf16; depths [0, depth)).
template <class T, class U>
void pack_b_panel(const matrix<const U>& b, std::size_t cols, std::size_t depth, T* out) {
    pack_panel<T, gemm_tiling<T>::nr>(b.data, b.col_stride, b.row_stride, cols, depth, out);
}

// tile (mr x nr, row stride ldc) = or += a (mr x depth) x b (depth x nr, rows b_step apart:
// nr when packed). A is packed (mr values per depth), or with packed_a false, rows lda apart.
// Meanwhile, unless `ahead` is null, it asks for the cache lines from `ahead` on into L2, one
// every gemm_tiling::prefetch_every depths: macro_kernel points it at the part of the next
// panel of B this tile fetches early (see there). Always inlined, as macro_kernel is.
template <class T, bool packed_a = true>
[[gnu::always_inline]] inline void micro_kernel(std::size_t depth, const T* a, std::ptrdiff_t lda, const T* b,
                                                std::ptrdiff_t b_step, T* tile, std::ptrdiff_t ldc, bool accumulate,
                                                const T* ahead) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size, mr = gemm_tiling<T>::mr, every = gemm_tiling<T>::prefetch_every;
    // The tile's rows lie far apart in C, where no hardware prefetcher follows them: ask for
    // them now, so that they arrive while the products are computed.
#pragma GCC unroll 16
    for (std::size_t r = 0; r < mr; ++r) {
        const T* row = tile + static_cast<std::ptrdiff_t>(r) * ldc;
        __builtin_prefetch(row, 1);
        __builtin_prefetch(row + 2 * width - 1, 1);
    }
    batch left[mr], right[mr];  // the tile: columns [0, width) and [width, 2 width)
#pragma GCC unroll 16
    for (std::size_t r = 0; r < mr; ++r) left[r] = right[r] = batch(T(0));
    auto one_depth = [&] {
        batch b0 = batch::load_unaligned(b), b1 = batch::load_unaligned(b + width);
#pragma GCC unroll 16
        for (std::size_t r = 0; r < mr; ++r) {
            batch ar(packed_a ? a[r] : a[static_cast<std::ptrdiff_t>(r) * lda]);
            left[r] = xsimd::fma(ar, b0, left[r]);
            right[r] = xsimd::fma(ar, b1, right[r]);
        }
        a += packed_a ? mr : 1;
        b += b_step;
    };
    std::size_t p = 0;
    for (; p + every <= depth; p += every) {
        if (ahead) {
            __builtin_prefetch(ahead, 0, 2);  // prefetcht1: into L2, leaving L1 to this tile's panels
            ahead += gemm_tiling<T>::line;
        }
#pragma GCC unroll 8
        for (std::size_t q = 0; q < every; ++q) one_depth();
    }
    for (; p < depth; ++p) one_depth();
#pragma GCC unroll 16
    for (std::size_t r = 0; r < mr; ++r) {
        T* row = tile + static_cast<std::ptrdiff_t>(r) * ldc;
        if (accumulate) {
            left[r] += batch::load_unaligned(row);
            right[r] += batch::load_unaligned(row + width);
        }
        left[r].store_unaligned(row);
        right[r].store_unaligned(row + width);
    }
}

// Where the micro-kernels read one block of an operand: its panels packed, or, when `direct`
// is given, its full panels in place (rows `ld` apart) and only a last, partial one packed.
template <class T>
struct block_source {
    const T* packed = nullptr;  // panels of mr rows of A, or nr columns of B
    const T* direct = nullptr;  // the block itself, or nullptr: every panel packed
    std::ptrdiff_t ld = 0;      // the distance between rows of `direct`
};

// One block product for macro_kernel: C block (rows x cols) = or += A block (rows x depth)
// x B block (depth x cols), the extents those of c.
template <class T>
struct block_operands {
    block_source<T> a, b;
    std::size_t depth = 0;
    matrix<T> c;
    bool accumulate = false;  // C += A B, else C = A B
};

// Inlined into its callers, and the micro-kernel into it: a tile then costs no call, and
// the callers' constant strides (attention's) reach the loops. Left to themselves, GCC's
// heuristics keep both out of line once the operands come in a struct (g++ 12: 0.5% more
// instructions in fused attention).
template <class T>
[[gnu::always_inline]] inline void macro_kernel(const block_operands<T>& block) {
    constexpr std::size_t mr = gemm_tiling<T>::mr, nr = gemm_tiling<T>::nr;
    const std::size_t rows = block.c.rows, cols = block.c.cols, depth = block.depth;
    const T *packed_a = block.a.packed, *direct_a = block.a.direct, *packed_b = block.b.packed, *direct_b = block.b.direct;
    const std::ptrdiff_t lda = block.a.ld, ldb = block.b.ld;
    const matrix<T>& c = block.c;
    const bool accumulate = block.accumulate;
    alignas(64) T edge[mr * nr];
    for (std::size_t j = 0; j < cols; j += nr) {
        std::size_t live_cols = std::min(nr, cols - j);
        bool in_place = direct_b && live_cols == nr;
        const T* b_panel = in_place ? direct_b + j : packed_b + j * depth;
        std::ptrdiff_t b_step = in_place ? ldb : static_cast<std::ptrdiff_t>(nr);
        for (std::size_t i = 0; i < rows; i += mr) {
            std::size_t live_rows = std::min(mr, rows - i);
            const bool a_in_place = direct_a && live_rows == mr;
            T* corner = c.data + c.at(i, j);
            T* target = live_rows == mr && live_cols == nr && c.col_stride == 1 ? corner : edge;
            std::ptrdiff_t ld_target = target == corner ? c.row_stride : static_cast<std::ptrdiff_t>(nr);
            bool add = target == corner && accumulate;
            // The next packed panel of B, fetched into L2 a part per tile while this panel is
            // in use: it comes from L3 or, packed by another thread, from that core's cache,
            // and each panel's first tile waited for it (2 threads, 1024 x 3072 x 768: 4%
            // slower).
            const std::size_t part = depth / gemm_tiling<T>::prefetch_every * gemm_tiling<T>::line, offset = i / mr * part;
            const bool fetch_next = !in_place && j + nr < cols && offset + part <= nr * depth;
            const T* ahead = fetch_next ? b_panel + nr * depth + offset : nullptr;
            if (a_in_place) {
                micro_kernel<T, false>(depth, direct_a + static_cast<std::ptrdiff_t>(i) * lda, lda, b_panel, b_step, target,
                                       ld_target, add, ahead);
            } else {
                micro_kernel<T>(depth, packed_a + i * depth, 0, b_panel, b_step, target, ld_target, add, ahead);
            }
            if (target == corner) continue;
            // an edge tile, or a C with strided rows: through the buffer
            for (std::size_t r = 0; r < live_rows; ++r) {
                for (std::size_t q = 0; q < live_cols; ++q) {
                    T& out = corner[c.at(r, q)];
                    out = accumulate ? out + edge[r * nr + q] : edge[r * nr + q];
                }
            }
        }
    }
}

// A share of one product: rows [row_first, row_last), with the column panels
// [col_panel_first, col_panel_last) of each B block, computed by one thread that packs the
// panels of B it uses into `packed_b` (unless B was packed once). With `direct_b`
// (`direct_a`), B's (A's) full panels are read in place and only a last, partial one is
// packed.
template <class T>
struct share {
    std::size_t item = 0;  // which product of the batch, for the epilogue
    std::size_t row_first = 0, row_last = 0;
    std::size_t col_panel_first = 0, col_panel_last = 0;
    T* packed_b = nullptr;
    const T* packed_once = nullptr;  // B's panels packed before (ds::prepack), or nullptr
    bool direct_a = false, direct_b = false;
};

// Where the panels of B's block (columns from jc, depths from pc) start in B packed once:
// the blocks follow each other by columns, then depths, each block_cols rounded up to nr.
template <class T>
std::size_t packed_block_offset(std::size_t k, std::size_t jc, std::size_t pc, std::size_t block_cols) {
    return jc * k + round_up(block_cols, gemm_tiling<T>::nr) * pc;
}

// One block of B (`depth` rows from pc, `block_cols` columns from jc), as the product works
// through it.
struct b_block {
    std::size_t jc = 0, pc = 0, depth = 0, block_cols = 0;
};

// Packs the panels [first_panel, last_panel) of B's block into `packed_b` (panel p at
// p * nr * depth); with `direct_b`, only a last, partial panel.
template <class T>
void pack_b_panels(const source_matrix<T>& b, const b_block& block, std::size_t first_panel, std::size_t last_panel, bool direct_b,
                   T* packed_b) {
    constexpr std::size_t nr = gemm_tiling<T>::nr;
    for (std::size_t panel = first_panel; panel < last_panel; ++panel) {
        std::size_t col = panel * nr;
        if (direct_b && col + nr <= block.block_cols) continue;
        b.visit([&](const auto& m) {
            pack_b_panel<T>(sub(m, block.pc, block.jc + col), std::min(nr, block.block_cols - col), block.depth,
                            packed_b + col * block.depth);
        });
    }
}

// Multiplies rows [row_first, row_last) of A's block by the columns [first, last) of B's
// block (packed in `packed_b`), into C; the epilogue follows the block's last depths. Uses the
// calling thread's packed_a scratch, reserved before (gemm's prepare): nothing here allocates.
template <class T>
void multiply_block(const source_matrix<T>& a, const source_matrix<T>& b, const matrix<T>& c, const b_block& block, std::size_t item,
                    std::size_t row_first, std::size_t row_last, std::size_t first, std::size_t last, const T* packed_b,
                    bool direct_a, bool direct_b, const gemm_epilogue& epilogue) {
    using tiling = gemm_tiling<T>;
    const std::size_t k = a.cols, jc = block.jc, pc = block.pc, depth = block.depth;
    T* packed_a = scratch<T>(scratch_use::packed_a, tiling::mc * tiling::kc);
    for (std::size_t ic = row_first; ic < row_last; ic += tiling::mc) {
        std::size_t rows = std::min(tiling::mc, row_last - ic);
        std::size_t packed_from = direct_a ? rows / tiling::mr * tiling::mr : 0;
        if (packed_from < rows) {
            a.visit([&](const auto& m) {
                pack_a<T>(sub(m, ic + packed_from, pc), rows - packed_from, depth, packed_a + packed_from * depth);
            });
        }
        // (an operand stored narrower is never read in place: gemm sets neither then)
        const T* a_in_place = direct_a ? sub(a.own(), ic, pc).data : nullptr;
        const T* b_in_place = direct_b ? sub(b.own(), pc, jc + first).data : nullptr;
        const matrix<T> c_block = sub(c, ic, jc + first, rows, last - first);
        macro_kernel<T>({.a = {.packed = packed_a, .direct = a_in_place, .ld = a.row_stride},
                         .b = {.packed = packed_b + first * depth, .direct = b_in_place, .ld = b.row_stride},
                         .depth = depth,
                         .c = c_block,
                         .accumulate = pc != 0});
        if (pc + depth == k) epilogue(item, ic, jc + first, rows, last - first);
    }
}

// Computes the share `part` of c = a b on the calling thread: for each block of B, pass 1
// packs the panels it uses (unless B was packed once), pass 2 multiplies.
template <class T>
void product_share(const source_matrix<T>& a, const source_matrix<T>& b, const matrix<T>& c, const share<T>& part,
                   const gemm_epilogue& epilogue) {
    using tiling = gemm_tiling<T>;
    constexpr std::size_t nr = tiling::nr;
    std::size_t n = c.cols, k = a.cols;
    for (std::size_t jc = 0; jc < n; jc += tiling::nc) {
        std::size_t block_cols = std::min(tiling::nc, n - jc);
        std::size_t panels = (block_cols + nr - 1) / nr;
        for (std::size_t pc = 0; pc < k; pc += tiling::kc) {
            const b_block block{jc, pc, std::min(tiling::kc, k - pc), block_cols};
            const T* const packed_b =
                part.packed_once ? part.packed_once + packed_block_offset<T>(k, jc, pc, block_cols) : part.packed_b;
            // pass 1
            if (!part.packed_once) {
                pack_b_panels(b, block, std::min(part.col_panel_first, panels), std::min(part.col_panel_last, panels),
                              part.direct_b, part.packed_b);
            }
            // pass 2
            std::size_t first = std::min(part.col_panel_first * nr, block_cols);
            std::size_t last = std::min(part.col_panel_last * nr, block_cols);
            if (first < last) {
                multiply_block(a, b, c, block, part.item, part.row_first, part.row_last, first, last, packed_b,
                               part.direct_a, part.direct_b, epilogue);
            }
        }
    }
}

// One large product shared by the threads: for each block of B, the threads pack its panels
// together into `packed_b` (pass 1), then multiply tiles of rows by columns of it (pass 2),
// each pass cut into chunks that the threads claim (threads.hpp), so that a thread taken off
// its core holds the others up by one chunk at most. `prepare` reserves a thread's scratch.
template <class T, class Prepare>
void shared_product(const source_matrix<T>& a, const source_matrix<T>& b, const matrix<T>& c, std::size_t item, int threads, T* packed_b,
                    const T* packed_once, Prepare&& prepare, const gemm_epilogue& epilogue) {
    using tiling = gemm_tiling<T>;
    constexpr std::size_t nr = tiling::nr;
    const std::size_t m = c.rows, n = c.cols, k = a.cols;
    // Blocks of at most about mc rows, as even as whole micro-panels make them, in a number the
    // threads share evenly: 1024 rows as 4 x 256 rather than 3 x 288 + 160, which left one
    // of two threads waiting at every barrier for an eighth of the product.
    const std::size_t row_panels = (m + tiling::mr - 1) / tiling::mr;
    std::size_t row_blocks = (m + tiling::mc - 1) / tiling::mc;
    if (row_blocks > 1) row_blocks = std::min(round_up(row_blocks, std::size_t(threads)), row_panels);
    for (std::size_t jc = 0; jc < n; jc += tiling::nc) {
        const std::size_t block_cols = std::min(tiling::nc, n - jc), panels = (block_cols + nr - 1) / nr;
        // tiles of mc rows by column groups: at least two per thread where the block has them
        const std::size_t col_groups =
            std::clamp<std::size_t>((2 * std::size_t(threads) + row_blocks - 1) / row_blocks, 1, panels);
        for (std::size_t pc = 0; pc < k; pc += tiling::kc) {
            const b_block block{jc, pc, std::min(tiling::kc, k - pc), block_cols};
            const T* const panels_of_b = packed_once ? packed_once + packed_block_offset<T>(k, jc, pc, block_cols) : packed_b;
            if (!packed_once) {  // pass 1
                split_range(threads, panels, prepare, [&](std::size_t first, std::size_t last) {
                    pack_b_panels(b, block, first, last, false, packed_b);
                });
            }
            // pass 2
            split_range(threads, row_blocks * col_groups, prepare, [&](std::size_t first_tile, std::size_t last_tile) {
                for (std::size_t tile = first_tile; tile < last_tile; ++tile) {
                    const std::size_t row_block = tile / col_groups, group = tile % col_groups;
                    const std::size_t first = std::min(block_cols, panels * group / col_groups * nr);
                    const std::size_t last = std::min(block_cols, panels * (group + 1) / col_groups * nr);
                    if (first >= last) continue;
                    const std::size_t row_first = std::min(m, row_panels * row_block / row_blocks * tiling::mr);
                    const std::size_t row_last = std::min(m, row_panels * (row_block + 1) / row_blocks * tiling::mr);
                    multiply_block(a, b, c, block, item, row_first, row_last, first, last, panels_of_b, false, false, epilogue);
                }
            });
        }
    }
}

// k == 0: every element of C is an empty sum.
template <class T>
void zero_product(const matrix<T>& c, std::size_t item, const gemm_epilogue& epilogue) {
    for (std::size_t i = 0; i < c.rows; ++i) {
        for (std::size_t j = 0; j < c.cols; ++j) c.data[c.at(i, j)] = T(0);
    }
    epilogue(item, 0, 0, c.rows, c.cols);
}

// C (m x n) = A (m x k) B (k x n) over columns [first, last) of C, for a few rows of A (one
// token decoding: m = 1) and a row-major B and C. B is streamed once, a few of its rows at a
// time, each row's columns in order: the product is as fast as memory gives B. (The general
// kernel would compute mr rows of which m are real, and walk B panel by panel, each panel a
// line from a new page per row of B.) C's rows stay in cache between passes. B of bf16 is
// widened as it is loaded.
inline constexpr std::size_t few_rows = 4;
template <class T, std::size_t M, class U>
void few_rows_product(const matrix<const T>& a, const matrix<const U>& b, const matrix<T>& c, std::size_t depth,
                      std::size_t first, std::size_t last) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size, step = 4;  // rows of B per pass over C
    auto a_at = [&](std::size_t r, std::size_t p) {
        return a.data[a.at(r, p)];
    };
    T* c_row[M];
    for (std::size_t r = 0; r < M; ++r) c_row[r] = c.data + static_cast<std::ptrdiff_t>(r) * c.row_stride;
    for (std::size_t p = 0; p < depth; p += step) {
        const std::size_t rows = std::min(step, depth - p);  // the last pass may have fewer
        const U* b_row[step] = {};
        batch coefficient[M][step];
        for (std::size_t q = 0; q < rows; ++q) {
            b_row[q] = b.data + static_cast<std::ptrdiff_t>(p + q) * b.row_stride;
            for (std::size_t r = 0; r < M; ++r) coefficient[r][q] = batch(a_at(r, p + q));
        }
        const bool start = p == 0;  // C = A B: the first pass writes C, the others add to it
        std::size_t j = first;
        if (rows == step) {
            for (; j + width <= last; j += width) {
                const batch b0 = load_widened<T>(b_row[0] + j), b1 = load_widened<T>(b_row[1] + j);
                const batch b2 = load_widened<T>(b_row[2] + j), b3 = load_widened<T>(b_row[3] + j);
                for (std::size_t r = 0; r < M; ++r) {
                    batch sum = start ? batch(T(0)) : batch::load_unaligned(c_row[r] + j);
                    sum = xsimd::fma(coefficient[r][0], b0, sum);
                    sum = xsimd::fma(coefficient[r][1], b1, sum);
                    sum = xsimd::fma(coefficient[r][2], b2, sum);
                    sum = xsimd::fma(coefficient[r][3], b3, sum);
                    sum.store_unaligned(c_row[r] + j);
                }
            }
        } else {
            for (; j + width <= last; j += width) {
                for (std::size_t r = 0; r < M; ++r) {
                    batch sum = start ? batch(T(0)) : batch::load_unaligned(c_row[r] + j);
                    for (std::size_t q = 0; q < rows; ++q) sum = xsimd::fma(coefficient[r][q], load_widened<T>(b_row[q] + j), sum);
                    sum.store_unaligned(c_row[r] + j);
                }
            }
        }
        for (; j < last; ++j) {
            for (std::size_t r = 0; r < M; ++r) {
                T sum = start ? T(0) : c_row[r][j];
                for (std::size_t q = 0; q < rows; ++q) sum += a_at(r, p + q) * static_cast<T>(b_row[q][j]);
                c_row[r][j] = sum;
            }
        }
    }
}
// The same with B packed once: each panel of nr columns streamed once (its blocks of depth
// one after the other), the M rows of C times those columns held in registers all along, in
// U sums of every U-th depth each: with one or two rows, one sum per row would wait on its
// own previous FMA at every step (m = 1, 768 x 2304: 1.3 times slower).
template <class T, std::size_t M>
void few_rows_product(const matrix<const T>& a, const packed_operand<T>& b, const matrix<T>& c, std::size_t first,
                      std::size_t last) {
    using batch = simd<T>;
    using tiling = gemm_tiling<T>;
    constexpr std::size_t width = batch::size, nr = tiling::nr, U = M >= 4 ? 1 : 4 / M;
    const std::size_t k = b.rows, n = b.cols;
    alignas(64) T edge[M * nr];
    for (std::size_t col = first / nr * nr; col < last; col += nr) {  // first is a multiple of nr
        const std::size_t jc = col / tiling::nc * tiling::nc, block_cols = std::min(tiling::nc, n - jc);
        batch left[U][M], right[U][M];
        for (std::size_t u = 0; u < U; ++u) {
            for (std::size_t r = 0; r < M; ++r) left[u][r] = right[u][r] = batch(T(0));
        }
        auto step = [&](std::size_t u, const T* panel, const T* a_at) {
            const batch b0 = batch::load_aligned(panel), b1 = batch::load_aligned(panel + width);
            for (std::size_t r = 0; r < M; ++r) {
                const batch ar(a_at[static_cast<std::ptrdiff_t>(r) * a.row_stride]);
                left[u][r] = xsimd::fma(ar, b0, left[u][r]);
                right[u][r] = xsimd::fma(ar, b1, right[u][r]);
            }
        };
        for (std::size_t pc = 0; pc < k; pc += tiling::kc) {
            const std::size_t depth = std::min(tiling::kc, k - pc);
            const T* panel = b.panels + packed_block_offset<T>(k, jc, pc, block_cols) + (col - jc) * depth;
            const T* a_at = a.data + static_cast<std::ptrdiff_t>(pc) * a.col_stride;
            std::size_t p = 0;
            for (; p + U <= depth; p += U, panel += U * nr, a_at += static_cast<std::ptrdiff_t>(U) * a.col_stride) {
                for (std::size_t u = 0; u < U; ++u) step(u, panel + u * nr, a_at + static_cast<std::ptrdiff_t>(u) * a.col_stride);
            }
            for (; p < depth; ++p, panel += nr, a_at += a.col_stride) step(0, panel, a_at);
        }
        for (std::size_t u = 1; u < U; ++u) {
            for (std::size_t r = 0; r < M; ++r) {
                left[0][r] += left[u][r];
                right[0][r] += right[u][r];
            }
        }
        batch* const sum_left = left[0];
        batch* const sum_right = right[0];
        const std::size_t live = std::min(nr, last - col);
        for (std::size_t r = 0; r < M; ++r) {
            T* row = c.data + c.at(r, col);
            if (live == nr && c.col_stride == 1) {
                sum_left[r].store_unaligned(row);
                sum_right[r].store_unaligned(row + width);
                continue;
            }
            sum_left[r].store_aligned(edge + r * nr);
            sum_right[r].store_aligned(edge + r * nr + width);
            for (std::size_t q = 0; q < live; ++q) row[static_cast<std::ptrdiff_t>(q) * c.col_stride] = edge[r * nr + q];
        }
    }
}

// to += from, element by element; rows of unit column stride, as many as `to` has.
template <class T>
void add_to(const matrix<T>& to, const matrix<T>& from) {
    using batch = simd<T>;
    for (std::size_t r = 0; r < to.rows; ++r) {
        T* const into = to.data + static_cast<std::ptrdiff_t>(r) * to.row_stride;
        const T* const added = from.data + static_cast<std::ptrdiff_t>(r) * from.row_stride;
        std::size_t j = 0;
        for (; j + batch::size <= to.cols; j += batch::size) {
            (batch::load_unaligned(into + j) + batch::load_unaligned(added + j)).store_unaligned(into + j);
        }
        for (; j < to.cols; ++j) into[j] += added[j];
    }
}

// A few rows times B, read in place (row-major, of T or bf16) or packed once.
template <class T, class B>
void few_rows_product(const matrix<const T>& a, const B& b, const matrix<T>& c, std::size_t first, std::size_t last) {
    auto rows = [&]<std::size_t M>(std::integral_constant<std::size_t, M>) {
        if constexpr (std::is_same_v<B, packed_operand<T>>) few_rows_product<T, M>(a, b, c, first, last);
        else few_rows_product<T, M>(a, b, c, a.cols, first, last);
    };
    switch (c.rows) {
        case 1: return rows(std::integral_constant<std::size_t, 1>{});
        case 2: return rows(std::integral_constant<std::size_t, 2>{});
        case 3: return rows(std::integral_constant<std::size_t, 3>{});
        default: return rows(std::integral_constant<std::size_t, 4>{});
    }
}

template <class T>
struct item_operands {
    source_matrix<T> a, b;
    matrix<T> c;
};
// B packed once must be of this product's extents, for this tiling, and the same for every
// item: a logic error otherwise, before anything is written.
template <class T>
void check_packed(const packed_operand<T>& once, const gemm_problem<T>& problem) {
    using tiling = gemm_tiling<T>;
    bool fits = once.rows == problem.b.rows && once.cols == problem.b.cols && once.nr == tiling::nr &&
                once.kc == tiling::kc && once.nc == tiling::nc;
    for (std::size_t i = 0; i < problem.batch.rank; ++i) {
        fits = fits && (problem.batch.strides[1][i] == 0 || problem.batch.extents[i] == 1);
    }
    if (!fits) throw std::logic_error("dimsum: gemm: an operand packed once does not fit this product");
}

template <class T>
item_operands<T> item_of(const gemm_problem<T>& p, std::size_t item) {
    const auto at = p.batch.offsets(item);  // a, b, c
    item_operands<T> r{p.a, p.b, p.c};
    r.a.advance(at[0]);
    r.b.advance(at[1]);
    r.c.data += at[2];
    return r;
}

// m (of T or bf16) as T into `out`, row-major (m.rows x m.cols elements): for kernels that
// read a few rows value by value (gemm's few rows of a bf16 A, attention's few queries).
template <class T, class U>
matrix<const T> copy_rows(const matrix<const U>& m, T* out) {
    for (std::size_t i = 0; i < m.rows; ++i) {
        for (std::size_t p = 0; p < m.cols; ++p) {
            out[i * m.cols + p] = static_cast<T>(m.data[m.at(i, p)]);
        }
    }
    return {out, m.rows, m.cols, static_cast<std::ptrdiff_t>(m.cols), 1};
}

}  // namespace detail

// (kernels.hpp)
template <class T>
std::size_t packed_elements(std::size_t rows, std::size_t cols) {
    return detail::round_up(cols, gemm_tiling<T>::nr) * rows;
}

// (kernels.hpp) Every block of m packed as product_share packs it, in the order it reads them.
template <class T, class U>
packed_operand<T> pack_operand(const matrix<const U>& m, T* panels) {
    using tiling = gemm_tiling<T>;
    constexpr std::size_t nr = tiling::nr;
    const std::size_t k = m.rows, n = m.cols;
    for (std::size_t jc = 0; jc < n; jc += tiling::nc) {
        const std::size_t block_cols = std::min(tiling::nc, n - jc);
        for (std::size_t pc = 0; pc < k; pc += tiling::kc) {
            const std::size_t depth = std::min(tiling::kc, k - pc);
            T* block = panels + detail::packed_block_offset<T>(k, jc, pc, block_cols);
            for (std::size_t col = 0; col < block_cols; col += nr) {
                const std::size_t lines = std::min(nr, block_cols - col);
                const matrix<const U> part = sub(m, pc, jc + col);
                detail::pack_panel<T, nr>(part.data, part.col_stride, part.row_stride, lines, depth, block + col * depth);
            }
        }
    }
    return {panels, k, n, nr, tiling::kc, tiling::nc};
}

// (kernels.hpp)
template <class T>
void gemm(const gemm_problem<T>& problem, const gemm_epilogue& epilogue) {
    using tiling = gemm_tiling<T>;
    constexpr std::size_t nr = tiling::nr;
    std::size_t m = problem.c.rows, n = problem.c.cols, k = problem.a.cols, items = problem.batch.count();
    const packed_operand<T>* const once = problem.packed_b;
    if (once) detail::check_packed(*once, problem);
    const T* const packed_once = once ? once->panels : nullptr;
    if (m == 0 || n == 0 || items == 0) return;
    std::size_t packed_b_size = once ? 0 : tiling::kc * detail::round_up(std::min(n, tiling::nc), nr);
    int threads = num_threads();
    double flops_per_item = 2.0 * double(m) * double(n) * double(k);
    // Below this, a product is not worth sharing between threads: the barriers would cost more.
    constexpr double shared_product_flops = 4e6;
    // A row-major B multiplying few rows, on one thread, is read in place: each of its
    // elements serves only m rows, so packing it is a large share of the work (128 x 768 x 768:
    // 6% faster). With more rows, or with B shared by threads, packing measured faster.
    constexpr std::size_t direct_b_rows = tiling::mc;
    const bool direct_b = !once && problem.b.holds_own() && problem.b.col_stride == 1 && m <= direct_b_rows;
    // Likewise a row-major A multiplying few columns (attention's products of 64 or 128):
    // each A panel serves only n / nr micro-kernels, too few to pay for its packing.
    constexpr std::size_t direct_a_columns = 8 * nr;
    const bool direct_a = problem.a.holds_own() && problem.a.col_stride == 1 && n <= direct_a_columns;

    // What a thread needs before it writes anything (threads.hpp): its packing buffers and the
    // epilogue's scratch. A failed allocation then leaves C untouched.
    auto prepare_a = [&] {
        scratch<T>(scratch_use::packed_a, tiling::mc * tiling::kc);
        epilogue.prepare();
    };
    auto prepare_a_and_b = [&] {
        prepare_a();
        scratch<T>(scratch_use::packed_b, packed_b_size);
    };

    // A few rows times a row-major B or B packed once (decoding): B streamed once, its columns
    // shared by the threads when it is large enough to pay for a team. A row-major B stored
    // narrower is streamed as it is even when it was packed once (into panels of T): bf16,
    // half the bytes (1 x 2304 x 768, k = 768: 2.1 times faster than its panels).
    const bool rows_of_b =
        problem.b.col_stride == 1 && problem.c.col_stride == 1 && (!once || (!problem.b.holds_own() && problem.b.data));
    const bool few_rows_of_b = m <= detail::few_rows && k > 0 && (once || rows_of_b);
    // Two bf16 operands on the bf16 dot-product instructions (bf16_gemm.hpp) where the path
    // in use has them (bf16_paths.hpp), unless the product is a few rows streaming B: bound by
    // memory, it would not be faster.
    if constexpr (std::is_same_v<T, float>) {
        if (problem.a.type == element_type::bf16 && problem.b.type == element_type::bf16 && problem.b.data) {
            if (epilogue.rounding.rounded && epilogue.rounding.rounded.type != element_type::bf16) {
                throw std::logic_error("dimsum: gemm: the bf16 kernels round into bf16 only");
            }
            const bf16_path path = few_rows_of_b ? bf16_path::widen : current_bf16_path();
            detail::products_on(path).fetch_add(1, std::memory_order_relaxed);
            if (with_bf16_kernel(path, "gemm", [&]<class Kernel>() { bf16_gemm<Kernel>(problem, epilogue); })) return;
        }
    }
    if (few_rows_of_b) {
        constexpr std::size_t shared_b_bytes = std::size_t(1) << 20;
        const bool shared_b = k * n * sizeof(T) >= shared_b_bytes;
        const std::size_t blocks = (n + 2 * nr - 1) / (2 * nr);  // of 2 nr columns: whole cache lines per thread
        // A row-major B is cut along its depth, in groups of rows fixed by k alone: each task
        // streams rows of B in long pieces, where a task of a few columns would read a short
        // piece of every row (16 such tasks on one thread: decoder_small 1.3 times slower).
        // Within a group, columns go in blocks whose sums stay in L1 (m = 4: 1,024 columns).
        // Group g > 0 sums into its own rows of `sums`, added to C in order afterwards: the
        // result is the same whoever ran which group, on any number of threads.
        constexpr std::size_t depth_group = 128, sums_in_l1 = std::size_t(16) << 10;
        const std::size_t groups = rows_of_b ? (k + depth_group - 1) / depth_group : 1;
        const std::size_t l1_cols = std::max(2 * nr, sums_in_l1 / (m * sizeof(T)) / (2 * nr) * (2 * nr));
        T* const sums = groups > 1 ? scratch<T>(scratch_use::depth_sums, (groups - 1) * m * n) : nullptr;
        // A stored narrower: its few rows widened once (the kernels read A value by value)
        T* const widened_a = problem.a.holds_own() ? nullptr : scratch<T>(scratch_use::widened, m * k);
        for (std::size_t item = 0; item < items; ++item) {
            const detail::item_operands<T> operands = detail::item_of(problem, item);
            matrix<const T> a = operands.a.own();
            if (widened_a) operands.a.visit([&](const auto& stored) { a = detail::copy_rows<T>(stored, widened_a); });
            const matrix<T>& c = operands.c;
            if (rows_of_b) {
                auto group_sums = [&](std::size_t g) {
                    return g == 0 ? c : matrix<T>{sums + (g - 1) * m * n, m, n, std::ptrdiff_t(n), 1};
                };
                const int team = shared_b ? int(std::min<std::size_t>(std::size_t(threads), groups)) : 1;
                split_range(team, groups, [] {}, [&](std::size_t first, std::size_t last) {
                    for (std::size_t g = first; g < last; ++g) {
                        const std::size_t depth = std::min(depth_group, k - g * depth_group);
                        const matrix<const T> a_part = sub(a, 0, g * depth_group, m, depth);
                        operands.b.visit([&](const auto& b) {
                            for (std::size_t col = 0; col < n; col += l1_cols) {
                                detail::few_rows_product<T>(a_part, sub(b, g * depth_group, 0, depth, n), group_sums(g), col,
                                                            std::min(n, col + l1_cols));
                            }
                        });
                    }
                });
                const bool shared_sums = (groups - 1) * m * n >= parallel_elements;
                split_range(shared_sums ? team : 1, blocks, [&] { epilogue.prepare(); }, [&](std::size_t first, std::size_t last) {
                    const std::size_t col_first = first * 2 * nr, col_last = std::min(n, last * 2 * nr);
                    if (col_first >= col_last) return;
                    const matrix<T> columns = sub(c, 0, col_first, m, col_last - col_first);
                    for (std::size_t g = 1; g < groups; ++g) detail::add_to(columns, sub(group_sums(g), 0, col_first));
                    epilogue(item, 0, col_first, m, col_last - col_first);
                });
                continue;
            }
            const int team = shared_b ? int(std::min<std::size_t>(std::size_t(threads), blocks)) : 1;
            split_range(team, blocks, [&] { epilogue.prepare(); }, [&](std::size_t first, std::size_t last) {
                const std::size_t col_first = first * 2 * nr, col_last = std::min(n, last * 2 * nr);
                if (col_first >= col_last) return;
                detail::few_rows_product<T>(a, *once, c, col_first, col_last);
                epilogue(item, 0, col_first, m, col_last - col_first);
            });
        }
        return;
    }

    bool whole_items = threads == 1 || items % std::size_t(threads) == 0 || items >= 4 * std::size_t(threads) ||
                       flops_per_item < shared_product_flops;
    if (whole_items) {
        auto one_item = [&](std::size_t item) {
            auto [a, b, c] = detail::item_of(problem, item);
            if (k == 0) return detail::zero_product(c, item, epilogue);
            T* packed_b = scratch<T>(scratch_use::packed_b, packed_b_size);
            std::size_t all_panels = (n + nr - 1) / nr;
            detail::product_share<T>(a, b, c,
                                     {.item = item, .row_first = 0, .row_last = m,
                                      .col_panel_first = 0, .col_panel_last = all_panels, .packed_b = packed_b,
                                      .packed_once = packed_once, .direct_a = direct_a, .direct_b = direct_b},
                                     epilogue);
        };
        split_range(int(std::min<std::size_t>(std::size_t(threads), items)), items, prepare_a_and_b,
                    [&](std::size_t first, std::size_t last) {
                        for (std::size_t item = first; item < last; ++item) one_item(item);
                    });
        return;
    }

    // A few large products: each is shared by all threads, which pack each block of B
    // together, then share its tiles. (Threads each taking a range of C's columns and packing
    // their own part of B, with no barrier, packed all of A again for every range: 1 to 13%
    // slower at the products of a layer's training step with C wider than tall.)
    T* packed_b = scratch<T>(scratch_use::packed_b, packed_b_size);
    for (std::size_t item = 0; item < items; ++item) {
        const detail::item_operands<T> operands = detail::item_of(problem, item);
        if (k == 0) {
            detail::zero_product(operands.c, item, epilogue);
            continue;
        }
        detail::shared_product<T>(operands.a, operands.b, operands.c, item, threads, packed_b, packed_once, prepare_a, epilogue);
    }
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
