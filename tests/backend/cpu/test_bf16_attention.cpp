// Attention of bf16 Q, K and V on the bf16 dot-product kernels (backend/cpu/attention.hpp's
// bf16 blocks), against the same bf16 values in double.
//
// Built twice, as test_bf16_gemm is: as test_bf16_attention, both kernels on the
// instructions' stand-ins (emulated_bf16_units.hpp), on every CPU; and into
// bf16_instructions_on_this_cpu, each kernel whose instructions this CPU runs.
#include "support.hpp"

#include "emulated_bf16_units.hpp"

#include <dimsum/backend/cpu/attention.hpp>
#include <dimsum/evaluation/codes.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace ds = dimsum;
namespace cpu = ds::backend::cpu;
using ds::bf16;

namespace {

enum class poison { none, nan_q, nan_k, nan_v };
// What the kernel writes of O: float; float and bf16 (o_rounded, as a product a bf16 kernel reads
// next); bf16 alone (o_unread: the float output a scratch no one reads)
enum class o_output { float_only, float_and_bf16, bf16_only };

struct attention_case {
    std::size_t items = 1, queries = 1, keys = 1, d = 1, dv = 1;
    float scale = 1;
    bool causal = false;
    bool shared_kv = false;     // one K and V for every item (stride 0, as heads sharing them)
    bool k_transposed = false;  // K stored (d, keys)
    bool v_transposed = false;  // V stored (dv, keys)
    bool o_columns = false;     // each item's O stored column-major
    bool score_bias = false;    // a score function that adds bias(query, key) after the scale
    o_output output = o_output::float_only;
    bool zero_queries = false;  // Q = 0: every weight exactly 1 / keys seen, O their mean
    poison nan = poison::none;
    std::uint64_t seed = 1;
};

// The score function of a case with score_bias, as the kernel and the reference apply it.
double bias(std::size_t query, std::size_t key) { return 0.25 * double((query + 2 * key) % 5); }
void add_bias(const void*, std::size_t, std::size_t query, std::size_t key, std::size_t queries, std::size_t keys, float* tile,
              std::ptrdiff_t query_stride) {
    for (std::size_t i = 0; i < queries; ++i) {
        for (std::size_t j = 0; j < keys; ++j) tile[std::ptrdiff_t(i) * query_stride + std::ptrdiff_t(j)] += float(bias(query + i, key + j));
    }
}

// A row of the expected O in double, and how far the kernel's may lie from it.
struct expected_row {
    std::vector<double> o, bound;
};

// Query i of one item, from the bf16 values in double. The bound, per element, adds up the
// roundings the bf16 path makes:
//  - S: each score a float sum of d exact products (bf16 times bf16 fits in float), within
//    d 2^-24 sum |q k| (and d 2^-126, sums flushed), times the scale, then 2^-24 |s| for the
//    scaling itself. An error e in every score moves each weight p_j / l by at most a factor
//    e^(2e): O by 2e sum_j w_j |v_j|.
//  - the weights: e^(s_j - m) as 2^y (attention.hpp's bf16_weights), with a polynomial within
//    2^-22 of itself and y rounded three times, by 2^-24 |y| each: an error in the score of
//    2^-22 + 3 2^-24 (m - s_j), m at most the row's maximum (AVX-512; elsewhere float's e^x,
//    within less).
//  - P: rounded to bf16 before P V, each weight by at most 2^-8 of itself (8 significant bits,
//    to nearest): O by 2^-8 sum_j w_j |v_j|; nothing when Q = 0, every weight then exp(0) = 1.
//  - the float sums of P V and of l over n keys, the rescaling by each key block and the
//    final division: (2n + 64) 2^-24 sum_j w_j |v_j|; weights flushed to zero as denormals:
//    n 2^-126 max |v|.
template <class Q, class K, class V>
expected_row expected(const attention_case& c, std::size_t i, Q q, K k, V v) {
    const std::size_t n = c.keys;
    std::vector<std::size_t> visible;
    for (std::size_t j = 0; j < n; ++j) {
        if (!c.causal || !ds::evaluation::in_future(i, j, c.queries, n)) visible.push_back(j);
    }
    expected_row row{std::vector<double>(c.dv, 0.0), std::vector<double>(c.dv, 0.0)};
    if (visible.empty()) return row;  // every key masked: O = 0
    std::vector<double> s(n);
    double top = -std::numeric_limits<double>::infinity(), score_error = 0;
    std::vector<double> sum_errors(n);
    for (std::size_t j : visible) {
        double sum = 0, magnitude = 0;
        for (std::size_t p = 0; p < c.d; ++p) {
            sum += double(q(i, p)) * double(k(j, p));
            magnitude += std::fabs(double(q(i, p)) * double(k(j, p)));
        }
        s[j] = double(c.scale) * sum + (c.score_bias ? bias(i, j) : 0.0);
        if (std::isnan(s[j])) {
            std::fill(row.o.begin(), row.o.end(), std::numeric_limits<double>::quiet_NaN());
            return row;
        }
        top = std::max(top, s[j]);
        const double sum_error = double(c.d) * (std::ldexp(magnitude, -24) + std::ldexp(1.0, -126));
        sum_errors[j] = std::fabs(double(c.scale)) * sum_error + std::ldexp(std::fabs(s[j]), -24);
    }
    for (std::size_t j : visible) {
        const double weight_error = std::ldexp(1.0, -22) + 3 * std::ldexp(top - s[j], -24);
        score_error = std::max(score_error, sum_errors[j] + weight_error);
    }
    double l = 0;
    for (std::size_t j : visible) l += std::exp(s[j] - top);
    const double rounded_p = c.zero_queries ? 0.0 : std::ldexp(1.0, -8);
    const double relative = rounded_p + 2 * score_error + (2.0 * double(n) + 64) * std::ldexp(1.0, -24);
    for (std::size_t col = 0; col < c.dv; ++col) {
        double sum = 0, weighted_magnitude = 0, largest = 0;
        for (std::size_t j : visible) {
            const double w = std::exp(s[j] - top) / l, value = double(v(j, col));
            sum += w * value;
            weighted_magnitude += w * std::fabs(value);
            largest = std::max(largest, std::fabs(value));
        }
        row.o[col] = sum;
        row.bound[col] = relative * weighted_magnitude + double(n) * std::ldexp(largest, -126);
    }
    return row;
}

// Runs one case on a kernel and checks every element of O.
template <class Kernel>
void check_case(const attention_case& c) {
    const std::size_t kv_items = c.shared_kv ? 1 : c.items;
    std::mt19937_64 random(c.seed);
    auto normal = [&] { return bf16(float(std::normal_distribution<double>(0.0, 1.0)(random))); };
    std::vector<bf16> q(c.items * c.queries * c.d), k(kv_items * c.keys * c.d), v(kv_items * c.keys * c.dv);
    for (auto* data : {&q, &k, &v}) std::generate(data->begin(), data->end(), normal);
    if (c.zero_queries) std::fill(q.begin(), q.end(), bf16{});
    const bf16 nan = std::numeric_limits<bf16>::quiet_NaN();
    // NaN in one element, at a lane that moves with the case: a query's row, a key's, a value's
    if (c.nan == poison::nan_q) q[(c.seed * 7) % q.size()] = nan;
    if (c.nan == poison::nan_k) k[(c.seed * 11) % k.size()] = nan;
    if (c.nan == poison::nan_v) v[(c.seed * 13) % v.size()] = nan;

    const std::size_t q_item = c.queries * c.d, k_item = c.shared_kv ? 0 : c.keys * c.d, v_item = c.shared_kv ? 0 : c.keys * c.dv;
    const std::size_t o_item = c.queries * c.dv;
    std::vector<float> o(c.items * o_item, std::numeric_limits<float>::quiet_NaN());  // every element written
    cpu::attention_problem<float> problem;
    problem.q = cpu::matrix<const bf16>{q.data(), c.queries, c.d, std::ptrdiff_t(c.d), 1};
    problem.k = c.k_transposed ? cpu::matrix<const bf16>{k.data(), c.keys, c.d, 1, std::ptrdiff_t(c.keys)}
                               : cpu::matrix<const bf16>{k.data(), c.keys, c.d, std::ptrdiff_t(c.d), 1};
    problem.v = c.v_transposed ? cpu::matrix<const bf16>{v.data(), c.keys, c.dv, 1, std::ptrdiff_t(c.keys)}
                               : cpu::matrix<const bf16>{v.data(), c.keys, c.dv, std::ptrdiff_t(c.dv), 1};
    problem.o = c.o_columns ? cpu::matrix<float>{o.data(), c.queries, c.dv, 1, std::ptrdiff_t(c.queries)}
                            : cpu::matrix<float>{o.data(), c.queries, c.dv, std::ptrdiff_t(c.dv), 1};
    problem.batch.rank = 1;
    problem.batch.extents[0] = c.items;
    problem.batch.strides[0][0] = std::ptrdiff_t(q_item);
    problem.batch.strides[1][0] = std::ptrdiff_t(k_item);
    problem.batch.strides[2][0] = std::ptrdiff_t(v_item);
    problem.batch.strides[3][0] = std::ptrdiff_t(o_item);
    problem.scale = c.scale;
    problem.causal = c.causal;
    if (c.score_bias) problem.scores.apply = &add_bias;
    const bf16 unwritten = bf16::from_bits(0x7fc1);  // a NaN no kernel makes
    std::vector<bf16> o_bf16(c.output == o_output::float_only ? 0 : o.size(), unwritten);
    if (c.output != o_output::float_only) problem.o_rounded = cpu::rounded_into<float>(o_bf16.data());
    problem.o_unread = c.output == o_output::bf16_only;

    const int unreleased = test::emulated_tiles::unreleased().load();
    cpu::bf16_attention<Kernel>(problem);
    REQUIRE(test::emulated_tiles::unreleased().load() == unreleased);

    std::size_t bad = 0;
    for (std::size_t t = 0; t < c.items; ++t) {
        const bf16* qt = q.data() + t * q_item;
        const bf16* kt = k.data() + t * k_item;
        const bf16* vt = v.data() + t * v_item;
        auto q_at = [&](std::size_t i, std::size_t p) { return float(qt[i * c.d + p]); };
        auto k_at = [&](std::size_t j, std::size_t p) { return float(c.k_transposed ? kt[p * c.keys + j] : kt[j * c.d + p]); };
        auto v_at = [&](std::size_t j, std::size_t col) { return float(c.v_transposed ? vt[col * c.keys + j] : vt[j * c.dv + col]); };
        for (std::size_t i = 0; i < c.queries; ++i) {
            const expected_row want = expected(c, i, q_at, k_at, v_at);
            for (std::size_t col = 0; col < c.dv; ++col) {
                const std::size_t at = t * o_item + (c.o_columns ? col * c.queries + i : i * c.dv + col);
                float got = o[at];
                double bound = want.bound[col];
                if (c.output == o_output::float_and_bf16 && o_bf16[at].bits != bf16(got).bits && bad++ == 0) {
                    UNSCOPED_INFO("first wrong: item " << t << " (" << i << ", " << col << "): bf16 " << std::hex << o_bf16[at].bits
                                                      << " is not float " << got << " rounded");
                }
                if (c.output == o_output::bf16_only) {  // the float output untouched; bf16's rounding on top of the bound
                    if (std::bit_cast<std::uint32_t>(o[at]) != std::bit_cast<std::uint32_t>(std::numeric_limits<float>::quiet_NaN()) && bad++ == 0) {
                        UNSCOPED_INFO("first wrong: item " << t << " (" << i << ", " << col << "): float output written, " << o[at]);
                    }
                    got = float(o_bf16[at]);
                    bound += std::ldexp(std::fabs(want.o[col]) + bound, -8);
                }
                if (!o_bf16.empty() && o_bf16[at].bits == unwritten.bits && bad++ == 0) {
                    UNSCOPED_INFO("first wrong: item " << t << " (" << i << ", " << col << "): bf16 output not written");
                }
                const bool ok = std::isnan(want.o[col]) ? std::isnan(got) : std::fabs(double(got) - want.o[col]) <= bound;
                if (!ok && bad++ == 0) {
                    UNSCOPED_INFO("first wrong: item " << t << " (" << i << ", " << col << "): got " << got << ", want "
                                                      << want.o[col] << " within " << want.bound[col]);
                }
            }
        }
    }
    REQUIRE(bad == 0);
}

// Extents under, at and over the blocks' (96 queries, 256 keys), the micro-tiles' (12 or 32
// rows, 32 columns, 32 depths) and the few queries of the float kernel's dot products.
struct extents {
    std::size_t queries, keys, d, dv;
};
const extents sizes[] = {{1, 1, 1, 1},     {3, 31, 3, 17},   {13, 33, 32, 32},  {33, 64, 33, 31}, {96, 256, 64, 64},
                         {97, 257, 20, 24}, {70, 300, 80, 40}, {200, 520, 16, 65}};

}  // namespace

