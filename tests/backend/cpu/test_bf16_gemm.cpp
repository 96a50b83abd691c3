// Products of bf16 operands on the bf16 dot-product kernels (backend/cpu/bf16_gemm.hpp),
// against the bf16 values multiplied in double, and the choice of path (bf16_paths.hpp).
//
// Built twice: as test_bf16_gemm, both kernels on the instructions' stand-ins
// (emulated_bf16_units.hpp), on every CPU; and as bf16_instructions_on_this_cpu
// (DIMSUM_TEST_BF16_HARDWARE), each kernel whose instructions this CPU runs on them
// themselves, or ctest's skip code where it runs none (hardware_main.cpp).
#include "support.hpp"

#include "emulated_bf16_units.hpp"

#include <dimsum/backend/cpu/bf16_paths.hpp>
#include <dimsum/backend/cpu/gemm.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ds = dimsum;
namespace cpu = ds::backend::cpu;
using ds::bf16;

namespace {

// The instructions a kernel issues per micro-tile of live_rows rows and 32 depths (fewer for a
// short last panel), counted by the stand-ins.
template <class Kernel>
long dots_per_step(std::size_t live_rows) {
    if constexpr (std::is_same_v<Kernel, cpu::tile_kernel<test::emulated_tiles>>) {
        return live_rows <= 16 ? 2 : 4;  // 1 or 2 x 2 tiles
    }
    if constexpr (std::is_same_v<Kernel, cpu::pair_kernel<test::emulated_pairs>>) {
        const long rows = live_rows <= 4 ? 4 : live_rows <= 8 ? 8 : 12;
        return 2 * rows * 16;  // 2 registers a row, 16 pairs
    }
    return 0;  // not counted
}
long dots_so_far() {
    return test::emulated_tiles::dots().load() + test::emulated_pairs::dots().load();
}

// How the operands lie in memory.
struct layouts {
    bool a_transposed = false;  // A stored (k, m)
    bool a_padded = false;      // A's rows 3 apart beyond k, NaN between them (not with a_transposed)
    bool b_transposed = false;  // B stored (n, k)
    enum class c_kind { rows, padded_rows, columns } c = c_kind::rows;
};

enum class values { small_integers, normal, specials };

// One batch of products C = 2 (A B) + 1, the epilogue applied by the kernel to each finished
// region, counting how often it saw each element.
struct product_case {
    std::size_t items = 1, m = 0, k = 0, n = 0;
    bool a_broadcast = false;  // one A for every item (stride 0 along the batch)
    bool b_packed_once = false;  // one B for every item, its pairs packed once (pack_pairs)
    // with b_packed_once: the depth blocks of the pairs, 0 for the kernel's own. Another
    // kernel's are left alone (the path changed since the packing): B is read instead.
    std::size_t pairs_kc = 0;
    layouts layout{};
    values kind = values::normal;
    // C unread (gemm_problem::c_unread): the epilogue gets each block in the kernel's buffer and
    // writes 2 x + 1 into a result of C's layout, where a bf16 destination would be rounded
    bool c_unread = false;
    std::uint64_t seed = 1;
};

struct epilogue_state {
    cpu::matrix<float> c;  // item 0
    std::ptrdiff_t item_stride = 0;
    std::vector<int>* seen = nullptr;  // per element of every item, row-major
    std::size_t m = 0, n = 0;
    float* result = nullptr;  // with c_unread: item 0 of the result, laid out as c
};

void twice_plus_one(const void* context, std::size_t item, std::size_t row, std::size_t col, std::size_t rows, std::size_t cols) {
    const auto& s = *static_cast<const epilogue_state*>(context);
    float* base = s.c.data + static_cast<std::ptrdiff_t>(item) * s.item_stride;
    for (std::size_t i = row; i < row + rows; ++i) {
        for (std::size_t j = col; j < col + cols; ++j) {
            float& x = base[s.c.at(i, j)];
            x = 2 * x + 1;
            ++(*s.seen)[(item * s.m + i) * s.n + j];
        }
    }
}

void twice_plus_one_to_block(const void* context, std::size_t item, std::size_t row, std::size_t col, std::size_t rows,
                             std::size_t cols, float* block, std::ptrdiff_t ld) {
    const auto& s = *static_cast<const epilogue_state*>(context);
    float* base = s.result + static_cast<std::ptrdiff_t>(item) * s.item_stride;
    for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) {
            const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(row + i) * s.c.row_stride + static_cast<std::ptrdiff_t>(col + j) * s.c.col_stride;
            base[at] = 2 * block[static_cast<std::ptrdiff_t>(i) * ld + static_cast<std::ptrdiff_t>(j)] + 1;
            ++(*s.seen)[(item * s.m + row + i) * s.n + col + j];
        }
    }
}

