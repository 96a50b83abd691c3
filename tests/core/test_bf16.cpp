// bf16 tensors: conversions bit for bit against independent references (PyTorch for float,
// exact rational arithmetic for double: tests/reference/generate_bf16.py), and formulas over
// bf16 on the CPU backend against (a) the same formula over the float values, rounded once
// (bit for bit: the CPU computes a bf16 formula in float), and (b) the reference backend,
// which computes in double from the bf16 values, within the bound written at each check.
#include "support.hpp"

#include <dimsum/interop/npy.hpp>
#include <dimsum/interop/parameters.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ds = dimsum;
using ds::bf16;
using test::require_same_bits;

namespace {

// This file's oracle for products is the float product of the widened values, bit for bit:
// the widen path's promise (backend/cpu/bf16_paths.hpp). The amx path sums in another order;
// test_bf16_gemm and bf16.instructions_on_this_cpu hold it to the reference backend instead.
const ds::backend::cpu::scoped_bf16_path widen_products{ds::backend::cpu::bf16_path::widen};

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Inner = ds::axis<"inner">;
using N = ds::axis<"n">;

const std::string data = test::data_path("bf16/");

template <class... A>
ds::tensor<bf16, A...> random_bf16(std::uint64_t seed, A... extents) {
    ds::tensor<bf16, A...> t(extents...);
    ds::fill_normal(t, seed);
    return t;
}

// NaN and infinities at positions that fall in every SIMD lane and in the tail.
template <class... A>
void poison(ds::tensor<bf16, A...>& t) {
    bf16* d = t.data();
    const std::size_t n = t.size();
    const bf16 specials[] = {std::numeric_limits<bf16>::quiet_NaN(), std::numeric_limits<bf16>::infinity(),
                             -std::numeric_limits<bf16>::infinity()};
    for (std::size_t i = 0; i < n; i += 7) d[i] = specials[(i / 7) % 3];
    d[n - 1] = specials[0];
}

template <class T, class... A>
std::vector<std::uint16_t> bits_of(const ds::tensor<T, A...>& t) {
    std::vector<std::uint16_t> bits(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) bits[i] = t.data()[i].bits;
    return bits;
}

// Whether got equals the float values `wide` rounded to bf16, bit for bit (any NaN for NaN).
template <class... A, class... B>
void require_rounded(const ds::tensor<bf16, A...>& got, const ds::tensor<float, B...>& wide) {
    REQUIRE(got.size() == wide.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const float w = wide.data()[i];
        const bool same = std::isnan(w) ? isnan(got.data()[i]) : got.data()[i].bits == bf16(w).bits;
        if (!same && bad++ == 0) UNSCOPED_INFO("first difference at " << i << ": got " << got.data()[i] << ", want " << w);
    }
    REQUIRE(bad == 0);
}

// |got - want| <= ulps bf16 ulps of want + absolute (NaN and infinities exactly).
template <class... A>
void require_near(const ds::tensor<bf16, A...>& got, const ds::tensor<bf16, A...>& want, double ulps, double absolute) {
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = double(got.data()[i]), w = double(want.data()[i]);
        bool ok = (std::isnan(g) && std::isnan(w)) || (std::isinf(w) && g == w) ||
                  std::abs(g - w) <= ulps * std::ldexp(1.0, -7) * std::abs(w) + absolute;
        if (!ok && bad++ == 0) UNSCOPED_INFO("first difference at " << i << ": got " << g << ", want " << w);
    }
    REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("float to bf16 rounds to nearest even, bit for bit as PyTorch") {
    const auto in = ds::load_npy<float, N>(data + "float_in.npy");
    const auto want = ds::load_npy<std::int32_t, N>(data + "float_bits.npy");
    std::size_t checked = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        INFO("input bits " << std::bit_cast<std::uint32_t>(in(i)));
        REQUIRE(bf16(in(i)).bits == std::uint16_t(want(i)));
        REQUIRE(float(bf16(in(i))) == float(bf16::from_bits(std::uint16_t(want(i)))));  // widening is exact
        ++checked;
    }
    REQUIRE(checked > 5000);
}

TEST_CASE("double to bf16 rounds once, where rounding through float would round twice") {
    const auto in = ds::load_npy<double, N>(data + "double_in.npy");
    const auto want = ds::load_npy<std::int32_t, N>(data + "double_bits.npy");
    std::size_t twice = 0;  // inputs on which rounding to float first gives another answer
    for (std::size_t i = 0; i < in.size(); ++i) {
        INFO("input " << in(i));
        REQUIRE(bf16(in(i)).bits == std::uint16_t(want(i)));
        if (bf16(float(in(i))).bits != std::uint16_t(want(i))) ++twice;
    }
    REQUIRE(twice > 100);  // the file holds such traps, so this test can tell the two apart
}