TEST_CASE("each bf16 kernel rounds P to nearest even, NaN quiet, a denormal to zero with its sign") {
    // The reference: bf16's own conversion (core/bf16.hpp), but for a denormal, which the
    // instruction (VCVTNE2PS2BF16) makes zero, as the products that read P would take it.
    auto expected = [](float x) -> std::uint16_t {
        if (x != 0 && std::fabs(x) < std::numeric_limits<float>::min()) return std::signbit(x) ? 0x8000 : 0;
        return bf16(x).bits;
    };
    const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::bit_cast<float>(0x007fffffu),
                              std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
                              std::bit_cast<float>(0x3f808000u),  // 1 + 2^-8: a tie, to the even 1
                              std::bit_cast<float>(0x3f818000u),  // a tie, to the even above
                              std::bit_cast<float>(0x3f808001u),  // just past a tie: up
                              std::numeric_limits<float>::max(),  // rounds past the largest bf16: infinity
                              std::bit_cast<float>(0x7f7f7fffu),  // the largest bf16, unrounded
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u),  // signalling
                              std::bit_cast<float>(0xffffffffu), std::bit_cast<float>(0x7fbfffffu)};
    // each special in every lane of a block of 32, among random bits of every class
    std::mt19937 random(17);
    std::vector<float> from;
    for (const float special : specials) {
        for (std::size_t lane = 0; lane < 32; ++lane) {
            for (std::size_t n = 0; n < 32; ++n) from.push_back(n == lane ? special : std::bit_cast<float>(std::uint32_t(random())));
        }
    }
    test::for_each_kernel([&]<class Kernel>(const char* name) {
        INFO(name);
        std::vector<bf16> to(from.size() + 32, bf16::from_bits(0x1234));  // past the end: must stay
        Kernel::round_row(from.data(), to.data(), from.size());
        std::size_t wrong = 0;
        for (std::size_t n = 0; n < from.size(); ++n) {
            if (to[n].bits != expected(from[n])) {
                if (wrong++ < 5) UNSCOPED_INFO("lane " << n % 32 << ": " << std::hex << std::bit_cast<std::uint32_t>(from[n]) << " -> " << to[n].bits << ", expected " << expected(from[n]));
            }
        }
        CHECK(wrong == 0);
        CHECK(std::all_of(to.begin() + std::ptrdiff_t(from.size()), to.end(), [](bf16 b) { return b.bits == 0x1234; }));
    });
}

