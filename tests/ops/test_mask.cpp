// Comparisons, mask logic, arange and sequence_mask: against loops in double, on odd sizes,
// broadcast and transposed operands, NaN included; and a padding mask made of them giving
// the same attention as the additive mask written by hand.
#include "support.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using Heads = ds::axis<"heads">;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

// x with NaN, infinities, and values equal to y's at a few places, so that every comparison
// meets its edge cases.
template <class T>
void add_edge_cases(ds::tensor<T, Rows, Cols>& x, const ds::tensor<T, Rows, Cols>& y) {
    const std::size_t n = x.shape().extent(1);
    x(0, 0) = static_cast<T>(not_a_number);
    x(0, n - 1) = static_cast<T>(inf);
    if (x.shape().extent(0) > 1) x(1, n / 2) = y(1, n / 2);
    if (x.shape().extent(0) > 2) x(2, 0) = static_cast<T>(-inf);
}

// 1 where the mask holds, else 0, in T: how a mask is looked at.
template <class T, class M>
auto ones_where(M&& mask) {
    return ds::eval(ds::where(std::forward<M>(mask), T(1), T(0)));
}

template <class F>
xt::xarray<double> loops(const xt::xarray<double>& a, const xt::xarray<double>& b, F&& f) {
    xt::xarray<double> out(a.shape());
    for (std::size_t i = 0; i < a.size(); ++i) out.data()[i] = f(a.data()[i], b.data()[i]) ? 1.0 : 0.0;
    return out;
}

}  // namespace

TEMPLATE_TEST_CASE("comparisons give masks: every operator, NaN and infinities, both backends", "", float, double) {
    using T = TestType;
    for (std::size_t rows : {1, 3, 7}) {
        for (std::size_t cols : test::odd_sizes) {
            INFO("rows=" << rows << " cols=" << cols);
            ds::tensor<T, Rows, Cols> x(Rows{rows}, Cols{cols}), y(Rows{rows}, Cols{cols});
            ds::fill_uniform(x, rows * cols, -2.0, 2.0);
            ds::fill_uniform(y, rows + cols, -2.0, 2.0);
            add_edge_cases(x, y);
            const xt::xarray<double> a = test::to_xt(x), b = test::to_xt(y);
            test::require_close(ones_where<T>(x < y), loops(a, b, [](double p, double q) { return p < q; }), 0, 0);
            test::require_close(ones_where<T>(x <= y), loops(a, b, [](double p, double q) { return p <= q; }), 0, 0);
            test::require_close(ones_where<T>(x > y), loops(a, b, [](double p, double q) { return p > q; }), 0, 0);
            test::require_close(ones_where<T>(x >= y), loops(a, b, [](double p, double q) { return p >= q; }), 0, 0);
            test::require_close(ones_where<T>(x == y), loops(a, b, [](double p, double q) { return p == q; }), 0, 0);
            test::require_close(ones_where<T>(x != y), loops(a, b, [](double p, double q) { return p != q; }), 0, 0);
            // the same on the reference backend
            auto reference = ds::eval(ds::where(x != y, T(1), T(0)), ds::backend::reference::evaluator{});
            test::require_close(reference, loops(a, b, [](double p, double q) { return p != q; }), 0, 0);

            // with a number on either side, and mask logic over them
            const xt::xarray<double> zeros = xt::zeros<double>(a.shape());
            test::require_close(ones_where<T>(x > T(0)), loops(a, zeros, [](double p, double q) { return p > q; }), 0, 0);
            test::require_close(ones_where<T>(T(0) >= x), loops(a, zeros, [](double p, double q) { return q >= p; }), 0, 0);
            auto inside = [](double p, double q) { return (p > -1 && p < 1) || !(q < 0); };
            test::require_close(ones_where<T>((x > T(-1) && x < T(1)) || !(y < T(0))), loops(a, b, inside), 0, 0);
        }
    }
}

