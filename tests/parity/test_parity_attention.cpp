// Fused attention (backend/cpu/attention.hpp) against the same formula run step by step, on
// the CPU backend and on the reference backend in double: every spelling of the scale,
// causal and additive masks, odd sizes, strided and broadcast operands, and the semantics of
// masked rows, infinities, NaN and very large scores.
#include "parity.hpp"

#include <dimsum/backend/cpu/attention.hpp>  // detail::visible_keys, tested here

#include <cmath>

using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using D = ds::axis<"d">;
using DV = ds::axis<"dv">;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// A float tensor's values as a double tensor of the same axes.
template <class... A>
ds::tensor<double, A...> widened(const ds::tensor<float, A...>& t) {
    ds::tensor<double, A...> wide(t.shape());
    std::copy(t.data(), t.data() + t.size(), wide.data());
    return wide;
}

// The three ways to evaluate a formula agree: fused on the CPU, step by step on the CPU, and
// the reference backend in double (on the formula `wide` builds from double inputs).
template <class Formula, class Wide>
void require_agreement(const Formula& formula, const Wide& wide, double rtol = 1e-4, double atol = 2e-6) {
    auto fused = ds::eval(formula);
    auto separate = ds::eval(formula, ds::backend::cpu::evaluator{.fuse_attention = false});
    auto exact = ds::eval(wide, ds::backend::reference::evaluator{});
    test::require_close(fused, test::to_xt(exact), rtol, atol);
    test::require_close(separate, test::to_xt(exact), rtol, atol);
}

struct sizes {
    std::size_t batch, heads, queries, keys, d, dv;
};

template <class T>
struct operands {
    ds::tensor<T, Batch, Heads, Query, D> q;
    ds::tensor<T, Batch, Heads, Key, D> k;
    ds::tensor<T, Batch, Heads, Key, DV> v;
};

operands<float> random_operands(const sizes& s, std::uint64_t seed) {
    operands<float> o{ds::tensor<float, Batch, Heads, Query, D>(Batch{s.batch}, Heads{s.heads}, Query{s.queries}, D{s.d}),
                      ds::tensor<float, Batch, Heads, Key, D>(Batch{s.batch}, Heads{s.heads}, Key{s.keys}, D{s.d}),
                      ds::tensor<float, Batch, Heads, Key, DV>(Batch{s.batch}, Heads{s.heads}, Key{s.keys}, DV{s.dv})};
    ds::fill_normal(o.q, seed);
    ds::fill_normal(o.k, seed + 1);
    ds::fill_normal(o.v, seed + 2);
    return o;
}

template <class T>
operands<double> widened(const operands<T>& o) {
    return {widened(o.q), widened(o.k), widened(o.v)};
}

auto plain(const auto& q, const auto& k, const auto& v, auto scale) {
    return ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(k)) * scale), v);
}
auto causal(const auto& q, const auto& k, const auto& v, auto scale) {
    auto scores = ds::matmul(q, ds::transpose(k)) * scale;
    Query queries{q.shape().extent(2)};
    Key keys{k.shape().extent(2)};
    return ds::matmul(ds::softmax(ds::masked_fill(scores, ds::causal_mask(queries, keys), -INFINITY)), v);
}

}  // namespace

TEST_CASE("fused attention matches the unfused formula: odd sizes, with and without a causal mask") {
    const sizes cases[] = {
        {1, 1, 1, 1, 1, 1},       {2, 3, 7, 5, 3, 4},     {1, 2, 17, 65, 16, 32}, {2, 1, 97, 97, 64, 64},
        {1, 1, 130, 300, 17, 40}, {1, 2, 1, 257, 64, 64}, {1, 1, 200, 33, 8, 8},  {1, 1, 3, 1000, 32, 32},
        {2, 3, 200, 150, 32, 32},  // items enough for whole-item tasks on two threads
        {2, 2, 2, 45, 17, 9},  // few queries: dot products instead of the micro-kernel; tails along d and dv
    };
    parity::with_one_and_two_threads([&] {
        for (const sizes& s : cases) {
            INFO("batch " << s.batch << " heads " << s.heads << " queries " << s.queries << " keys " << s.keys << " d "
                          << s.d << " dv " << s.dv);
            auto f = random_operands(s, 7 + s.queries);
            auto w = widened(f);
            float scale = 1.0f / std::sqrt(float(s.d));
            require_agreement(plain(f.q, f.k, f.v, scale), plain(w.q, w.k, w.v, double(scale)));
            require_agreement(causal(f.q, f.k, f.v, scale), causal(w.q, w.k, w.v, double(scale)));
        }
    });
}