#if !defined(DIMSUM_TEST_BF16_HARDWARE)
// (the weights are computed by the SIMD code of the build's instruction set, with no bf16
// instruction: once is enough, in the stand-ins' build)
TEST_CASE("the bf16 kernels' weights e^(x - m) lie within the bound the attention test derives, 0 where x is masked") {
    using batch = cpu::simd<float>;
    constexpr std::size_t width = batch::size;
    auto weights = [](const std::vector<float>& x, float top) {  // x.size() a multiple of width
        const cpu::detail::bf16_weights weight(top);
        std::vector<float> e(x.size());
        for (std::size_t i = 0; i < x.size(); i += width) weight(batch::load_unaligned(x.data() + i)).store_unaligned(e.data() + i);
        return e;
    };
    SECTION("x - m from -104 (e^(x - m) the smallest denormal) to 0, every 31st float, at several m") {
        for (const float top : {0.0f, 3.5f, -7.25f, 1000.0f, -1e6f}) {
            std::vector<float> x;
            for (std::uint32_t bits = 0x80000000u; bits <= std::bit_cast<std::uint32_t>(-104.0f); bits += 31) {
                x.push_back(top + std::bit_cast<float>(bits));
            }
            while (x.size() % width != 0) x.push_back(top);
            const std::vector<float> e = weights(x, top);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double y = double(x[i]) - double(top), want = std::exp(y);
                // test_bf16_attention's allowance, and half a denormal's unit where e^y is one
                const double bound = want * (std::ldexp(1.0, -22) + 3 * std::ldexp(-y, -24)) + std::ldexp(1.0, -150);
                if (!(std::fabs(double(e[i]) - want) <= bound) && wrong++ < 5) UNSCOPED_INFO("m = " << top << ", x - m = " << y << ": " << e[i] << ", e^(x - m) = " << want);
            }
            CHECK(wrong == 0);
        }
    }
    SECTION("x = m gives 1, -infinity 0, NaN NaN, in every lane among ordinary values") {
        std::mt19937 random(5);
        std::uniform_real_distribution<float> ordinary(-30.0f, 0.0f);
        const float top = 2.5f;
        for (const float special : {top, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
            for (std::size_t lane = 0; lane < width; ++lane) {
                std::vector<float> x(width);
                for (auto& v : x) v = top + ordinary(random);
                x[lane] = special;
                const float e = weights(x, top)[lane];
                INFO("x = " << special << " in lane " << lane);
                if (std::isnan(special)) CHECK(std::isnan(e));
                else CHECK(e == (special == top ? 1.0f : 0.0f));
            }
        }
    }
}
#endif