bf16 value_of(values kind, std::mt19937_64& random, std::size_t index) {
    switch (kind) {
        case values::small_integers: return bf16(float(int(random() % 9) - 4));
        case values::normal: return bf16(float(std::normal_distribution<double>(0.0, 1.0)(random)));
        case values::specials: {
            // NaN, +inf, -inf at positions that fall in every lane of a tile row (index mod 32)
            // and tail; the rest normal
            const bf16 specials[] = {std::numeric_limits<bf16>::quiet_NaN(), std::numeric_limits<bf16>::infinity(),
                                     -std::numeric_limits<bf16>::infinity()};
            if (index % 97 == 5) return specials[(index / 97) % 3];
            return bf16(float(std::normal_distribution<double>(0.0, 1.0)(random)));
        }
    }
    return bf16{};
}

// Runs one case on a kernel and checks every element of C against the double
// product of the same bf16 values: exactly for small integers (every partial sum is an integer
// below 2^24, exact in float in any order), else within float's bound for a sum of k exact
// products in any order, |error| <= k 2^-24 sum |a b| (plus k 2^-126: sums flushed to zero).
template <class Kernel>
void check_case(const product_case& p) {
    const std::size_t a_items = p.a_broadcast ? 1 : p.items, b_items = p.b_packed_once ? 1 : p.items;
    std::mt19937_64 random(p.seed);
    const std::size_t a_row = p.layout.a_padded ? p.k + 3 : p.k, a_item = p.layout.a_transposed ? p.m * p.k : p.m * a_row;
    std::vector<bf16> a(a_items * a_item), b(b_items * p.k * p.n);
    for (std::size_t i = 0; i < a.size(); ++i) {
        a[i] = i % a_row < p.k || p.layout.a_transposed ? value_of(p.kind, random, i) : std::numeric_limits<bf16>::quiet_NaN();
    }
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = value_of(p.kind, random, i + 50);
    // element (i, j) of item t of each operand
    auto a_at = [&](std::size_t t, std::size_t i, std::size_t q) {
        const std::size_t base = (p.a_broadcast ? 0 : t) * a_item;
        return a[base + (p.layout.a_transposed ? q * p.m + i : i * a_row + q)];
    };
    auto b_at = [&](std::size_t t, std::size_t q, std::size_t j) {
        return b[(p.b_packed_once ? 0 : t) * p.k * p.n + (p.layout.b_transposed ? j * p.k + q : q * p.n + j)];
    };
    const std::size_t c_pad = p.layout.c == layouts::c_kind::padded_rows ? 5 : 0;
    const std::size_t c_item = p.layout.c == layouts::c_kind::columns ? p.m * p.n : p.m * (p.n + c_pad);
    std::vector<float> c(p.items * c_item, std::numeric_limits<float>::quiet_NaN());  // every element written

    cpu::gemm_problem<float> problem;
    problem.a = cpu::matrix<const bf16>{a.data(), p.m, p.k, p.layout.a_transposed ? 1 : std::ptrdiff_t(a_row),
                                        p.layout.a_transposed ? std::ptrdiff_t(p.m) : 1};
    problem.b = cpu::matrix<const bf16>{b.data(), p.k, p.n, p.layout.b_transposed ? 1 : std::ptrdiff_t(p.n),
                                        p.layout.b_transposed ? std::ptrdiff_t(p.k) : 1};
    if (p.layout.c == layouts::c_kind::columns) problem.c = {c.data(), p.m, p.n, 1, std::ptrdiff_t(p.m)};
    else problem.c = {c.data(), p.m, p.n, std::ptrdiff_t(p.n + c_pad), 1};
    problem.batch.rank = 1;
    problem.batch.extents[0] = p.items;
    problem.batch.strides[0][0] = p.a_broadcast ? 0 : std::ptrdiff_t(a_item);
    problem.batch.strides[1][0] = p.b_packed_once ? 0 : std::ptrdiff_t(p.k * p.n);
    problem.batch.strides[2][0] = std::ptrdiff_t(c_item);
    // B's pairs, packed after NaN everywhere: any element the packing failed to write shows
    std::vector<bf16> pairs;
    cpu::packed_operand<float> packed_b{nullptr, p.k, p.n, 0, 0, 0, nullptr};
    if (p.b_packed_once) {
        const std::size_t kc = p.pairs_kc ? p.pairs_kc : Kernel::kc;
        pairs.assign(cpu::pair_elements(p.k, p.n), std::numeric_limits<bf16>::quiet_NaN());
        packed_b.pairs = pairs.data();
        packed_b.pairs_kc = kc;
        cpu::detail::pack_pairs_in_blocks({b.data(), p.k, p.n, problem.b.row_stride, problem.b.col_stride}, pairs.data(), kc);
        problem.packed_b = &packed_b;
        if (kc == Kernel::kc) problem.b.data = nullptr;  // the kernel must read the pairs alone
    }

    std::vector<int> seen(p.items * p.m * p.n, 0);
    std::vector<float> result(p.c_unread ? c.size() : 0, std::numeric_limits<float>::quiet_NaN());
    const epilogue_state state{problem.c, std::ptrdiff_t(c_item), &seen, p.m, p.n, result.data()};
    cpu::gemm_epilogue epilogue{&twice_plus_one, nullptr, &state};
    if (p.c_unread) {
        problem.c_unread = true;
        epilogue.apply_to_block = &twice_plus_one_to_block;
    }
    // the blocks in the kernel's buffer, but for empty sums and depths of more than one span,
    // which go through C
    const bool buffered = p.c_unread && p.k > 0 && p.k <= cpu::bf16_blocking::k_span;
    const int unreleased = test::emulated_tiles::unreleased().load();
    const long dots = dots_so_far();
    cpu::bf16_gemm<Kernel>(problem, epilogue);
    REQUIRE(test::emulated_tiles::unreleased().load() == unreleased);
    if (const long per_step = dots_per_step<Kernel>(Kernel::rows); per_step > 0) {
        // every micro-tile (Kernel::rows x 32 of C) takes the same instructions per 32 depths
        // but the last of m's rows, which takes its live rows' (no more), and no micro-tile is
        // computed twice: the blocks' edges are multiples of the tiles'
        auto tiles = [](std::size_t x, std::size_t per) { return long((x + per - 1) / per); };
        const std::size_t edge = p.m % Kernel::rows;
        const long per_column_step = long(p.m / Kernel::rows) * per_step + (edge ? dots_per_step<Kernel>(edge) : 0);
        CHECK(dots_so_far() - dots == long(p.items) * tiles(p.n, 32) * tiles(p.k, 32) * per_column_step);
    }

    // the operands' values in double, A's rows and B's columns each contiguous: the loop below
    // reads them plainly (the sanitizer build runs it unoptimised)
    std::vector<double> a_rows(p.items * p.m * p.k), b_columns(p.items * p.n * p.k);
    for (std::size_t t = 0; t < p.items; ++t) {
        for (std::size_t q = 0; q < p.k; ++q) {
            for (std::size_t i = 0; i < p.m; ++i) a_rows[(t * p.m + i) * p.k + q] = double(a_at(t, i, q));
            for (std::size_t j = 0; j < p.n; ++j) b_columns[(t * p.n + j) * p.k + q] = double(b_at(t, q, j));
        }
    }
    std::size_t bad = 0, unseen = 0;
    for (std::size_t t = 0; t < p.items; ++t) {
        for (std::size_t i = 0; i < p.m; ++i) {
            for (std::size_t j = 0; j < p.n; ++j) {
                const double* a_row = a_rows.data() + (t * p.m + i) * p.k;
                const double* b_column = b_columns.data() + (t * p.n + j) * p.k;
                double sum = 0, magnitude = 0;
                for (std::size_t q = 0; q < p.k; ++q) {
                    const double term = a_row[q] * b_column[q];
                    sum += term;
                    magnitude += term < 0 ? -term : term;
                }
                const double want = 2 * sum + 1;
                const double bound = 2 * (double(p.k) * std::ldexp(magnitude, -24) + double(p.k) * std::ldexp(1.0, -126));
                const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(t) * problem.batch.strides[2][0] +
                                          static_cast<std::ptrdiff_t>(i) * problem.c.row_stride +
                                          static_cast<std::ptrdiff_t>(j) * problem.c.col_stride;
                const float got = buffered ? result[std::size_t(at)] : problem.c.data[at];
                if (buffered && !std::isnan(problem.c.data[at]) && bad++ == 0) {
                    UNSCOPED_INFO("C written at (" << i << ", " << j << ") of item " << t << ", where only the epilogue should write");
                }
                bool ok = false;
                if (std::isnan(want)) ok = std::isnan(got);
                else if (std::isinf(want)) ok = double(got) == want;
                else if (p.kind == values::small_integers) ok = double(got) == want;
                else ok = std::fabs(double(got) - want) <= bound;
                if (!ok && bad++ == 0) {
                    UNSCOPED_INFO("first wrong: item " << t << " (" << i << ", " << j << "): got " << got << ", want " << want
                                                      << " within " << bound);
                }
                if (seen[(t * p.m + i) * p.n + j] != 1 && unseen++ == 0) {
                    UNSCOPED_INFO("(" << i << ", " << j << ") of item " << t << " seen by the epilogue "
                                      << seen[(t * p.m + i) * p.n + j] << " times");
                }
            }
        }
    }
    CHECK(unseen == 0);
    REQUIRE(bad == 0);
}

