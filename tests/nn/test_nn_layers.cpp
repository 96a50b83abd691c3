// nn's pieces for current models: rotary embeddings in both conventions (against loops in
// double, at offsets, on both backends), rms_norm and swiglu (against loops), and the README's
// split_heads helper given a temporary (held, not dangling: AddressSanitizer runs this).
#include "support.hpp"

#include <cmath>

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using Heads = ds::axis<"heads", 3>;
using Seq = ds::axis<"seq">;
using Head = ds::axis<"head", 6>;
using Model = ds::axis<"model">;
using Hidden = ds::axis<"hidden">;

// RoPE in double: pair i of each head, its elements first(i) and second(i), turned by
// position / base^(2i / head).
template <class First, class Second>
xt::xarray<double> rotated(const xt::xarray<double>& x, std::size_t offset, double base, First first, Second second) {
    xt::xarray<double> out = x;
    const std::size_t batch = x.shape()[0], heads = x.shape()[1], seq = x.shape()[2], head = x.shape()[3];
    for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t h = 0; h < heads; ++h) {
            for (std::size_t p = 0; p < seq; ++p) {
                for (std::size_t i = 0; i < head / 2; ++i) {
                    const double angle = double(offset + p) * std::pow(base, -2.0 * double(i) / double(head));
                    const std::size_t a = first(i), c = second(i);
                    out(b, h, p, a) = x(b, h, p, a) * std::cos(angle) - x(b, h, p, c) * std::sin(angle);
                    out(b, h, p, c) = x(b, h, p, c) * std::cos(angle) + x(b, h, p, a) * std::sin(angle);
                }
            }
        }
    }
    return out;
}

}  // namespace

TEMPLATE_TEST_CASE("rotary: both conventions against loops in double, at every offset", "", float, double) {
    using T = TestType;
    const double tolerance = std::is_same_v<T, float> ? 2e-6 : 1e-13;
    ds::nn::rotary<T, Seq, Head> half(40);
    ds::nn::rotary<T, Seq, Head, ds::nn::rotary_pairs::interleaved> interleaved(40, 500.0);
    for (std::size_t seq : {1, 5, 17}) {
        for (std::size_t offset : {std::size_t{0}, std::size_t{3}, 40 - seq}) {
            INFO("seq=" << seq << " offset=" << offset);
            ds::tensor<T, Batch, Heads, Seq, Head> q(Batch{2}, Seq{seq});
            ds::fill_uniform(q, seq + offset);
            const xt::xarray<double> x = test::to_xt(q);
            const auto want_half = rotated(x, offset, 10000.0, [](std::size_t i) { return i; }, [](std::size_t i) { return i + 3; });
            const auto want_pairs = rotated(x, offset, 500.0, [](std::size_t i) { return 2 * i; }, [](std::size_t i) { return 2 * i + 1; });
            test::require_close(ds::eval(half(q, offset)), want_half, tolerance, tolerance);
            test::require_close(ds::eval(half(q, offset), ds::backend::reference::evaluator{}), want_half, tolerance, tolerance);
            test::require_close(ds::eval(interleaved(q, offset)), want_pairs, tolerance, tolerance);
            test::require_close(ds::eval(interleaved(q, offset), ds::backend::reference::evaluator{}), want_pairs, tolerance,
                                tolerance);
            // of a formula (a projection would be one): computed once, rotated the same
            test::require_close(ds::eval(half(q * T(2), offset)), want_half * 2.0, tolerance, tolerance);
        }
    }
    ds::tensor<T, Batch, Heads, Seq, Head> q(Batch{1}, Seq{5});
    CHECK(test::error_of([&] { (void)half(q, 36); }) == "dimsum: rotary: positions 36 to 41 (exclusive) lie past the table's 40");
}