TEST_CASE("bf16 attention on the bf16 kernels, within the bound of its roundings, through every edge of the blocks") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const auto [queries, keys, d, dv] : sizes) {
            for (const bool causal : {false, true}) {
                INFO(queries << " queries, " << keys << " keys, d " << d << ", dv " << dv << (causal ? ", causal" : ""));
                check_case<Kernel>({.queries = queries, .keys = keys, .d = d, .dv = dv, .scale = 0.3f, .causal = causal,
                                    .seed = queries + keys});
            }
        }
    });
}

TEST_CASE("bf16 attention reads K and V transposed, writes O column-major, and takes batches") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const bool k_transposed : {false, true}) {
            for (const bool v_transposed : {false, true}) {
                INFO("K transposed " << k_transposed << ", V transposed " << v_transposed);
                check_case<Kernel>({.queries = 40, .keys = 300, .d = 24, .dv = 40, .scale = 0.125f, .k_transposed = k_transposed,
                                    .v_transposed = v_transposed, .o_columns = k_transposed});
            }
        }
        // items enough for every thread, each of two query blocks: K and V packed once per item
        check_case<Kernel>({.items = 5, .queries = 100, .keys = 270, .d = 40, .dv = 33, .scale = 0.2f, .causal = true, .seed = 5});
        // the same, but for blocks of keys that the causal mask cuts short, which each visit
        // packs itself to a shallower depth: the first 96 queries see 196 of the first 256 keys
        check_case<Kernel>({.items = 4, .queries = 200, .keys = 300, .d = 24, .dv = 40, .scale = 0.2f, .causal = true,
                            .v_transposed = true, .seed = 10});
        // heads sharing one K and V
        check_case<Kernel>({.items = 3, .queries = 20, .keys = 90, .d = 16, .dv = 8, .shared_kv = true, .seed = 6});
        // one block of queries and many keys: the keys split between the threads, then merged
        check_case<Kernel>({.queries = 30, .keys = 1100, .d = 32, .dv = 20, .scale = 0.18f, .seed = 7});
        check_case<Kernel>({.queries = 5, .keys = 800, .d = 64, .dv = 40, .causal = true, .seed = 8});
    });
}