// Extents around the micro-tiles' (32 x 32 on tiles, 12 x 32 on pairs, 32 depths) and the
// blocks' (kc = 256 depths on tiles, 512 on pairs; mc = 256 or 252 rows, nc = 512 columns):
// under, at and over each.
struct extents {
    std::size_t m, k, n;
};
const extents sizes[] = {{1, 1, 1},     {5, 31, 17},   {12, 32, 16},  {13, 33, 33},   {16, 32, 16},   {31, 64, 32},
                         {32, 65, 31},  {33, 100, 47}, {70, 255, 64}, {64, 256, 96},  {97, 257, 65},  {252, 40, 33},
                         {253, 40, 33}, {257, 300, 40}, {30, 511, 40}, {45, 512, 33}, {26, 513, 64},
                         {40, 520, 545}, {3, 64, 64}};

}  // namespace

TEST_CASE("bf16 products of small integers are exact, through every edge of the tiles and blocks") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [m, k, n] : sizes) {
            INFO(m << " x " << k << " x " << n);
            check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .kind = values::small_integers, .seed = m * 7 + k});
        }
        // deeper than a task packs B at once (k_span): two spans, the second short of 32
        // depths, each taken by both blocks of rows, with B packed per call and packed once
        constexpr std::size_t deep = ds::backend::cpu::bf16_blocking::k_span + 300;
        for (const bool once : {false, true}) {
            check_case<Kernel>({.items = 1, .m = 260, .k = deep, .n = 33, .b_packed_once = once, .kind = values::small_integers, .seed = 8});
        }
        // pairs packed for the other kernel's depth blocks: read, they would give wrong sums
        // past the first block
        const std::size_t other_kc = Kernel::kc == 512 ? 256 : 512;
        check_case<Kernel>({.items = 2, .m = 40, .k = 600, .n = 70, .b_packed_once = true, .pairs_kc = other_kc,
                            .kind = values::small_integers, .seed = 9});
    });
}