TEST_CASE("rms_norm and swiglu against loops in double") {
    const std::size_t rows = 7, model = 17, hidden = 9;
    ds::tensor<double, Seq, Model> x(Seq{rows}, Model{model});
    ds::tensor<double, Model> g(Model{model});
    ds::tensor<double, Model, Hidden> w_1(Model{model}, Hidden{hidden}), w_3(Model{model}, Hidden{hidden});
    ds::tensor<double, Hidden, Model> w_2(Hidden{hidden}, Model{model});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(g, 2, 0.5, 1.5);
    ds::fill_uniform(w_1, 3);
    ds::fill_uniform(w_3, 4);
    ds::fill_uniform(w_2, 5);
    const xt::xarray<double> xs = test::to_xt(x), gs = test::to_xt(g), a = test::to_xt(w_1), c = test::to_xt(w_3),
                             d = test::to_xt(w_2);
    xt::xarray<double> norm = xs;
    for (std::size_t r = 0; r < rows; ++r) {
        double square = 0;
        for (std::size_t m = 0; m < model; ++m) square += xs(r, m) * xs(r, m);
        for (std::size_t m = 0; m < model; ++m) norm(r, m) = xs(r, m) / std::sqrt(square / double(model) + 1e-5) * gs(m);
    }
    test::require_close(ds::eval(ds::nn::rms_norm(x, g, 1e-5)), norm, 1e-13, 1e-14);
    xt::xarray<double> want = xt::zeros<double>({rows, model});
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t h = 0; h < hidden; ++h) {
            double p = 0, q = 0;
            for (std::size_t m = 0; m < model; ++m) {
                p += xs(r, m) * a(m, h);
                q += xs(r, m) * c(m, h);
            }
            const double gate = p / (1 + std::exp(-p)) * q;
            for (std::size_t m = 0; m < model; ++m) want(r, m) += gate * d(h, m);
        }
    }
    test::require_close(ds::eval(ds::nn::swiglu(x, w_1, w_3, w_2)), want, 1e-12, 1e-13);
    test::require_close(ds::eval(ds::nn::swiglu(x, w_1, w_3, w_2), ds::backend::reference::evaluator{}), want, 1e-12, 1e-13);
}

TEST_CASE("swiglu and gelu_feed_forward over bf16 values round what each product reads to bf16, as a bf16 model holds it") {
    const std::size_t rows = 7, model = 17, hidden = 9;
    ds::tensor<ds::bf16, Seq, Model> x(Seq{rows}, Model{model});
    ds::tensor<ds::bf16, Model> g(Model{model}), b_2(Model{model});
    ds::tensor<ds::bf16, Hidden> b_1(Hidden{hidden});
    ds::tensor<ds::bf16, Model, Hidden> w_1(Model{model}, Hidden{hidden}), w_3(Model{model}, Hidden{hidden});
    ds::tensor<ds::bf16, Hidden, Model> w_2(Hidden{hidden}, Model{model});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(g, 2, 0.5, 1.5);
    ds::fill_uniform(w_1, 3);
    ds::fill_uniform(w_3, 4);
    ds::fill_uniform(w_2, 5);
    ds::fill_uniform(b_1, 6);
    ds::fill_uniform(b_2, 7);
    // x a formula of bf16 values (which computes in float): rounded before the products read
    // it, and so is the inner activation, so that every product multiplies two bf16 operands
    const auto normed = ds::nn::rms_norm(x, g, 1e-5);
    auto check = [&](const auto& formula, std::size_t product_count) {
        const std::string plan = ds::explain(formula);
        INFO(plan);
        CHECK(plan.find("rounded into") != std::string::npos);
        const std::size_t before = test::bf16_products_run();
        const ds::tensor<float, Seq, Model> got = ds::cast<float>(formula);
        CHECK(test::bf16_products_run() - before == product_count);
        // the reference backend rounds at the same places, in double
        const ds::tensor<float, Seq, Model> want = ds::eval(ds::cast<float>(formula), ds::backend::reference::evaluator{});
        test::require_close(got, test::to_xt(want), 1e-2, 1e-2);
    };
    SECTION("swiglu") { check(ds::nn::swiglu(normed, w_1, w_3, w_2), 3); }
    SECTION("gelu_feed_forward") { check(ds::nn::gelu_feed_forward(normed, w_1, b_1, w_2, b_2), 2); }
    // over float values, nothing is rounded
    const ds::tensor<float, Seq, Model> xf = ds::cast<float>(x);
    const ds::tensor<float, Model, Hidden> f_1 = ds::cast<float>(w_1), f_3 = ds::cast<float>(w_3);
    const ds::tensor<float, Hidden, Model> f_2 = ds::cast<float>(w_2);
    CHECK(ds::explain(ds::nn::swiglu(xf, f_1, f_3, f_2)).find("round") == std::string::npos);
}