TEST_CASE("bf16 attention rounds O into bf16 as it writes it, and leaves the float output alone where no one reads it") {
    test::for_kernels_and_threads([]<class Kernel>() {
        for (const o_output output : {o_output::float_and_bf16, o_output::bf16_only}) {
            INFO((output == o_output::bf16_only ? "bf16 only" : "float and bf16"));
            // whole items per thread, blocks of queries per thread, keys split and merged
            check_case<Kernel>({.items = 5, .queries = 100, .keys = 270, .d = 40, .dv = 33, .scale = 0.2f, .causal = true,
                                .o_columns = true, .output = output, .seed = 11});
            check_case<Kernel>({.queries = 130, .keys = 300, .d = 40, .dv = 33, .scale = 0.2f, .causal = true, .output = output});
            check_case<Kernel>({.queries = 30, .keys = 1100, .d = 32, .dv = 20, .scale = 0.18f, .output = output, .seed = 12});
            check_case<Kernel>({.queries = 20, .keys = 300, .d = 16, .dv = 24, .output = output, .nan = poison::nan_v, .seed = 13});
        }
    });
}

TEST_CASE("bf16 attention: masked queries give 0, a score function applies after the scale, equal weights average") {
    test::for_kernels_and_threads([]<class Kernel>() {
        // causal with more queries than keys: the first 30 queries see no key at all
        check_case<Kernel>({.queries = 40, .keys = 10, .d = 16, .dv = 24, .causal = true, .seed = 9});
        check_case<Kernel>({.queries = 130, .keys = 300, .d = 40, .dv = 33, .scale = 0.2f, .causal = true, .score_bias = true});
        check_case<Kernel>({.items = 2, .queries = 97, .keys = 520, .d = 33, .dv = 40, .scale = 0.5f, .score_bias = true});
        // a negative scale reverses the scores' order (the softmax's maximum is of S scaled)
        check_case<Kernel>({.queries = 60, .keys = 300, .d = 24, .dv = 40, .scale = -0.3f, .causal = true, .seed = 4});
        // every weight 1 / n exactly (Q = 0): no rounding of P, O within float's sums of the mean
        check_case<Kernel>({.queries = 50, .keys = 700, .d = 20, .dv = 35, .zero_queries = true});
        check_case<Kernel>({.queries = 100, .keys = 300, .d = 20, .dv = 35, .causal = true, .zero_queries = true});
    });
}