TEST_CASE("bf16 products with C unread hand each block to the epilogue in their own buffer, and never write C") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [m, k, n] : sizes) {
            INFO(m << " x " << k << " x " << n);
            check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .kind = values::small_integers, .c_unread = true, .seed = m + 3 * k});
            check_case<Kernel>({.items = 2, .m = m, .k = k, .n = n, .b_packed_once = true, .kind = values::specials, .c_unread = true});
        }
        const layouts strided_c{.a_transposed = true, .b_transposed = true, .c = layouts::c_kind::padded_rows};
        check_case<Kernel>({.items = 3, .m = 70, .k = 300, .n = 33, .layout = strided_c, .kind = values::normal, .c_unread = true});
        check_case<Kernel>({.items = 2, .m = 45, .k = 70, .n = 33, .layout = {.c = layouts::c_kind::columns}, .c_unread = true});
        // what goes through C all the same: empty sums, and more depths than one span
        check_case<Kernel>({.items = 2, .m = 9, .k = 0, .n = 5, .kind = values::small_integers, .c_unread = true});
        check_case<Kernel>({.items = 1, .m = 30, .k = ds::backend::cpu::bf16_blocking::k_span + 40, .n = 33,
                            .kind = values::small_integers, .c_unread = true});
    });
}

// An epilogue that is a rounding (gemm_epilogue::rounding): with C unread, each micro-tile is
// rounded from the kernel's buffer, plus the bias where there is one, and neither C, the
// epilogue's functions nor apply_to_block are touched. The same sums as where C is written,
// so that C plus the bias, rounded: bit for bit (where both are NaN, a NaN: which one, C++ leaves
// to the compiler).
enum class bias_kind { none, bf16, float_strided };

void never_called(const void*, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t) {
    throw std::logic_error("the epilogue's function called where the kernel rounds");
}
void never_called_to_block(const void*, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, float*, std::ptrdiff_t) {
    throw std::logic_error("apply_to_block called where the kernel rounds");
}