TEST_CASE("the scale however spelt, and a score function the kernel applies to each tile") {
    sizes s{2, 2, 45, 150, 24, 24};
    auto f = random_operands(s, 3);
    auto w = widened(f);
    auto kt = ds::transpose(f.k);
    auto wkt = ds::transpose(w.k);
    require_agreement(ds::matmul(ds::softmax(ds::matmul(f.q, kt) / std::sqrt(24.0f)), f.v),
                      ds::matmul(ds::softmax(ds::matmul(w.q, wkt) / std::sqrt(24.0)), w.v));
    require_agreement(ds::matmul(ds::softmax(0.2f * ds::matmul(f.q, kt)), f.v),
                      ds::matmul(ds::softmax(0.2 * ds::matmul(w.q, wkt)), w.v));
    require_agreement(ds::matmul(ds::softmax(ds::matmul(f.q, kt)), f.v), ds::matmul(ds::softmax(ds::matmul(w.q, wkt)), w.v));
    // a negative scale: the largest score is the smallest product
    require_agreement(ds::matmul(ds::softmax(ds::matmul(f.q, kt) * -0.3f), f.v),
                      ds::matmul(ds::softmax(ds::matmul(w.q, wkt) * -0.3), w.v));
    // an additive mask per sequence and key (padding), broadcast over heads and queries,
    // and a score function the pattern does not take apart
    ds::tensor<float, Batch, ds::dim<1>, ds::dim<1>, Key> padding(Batch{2}, ds::dim<1>{1}, ds::dim<1>{1}, Key{150});
    for (std::size_t j = 0; j < 150; ++j) padding(1, 0, 0, j) = j < 101 ? 0.0f : -inf;
    auto wide_padding = widened(padding);
    require_agreement(ds::matmul(ds::softmax(ds::matmul(f.q, kt) * 0.2f + padding), f.v),
                      ds::matmul(ds::softmax(ds::matmul(w.q, wkt) * 0.2 + wide_padding), w.v));
    require_agreement(ds::matmul(ds::softmax(ds::tanh(ds::matmul(f.q, kt) * 0.1f) * 5.0f + padding), f.v),
                      ds::matmul(ds::softmax(ds::tanh(ds::matmul(w.q, wkt) * 0.1) * 5.0 + wide_padding), w.v));
    // the causal mask taken out, the rest applied per tile
    Query queries{45};
    Key keys{150};
    require_agreement(
        ds::matmul(ds::softmax(ds::masked_fill(ds::matmul(f.q, kt) * 0.2f + padding, ds::causal_mask(queries, keys), -inf)), f.v),
        ds::matmul(ds::softmax(ds::masked_fill(ds::matmul(w.q, wkt) * 0.2 + wide_padding, ds::causal_mask(queries, keys), -INFINITY)),
                   w.v));
}

TEST_CASE("a score function on tiles of a batch that is O's, not the scores' own") {
    // Q and K shared by the heads (extent 1), V per head: the kernel's batch of tiles is O's
    // (batch, heads), of which the scores have only (batch, 1), and a padding mask that differs
    // from sequence to sequence must be read at each tile's own sequence
    ds::tensor<float, Batch, ds::dim<1>, Query, D> q(Batch{2}, ds::dim<1>{1}, Query{9}, D{8});
    ds::tensor<float, Batch, ds::dim<1>, Key, D> k(Batch{2}, ds::dim<1>{1}, Key{40}, D{8});
    ds::tensor<float, Batch, Heads, Key, DV> v(Batch{2}, Heads{3}, Key{40}, DV{5});
    ds::tensor<float, Batch, ds::dim<1>, ds::dim<1>, Key> padding(Batch{2}, ds::dim<1>{1}, ds::dim<1>{1}, Key{40});
    ds::fill_normal(q, 21);
    ds::fill_normal(k, 22);
    ds::fill_normal(v, 23);
    for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t j = 0; j < 40; ++j) padding(b, 0, 0, j) = j < (b == 0 ? 31u : 12u) ? 0.0f : -inf;
    }
    auto wq = widened(q);
    auto wk = widened(k);
    auto wv = widened(v);
    auto wpadding = widened(padding);
    require_agreement(ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(k)) * 0.3f + padding), v),
                      ds::matmul(ds::softmax(ds::matmul(wq, ds::transpose(wk)) * 0.3 + wpadding), wv));
    // scores of a lower rank than O (Q and K without the batch axis V has), a mask per query and key
    ds::tensor<float, Query, D> q2(Query{9}, D{8});
    ds::tensor<float, Key, D> k2(Key{40}, D{8});
    ds::tensor<float, Query, Key> mask(Query{9}, Key{40});
    ds::fill_normal(q2, 24);
    ds::fill_normal(k2, 25);
    ds::fill_normal(mask, 26);
    auto wq2 = widened(q2);
    auto wk2 = widened(k2);
    auto wmask = widened(mask);
    require_agreement(ds::matmul(ds::softmax(ds::matmul(q2, ds::transpose(k2)) * 0.3f + mask), v),
                      ds::matmul(ds::softmax(ds::matmul(wq2, ds::transpose(wk2)) * 0.3 + wmask), wv));
}