TEST_CASE("bf16 attention carries NaN from a query, a key or a value, and finds no NaN in its scratch") {
    test::for_kernels_and_threads([]<class Kernel>() {
        // first a problem all of NaN, which leaves NaN in every thread's tiles: padding must be
        // written, not found
        std::vector<bf16> nan(128 * 300, std::numeric_limits<bf16>::quiet_NaN());
        std::vector<float> o(128 * 64);
        cpu::attention_problem<float> poisoned;
        poisoned.q = cpu::matrix<const bf16>{nan.data(), 128, 64, 64, 1};
        poisoned.k = cpu::matrix<const bf16>{nan.data(), 300, 64, 64, 1};
        poisoned.v = cpu::matrix<const bf16>{nan.data(), 300, 64, 64, 1};
        poisoned.o = {o.data(), 128, 64, 64, 1};
        poisoned.batch.rank = 1;
        poisoned.batch.extents[0] = 1;
        cpu::bf16_attention<Kernel>(poisoned);
        for (const auto [queries, keys, d, dv] : {extents{17, 33, 33, 31}, extents{97, 257, 20, 24}}) {
            for (const poison where : {poison::none, poison::nan_q, poison::nan_k, poison::nan_v}) {
                for (std::uint64_t seed : {1, 2, 3}) {
                    INFO(queries << " queries, " << keys << " keys, NaN in " << int(where) << ", seed " << seed);
                    check_case<Kernel>({.queries = queries, .keys = keys, .d = d, .dv = dv, .scale = 0.25f, .nan = where, .seed = seed});
                }
            }
        }
    });
}

#if defined(DIMSUM_TEST_BF16_HARDWARE)
// The whole way from a formula: attention of bf16 tensors, plain and causal, on each path this
// CPU runs, against the reference backend; and decoding (one query), which stays on widen.
TEST_CASE("attention formulas over bf16 on each bf16 path this CPU runs, against the reference backend") {
    using Heads = ds::axis<"heads">;
    using Query = ds::axis<"query">;
    using Key = ds::axis<"key">;
    using D = ds::axis<"d">;
    for (const cpu::bf16_path path : {cpu::bf16_path::amx, cpu::bf16_path::avx512_bf16}) {
        if (!cpu::support_of(path).usable) continue;
        const cpu::scoped_bf16_path chosen(path);
        for (const int threads : {1, 2}) {
            ds::set_num_threads(threads);
            for (const auto [queries, keys, d, dv] : {extents{1, 300, 64, 64}, extents{97, 257, 20, 20}, extents{300, 600, 64, 64}}) {
                INFO(cpu::name(path) << ", " << threads << " threads, " << queries << " queries, " << keys << " keys, d " << d);
                ds::tensor<bf16, Heads, Query, D> q(Heads{3}, Query{queries}, D{d});
                ds::tensor<bf16, Heads, Key, D> k(Heads{3}, Key{keys}, D{d});
                ds::tensor<bf16, Heads, Key, D> v(Heads{3}, Key{keys}, D{dv});
                ds::fill_uniform(q, 1);
                ds::fill_uniform(k, 2);
                ds::fill_uniform(v, 3);
                auto scores = ds::matmul(ds::cast<float>(q), ds::transpose(ds::cast<float>(k))) * 0.125f;
                const auto plain = ds::matmul(ds::softmax<Key>(scores), ds::cast<float>(v));
                const auto causal = ds::matmul(ds::softmax<Key>(ds::nn::causal(scores)), ds::cast<float>(v));
                const std::size_t before = cpu::bf16_attentions(path), widened = cpu::bf16_attentions(cpu::bf16_path::widen);
                // values of magnitude below 1: P's rounding to bf16 moves O by at most 2^-8; the
                // scores' float sums of d exact products, by less than 2^-12
                const double bound = 1.0 / 128;
                test::require_close(ds::tensor<float, Heads, Query, D>(plain),
                                    test::to_xt(ds::eval(plain, ds::backend::reference::evaluator{})), 0, bound);
                test::require_close(ds::tensor<float, Heads, Query, D>(causal),
                                    test::to_xt(ds::eval(causal, ds::backend::reference::evaluator{})), 0, bound);
                const bool decoding = queries <= cpu::attention_tiling<float>::few_queries;
                CHECK(cpu::bf16_attentions(path) - before == (decoding ? 0u : 2u));
                CHECK(cpu::bf16_attentions(cpu::bf16_path::widen) - widened == (decoding ? 2u : 0u));
            }
        }
        ds::set_num_threads(0);
    }
}