TEST_CASE("comparisons broadcast and read transposed operands") {
    ds::tensor<float, Rows, Cols> x(Rows{7}, Cols{17});
    ds::tensor<float, Cols> threshold(Cols{17});
    ds::tensor<float, Cols, Rows> t(Cols{17}, Rows{7});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(threshold, 2);
    ds::fill_uniform(t, 3);
    const xt::xarray<double> a = test::to_xt(x), b = test::to_xt(threshold), c = xt::transpose(test::to_xt(t));
    xt::xarray<double> want(a.shape());
    for (std::size_t i = 0; i < 7; ++i) {
        for (std::size_t j = 0; j < 17; ++j) want(i, j) = a(i, j) < b(j) && a(i, j) < c(i, j) ? a(i, j) : 0.0;
    }
    test::require_close(ds::eval(ds::where(x < threshold && x < ds::transpose(t), x, 0.0f)), want, 0, 0);
}

TEST_CASE("arange counts along its axis, and broadcasts like any operand") {
    for (std::size_t n : test::odd_sizes) {
        auto positions = ds::eval(ds::arange<double>(Cols{n}));
        xt::xarray<double> want = xt::arange<double>(static_cast<double>(n));
        test::require_close(positions, want, 0, 0);
        test::require_close(ds::eval(ds::arange<double>(Cols{n}), ds::backend::reference::evaluator{}), want, 0, 0);
    }
    // (rows, cols) + positions along cols; a static extent stays static
    ds::tensor<float, Rows, Cols> x(Rows{3}, Cols{5});
    ds::fill_uniform(x, 4);
    xt::xarray<double> want = test::to_xt(x) + xt::arange<double>(5.0);
    test::require_close(ds::eval(x + ds::arange(Cols{5})), want, 1e-7, 0);
    static_assert(ds::shape_of<decltype(ds::arange(ds::axis<"pos", 8>{}))>::axes[0].extent == 8);
    // explain shows it as an entry of its own
    const std::string plan = ds::explain(x + ds::arange(Cols{5}));
    CHECK(plan.find("indices    t0 (cols=5) = arange") != std::string::npos);
}

TEST_CASE("sequence_mask: positions before each length, any leading axes") {
    for (std::size_t keys : {1, 7, 17}) {
        ds::tensor<float, Batch> lengths(Batch{4});
        const float given[] = {0, 1, static_cast<float>(keys) / 2, static_cast<float>(keys)};
        std::copy(std::begin(given), std::end(given), lengths.data());
        auto mask = ones_where<float>(ds::sequence_mask(lengths, Key{keys}));  // (batch, key)
        xt::xarray<double> want = xt::zeros<double>({std::size_t{4}, keys});
        for (std::size_t b = 0; b < 4; ++b) {
            for (std::size_t j = 0; j < keys; ++j) want(b, j) = static_cast<double>(j) < given[b] ? 1 : 0;
        }
        test::require_close(mask, want, 0, 0);
        static_assert(std::is_same_v<ds::shape_of<decltype(mask)>, ds::shape<Batch, Key>>);
    }
}