TEST_CASE("rms_norm in a bf16 formula adds its epsilon in float, not rounded to bf16") {
    // mean(x^2) = 2^-22, exact in bf16, beside epsilon 1e-5 (1.00136e-5 once rounded to bf16,
    // which would move the result by 6.6e-4)
    ds::tensor<ds::bf16, Seq, Model> x(Seq{1}, Model{4});
    ds::tensor<ds::bf16, Model> g(Model{4});
    x(0, 0) = ds::bf16(std::ldexp(1.0f, -10));
    for (std::size_t m = 0; m < 4; ++m) g(m) = ds::bf16(1.0f);
    const double want = std::ldexp(1.0, -10) / std::sqrt(std::ldexp(1.0, -22) + 1e-5);
    for (int backend = 0; backend < 2; ++backend) {
        INFO((backend == 0 ? "cpu" : "reference"));
        const auto formula = ds::cast<float>(ds::nn::rms_norm(x, g, 1e-5));
        const ds::tensor<float, Seq, Model> y =
            backend == 0 ? ds::eval(formula) : ds::eval(formula, ds::backend::reference::evaluator{});
        REQUIRE(std::abs(double(y(0, 0)) - want) <= 1e-6 * want);
        REQUIRE(y(0, 1) == 0.0f);
    }
}

namespace {
using ModelS = ds::axis<"model", 6>;
using HeadsS = ds::axis<"heads", 2>;
using HeadS = ds::axis<"head", 3>;
// The README's helper: forwarding its argument, it holds a temporary tensor rather than
// viewing it.
auto split_heads(auto&& t) {
    return ds::transpose<Seq, HeadsS>(ds::view<Batch, Seq, HeadsS, HeadS>(std::forward<decltype(t)>(t)));
}
}  // namespace

TEST_CASE("the README's split_heads holds a temporary tensor it is given") {
    ds::tensor<float, Batch, Seq, ModelS> x(Batch{2}, Seq{4});
    ds::fill_uniform(x, 1);
    auto heads = split_heads(ds::eval(x * 2.0f));  // the temporary dies here; the formula keeps it
    auto want = test::to_xt(ds::eval(split_heads(x))) * 2.0;
    test::require_close(ds::eval(heads), want, 0, 0);
}