template <class Kernel>
void check_rounding(std::size_t items, std::size_t m, std::size_t k, std::size_t n, layouts::c_kind c_layout, bias_kind bias,
                    bool with_block_function = true) {
    INFO(items << " x " << m << " x " << k << " x " << n << ", C layout " << int(c_layout) << ", bias kind " << int(bias)
               << (with_block_function ? "" : ", no apply_to_block"));
    std::mt19937_64 random(m * 31 + k * 7 + n);
    std::vector<bf16> a(items * m * k), b(items * k * n);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = value_of(values::specials, random, i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = value_of(values::normal, random, i);
    // a bias of bf16 (one per column), or of float every third element, with NaN and infinities
    std::vector<bf16> bias_bf16(n);
    std::vector<float> bias_float(3 * n);
    for (std::size_t j = 0; j < n; ++j) {
        bias_bf16[j] = value_of(values::specials, random, j * 13);
        bias_float[3 * j] = float(value_of(values::specials, random, j * 13 + 1)) * 1.001f;  // not a bf16
    }
    const std::size_t c_pad = c_layout == layouts::c_kind::padded_rows ? 5 : 0;
    const std::size_t c_item = c_layout == layouts::c_kind::columns ? m * n : m * (n + c_pad);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> c(items * c_item, nan), unread(items * c_item, nan);

    cpu::gemm_problem<float> problem;
    problem.a = cpu::matrix<const bf16>{a.data(), m, k, std::ptrdiff_t(k), 1};
    problem.b = cpu::matrix<const bf16>{b.data(), k, n, std::ptrdiff_t(n), 1};
    problem.c = c_layout == layouts::c_kind::columns ? cpu::matrix<float>{c.data(), m, n, 1, std::ptrdiff_t(m)}
                                                     : cpu::matrix<float>{c.data(), m, n, std::ptrdiff_t(n + c_pad), 1};
    problem.batch.rank = 1;
    problem.batch.extents[0] = items;
    problem.batch.strides[0][0] = std::ptrdiff_t(m * k);
    problem.batch.strides[1][0] = std::ptrdiff_t(k * n);
    problem.batch.strides[2][0] = std::ptrdiff_t(c_item);
    cpu::bf16_gemm<Kernel>(problem, {});  // C written: the sums to compare with

    // every element of the rounded result written, at C's offsets (a sentinel elsewhere)
    constexpr std::uint16_t sentinel = 0x7fa5;
    std::vector<bf16> rounded(items * c_item, bf16::from_bits(sentinel));
    cpu::gemm_problem<float> buffered = problem;
    buffered.c.data = unread.data();
    buffered.c_unread = true;
    // (the evaluator gives no apply_to_block where the rounding is all: the kernel buffers all the same)
    cpu::gemm_epilogue epilogue{&never_called, nullptr, nullptr, with_block_function ? &never_called_to_block : nullptr};
    epilogue.rounding.rounded = cpu::rounded_into<float>(rounded.data());
    if (bias == bias_kind::bf16) {
        epilogue.rounding.bias = {bias_bf16.data(), ds::evaluation::element_type::bf16};
        epilogue.rounding.bias_stride = 1;
    } else if (bias == bias_kind::float_strided) {
        epilogue.rounding.bias = {bias_float.data(), ds::evaluation::element_type::float32};
        epilogue.rounding.bias_stride = 3;
    }
    cpu::bf16_gemm<Kernel>(buffered, epilogue);

    std::size_t bad = 0;
    for (std::size_t t = 0; t < items; ++t) {
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                const std::size_t at = t * c_item + std::size_t(std::ptrdiff_t(i) * problem.c.row_stride + std::ptrdiff_t(j) * problem.c.col_stride);
                float want = c[at];
                if (bias == bias_kind::bf16) want += float(bias_bf16[j]);
                if (bias == bias_kind::float_strided) want += bias_float[3 * j];
                const bool same = std::isnan(want) ? std::isnan(float(rounded[at])) : rounded[at].bits == bf16(want).bits;
                if (!same && bad++ == 0) {
                    UNSCOPED_INFO("first wrong: item " << t << " (" << i << ", " << j << "): got bits " << rounded[at].bits << ", want "
                                                      << bf16(want).bits);
                }
                if (!std::isnan(unread[at]) && bad++ == 0) UNSCOPED_INFO("C written at (" << i << ", " << j << ") of item " << t);
            }
        }
    }
    for (std::size_t at = 0; at < rounded.size(); ++at) {  // what lies between C's elements stays
        const bool element = c_layout != layouts::c_kind::padded_rows || at % (n + c_pad) < n;
        if (!element && rounded[at].bits != sentinel && bad++ == 0) UNSCOPED_INFO("written between elements, at " << at);
    }
    REQUIRE(bad == 0);
}

TEST_CASE("bf16 products whose epilogue is a rounding round each micro-tile from their buffer, with the bias, bit for bit") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [m, k, n] : sizes) {
            for (const bias_kind bias : {bias_kind::none, bias_kind::bf16, bias_kind::float_strided}) {
                check_rounding<Kernel>(1, m, k, n, layouts::c_kind::rows, bias);
            }
        }
        for (const auto c : {layouts::c_kind::rows, layouts::c_kind::padded_rows, layouts::c_kind::columns}) {
            check_rounding<Kernel>(3, 70, 300, 45, c, bias_kind::bf16);
            check_rounding<Kernel>(2, 13, 33, 600, c, bias_kind::float_strided);
        }
        check_rounding<Kernel>(2, 97, 257, 65, layouts::c_kind::rows, bias_kind::none, false);
        check_rounding<Kernel>(2, 97, 257, 65, layouts::c_kind::padded_rows, bias_kind::bf16, false);
    });
}