TEST_CASE("fused attention reads strided, transposed and broadcast operands") {
    // Q, K, V as heads of one projection (batch, seq, heads, d), read through transposed views;
    // keys and values shared by every head (broadcast), and the output written transposed.
    using Seq = ds::axis<"seq">;
    ds::tensor<float, Batch, Seq, Heads, D> x(Batch{2}, Seq{70}, Heads{3}, D{20});
    ds::fill_normal(x, 11);
    ds::tensor<float, Batch, ds::dim<1>, Seq, D> shared(Batch{2}, ds::dim<1>{1}, Seq{70}, D{20});
    ds::fill_normal(shared, 12);
    auto q = ds::transpose<Seq, Heads>(x);  // (batch, heads, seq, d), strided
    auto wx = widened(x);
    auto wshared = widened(shared);
    auto wq = ds::transpose<Seq, Heads>(wx);
    parity::with_one_and_two_threads([&] {
        require_agreement(ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(shared)) * 0.25f), shared),
                          ds::matmul(ds::softmax(ds::matmul(wq, ds::transpose(wshared)) * 0.25), wshared));
        require_agreement(ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(q)) * 0.25f), q),
                          ds::matmul(ds::softmax(ds::matmul(wq, ds::transpose(wq)) * 0.25), wq));
        // into a transposed destination: (batch, seq, heads, d) written through a view
        ds::tensor<float, Batch, Seq, Heads, D> out(Batch{2}, Seq{70}, Heads{3}, D{20});
        ds::transpose<Seq, Heads>(out) = ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(q)) * 0.25f), q);
        auto want = ds::eval(ds::transpose<Heads, Seq>(ds::matmul(ds::softmax(ds::matmul(wq, ds::transpose(wq)) * 0.25), wq)),
                             ds::backend::reference::evaluator{});
        test::require_close(out, test::to_xt(want), 1e-4, 2e-6);
    });
}

TEST_CASE("K^T given as a tensor of its own: keys strided, for many queries and for one") {
    for (std::size_t queries : {1, 70}) {
        INFO("queries " << queries);
        ds::tensor<float, Batch, Heads, Query, D> q(Batch{1}, Heads{2}, Query{queries}, D{20});
        ds::tensor<float, Batch, Heads, D, Key> kt(Batch{1}, Heads{2}, D{20}, Key{150});  // (batch, heads, d, key)
        ds::tensor<float, Batch, Heads, Key, DV> v(Batch{1}, Heads{2}, Key{150}, DV{24});
        ds::fill_normal(q, 1);
        ds::fill_normal(kt, 2);
        ds::fill_normal(v, 3);
        ds::tensor<float, Batch, Heads, DV, Key> vt(Batch{1}, Heads{2}, DV{24}, Key{150});  // V^T: values strided
        ds::fill_normal(vt, 4);
        auto wvt = widened(vt);
        auto wq = widened(q);
        auto wkt = widened(kt);
        auto wv = widened(v);
        parity::with_one_and_two_threads([&] {
            require_agreement(ds::matmul(ds::softmax(ds::matmul(q, kt) * 0.2f), v),
                              ds::matmul(ds::softmax(ds::matmul(wq, wkt) * 0.2), wv));
            require_agreement(ds::matmul(ds::softmax(ds::matmul(q, kt) * 0.2f), ds::transpose(vt)),
                              ds::matmul(ds::softmax(ds::matmul(wq, wkt) * 0.2), ds::transpose(wvt)));
        });
    }
}