namespace {
using Query = ds::axis<"query">;
using KeyAxis = ds::axis<"key">;
using Width = ds::axis<"model", 16>;
using QueryHeads = ds::axis<"heads", 4>;
using Dim = ds::axis<"head", 4>;

// The grouped layer as a plain multi-head layer: each key/value head's columns repeated for
// every query head of its group (PyTorch's repeat_interleave), an independent construction.
template <class Grouped, class Plain>
Plain repeated(const Grouped& g) {
    constexpr std::size_t group = Grouped::heads / Grouped::kv_heads, head = 4, model = 16;
    Plain p;
    p.w_q = *g.w_q;
    p.b_q = *g.b_q;
    p.w_o = g.w_o;
    p.b_o = g.b_o;
    auto widen = [&](const auto& narrow, auto& wide) {  // (model, kv_heads x head) -> (model, heads x head)
        wide.emplace();
        for (std::size_t m = 0; m < model; ++m) {
            for (std::size_t h = 0; h < Grouped::heads; ++h) {
                for (std::size_t d = 0; d < head; ++d) (*wide)(m, h * head + d) = narrow(m, (h / group) * head + d);
            }
        }
    };
    widen(*g.w_k, p.w_k);
    widen(*g.w_v, p.w_v);
    p.b_k.emplace();
    p.b_v.emplace();
    for (std::size_t h = 0; h < Grouped::heads; ++h) {
        for (std::size_t d = 0; d < head; ++d) {
            (*p.b_k)(h * head + d) = (*g.b_k)((h / group) * head + d);
            (*p.b_v)(h * head + d) = (*g.b_v)((h / group) * head + d);
        }
    }
    return p;
}

template <class KvHeads>
void check_grouped_layer() {
    using grouped = ds::nn::multi_head_attention<float, Width, QueryHeads, Dim, Dim, Width, KvHeads>;
    using plain = ds::nn::multi_head_attention<float, Width, QueryHeads, Dim>;
    grouped g;
    ds::fill_uniform(g.w_q.emplace(), 1, -0.5, 0.5);
    ds::fill_uniform(g.w_k.emplace(), 2, -0.5, 0.5);
    ds::fill_uniform(g.w_v.emplace(), 3, -0.5, 0.5);
    ds::fill_uniform(g.b_q.emplace(), 4);
    ds::fill_uniform(g.b_k.emplace(), 5);
    ds::fill_uniform(g.b_v.emplace(), 6);
    ds::fill_uniform(g.w_o, 7, -0.5, 0.5);
    ds::fill_uniform(g.b_o.emplace(), 8);
    const plain p = repeated<grouped, plain>(g);
    for (std::size_t seq : {1, 7}) {
        ds::tensor<float, Batch, Query, Width> x(Batch{2}, Query{seq});
        ds::fill_normal(x, seq);
        const std::vector<std::size_t> lengths{seq, (seq + 1) / 2};
        for (bool causal : {false, true}) {
            for (bool padded : {false, true}) {
                INFO("kv_heads=" << KvHeads::static_extent << " seq=" << seq << " causal=" << causal << " padded=" << padded);
                ds::nn::attention_options options{.causal = causal};
                if (padded) options.key_lengths = lengths;
                ds::tensor<float, Batch, QueryHeads, Query, Query> weights, want_weights;
                auto y = g(x, options, &weights);
                auto want = p(x, options, &want_weights);
                test::require_close(y, test::to_xt(want), 1e-5, 1e-6);
                test::require_close(weights, test::to_xt(want_weights), 1e-5, 1e-7);
            }
        }
    }
    // the fused projection of the grouped layer: [W_Q | W_K | W_V], (model, (heads + 2 kv_heads) x head)
    grouped f;
    f.w_qkv.emplace();
    f.b_qkv.emplace();
    constexpr std::size_t q_columns = 16, kv_columns = KvHeads::static_extent * 4;
    for (std::size_t m = 0; m < 16; ++m) {
        for (std::size_t j = 0; j < q_columns; ++j) (*f.w_qkv)(m, j) = (*g.w_q)(m, j);
        for (std::size_t j = 0; j < kv_columns; ++j) {
            (*f.w_qkv)(m, q_columns + j) = (*g.w_k)(m, j);
            (*f.w_qkv)(m, q_columns + kv_columns + j) = (*g.w_v)(m, j);
        }
    }
    for (std::size_t j = 0; j < q_columns; ++j) (*f.b_qkv)(j) = (*g.b_q)(j);
    for (std::size_t j = 0; j < kv_columns; ++j) {
        (*f.b_qkv)(q_columns + j) = (*g.b_k)(j);
        (*f.b_qkv)(q_columns + kv_columns + j) = (*g.b_v)(j);
    }
    f.w_o = g.w_o;
    f.b_o = g.b_o;
    ds::tensor<float, Batch, Query, Width> x(Batch{3}, Query{5});
    ds::fill_normal(x, 99);
    test::require_close(f(x, {.causal = true}), test::to_xt(g(x, {.causal = true})), 1e-6, 1e-7);

    // views and formulas as inputs: a slice of a longer sequence, and a formula of x
    ds::tensor<float, Batch, Query, Width> longer(Batch{3}, Query{9});
    ds::fill_normal(longer, 7);
    ds::tensor<float, Batch, Query, Width> first(Batch{3}, Query{5});
    first = ds::slice<Query>(longer, 0, 5);
    const auto want = test::to_xt(g(first, {.causal = true}));
    test::require_close(g(ds::slice<Query>(longer, 0, 5), {.causal = true}), want, 1e-6, 1e-7);
    test::require_close(g(first * 2.0f - first, {.causal = true}), want, 1e-6, 1e-7);
    ds::tensor<float, Batch, Query, Width> y(Batch{3}, Query{5});
    g.forward(ds::slice<Query>(longer, 0, 5), longer, y.view(), {.causal = true});  // cross-attention to all 9
    test::require_close(y, test::to_xt(g(first, longer, {.causal = true})), 1e-6, 1e-7);
}

}  // namespace