TEST_CASE("bf16 products read transposed operands and write strided and column-major C") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [m, k, n] : {extents{33, 70, 47}, extents{70, 300, 33}}) {
            for (const int a_kind : {0, 1, 2}) {  // rows, padded rows, transposed
                for (const bool b_transposed : {false, true}) {
                    for (const auto c : {layouts::c_kind::rows, layouts::c_kind::padded_rows, layouts::c_kind::columns}) {
                        INFO(m << " x " << k << " x " << n << ", A layout " << a_kind << ", B transposed " << b_transposed
                               << ", C layout " << int(c));
                        const layouts layout{.a_transposed = a_kind == 2, .a_padded = a_kind == 1, .b_transposed = b_transposed, .c = c};
                        check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .layout = layout, .kind = values::small_integers});
                        check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .layout = layout, .kind = values::normal, .seed = 3});
                    }
                }
            }
        }
    });
}

TEST_CASE("bf16 products of normal values are within float's bound of the double product, through batches") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [m, k, n] : sizes) {
            INFO(m << " x " << k << " x " << n);
            check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .kind = values::normal, .seed = k});
        }
        check_case<Kernel>({.items = 3, .m = 45, .k = 70, .n = 33, .kind = values::normal, .seed = 9});
        check_case<Kernel>({.items = 5, .m = 33, .k = 40, .n = 20, .a_broadcast = true, .kind = values::small_integers});
        check_case<Kernel>({.items = 2, .m = 0, .k = 7, .n = 5});  // nothing to compute
        check_case<Kernel>({.items = 2, .m = 9, .k = 0, .n = 5, .kind = values::small_integers});  // empty sums: C = 0
    });
}

TEST_CASE("bf16 products read B's pairs packed once, B row-major or transposed, for every item") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [m, k, n] : sizes) {
            for (const bool b_transposed : {false, true}) {
                for (const values kind : {values::small_integers, values::specials}) {
                    INFO(m << " x " << k << " x " << n << (b_transposed ? ", B transposed" : ""));
                    check_case<Kernel>({.items = 2, .m = m, .k = k, .n = n, .b_packed_once = true,
                                        .layout = {.b_transposed = b_transposed}, .kind = kind, .seed = m + k});
                }
            }
        }
    });
}

// A's rows are read where they lie for every depth block of a whole number of 32 depths (K of
// 32; 288: blocks of 256 and 32; 520: 256, 256 and a short 8, packed), its rows contiguous or
// 3 apart with NaN between them (which a read past the block's depths would carry into C); a
// last panel short of the kernel's rows (12 on pairs, 32 on tiles) is packed.
TEST_CASE("bf16 products read A where it lies in whole blocks of depths, and pack only what they must") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const std::size_t k : {32, 288, 520}) {
            for (const std::size_t m : {1, 13, 33, 100}) {
                for (const bool padded : {false, true}) {
                    INFO(m << " x " << k << " x 45" << (padded ? ", A's rows padded" : ""));
                    const layouts layout{.a_padded = padded};
                    check_case<Kernel>({.items = 2, .m = m, .k = k, .n = 45, .layout = layout, .kind = values::small_integers, .seed = m});
                    check_case<Kernel>({.items = 1, .m = m, .k = k, .n = 45, .layout = layout, .kind = values::specials, .seed = k});
                }
            }
        }
    });
}

TEST_CASE("bf16 products carry NaN and infinities from every lane, and padding never leaks into C") {
    test::for_kernels_and_threads([]<class Kernel>() {
        // first a product all of NaN, which leaves NaN in every thread's packing buffers: the
        // padding of the next products must be written, not found
        std::vector<bf16> nan(300 * 300, std::numeric_limits<bf16>::quiet_NaN());
        std::vector<float> c(300 * 300);
        cpu::gemm_problem<float> poisoned;
        poisoned.a = cpu::matrix<const bf16>{nan.data(), 300, 300, 300, 1};
        poisoned.b = cpu::matrix<const bf16>{nan.data(), 300, 300, 300, 1};
        poisoned.c = {c.data(), 300, 300, 300, 1};
        cpu::bf16_gemm<Kernel>(poisoned, {});
        for (const auto [m, k, n] : {extents{17, 33, 33}, extents{70, 255, 64}, extents{97, 257, 65}}) {
            INFO(m << " x " << k << " x " << n);
            check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .kind = values::small_integers});
            check_case<Kernel>({.items = 1, .m = m, .k = k, .n = n, .kind = values::specials, .seed = 4});
        }
    });
}

#if !defined(DIMSUM_TEST_BF16_HARDWARE)
TEST_CASE("the emulated unit catches a kernel that forgets to configure its tiles") {
    test::emulated_tiles unit;
    CHECK_THROWS_AS(unit.zero<0>(), std::logic_error);
    unit.configure();
    unit.zero<0>();
    unit.release();
    CHECK_THROWS_AS(unit.release(), std::logic_error);
    // the configuration is the thread's, as the real tiles': a second unit configured on the
    // same thread is caught, and one on another thread is not
    test::emulated_tiles outer, inner;
    outer.configure();
    CHECK_THROWS_AS(inner.configure(), std::logic_error);
    std::thread([&inner] {
        inner.configure();
        inner.release();
    }).join();
    outer.release();
}
#endif