TEST_CASE("a padding mask from lengths in one line: the same attention as the mask written by hand") {
    const std::size_t batch = 3, heads = 2, queries = 5, keys = 9, head = 7;
    ds::tensor<double, Batch, Heads, Query, Head> q(Batch{batch}, Heads{heads}, Query{queries}, Head{head});
    ds::tensor<double, Batch, Heads, Key, Head> k(Batch{batch}, Heads{heads}, Key{keys}, Head{head});
    ds::tensor<double, Batch, Heads, Key, Head> v(Batch{batch}, Heads{heads}, Key{keys}, Head{head});
    ds::fill_uniform(q, 1);
    ds::fill_uniform(k, 2);
    ds::fill_uniform(v, 3);
    ds::tensor<double, Batch> lengths(Batch{batch});
    const double given[] = {9, 4, 1};
    std::copy(std::begin(given), std::end(given), lengths.data());

    // by hand: 0 where seen, -infinity past the length, (batch, 1, 1, key)
    ds::tensor<double, Batch, ds::dim<1>, ds::dim<1>, Key> additive(Batch{batch}, ds::dim<1>{}, ds::dim<1>{}, Key{keys});
    for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t j = 0; j < keys; ++j) additive(b, 0, 0, j) = static_cast<double>(j) < given[b] ? 0 : -inf;
    }
    auto want = ds::eval(ds::nn::masked_attention(q, k, v, additive), ds::backend::reference::evaluator{});

    auto padded = ds::view<Batch, ds::dim<1>, ds::dim<1>, Key>(!ds::sequence_mask(lengths, Key{keys}));
    auto formula = ds::matmul(ds::softmax(ds::masked_fill(ds::nn::attention_scores(q, k), padded, -inf)), v);
    test::require_close(ds::eval(formula), test::to_xt(want), 1e-12, 1e-14);
    test::require_close(ds::eval(formula, ds::backend::reference::evaluator{}), test::to_xt(want), 1e-12, 1e-14);
    // fused: the mask is part of the score function, applied per tile
    CHECK(ds::explain(formula).find("attention") != std::string::npos);
}

TEST_CASE("causal_mask from lengths: a padded batch, each sequence's queries at its own end") {
    const std::int64_t given[] = {1, 3, 6};
    for (std::size_t queries : {1, 2, 3}) {
        ds::tensor<std::int64_t, Batch> lengths(Batch{3});
        std::copy(std::begin(given), std::end(given), lengths.data());
        auto mask = ones_where<float>(ds::causal_mask(lengths, Query{queries}, Key{6}));  // (batch, query, key)
        static_assert(std::is_same_v<ds::shape_of<decltype(mask)>, ds::shape<Batch, Query, Key>>);
        for (std::size_t b = 0; b < 3; ++b) {
            for (std::size_t i = 0; i < queries; ++i) {
                for (std::size_t j = 0; j < 6; ++j) {
                    // query i is position given[b] - queries + i of its sequence
                    const bool hidden = std::int64_t(j) > given[b] - std::int64_t(queries) + std::int64_t(i);
                    INFO("queries=" << queries << " b=" << b << " i=" << i << " j=" << j);
                    CHECK(mask(b, i, j) == (hidden ? 1.0f : 0.0f));
                }
            }
        }
    }

    // decoding two sequences of different lengths from one padded cache: each row of the
    // result equals causal attention over that sequence alone
    const std::size_t heads = 2, head = 4, capacity = 7, queries = 2;
    ds::tensor<double, Batch, Heads, Key, Head> k(Batch{2}, Heads{heads}, Key{capacity}, Head{head});
    ds::tensor<double, Batch, Heads, Key, Head> v(Batch{2}, Heads{heads}, Key{capacity}, Head{head});
    ds::tensor<double, Batch, Heads, Query, Head> q(Batch{2}, Heads{heads}, Query{queries}, Head{head});
    ds::fill_uniform(k, 1);
    ds::fill_uniform(v, 2);
    ds::fill_uniform(q, 3);
    ds::tensor<std::int64_t, Batch> lengths(Batch{2});
    lengths(0) = 4;  // positions 4, 5, 6 of sequence 0 are padding
    lengths(1) = 7;
    auto hidden = ds::unsqueeze<ds::axis<"heads", 1>, 1>(ds::causal_mask(lengths, Query{queries}, Key{capacity}));
    auto scores = ds::nn::attention_scores(q, k);
    auto z = ds::eval(ds::matmul(ds::softmax(ds::masked_fill(scores, hidden, -inf)), v));
    for (std::size_t b = 0; b < 2; ++b) {
        const auto length = static_cast<std::size_t>(lengths(b));
        auto alone = ds::eval(ds::nn::causal_attention(ds::select<Batch>(q, b), ds::slice<Key>(ds::select<Batch>(k, b), 0, length),
                                                       ds::slice<Key>(ds::select<Batch>(v, b), 0, length)));
        test::require_close(ds::select<Batch>(z.view(), b), test::to_xt(alone), 1e-12, 1e-14);
    }
}