// A bf16 layer holds its Q, K, V and heads' output in bf16 (cast<bf16>, in bf16 temporaries),
// so its attention and all four products run on the bf16 path: the counters say so. Its output
// against the reference backend (double, rounding at the same casts): P rounded to bf16 on the
// path, and a rounded intermediate that lands on the neighbouring bf16 where float's sums and
// double's straddle a tie, each move an output by a few 2^-8 of the largest (values below 2
// here); the bound, 2^-5 of the largest, is loose: what it catches is a wrong or missing value.
TEST_CASE("a bf16 attention layer runs its attention and its products on each bf16 path this CPU runs") {
    using Batch = ds::axis<"batch">;
    using Seq = ds::axis<"seq">;
    using Model = ds::axis<"model", 48>;
    ds::nn::multi_head_attention<bf16, Model, ds::axis<"heads", 3>, ds::axis<"head", 16>> layer;
    const double bound = 1.0 / std::sqrt(48.0);  // as torch.nn.Linear
    ds::fill_uniform(layer.w_q.emplace(), 1, -bound, bound);
    ds::fill_uniform(layer.w_k.emplace(), 2, -bound, bound);
    ds::fill_uniform(layer.w_v.emplace(), 3, -bound, bound);
    ds::fill_uniform(layer.w_o, 4, -bound, bound);
    ds::tensor<bf16, Batch, Seq, Model> x(Batch{2}, Seq{97});
    ds::fill_normal(x, 5);
    for (const cpu::bf16_path path : {cpu::bf16_path::amx, cpu::bf16_path::avx512_bf16}) {
        if (!cpu::support_of(path).usable) continue;
        const cpu::scoped_bf16_path chosen(path);
        for (const int threads : {1, 2}) {
            INFO(cpu::name(path) << ", " << threads << " threads");
            ds::set_num_threads(threads);
            const std::size_t attentions = cpu::bf16_attentions(path), products = cpu::bf16_products(path);
            ds::tensor<bf16, Batch, Seq, Model> y(Batch{2}, Seq{97});
            layer.forward(x, x, y.view(), {.causal = true});
            CHECK(cpu::bf16_attentions(path) - attentions == 1);
            CHECK(cpu::bf16_products(path) - products == 4);  // Q, K, V and the output projection
            ds::tensor<bf16, Batch, Seq, Model> want(Batch{2}, Seq{97});
            layer.forward_on(ds::backend::reference::evaluator{}, x, x, want.view(), {.causal = true});
            double largest = 0, worst = 0;
            for (std::size_t i = 0; i < y.size(); ++i) {
                largest = std::max(largest, std::abs(double(want.data()[i])));
                const double difference = std::abs(double(y.data()[i]) - double(want.data()[i]));
                worst = std::isnan(difference) ? difference : std::max(worst, difference);
            }
            INFO("largest difference " << worst << " at outputs up to " << largest);
            CHECK(largest > 0.1);
            CHECK(worst <= largest / 32);
        }
        ds::set_num_threads(0);
    }
}
#endif