TEST_CASE("the bf16 path: the best this CPU can run unless set or named, an error where it cannot run") {
    for (const cpu::bf16_path path : cpu::bf16_paths) {
        const cpu::bf16_path_support support = cpu::support_of(path);
        std::cout << "bf16 path " << cpu::name(path) << ": " << (support.usable ? "runs here" : "cannot run here: " + support.reason)
                  << '\n';
        CHECK(cpu::parse_bf16_path(cpu::name(path)) == path);
        if (support.usable) {
            cpu::scoped_bf16_path chosen(path);
            CHECK(cpu::current_bf16_path() == path);
        } else {
            CHECK(!support.reason.empty());
            CHECK_THROWS_WITH(cpu::set_bf16_path(path), Catch::Contains("cannot run here") && Catch::Contains(support.reason));
            // a kernel asked for directly is refused too, before any instruction it cannot run
            bool ran = false;
            CHECK_THROWS_WITH(cpu::with_bf16_kernel(path, "test", [&]<class Kernel>() { ran = true; }),
                              Catch::Contains("test: the " + std::string(cpu::name(path)) + " path cannot run here") &&
                                  Catch::Contains(support.reason));
            CHECK(!ran);
        }
    }
    CHECK(cpu::support_of(cpu::bf16_path::widen).usable);
    CHECK(!cpu::parse_bf16_path("AMX"));
    // the best: the first that runs of amx, avx512_bf16, widen
    const cpu::bf16_path best = cpu::support_of(cpu::bf16_path::amx).usable           ? cpu::bf16_path::amx
                                : cpu::support_of(cpu::bf16_path::avx512_bf16).usable ? cpu::bf16_path::avx512_bf16
                                                                                      : cpu::bf16_path::widen;
    CHECK(cpu::best_bf16_path() == best);

    // DIMSUM_BF16_PATH, read whenever no path was set
    cpu::reset_bf16_path();
    ::setenv("DIMSUM_BF16_PATH", "tiles", 1);
    CHECK_THROWS_WITH(cpu::current_bf16_path(), Catch::Contains("DIMSUM_BF16_PATH=tiles: expected widen, avx512_bf16 or amx"));
    cpu::reset_bf16_path();
    ::setenv("DIMSUM_BF16_PATH", "widen", 1);
    CHECK(cpu::current_bf16_path() == cpu::bf16_path::widen);
    {
        cpu::scoped_bf16_path scoped(cpu::bf16_path::widen);
        CHECK(cpu::current_bf16_path() == cpu::bf16_path::widen);
    }
    cpu::reset_bf16_path();
    ::unsetenv("DIMSUM_BF16_PATH");
    CHECK(cpu::current_bf16_path() == cpu::best_bf16_path());
    cpu::reset_bf16_path();
}

#if defined(DIMSUM_TEST_BF16_HARDWARE)
// body(path, threads) on each bf16 path this CPU runs, chosen, on 1 and 2 threads.
template <class Body>
void on_each_path(Body&& body) {
    for (const cpu::bf16_path path : {cpu::bf16_path::amx, cpu::bf16_path::avx512_bf16}) {
        if (!cpu::support_of(path).usable) continue;
        const cpu::scoped_bf16_path chosen(path);
        for (const int threads : {1, 2}) {
            ds::set_num_threads(threads);
            body(path, threads);
        }
        ds::set_num_threads(0);
    }
}

// The whole way from a formula: a bf16 product with a fused epilogue, in float and rounded
// into bf16, on each path this CPU runs, against the reference backend.
TEST_CASE("formulas over bf16 on each bf16 path this CPU runs, against the reference backend") {
    using Rows = ds::axis<"rows">;
    using Inner = ds::axis<"inner">;
    using Cols = ds::axis<"cols">;
    on_each_path([](cpu::bf16_path path, int threads) {
        for (const auto [m, k, n] : {extents{5, 31, 17}, extents{97, 257, 65}, extents{300, 768, 200}}) {
            INFO(cpu::name(path) << ", " << threads << " threads, " << m << " x " << k << " x " << n);
            ds::tensor<bf16, Rows, Inner> x(Rows{m}, Inner{k});
            ds::tensor<bf16, Cols, Inner> w(Cols{n}, Inner{k});  // as nn.Linear stores it
            ds::tensor<bf16, Cols> bias(Cols{n});
            ds::fill_uniform(x, 1);
            ds::fill_uniform(w, 2);
            ds::fill_uniform(bias, 3);
            auto formula = ds::matmul(x, ds::transpose(w)) + bias;
            const auto want = test::to_xt(ds::eval(ds::cast<float>(formula), ds::backend::reference::evaluator{}));
            const std::size_t before = cpu::bf16_products(path);
            // values below 1: |error| <= k 2^-24 k, and at most 2^-8 relative where rounded to bf16
            const double bound = double(k) * double(k) * std::ldexp(1.0, -24);
            test::require_close(ds::tensor<float, Rows, Cols>(ds::cast<float>(formula)), want, 1.0 / 256, bound);
            test::require_close(ds::tensor<bf16, Rows, Cols>(formula), want, 1.0 / 256, bound);
            CHECK(cpu::bf16_products(path) - before == 2);  // both products ran on this path
        }
    });
}