TEST_CASE("NaN stays NaN, with its sign, infinities and the edges of the range") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    REQUIRE(isnan(bf16(nan)));
    REQUIRE(isnan(bf16(-nan)));
    REQUIRE((bf16(-nan).bits & 0x8000) != 0);
    REQUIRE(isnan(bf16(std::bit_cast<float>(0x7f80'0001u))));  // a payload only in the low bits
    REQUIRE(isnan(bf16(std::bit_cast<float>(0x7fff'ffffu))));   // rounding must not carry it to infinity
    REQUIRE(isnan(bf16(double(nan))));
    REQUIRE(float(std::numeric_limits<bf16>::max()) == 3.3895313892515355e38f);  // torch.finfo(torch.bfloat16)
    REQUIRE(float(std::numeric_limits<bf16>::min()) == 1.1754943508222875e-38f);
    REQUIRE(float(std::numeric_limits<bf16>::epsilon()) == 0.0078125f);
    REQUIRE(float(std::numeric_limits<bf16>::denorm_min()) == std::ldexp(1.0f, -133));
    REQUIRE(float(std::numeric_limits<bf16>::lowest()) == -3.3895313892515355e38f);
    REQUIRE(std::isinf(float(std::numeric_limits<bf16>::infinity())));
    REQUIRE(isnan(std::numeric_limits<bf16>::quiet_NaN()));
    REQUIRE(float(-bf16(0.0f)) == 0.0f);
    REQUIRE(std::signbit(float(-bf16(0.0f))));
}

TEST_CASE("elementwise formulas over bf16 are the float formula rounded once, on strided and broadcast operands") {
    for (std::size_t rows : {1, 5, 37}) {
        for (std::size_t cols : {1, 7, 16, 33}) {
            INFO(rows << " x " << cols);
            auto x = random_bf16(1, Rows{rows}, Cols{cols});
            auto y = random_bf16(2, Cols{cols}, Rows{rows});  // read transposed
            auto b = random_bf16(3, Cols{cols});               // broadcast
            poison(x);
            const ds::tensor<float, Rows, Cols> xf = ds::cast<float>(x);
            const ds::tensor<float, Cols, Rows> yf = ds::cast<float>(y);
            const ds::tensor<float, Cols> bf = ds::cast<float>(b);

            auto formula = [](const auto& x, const auto& y, const auto& b) {
                // 0.1f is no bf16: a number keeps float's precision in a bf16 formula
                return ds::tanh(x * ds::transpose(y) + b) - ds::exp(ds::abs(x)) * 0.1f + ds::nn::gelu(x);
            };
            const ds::tensor<bf16, Rows, Cols> got = formula(x, y, b);
            const ds::tensor<float, Rows, Cols> wide = formula(xf, yf, bf);
            require_rounded(got, wide);

            // the oracle computes in double from the bf16 values; rounded once, the two differ by
            // at most one bf16 ulp, plus float's own error near 0 (cancellation in the sum)
            const auto oracle = ds::eval(formula(x, y, b), ds::backend::reference::evaluator{});
            require_near(got, oracle, 1.0, 1e-5);

            // into a transposed view of a bf16 tensor
            ds::tensor<bf16, Cols, Rows> out(Cols{cols}, Rows{rows});
            ds::assign(ds::transpose(out), formula(x, y, b));
            const ds::tensor<bf16, Rows, Cols> back = ds::transpose(out);
            REQUIRE(bits_of(back) == bits_of(got));
        }
    }
}

TEST_CASE("matmul, softmax, layer_norm and sum over bf16 compute in float and round once") {
    const std::size_t rows = 29, inner = 67, cols = 35;
    auto a = random_bf16(4, Rows{rows}, Inner{inner});
    auto w = random_bf16(5, Cols{cols}, Inner{inner});  // used transposed
    auto bias = random_bf16(6, Cols{cols});
    const ds::tensor<float, Rows, Inner> af = ds::cast<float>(a);
    const ds::tensor<float, Cols, Inner> wf = ds::cast<float>(w);
    const ds::tensor<float, Cols> biasf = ds::cast<float>(bias);

    auto product = [](const auto& a, const auto& w, const auto& bias) { return ds::matmul(a, ds::transpose(w)) + bias; };
    const ds::tensor<bf16, Rows, Cols> got = product(a, w, bias);
    require_rounded(got, ds::tensor<float, Rows, Cols>(product(af, wf, biasf)));
    // float accumulation over `inner` products of values below ~4 (normal data): at most
    // inner * 2^-24 * sum |a||w| ~ 67 * 6e-8 * 67 * 1.5 < 5e-4 absolute, plus one bf16 ulp
    require_near(got, ds::eval(product(a, w, bias), ds::backend::reference::evaluator{}), 1.0, 5e-4);

    const ds::tensor<bf16, Rows, Cols> p = ds::softmax<Cols>(got);
    require_rounded(p, ds::tensor<float, Rows, Cols>(ds::softmax<Cols>(ds::cast<float>(got))));
    const ds::tensor<bf16, Rows, Cols> n = ds::layer_norm<Cols>(got);
    require_rounded(n, ds::tensor<float, Rows, Cols>(ds::layer_norm<Cols>(ds::cast<float>(got))));
    const ds::tensor<bf16, Rows> s = ds::sum<Cols>(got);
    require_rounded(s, ds::tensor<float, Rows>(ds::sum<Cols>(ds::cast<float>(got))));
    require_near(s, ds::eval(ds::sum<Cols>(got), ds::backend::reference::evaluator{}), 1.0, 1e-4);
}

// Specials in row `row` of a matrix: NaN, +inf and -inf in turn at every 5th column from `from`,
// so that over the extents below they fall in every SIMD lane and in the tails.
template <class Rows_, class Cols_>
void poison_row(ds::tensor<bf16, Rows_, Cols_>& t, std::size_t row, std::size_t from) {
    const bf16 specials[] = {std::numeric_limits<bf16>::quiet_NaN(), std::numeric_limits<bf16>::infinity(),
                             -std::numeric_limits<bf16>::infinity()};
    for (std::size_t c = from; c < t.extent(1); c += 5) t(row, c) = specials[(c / 5) % 3];
}

// The float formula of the widened values is the oracle here, bit for bit: the CPU's products
// read their bf16 operands where they lie and widen them as they pack or load them, computing
// the same sums in the same order as on the widened copy (gemm.hpp). The extents reach every
// path of gemm: a few rows (1 to 4, B streamed), A or B read in place for float but packed for
// bf16, depths past one block (kc = 256), B shared by two threads and cut along its depth
// (gemm.hpp), whole products per thread and products shared by
// two threads by rows and by columns.
TEST_CASE("a product reads its bf16 operands where they lie: the product of the widened values, bit for bit") {
    struct extents {
        std::size_t m, k, n;
    };
    const extents cases[] = {{1, 19, 45},  {2, 300, 33}, {3, 7, 130}, {4, 300, 1},   {5, 1, 7},
                             {13, 67, 35}, {37, 300, 45}, {300, 300, 130}, {100, 300, 400},
                             {1, 1031, 263}, {4, 129, 2049}};  // B shared by two threads, cut along its depth
    for (const int threads : {1, 2}) {
        ds::set_num_threads(threads);
        for (const auto [m, k, n] : cases) {
            INFO(threads << " threads, " << m << " x " << k << " x " << n);
            auto a = random_bf16(11, Rows{m}, Inner{k});
            auto at = random_bf16(12, Inner{k}, Rows{m});  // read transposed
            auto b = random_bf16(13, Inner{k}, Cols{n});
            auto bt = random_bf16(14, Cols{n}, Inner{k});  // read transposed
            auto bias = random_bf16(15, Cols{n});
            poison_row(a, m / 2, 0);
            poison_row(bt, n / 2, 1);
            const ds::tensor<float, Rows, Inner> af = ds::cast<float>(a);
            const ds::tensor<float, Inner, Rows> atf = ds::cast<float>(at);
            const ds::tensor<float, Inner, Cols> bf = ds::cast<float>(b);
            const ds::tensor<float, Cols, Inner> btf = ds::cast<float>(bt);
            const ds::tensor<float, Cols> biasf = ds::cast<float>(bias);
            using C = ds::tensor<float, Rows, Cols>;
            auto wide = [](const auto& x) { return ds::cast<float>(x); };

            require_same_bits(C(ds::matmul(wide(a), wide(b))), C(ds::matmul(af, bf)));
            require_same_bits(C(ds::matmul(ds::transpose(wide(at)), ds::transpose(wide(bt)))),
                              C(ds::matmul(ds::transpose(atf), ds::transpose(btf))));
            require_same_bits(C(ds::matmul(wide(a), bf)), C(ds::matmul(af, bf)));  // one operand of each type
            require_same_bits(C(ds::matmul(ds::transpose(atf), wide(b))), C(ds::matmul(ds::transpose(atf), bf)));
            // a formula of bf16, its epilogue fused, rounded into bf16
            const ds::tensor<bf16, Rows, Cols> got = ds::nn::gelu(ds::matmul(a, ds::transpose(bt)) + bias);
            require_rounded(got, C(ds::nn::gelu(ds::matmul(af, ds::transpose(btf)) + biasf)));
        }
    }
    ds::set_num_threads(0);
}

TEST_CASE("bf16 operands read where they lie through batches, broadcasts and slices, with no convert") {
    using Batch = ds::axis<"batch">;
    using Wide = ds::axis<"wide">;
    const std::size_t batch = 3, m = 9, k = 40, n = 21;
    auto x = random_bf16(21, Batch{batch}, Rows{m}, Inner{k});
    auto w = random_bf16(22, Inner{k}, Wide{3 * n});  // three weights side by side; the middle one read
    auto y = random_bf16(23, Batch{batch}, Inner{k}, Cols{n});
    auto z = random_bf16(24, Rows{m}, Inner{k});  // broadcast along the batch
    poison_row(z, 4, 2);
    const ds::tensor<float, Batch, Rows, Inner> xf = ds::cast<float>(x);
    const ds::tensor<float, Inner, Wide> wf = ds::cast<float>(w);
    const ds::tensor<float, Batch, Inner, Cols> yf = ds::cast<float>(y);
    const ds::tensor<float, Rows, Inner> zf = ds::cast<float>(z);
    using C = ds::tensor<float, Batch, Rows, Cols>;
    auto middle = [n](const auto& w) { return ds::rename<Wide, Cols>(ds::slice<Wide>(w, n, 2 * n)); };
    auto wide = [](const auto& t) { return ds::cast<float>(t); };

    // (batch, m, k) x (k, n): the batch folded into rows, B a slice of w
    require_same_bits(C(ds::matmul(wide(x), middle(wide(w)))), C(ds::matmul(xf, middle(wf))));
    // (batch, m, k) x (batch, k, n), and A broadcast along the batch
    require_same_bits(C(ds::matmul(wide(x), wide(y))), C(ds::matmul(xf, yf)));
    require_same_bits(C(ds::matmul(wide(z), wide(y))), C(ds::matmul(zf, yf)));
    // one item of the batch, selected
    using One = ds::tensor<float, Rows, Cols>;
    require_same_bits(One(ds::matmul(ds::select<Batch>(wide(x), 2), ds::select<Batch>(wide(y), 1))),
                      One(ds::matmul(ds::select<Batch>(xf, 2), ds::select<Batch>(yf, 1))));

    // the views of a formula (the slice of a cast) and a tensor's own (the slice of w)
    for (const std::string& plan : {ds::backend::cpu::evaluator{}.explain(ds::matmul(wide(x), middle(wide(w)))),
                                    ds::backend::cpu::evaluator{}.explain(ds::matmul(x, middle(w)))}) {
        INFO(plan);
        CHECK(plan.find("convert") == std::string::npos);
        CHECK(plan.find("[bf16 read where it lies]") != std::string::npos);
    }
    // the reference backend converts: it computes in double from the bf16 values
    CHECK(ds::backend::reference::evaluator{}.explain(ds::matmul(x, middle(w))).find("convert") != std::string::npos);
}

TEST_CASE("fused attention over bf16 equals the float kernel rounded once, and the oracle within its bound") {
    using Batch = ds::axis<"batch">;
    using Seq = ds::axis<"seq">;
    using Key = ds::axis<"key">;
    using Head = ds::axis<"head", 16>;
    auto q = random_bf16(7, Batch{2}, Seq{45}, Head{});
    auto k = random_bf16(8, Batch{2}, Key{45}, Head{});
    auto v = random_bf16(9, Batch{2}, Key{45}, Head{});
    auto attention = [](const auto& q, const auto& k, const auto& v) {
        return ds::matmul(ds::softmax<Key>(ds::nn::causal(ds::matmul(q, ds::transpose(k)) * 0.25f)), v);
    };
    const ds::tensor<bf16, Batch, Seq, Head> got = attention(q, k, v);
    using F = ds::tensor<float, Batch, Seq, Head>;
    const F qf = ds::cast<float>(q);
    const ds::tensor<float, Batch, Key, Head> kf = ds::cast<float>(k), vf = ds::cast<float>(v);
    require_rounded(got, F(attention(qf, kf, vf)));
    // outputs are convex combinations of v (|v| < ~5): float's error over 45 keys is below 1e-5
    require_near(got, ds::eval(attention(q, k, v), ds::backend::reference::evaluator{}), 1.0, 1e-5);

    // an additive mask of bf16 in the score function, read where it lies by each tile's pass
    auto mask = random_bf16(10, Seq{45}, Key{45});
    const ds::tensor<float, Seq, Key> maskf = ds::cast<float>(mask);
    auto masked = [](const auto& q, const auto& k, const auto& v, const auto& m) {
        return ds::matmul(ds::softmax<Key>(ds::matmul(q, ds::transpose(k)) * 0.25f + m), v);
    };
    const std::string plan = ds::backend::cpu::evaluator{}.explain(masked(q, k, v, mask));
    INFO(plan);
    CHECK(plan.find("convert") == std::string::npos);
    for (int threads : {1, 2}) {
        ds::set_num_threads(threads);
        const ds::tensor<bf16, Batch, Seq, Head> with_mask = masked(q, k, v, mask);
        require_rounded(with_mask, F(masked(qf, kf, vf, maskf)));
    }
    ds::set_num_threads(0);
}

// Passes and kernels along an axis read bf16 where it lies and write bf16 themselves (no
// convert, no narrow): a result of over 8 MiB is streamed around the caches, from rows that
// start at every alignment (the destination is a slice), NaN and infinities in every lane.
TEST_CASE("passes and line kernels over bf16 read and write it where it lies: the float formula rounded, bit for bit") {
    const std::size_t rows = 2049, cols = 2053;  // 2049 x 2053 bf16: 8.4 MB, past streaming_bytes
    auto x = random_bf16(11, Rows{rows}, Cols{cols});
    auto b = random_bf16(12, Cols{cols});
    poison(x);
    const ds::tensor<float, Rows, Cols> xf = ds::cast<float>(x);
    const ds::tensor<float, Cols> bf = ds::cast<float>(b);
    ds::tensor<bf16, Rows, Cols> wide(Rows{rows}, Cols{cols + 3});
    auto into = ds::slice<Cols>(wide, 1, cols + 1);  // a view whose rows start at every alignment
    auto check = [&](const auto& formula, const auto& formula_f, std::string_view plan_size) {
        const ds::tensor<float, Rows, Cols> want = formula_f;
        ds::assign(into, formula);
        const ds::tensor<bf16, Rows, Cols> got = into;
        require_rounded(got, want);
        const ds::tensor<bf16, Rows, Cols> fresh = formula;  // a row-major destination
        require_rounded(fresh, want);
        const std::string plan = ds::backend::cpu::evaluator{}.explain(formula);
        INFO(plan);
        CHECK(plan.find("convert") == std::string::npos);
        CHECK(plan.find("narrow") == std::string::npos);
        CHECK(plan.find(plan_size) != std::string::npos);
    };
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        check(ds::tanh(x * 0.5f + b), ds::tanh(xf * 0.5f + bf), "1 entry, 0 temporaries");
        check(ds::softmax<Cols>(x), ds::softmax<Cols>(xf), "1 entry, 0 temporaries");
        // x + b is a float value the line kernel reads: one float temporary
        check(ds::layer_norm<Cols>(x + b), ds::layer_norm<Cols>(xf + bf), "2 entries, 1 temporary");
    }
    ds::set_num_threads(0);
}

// softmax reads a contiguous line of bf16 where it lies, widening as it loads, and rounds its
// result straight into a contiguous line of bf16 (no line buffer): each of the four layouts of
// bf16 and float, in and out, and strided lines (gathered into the buffer), must give the
// float softmax of the widened values, rounded, bit for bit. Rows hold no special value, a
// NaN, +inf, -inf (weight 0) or only -inf (all weights 0), in every lane and in the tail; a
// result of over 8 MiB goes around the caches from rows that start at every alignment.
TEST_CASE("softmax over bf16 lines where they lie: the float softmax rounded, bit for bit") {
    auto special_rows = [](ds::tensor<bf16, Rows, Cols>& t) {
        const std::size_t rows = t.extent(0), cols = t.extent(1);
        for (std::size_t r = 0; r < rows; ++r) {
            const std::size_t c = (r * 5) % cols;
            switch (r % 5) {
                case 1: t(r, c) = std::numeric_limits<bf16>::quiet_NaN(); break;
                case 2: t(r, c) = std::numeric_limits<bf16>::infinity(); break;
                case 3: t(r, c) = -std::numeric_limits<bf16>::infinity(); t(r, (r * 3) % cols) = t(r, c); break;
                default: break;
            }
        }
        for (std::size_t c = 0; c < cols; ++c) t(rows - 1, c) = -std::numeric_limits<bf16>::infinity();
    };
    auto same_floats = [](const auto& got, const auto& want) {  // bit for bit, any NaN for NaN
        REQUIRE(got.size() == want.size());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            const float g = got.data()[i], w = want.data()[i];
            if (!(std::isnan(w) ? std::isnan(g) : std::bit_cast<std::uint32_t>(g) == std::bit_cast<std::uint32_t>(w)) && bad++ == 0)
                UNSCOPED_INFO("first difference at " << i << ": got " << g << ", want " << w);
        }
        REQUIRE(bad == 0);
    };
    struct extents {
        std::size_t rows, cols;
    };
    for (const extents e : {extents{41, 1}, {23, 3}, {40, 8}, {37, 9}, {12, 17}, {30, 33}, {9, 100}, {2049, 2053}}) {
        INFO("rows " << e.rows << ", cols " << e.cols);
        auto x = random_bf16(21, Rows{e.rows}, Cols{e.cols});
        special_rows(x);
        const ds::tensor<float, Rows, Cols> xf = ds::cast<float>(x);
        const ds::tensor<float, Rows, Cols> want = ds::softmax<Cols>(xf);
        const ds::tensor<float, Rows, Cols> want_down = ds::softmax<Rows>(xf);  // strided lines
        ds::tensor<bf16, Rows, Cols> wide(Rows{e.rows}, Cols{e.cols + 3});
        auto into = ds::slice<Cols>(wide, 1, e.cols + 1);  // rows that start at every alignment
        for (int threads : {1, 2}) {
            INFO("threads: " << threads);
            ds::set_num_threads(threads);
            const ds::tensor<bf16, Rows, Cols> both = ds::softmax<Cols>(x);
            require_rounded(both, want);
            ds::assign(into, ds::softmax<Cols>(x));
            require_rounded(ds::tensor<bf16, Rows, Cols>(into), want);
            const ds::tensor<float, Rows, Cols> in_only = ds::softmax<Cols>(ds::cast<float>(x));
            same_floats(in_only, want);
            const ds::tensor<bf16, Rows, Cols> out_only = ds::cast<bf16>(ds::softmax<Cols>(xf));
            require_rounded(out_only, want);
            const ds::tensor<bf16, Rows, Cols> down = ds::softmax<Rows>(x);
            require_rounded(down, want_down);
        }
        for (const std::string& plan : {ds::backend::cpu::evaluator{}.explain(ds::softmax<Cols>(ds::cast<float>(x))),
                                       ds::backend::cpu::evaluator{}.explain(ds::cast<bf16>(ds::softmax<Cols>(xf))),
                                       ds::backend::cpu::evaluator{}.explain(ds::softmax<Cols>(x))}) {
            INFO(plan);
            CHECK(plan.find("convert") == std::string::npos);
            CHECK(plan.find("narrow") == std::string::npos);
            CHECK(plan.find("1 entry, 0 temporaries") != std::string::npos);
        }
    }
    ds::set_num_threads(0);
}

// As the products above: the fused attention kernel reads Q, K and V of bf16 where they lie,
// widened as it packs or loads them, so the result is the float kernel's on the widened
// values, bit for bit. The extents reach its paths: one or two queries (dot products, no
// packing), blocks of queries, several blocks per item (K packed once per item), keys split
// between threads (one sequence decoding), V read in place by the float kernel (dv = 32) or
// packed (dv = 12), K stored transposed, a causal mask, NaN and infinities in K and V.
TEST_CASE("fused attention reads bf16 Q, K and V where they lie: the float kernel's result, bit for bit") {
    using Batch = ds::axis<"batch">;
    using Seq = ds::axis<"seq">;
    using Key = ds::axis<"key">;
    using Dim = ds::axis<"dim">;
    using DimV = ds::axis<"dim_v">;
    struct extents {
        std::size_t batch, queries, keys, d, dv;
    };
    const extents cases[] = {{3, 1, 300, 16, 32}, {2, 2, 700, 20, 12}, {1, 1, 1500, 64, 64},
                             {2, 45, 45, 16, 12},  {4, 200, 200, 32, 32}, {1, 130, 300, 24, 32}};
    auto wide = [](const auto& x) { return ds::cast<float>(x); };
    auto attention = [](const auto& q, const auto& kt, const auto& v, bool causal) {
        auto scores = ds::matmul(q, kt) * 0.125f;  // (batch, seq, key)
        return causal ? ds::eval(ds::matmul(ds::softmax<Key>(ds::nn::causal(scores)), v))
                      : ds::eval(ds::matmul(ds::softmax<Key>(scores), v));
    };
    for (const int threads : {1, 2}) {
        ds::set_num_threads(threads);
        for (const auto [batch, queries, keys, d, dv] : cases) {
            for (const bool causal : {false, true}) {
                INFO(threads << " threads, batch " << batch << ", " << queries << " queries, " << keys << " keys, d " << d
                              << ", dv " << dv << (causal ? ", causal" : ""));
                auto q = random_bf16(31, Batch{batch}, Seq{queries}, Dim{d});
                auto k = random_bf16(32, Batch{batch}, Key{keys}, Dim{d});
                auto kt = random_bf16(33, Batch{batch}, Dim{d}, Key{keys});  // K stored transposed
                auto v = random_bf16(34, Batch{batch}, Key{keys}, DimV{dv});
                k(0, keys / 2, d - 1) = std::numeric_limits<bf16>::quiet_NaN();
                v(batch - 1, keys - 1, dv / 2) = std::numeric_limits<bf16>::infinity();
                const ds::tensor<float, Batch, Seq, Dim> qf = ds::cast<float>(q);
                const ds::tensor<float, Batch, Key, Dim> kf = ds::cast<float>(k);
                const ds::tensor<float, Batch, Dim, Key> ktf = ds::cast<float>(kt);
                const ds::tensor<float, Batch, Key, DimV> vf = ds::cast<float>(v);
                require_same_bits(attention(wide(q), ds::transpose(wide(k)), wide(v), causal),
                                  attention(qf, ds::transpose(kf), vf, causal));
                require_same_bits(attention(wide(q), wide(kt), wide(v), causal), attention(qf, ktf, vf, causal));
            }
        }
    }
    ds::set_num_threads(0);
}

TEST_CASE("the plan of attention over bf16 reads Q, K and V where they lie, with no convert") {
    using Seq = ds::axis<"seq">;
    using Key = ds::axis<"key">;
    using Head = ds::axis<"head", 16>;
    auto q = random_bf16(41, Seq{9}, Head{});
    auto k = random_bf16(42, Key{9}, Head{});
    auto v = random_bf16(43, Key{9}, Head{});
    const std::string plan =
        ds::backend::cpu::evaluator{}.explain(ds::matmul(ds::softmax<Key>(ds::matmul(q, ds::transpose(k)) * 0.25f), v));
    INFO(plan);
    CHECK(plan.find("attention") != std::string::npos);
    CHECK(plan.find("convert") == std::string::npos);
    CHECK(plan.find("[bf16 read where it lies]") != std::string::npos);
}

TEST_CASE("cast<bf16> inside a formula rounds there, cast<float> widens exactly") {
    ds::tensor<float, N> x(N{19});
    ds::fill_normal(x, 10);
    x(3) = std::numeric_limits<float>::quiet_NaN();
    x(4) = std::numeric_limits<float>::infinity();
    // rounded to bf16 before the subtraction: x - round(x) is the rounding error, exactly
    const ds::tensor<float, N> error = x - ds::cast<float>(ds::cast<bf16>(x));
    const auto oracle = ds::eval(x - ds::cast<float>(ds::cast<bf16>(x)), ds::backend::reference::evaluator{});
    for (std::size_t i = 0; i < 19; ++i) {
        if (i == 3 || i == 4) {
            REQUIRE(std::isnan(error(i)));  // NaN - NaN, inf - inf
            continue;
        }
        REQUIRE(error(i) == x(i) - float(bf16(x(i))));
        REQUIRE(oracle(i) == error(i));
        REQUIRE(error(i) != 0.0f);  // normal data is never a bf16 already: the cast did something
    }
    const ds::tensor<bf16, N> stored = ds::cast<bf16>(x * 2.0f);
    for (std::size_t i = 0; i < 19; ++i) {
        if (i != 3) REQUIRE(stored(i).bits == bf16(x(i) * 2.0f).bits);
    }
    ds::tensor<std::int32_t, N> ids(N{19});
    for (std::size_t i = 0; i < 19; ++i) ids(i) = std::int32_t(i) * 1000 - 7;
    const ds::tensor<double, N> wide = ds::cast<double>(ids);
    for (std::size_t i = 0; i < 19; ++i) REQUIRE(wide(i) == double(ids(i)));
}

// cast<bf16> of a formula that a product or the fused attention reads: the planner computes
// the formula, rounds it into a bf16 temporary (by the gemm or attention that computes it,
// block by block, or by a `narrow` entry) and the kernel reads that as it reads a bf16 tensor.
// So one formula gives, bit for bit, what the same steps give through bf16 tensors the caller
// stores between them: here a multi-head attention with its Q, K, V and heads' output held in
// bf16 (as nn::multi_head_attention<bf16> holds them), the heads' output stored permuted so
// that merging them is a view; and one query over keys that the threads split. Odd extents,
// NaN and infinities in x, x given as bf16 or as cast<bf16> of its float values, 1 and 2
// threads.
TEST_CASE("cast<bf16> read by a product or attention is held in a bf16 temporary: the stored steps' result, bit for bit") {
    using Batch = ds::axis<"batch">;
    using Seq = ds::axis<"seq">;
    using Key = ds::axis<"key">;
    using Model = ds::axis<"model", 24>;
    using Heads = ds::axis<"heads", 3>;
    using Head = ds::axis<"head", 8>;
    using Inner = ds::axis<"heads*head", 24>;
    auto heads = [](auto&& f) { return ds::permute<Batch, Heads, Seq, Head>(ds::view<Batch, Seq, Heads, Head>(f)); };
    auto keys = [](auto&& f) { return ds::permute<Batch, Heads, Key, Head>(ds::view<Batch, Key, Heads, Head>(f)); };
    auto merged = [](auto&& z) { return ds::view<Batch, Seq, Inner>(ds::permute<Batch, Seq, Heads, Head>(z)); };
    auto attention = [](auto&& q, auto&& k, auto&& v) {
        return ds::matmul(ds::softmax<Key>(ds::nn::causal(ds::matmul(q, ds::transpose(k)) * 0.35f)), v);
    };
    const auto w_q = random_bf16(61, Model{}, Inner{}), w_k = random_bf16(62, Model{}, Inner{});
    const auto w_v = random_bf16(63, Model{}, Inner{});
    const auto w_o = random_bf16(64, Inner{}, Model{});
    const auto b_q = random_bf16(65, Inner{});
    for (const int threads : {1, 2}) {
        ds::set_num_threads(threads);
        for (const std::size_t seq : {1, 2, 13, 70}) {
            INFO(threads << " threads, seq " << seq);
            auto x = random_bf16(66, Batch{2}, Seq{seq}, Model{});
            poison(x);
            const ds::tensor<float, Batch, Seq, Model> xf = ds::cast<float>(x);
            auto one_formula = [&](const auto& x, float output_scale) {
                auto q = heads(ds::cast<bf16>(ds::matmul(x, w_q) + b_q));
                auto k = keys(ds::cast<bf16>(ds::matmul(x, w_k)));
                auto v = keys(ds::cast<bf16>(ds::matmul(x, w_v) * 0.5f));
                if (output_scale == 1.0f) return ds::eval(ds::matmul(merged(ds::cast<bf16>(attention(q, k, v))), w_o));
                return ds::eval(ds::matmul(merged(ds::cast<bf16>(attention(q, k, v) * output_scale)), w_o));
            };
            using Stored = ds::tensor<bf16, Batch, Seq, Inner>;
            const Stored q = ds::matmul(x, w_q) + b_q, k = ds::matmul(x, w_k), v = ds::matmul(x, w_v) * 0.5f;
            const ds::tensor<bf16, Batch, Heads, Seq, Head> z = attention(heads(q), keys(k), keys(v));
            const ds::tensor<bf16, Batch, Seq, Model> want = ds::matmul(merged(z), w_o);
            // the heads' output rounded by the attention kernel itself, or, scaled by 3 after
            // it, by a narrow entry over their permuted layout
            REQUIRE(bits_of(one_formula(x, 1.0f)) == bits_of(want));
            REQUIRE(bits_of(one_formula(ds::cast<bf16>(xf), 1.0f)) == bits_of(want));
            const ds::tensor<bf16, Batch, Heads, Seq, Head> z3 = attention(heads(q), keys(k), keys(v)) * 3.0f;
            const ds::tensor<bf16, Batch, Seq, Model> want3 = ds::matmul(merged(z3), w_o);
            REQUIRE(bits_of(one_formula(x, 3.0f)) == bits_of(want3));
        }
        // one query and enough keys that two threads split them and merge (merge_partials)
        using Wide = ds::axis<"wide", 64>;
        auto q1 = random_bf16(68, Batch{1}, Seq{1}, Wide{});
        auto k1 = random_bf16(69, Batch{1}, Key{2500}, Wide{}), v1 = random_bf16(70, Batch{1}, Key{2500}, Wide{});
        const auto w_head = random_bf16(71, Wide{}, Model{});
        const ds::tensor<bf16, Batch, Seq, Wide> z1 = attention(q1, k1, v1);
        const ds::tensor<bf16, Batch, Seq, Model> got1 = ds::matmul(ds::cast<bf16>(attention(q1, k1, v1)), w_head);
        const ds::tensor<bf16, Batch, Seq, Model> want1 = ds::matmul(z1, w_head);
        REQUIRE(bits_of(got1) == bits_of(want1));
    }
    ds::set_num_threads(0);

    auto x = random_bf16(67, Batch{2}, Seq{5}, Model{});
    const std::string plan = ds::backend::cpu::evaluator{}.explain(ds::matmul(
        merged(ds::cast<bf16>(attention(heads(ds::cast<bf16>(ds::matmul(x, w_q))), keys(ds::cast<bf16>(ds::matmul(x, w_k))),
                                        keys(ds::cast<bf16>(ds::matmul(x, w_v)))))),
        w_o));
    INFO(plan);
    auto count = [&](std::string_view what) {
        std::size_t n = 0;
        for (std::size_t at = plan.find(what); at != std::string::npos; at = plan.find(what, at + 1)) ++n;
        return n;
    };
    CHECK(count("elements, bf16") == 4);  // Q, K, V and the heads' output, each in a bf16 temporary,
    CHECK(count("block by block]") == 5);  // rounded by the kernels that compute them, as is the output
    CHECK(count("[rounded into out block by block]") == 1);
    CHECK(count(" elements, ") - count("elements, bf16") == 1);  // whose float values share one
    CHECK(count("narrow ") == 0);
    CHECK(count("then out") == 0);  // no float value of the output rounded after
    CHECK(count("[bf16 read where it lies]") == 5);  // by the three projections, the attention and W_O's product
    CHECK(count("convert") == 0);

    // a value the cast shares with another reader keeps its own float temporary; the cast
    // read as float too is computed again, from the product
    const auto w_square = random_bf16(72, Inner{}, Inner{});
    auto p = ds::matmul(x, w_q) + b_q;
    const ds::tensor<bf16, Batch, Seq, Inner> p_stored = p;
    const ds::tensor<bf16, Batch, Seq, Inner> shared = ds::matmul(ds::cast<bf16>(p), w_square) + p;
    const ds::tensor<bf16, Batch, Seq, Inner> shared_want = ds::matmul(p_stored, w_square) + p;
    REQUIRE(bits_of(shared) == bits_of(shared_want));
    const ds::tensor<bf16, Batch, Seq, Inner> twice = ds::matmul(ds::cast<bf16>(p), w_square) + ds::cast<bf16>(p);
    const ds::tensor<bf16, Batch, Seq, Inner> twice_want = ds::matmul(p_stored, w_square) + p_stored;
    REQUIRE(bits_of(twice) == bits_of(twice_want));
}

// convert_each takes one flat loop where source and destination are laid out alike and
// densely in some order of their axes, never where strides alias or leave gaps.
TEST_CASE("a narrow entry's flat loop is taken only over dense layouts") {
    using ds::evaluation::alike_and_dense;
    using S = ds::evaluation::strided<float>;
    const S permuted{nullptr, 3, {2, 3, 4}, {4, 8, 1}};       // a permutation of row-major
    const S aliased{nullptr, 3, {2, 2, 2}, {1, 1, 5}};        // offsets 1 and 6 twice, 3 and 4 never
    const S gaps{nullptr, 2, {3, 4}, {8, 1}};                 // rows with gaps between them
    const S broadcast{nullptr, 2, {3, 4}, {0, 1}};
    const S singleton{nullptr, 3, {1, 3, 1}, {99, 1, 7}};     // extents of 1 step nowhere
    CHECK(alike_and_dense(permuted, permuted));
    CHECK(alike_and_dense(singleton, singleton));
    CHECK_FALSE(alike_and_dense(aliased, aliased));
    CHECK_FALSE(alike_and_dense(gaps, gaps));
    CHECK_FALSE(alike_and_dense(broadcast, broadcast));
    CHECK_FALSE(alike_and_dense(permuted, S{nullptr, 3, {2, 3, 4}, {12, 4, 1}}));  // laid out otherwise
}

TEST_CASE("a bf16 formula reading its own destination goes through a copy") {
    using D = ds::dim<9>;
    auto x = random_bf16(11, D{}, D{});
    const auto before = bits_of(x);
    const ds::tensor<float, D, D> xf = ds::cast<float>(x);
    x = ds::transpose(x) * 2.0f + 1.0f;  // reads x transposed while writing it
    const ds::tensor<bf16, D, D> want = ds::cast<bf16>(ds::transpose(xf) * 2.0f + 1.0f);
    REQUIRE(bits_of(x) == bits_of(want));
    REQUIRE(bits_of(x) != before);
}

namespace {
struct bf16_block {
    BOOST_HANA_DEFINE_STRUCT(bf16_block,
        (ds::tensor<bf16, ds::axis<"model", 8>, ds::axis<"hidden">>, w1),
        (std::optional<ds::tensor<bf16, ds::axis<"hidden">>>, b1));
};
}  // namespace

TEST_CASE(".npy holds bf16 as float32: saved exactly, loaded rounded to nearest even") {
    test::temp_dir tmp;
    auto x = random_bf16(12, Rows{3}, Cols{5});
    poison(x);
    ds::save_npy(tmp.path("x.npy"), ds::transpose(x));  // strided
    const auto wide = ds::load_npy<float, Cols, Rows>(tmp.path("x.npy"));
    for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 5; ++j) {
            REQUIRE((std::bit_cast<std::uint32_t>(wide(j, i)) >> 16) == x(i, j).bits);  // exactly, NaN payload too
        }
    }
    const auto in = ds::load_npy<float, N>(data + "float_in.npy");
    const auto rounded = ds::load_npy<bf16, N>(data + "float_in.npy");
    const auto want = ds::load_npy<std::int32_t, N>(data + "float_bits.npy");
    for (std::size_t i = 0; i < in.size(); ++i) REQUIRE(rounded(i).bits == std::uint16_t(want(i)));
    ds::tensor<float, N> big(N{70001});  // read in more than one chunk
    ds::fill_normal(big, 16);
    ds::save_npy(tmp.path("big.npy"), big);
    const auto big_bf16 = ds::load_npy<bf16, N>(tmp.path("big.npy"));
    for (std::size_t i = 0; i < big.size(); ++i) REQUIRE(big_bf16(i).bits == bf16(big(i)).bits);
    REQUIRE(test::error_of([&] { ds::load_npy<bf16, N>(data + "double_in.npy"); }) ==
            "dimsum: load_npy: " + data + "double_in.npy: the file holds '<f8' (float64) values; a tensor of bf16 "
            "loads '<f4' (float32) only");
}

TEST_CASE("bf16 parameters: BF16 in .safetensors, float32 in .npz and .npy folders, the same bits back") {
    test::temp_dir tmp;
    bf16_block b;
    b.w1 = random_bf16(13, ds::axis<"model", 8>{}, ds::axis<"hidden">{5});
    b.b1 = random_bf16(14, ds::axis<"hidden">{5});
    (*b.b1)(2) = std::numeric_limits<bf16>::infinity();
    for (const char* name : {"w.safetensors", "w.npz", "folder"}) {
        INFO(name);
        ds::save(b, tmp.path(name));
        bf16_block got;
        ds::load(got, tmp.path(name));
        REQUIRE(bits_of(got.w1) == bits_of(b.w1));
        REQUIRE(bits_of(*got.b1) == bits_of(*b.b1));
    }
    REQUIRE(ds::parameters(b)[0].element_type == "bfloat16");
    // a float32 checkpoint loads into bf16 parameters, rounded
    struct float_block {
        BOOST_HANA_DEFINE_STRUCT(float_block,
            (ds::tensor<float, ds::axis<"model", 8>, ds::axis<"hidden">>, w1));
    } f;
    f.w1 = ds::tensor<float, ds::axis<"model", 8>, ds::axis<"hidden">>(ds::axis<"model", 8>{}, ds::axis<"hidden">{5});
    ds::fill_normal(f.w1, 15);
    ds::save(f, tmp.path("f.safetensors"));
    bf16_block got;
    ds::load(got, tmp.path("f.safetensors"));
    for (std::size_t i = 0; i < f.w1.size(); ++i) REQUIRE(got.w1.data()[i].bits == bf16(f.w1.data()[i]).bits);
    REQUIRE_FALSE(got.b1);
}

TEST_CASE("a checkpoint reads a bf16 slice from float32 or BF16 arrays") {
    test::temp_dir tmp;
    bf16_block b;
    b.w1 = random_bf16(17, ds::axis<"model", 8>{}, ds::axis<"hidden">{6});
    ds::save(b, tmp.path("w.safetensors"));  // BF16
    ds::save(b, tmp.path("w.npz"));          // float32
    using Local = ds::axis<"local">;
    for (const char* name : {"w.safetensors", "w.npz"}) {
        INFO(name);
        ds::checkpoint in(tmp.path(name));
        ds::tensor<bf16, ds::axis<"model", 8>, Local> part;
        in.read_slice<Local>("w1", 2, 3, part);
        for (std::size_t i = 0; i < 8; ++i) {
            for (std::size_t j = 0; j < 3; ++j) REQUIRE(part(i, j).bits == b.w1(i, 2 + j).bits);
        }
    }
}