// Q, K and V of bf16, read where they lie and widened as the kernel packs or loads them (this
// file is also built for AVX2 and SSE2, whose widening loads differ), against the reference,
// which reads the same bf16 values in double: float's tolerance, as for float inputs. On the
// widen path: the others round P to bf16 (test_bf16_attention).
TEST_CASE("Q, K and V of bf16 read where they lie, for many queries and for one") {
    const ds::backend::cpu::scoped_bf16_path widen(ds::backend::cpu::bf16_path::widen);
    auto wide = [](const auto& x) { return ds::cast<float>(x); };
    for (std::size_t queries : {1, 70}) {
        for (std::size_t dv : {24, 32}) {
            INFO("queries " << queries << ", dv " << dv);
            ds::tensor<ds::bf16, Batch, Heads, Query, D> q(Batch{2}, Heads{2}, Query{queries}, D{20});
            ds::tensor<ds::bf16, Batch, Heads, Key, D> k(Batch{2}, Heads{2}, Key{300}, D{20});
            ds::tensor<ds::bf16, Batch, Heads, Key, DV> v(Batch{2}, Heads{2}, Key{300}, DV{dv});
            ds::tensor<ds::bf16, Batch, Heads, DV, Key> vt(Batch{2}, Heads{2}, DV{dv}, Key{300});  // V^T: values strided
            ds::fill_normal(q, 1);
            ds::fill_normal(k, 2);
            ds::fill_normal(v, 3);
            ds::fill_normal(vt, 4);
            parity::with_one_and_two_threads([&] {
                auto scores = ds::matmul(wide(q), ds::transpose(wide(k))) * 0.2f;  // (batch, heads, query, key)
                parity::require_parity(ds::matmul(ds::softmax<Key>(scores), wide(v)), 1e-4, 2e-6);
                parity::require_parity(ds::matmul(ds::softmax<Key>(ds::nn::causal(scores)), ds::transpose(wide(vt))), 1e-4, 2e-6);
            });
        }
    }
}

TEST_CASE("the kernel's count of visible keys is the causal mask's rule") {
    for (std::size_t queries : {1, 3, 8}) {
        for (std::size_t keys : {1, 3, 8}) {
            for (std::size_t q = 0; q < queries; ++q) {
                std::size_t visible = 0;
                for (std::size_t k = 0; k < keys; ++k) visible += !ds::evaluation::in_future(q, k, queries, keys);
                REQUIRE(ds::backend::cpu::detail::visible_keys(q, queries, keys) == visible);
            }
        }
    }
}

TEST_CASE("fused attention holds no queries x keys matrix") {
    sizes s{1, 2, 2048, 2048, 16, 16};
    auto f = random_operands(s, 5);
    auto fused = ds::eval(causal(f.q, f.k, f.v, 0.25f));
    std::size_t fused_bytes = ds::backend::cpu::last_temporary_bytes<float>();
    auto separate = ds::eval(causal(f.q, f.k, f.v, 0.25f), ds::backend::cpu::evaluator{.fuse_attention = false});
    std::size_t separate_bytes = ds::backend::cpu::last_temporary_bytes<float>();
    INFO("fused " << fused_bytes << " bytes, separate " << separate_bytes << " bytes");
    REQUIRE(separate_bytes >= 2 * 2048 * 2048 * sizeof(float));
    REQUIRE(fused_bytes < 2048 * 16 * sizeof(float));
    test::require_close(fused, test::to_xt(separate), 1e-4, 2e-6);
    auto unmasked = ds::eval(plain(f.q, f.k, f.v, 0.25f));
    REQUIRE(ds::backend::cpu::last_temporary_bytes<float>() < 2048 * 16 * sizeof(float));
}