// A product whose float value only its rounding reads (a bf16 destination, or a bf16 temporary
// the next product reads) keeps each block's sums in the kernel's buffer and rounds them from
// there (gemm_problem::c_unread): the same sums as where C is written, so the float result of
// the same formula, rounded once, bit for bit; the epilogue reads its other operands at the
// block's place, through batches and a transposed destination.
TEST_CASE("bf16 products rounded from the kernel's own buffer: the float result rounded, bit for bit, on each path") {
    using Batch = ds::axis<"batch">;
    using Rows = ds::axis<"rows">;
    using Inner = ds::axis<"inner">;
    using Cols = ds::axis<"cols">;
    auto rounded = [](const auto& wide) {  // wide's float values rounded to bf16, as bits
        std::vector<std::uint16_t> bits(wide.size());
        for (std::size_t i = 0; i < wide.size(); ++i) bits[i] = bf16(wide.data()[i]).bits;
        return bits;
    };
    auto bits_of = [](const auto& narrow) {
        std::vector<std::uint16_t> bits(narrow.size());
        for (std::size_t i = 0; i < narrow.size(); ++i) bits[i] = narrow.data()[i].bits;
        return bits;
    };
    on_each_path([&](cpu::bf16_path path, int threads) {
        for (const auto [m, k, n] : {extents{5, 31, 17}, extents{97, 257, 65}, extents{300, 768, 600}}) {
            INFO(cpu::name(path) << ", " << threads << " threads, " << m << " x " << k << " x " << n);
            ds::tensor<bf16, Batch, Rows, Inner> x(Batch{3}, Rows{m}, Inner{k});
            ds::tensor<bf16, Cols, Inner> w(Cols{n}, Inner{k});
            ds::tensor<bf16, Cols> bias(Cols{n});
            ds::tensor<bf16, Batch, Rows, Cols> residual(Batch{3}, Rows{m}, Cols{n});
            ds::tensor<bf16, Cols, Cols> w2(Cols{n}, Cols{n});
            ds::fill_normal(x, 1);
            ds::fill_uniform(w, 2, -0.1, 0.1);
            ds::fill_normal(bias, 3);
            ds::fill_normal(residual, 4);
            ds::fill_uniform(w2, 5, -0.1, 0.1);
            x.data()[7] = std::numeric_limits<bf16>::quiet_NaN();
            x.data()[m * k + 40 % k] = std::numeric_limits<bf16>::infinity();
            // the epilogues that bf16_gemm rounds itself, per micro-tile (gemm_epilogue::rounding)
            auto product = ds::matmul(x, ds::transpose(w));
            const auto same_bits = [&](const auto& f) {
                const ds::tensor<float, Batch, Rows, Cols> wide = ds::cast<float>(f);
                const ds::tensor<bf16, Batch, Rows, Cols> narrow = f;
                return bits_of(narrow) == rounded(wide);
            };
            REQUIRE(same_bits(product));
            REQUIRE(same_bits(product + bias));
            REQUIRE(same_bits(bias + product));
            // and those the fused pass runs, moved to each block: an addend of every row's own, and
            // a longer formula
            REQUIRE(same_bits(product + residual));
            auto formula = ds::tanh(product + bias) * residual + 0.5f;
            const ds::tensor<float, Batch, Rows, Cols> wide = ds::cast<float>(formula);
            const ds::tensor<bf16, Batch, Rows, Cols> narrow = formula;
            REQUIRE(bits_of(narrow) == rounded(wide));
            // written transposed: the destination's layout, not the product's
            const ds::tensor<float, Cols, Batch, Rows> wide_t = ds::permute<Cols, Batch, Rows>(ds::cast<float>(formula));
            const ds::tensor<bf16, Cols, Batch, Rows> narrow_t = ds::permute<Cols, Batch, Rows>(formula);
            REQUIRE(bits_of(narrow_t) == rounded(wide_t));
            // into a bf16 temporary that the next product reads
            const ds::tensor<bf16, Batch, Rows, Cols> stored = formula;
            const ds::tensor<float, Batch, Rows, Cols> chained = ds::cast<float>(ds::matmul(ds::cast<bf16>(formula), w2));
            const ds::tensor<float, Batch, Rows, Cols> chained_want = ds::cast<float>(ds::matmul(stored, w2));
            REQUIRE(rounded(chained) == rounded(chained_want));
        }
    });
}
#endif