TEST_CASE("grouped-query and multi-query attention equal the layer with repeated key/value heads") {
    check_grouped_layer<ds::axis<"kv_heads", 2>>();  // GQA: 4 query heads, 2 key/value heads
    check_grouped_layer<ds::axis<"kv_heads", 1>>();  // MQA
}

TEST_CASE("kv_cache: decoding step by step equals causal attention over the whole sequence") {
    using KvHeads = ds::axis<"kv_heads", 2>;
    using Group = ds::axis<"group", 2>;
    using OneGroup = ds::axis<"group", 1>;
    const std::size_t batch = 2, steps = 9;
    ds::tensor<double, Batch, KvHeads, Group, Seq, Dim> q(Batch{batch}, Seq{steps});
    ds::tensor<double, Batch, KvHeads, Seq, Dim> k(Batch{batch}, Seq{steps}), v(Batch{batch}, Seq{steps});
    ds::fill_uniform(q, 1);
    ds::fill_uniform(k, 2);
    ds::fill_uniform(v, 3);
    // all at once: (batch, kv_heads, group, seq, head)
    auto whole = ds::eval(ds::nn::causal_attention(q, ds::unsqueeze<OneGroup, 2>(k), ds::unsqueeze<OneGroup, 2>(v)));

    ds::nn::kv_cache<double, Batch, KvHeads, Seq, Dim> cache(batch, steps);
    ds::tensor<double, Batch, KvHeads, Group, Seq, Dim> z(Batch{batch}, Seq{1});
    for (std::size_t t = 0; t < steps; ++t) {
        cache.append(ds::slice<Seq>(k, t, t + 1), ds::slice<Seq>(v, t, t + 1));
        CHECK(cache.size() == t + 1);
        // one query against the t + 1 cached positions: views, no copy
        z = ds::nn::attention(ds::slice<Seq>(q, t, t + 1), ds::unsqueeze<OneGroup, 2>(cache.keys()),
                              ds::unsqueeze<OneGroup, 2>(cache.values()));
        test::require_close(z, test::to_xt(ds::eval(ds::slice<Seq>(whole, t, t + 1))), 1e-12, 1e-14);
    }
    CHECK(test::error_of([&] { cache.append(ds::slice<Seq>(k, 0, 1), ds::slice<Seq>(v, 0, 1)); }) ==
          "dimsum: kv_cache: 1 more positions after 9 do not fit in its 9");
    cache.keep(4);  // back to 4 positions: the next append overwrites the fifth
    CHECK(cache.size() == 4);
    CHECK(test::error_of([&] { cache.keep(5); }) == "dimsum: kv_cache: cannot keep 5 positions of 4");
    cache.append(ds::slice<Seq>(k, 4, 5), ds::slice<Seq>(v, 4, 5));
    test::require_close(cache.keys(), test::to_xt(ds::eval(ds::slice<Seq>(k, 0, 5))), 0, 0);
    cache.clear();
    CHECK(cache.size() == 0);
    cache.append(ds::slice<Seq>(k, 0, 2), ds::slice<Seq>(v, 0, 2));
    test::require_close(cache.keys(), test::to_xt(ds::eval(ds::slice<Seq>(k, 0, 2))), 0, 0);
}