TEST_CASE("attention semantics: masked rows, infinities, NaN, very large scores") {
    sizes s{1, 1, 40, 150, 8, 8};
    auto base = random_operands(s, 9);
    SECTION("scores of 1e3 and more stay finite and match double") {
        auto f = random_operands(s, 9);
        for (std::size_t i = 0; i < 40; ++i) {
            for (std::size_t c = 0; c < 8; ++c) f.q(0, 0, i, c) *= 300.0f;  // scores up to about 1e4
        }
        auto w = widened(f);
        auto fused = ds::eval(plain(f.q, f.k, f.v, 1.0f));
        for (std::size_t i = 0; i < fused.size(); ++i) REQUIRE(std::isfinite(fused.data()[i]));
        require_agreement(plain(f.q, f.k, f.v, 1.0f), plain(w.q, w.k, w.v, 1.0), 1e-3, 1e-4);
        require_agreement(causal(f.q, f.k, f.v, 1.0f), causal(w.q, w.k, w.v, 1.0), 1e-3, 1e-4);
    }
    SECTION("a fully masked row gives 0, in both paths; -inf scores get weight 0") {
        ds::tensor<float, ds::dim<1>, ds::dim<1>, Query, Key> mask(ds::dim<1>{1}, ds::dim<1>{1}, Query{40}, Key{150});
        for (std::size_t j = 0; j < 150; ++j) {
            mask(0, 0, 5, j) = -inf;                          // query 5 sees nothing
            mask(0, 0, 6, j) = j % 3 == 0 ? 0.0f : -inf;      // query 6 sees every third key
        }
        auto w = widened(base);
        auto wide_mask = widened(mask);
        auto formula = ds::matmul(ds::softmax(ds::matmul(base.q, ds::transpose(base.k)) * 0.3f + mask), base.v);
        require_agreement(formula, ds::matmul(ds::softmax(ds::matmul(w.q, ds::transpose(w.k)) * 0.3 + wide_mask), w.v));
        auto fused = ds::eval(formula);
        for (std::size_t c = 0; c < 8; ++c) REQUIRE(fused(0, 0, 5, c) == 0.0f);
        // more queries than keys under a causal mask: the first queries see no key at all
        sizes t{1, 1, 20, 6, 8, 8};
        auto g = random_operands(t, 4);
        auto out = ds::eval(causal(g.q, g.k, g.v, 1.0f));
        auto step_by_step = ds::eval(causal(g.q, g.k, g.v, 1.0f), ds::backend::cpu::evaluator{.fuse_attention = false});
        test::require_close(out, test::to_xt(step_by_step), 1e-5, 1e-6);
        for (std::size_t i = 0; i < 14; ++i) {
            for (std::size_t c = 0; c < 8; ++c) REQUIRE(out(0, 0, i, c) == 0.0f);
        }
    }
    SECTION("NaN in a query, a key or a value reaches exactly the outputs that read it") {
        auto f = random_operands(s, 9);
        f.q(0, 0, 3, 2) = NAN;  // row 3 of the scores: NaN
        auto fused = ds::eval(plain(f.q, f.k, f.v, 0.3f));
        auto separate = ds::eval(plain(f.q, f.k, f.v, 0.3f), ds::backend::cpu::evaluator{.fuse_attention = false});
        test::require_close(fused, test::to_xt(separate), 1e-5, 1e-6);
        for (std::size_t c = 0; c < 8; ++c) {
            REQUIRE(std::isnan(fused(0, 0, 3, c)));
            REQUIRE(std::isfinite(fused(0, 0, 4, c)));
        }
        f.k(0, 0, 77, 1) = NAN;  // column 77: NaN in every row
        fused = ds::eval(plain(f.q, f.k, f.v, 0.3f));
        for (std::size_t i = 0; i < fused.size(); ++i) REQUIRE(std::isnan(fused.data()[i]));
        auto g = random_operands(s, 9);
        g.v(0, 0, 10, 4) = NAN;  // one value: column 4 of every output
        auto out = ds::eval(plain(g.q, g.k, g.v, 0.3f));
        for (std::size_t i = 0; i < 40; ++i) {
            REQUIRE(std::isnan(out(0, 0, i, 4)));
            REQUIRE(std::isfinite(out(0, 0, i, 3)));
        }
    }
    SECTION("+inf in the scores gives what the unfused formula gives (NaN)") {
        auto f = random_operands(s, 9);
        f.q(0, 0, 2, 0) = inf;
        auto fused = ds::eval(plain(f.q, f.k, f.v, 0.3f));
        auto separate = ds::eval(plain(f.q, f.k, f.v, 0.3f), ds::backend::cpu::evaluator{.fuse_attention = false});
        test::require_close(fused, test::to_xt(separate), 1e-5, 1e-6);
    }
}
