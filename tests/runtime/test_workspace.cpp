// Memory: a formula evaluated again into the same destination allocates nothing; every
// temporary and packing buffer comes from the kept workspace. counting_new.hpp replaces the
// global operator new to count allocations (dimsum allocates only through it).
#include "support.hpp"

#include "decoder.hpp"
#include "multi_head_attention.hpp"

#include "counting_new.hpp"

#include <limits>

using counting_new::allocations;

namespace ds = dimsum;

TEST_CASE("a formula evaluated again allocates nothing") {
    using namespace mha;
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        activations x = make_input(2, 37);
        weight w_q = make_weight(2), w_k = make_weight(3), w_v = make_weight(4), w_o = make_weight(5);
        ds::tensor<float, Model> bias;
        ds::fill_uniform(bias, 6);
        activations y(Batch{2}, Seq{37});

        // causal attention, a product with an epilogue, softmax of a view, and a layer norm
        auto q = split_heads(ds::matmul(x, w_q)), k = split_heads(ds::matmul(x, w_k)), v = split_heads(ds::matmul(x, w_v));
        auto formula = ds::layer_norm(ds::matmul(merge_heads(causal_attention(q, k, v)), w_o) + bias + x);
        ds::assign(y, formula);  // the first evaluation sizes the workspace
        auto first = ds::eval(formula, ds::backend::reference::evaluator{});
        test::require_close(y, test::to_xt(first), 1e-4, 1e-5);

        std::size_t before = allocations.load();
        for (int repeat = 0; repeat < 3; ++repeat) ds::assign(y, formula);
        REQUIRE(allocations.load() - before == 0);
    }
    ds::set_num_threads(0);
}

TEST_CASE("a bf16 formula allocates nothing after its first evaluation: its float values live in the workspace") {
    using Rows = ds::axis<"rows">;
    using Inner = ds::axis<"inner", 48>;
    using Cols = ds::axis<"cols", 40>;
    ds::tensor<ds::bf16, Rows, Inner> a(Rows{33});
    ds::tensor<ds::bf16, Inner, Cols> w;
    ds::tensor<ds::bf16, Cols> b;
    ds::fill_normal(a, 1);
    ds::fill_normal(w, 2);
    ds::fill_normal(b, 3);
    ds::tensor<ds::bf16, Rows, Cols> y(Rows{33});
    auto formula = ds::softmax<Cols>(ds::nn::gelu(ds::matmul(a, w) + b));
    ds::assign(y, formula);
    std::size_t before = allocations.load();
    for (int repeat = 0; repeat < 3; ++repeat) ds::assign(y, formula);
    REQUIRE(allocations.load() - before == 0);
}

TEST_CASE("a bf16 attention layer allocates nothing after its first call, and holds no more than in float") {
    using Batch = ds::axis<"batch">;
    using Seq = ds::axis<"seq">;
    using Model = ds::axis<"model", 48>;
    ds::nn::multi_head_attention<ds::bf16, Model, ds::axis<"heads", 3>, ds::axis<"head", 16>> layer;
    layer.w_q.emplace();
    layer.w_k.emplace();
    layer.w_v.emplace();
    ds::fill_normal(*layer.w_q, 1);
    ds::fill_normal(*layer.w_k, 2);
    ds::fill_normal(*layer.w_v, 3);
    ds::fill_normal(layer.w_o, 4);
    ds::tensor<ds::bf16, Batch, Seq, Model> x(Batch{2}, Seq{37}), y(Batch{2}, Seq{37});
    ds::fill_normal(x, 5);
    // the same layer in float, for the memory its intermediate values take
    ds::nn::multi_head_attention<float, Model, ds::axis<"heads", 3>, ds::axis<"head", 16>> wide;
    wide.w_q = ds::tensor<float, Model, decltype(wide)::Inner>(ds::cast<float>(*layer.w_q));
    wide.w_k = ds::tensor<float, Model, decltype(wide)::Inner>(ds::cast<float>(*layer.w_k));
    wide.w_v = ds::tensor<float, Model, decltype(wide)::Inner>(ds::cast<float>(*layer.w_v));
    wide.w_o = ds::cast<float>(layer.w_o);
    const ds::tensor<float, Batch, Seq, Model> xf = ds::cast<float>(x);
    ds::tensor<float, Batch, Seq, Model> yf(Batch{2}, Seq{37});
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        layer.forward(x, x, y.view(), {.causal = true});
        const std::size_t before = allocations.load();
        for (int repeat = 0; repeat < 3; ++repeat) layer.forward(x, x, y.view(), {.causal = true});
        REQUIRE(allocations.load() - before == 0);
        // Q, K, V and the heads' output held in bf16, their float values and y's (rounded into
        // y by the output projection, block by block) sharing one temporary: one float array and
        // four of bf16, three quarters of float's four arrays; the bf16 layer also widens its
        // biases (convert entries: two of 48 floats)
        const std::size_t held = ds::backend::cpu::last_temporary_bytes<float>();
        wide.forward(xf, xf, yf.view(), {.causal = true});
        const std::size_t held_in_float = ds::backend::cpu::last_temporary_bytes<float>();
        INFO("bf16 layer: " << held << " bytes, float layer: " << held_in_float);
        REQUIRE(held_in_float >= 4 * 2 * 37 * 48 * sizeof(float));
        REQUIRE(held <= held_in_float * 3 / 4 + 2 * 48 * sizeof(float));
    }
    ds::set_num_threads(0);
}

TEST_CASE("a product with weights packed once allocates nothing after the first, nor packs again") {
    using Rows = ds::axis<"rows">;
    using Inner = ds::axis<"inner">;
    using Cols = ds::axis<"cols">;
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        ds::tensor<float, Rows, Inner> x(Rows{300}, Inner{200});
        ds::tensor<ds::bf16, Rows, Inner> x16(Rows{300}, Inner{200});
        ds::tensor<float, Inner, Cols> w(Inner{200}, Cols{150});
        ds::tensor<ds::bf16, Inner, Cols> w16(Inner{200}, Cols{150});
        ds::fill_normal(x, 1);
        ds::fill_normal(x16, 2);
        ds::fill_normal(w, 3);
        ds::fill_normal(w16, 4);
        const auto packed = ds::prepack(w);
        const auto packed16 = ds::prepack(w16);
        ds::tensor<float, Rows, Cols> y(Rows{300}, Cols{150});
        ds::tensor<ds::bf16, Rows, Cols> y16(Rows{300}, Cols{150});
        ds::assign(y, ds::matmul(x, packed));
        ds::assign(y16, ds::matmul(x16, packed16));
        const std::size_t before = allocations.load();
        for (int repeat = 0; repeat < 3; ++repeat) {
            ds::assign(y, ds::matmul(x, packed));
            ds::assign(y16, ds::matmul(x16, packed16));
        }
        REQUIRE(allocations.load() - before == 0);
        // the workspace held y16's float value, not x16 widened (the product reads it where it
        // lies) nor w16 (read from its panels)
        const std::size_t held = ds::backend::cpu::last_temporary_bytes<float>();
        REQUIRE(held >= 300 * 150 * sizeof(float));
        REQUIRE(held < (300 * 150 + 200 * 150) * sizeof(float));
    }
    ds::set_num_threads(0);
}

TEST_CASE("a decoder step with a KV cache allocates nothing after the first of its size") {
    using sizes = llama::tiny;
    using llama::Batch;
    using llama::Seq;
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        llama::decoder_weights<sizes> w;
        ds::fill_uniform(w.embedding, 1);
        ds::fill_uniform(w.block.attention.w_q.emplace(), 2);
        ds::fill_uniform(w.block.attention.w_k.emplace(), 3);
        ds::fill_uniform(w.block.attention.w_v.emplace(), 4);
        ds::fill_uniform(w.block.attention.w_o, 5);
        ds::fill_uniform(w.block.w_1, 6);
        ds::fill_uniform(w.block.w_3, 7);
        ds::fill_uniform(w.block.w_2, 8);
        ds::fill_uniform(w.output, 9);
        w.block.attention_norm.fill(1.0f);
        w.block.ffn_norm.fill(1.0f);
        w.norm.fill(1.0f);
        llama::decoder<sizes> d(w, 2, 64);
        ds::tensor<std::int64_t, Batch, Seq> prompt(Batch{2}, Seq{5}), token(Batch{2}, Seq{1});
        for (std::size_t i = 0; i < prompt.size(); ++i) prompt.data()[i] = std::int64_t(i * 7 % 50);
        ds::tensor<float, Batch, sizes::Vocab> logits(Batch{2});
        d.step(prompt, logits);
        d.step(token, logits);  // the first step of one token sizes its tensors
        std::size_t before = allocations.load();
        for (int step = 0; step < 40; ++step) {  // positions 6 to 45: the cache grows, nothing allocates
            token(0, 0) = step % 50;
            d.step(token, logits);
        }
        REQUIRE(allocations.load() - before == 0);
        REQUIRE(d.size() == 46);
    }
    ds::set_num_threads(0);
}

TEST_CASE("the counter sees allocations, so the test above can fail") {
    std::size_t before = allocations.load();
    ds::tensor<float, ds::axis<"n">> t(ds::axis<"n">{100});
    REQUIRE(allocations.load() - before == 1);
}

TEST_CASE("the workspace can be released, and grows again on demand") {
    ds::tensor<float, ds::axis<"m">, ds::axis<"k">> a(ds::axis<"m">{65}, ds::axis<"k">{33});
    ds::tensor<float, ds::axis<"k">, ds::axis<"n">> b(ds::axis<"k">{33}, ds::axis<"n">{17});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(b, 2);
    auto before = ds::eval(ds::matmul(a, b));
    ds::release_workspace();
    auto after = ds::eval(ds::matmul(a, b));
    REQUIRE(std::equal(before.data(), before.data() + before.size(), after.data()));
}

namespace {

using TSeq = ds::axis<"seq">;
using TKey = ds::axis<"key">;
using TModel = ds::axis<"model", 12>;
using THeads = ds::axis<"heads", 2>;
using THead = ds::axis<"head", 6>;
using TInner = ds::axis<"heads_head", 12>;
using TVocab = ds::axis<"vocab", 7>;

struct tiny_model {
    BOOST_HANA_DEFINE_STRUCT(tiny_model,
        (ds::tensor<float, TModel, TInner>, w_q),
        (ds::tensor<float, TModel, TInner>, w_k),
        (ds::tensor<float, TModel, TInner>, w_v),
        (ds::tensor<float, TInner, TModel>, w_o),
        (ds::tensor<float, TModel, TVocab>, w_out));
};

// (seq, heads_head) -> (heads, seq, head)
auto heads_of(auto&& t) { return ds::transpose<TSeq, THeads>(ds::view<TSeq, THeads, THead>(std::forward<decltype(t)>(t))); }

// A pre-norm block with causal attention and a cross-entropy over its vocabulary.
auto tiny_block(const tiny_model& w, const ds::tensor<float, TSeq, TModel>& x) {
    const std::size_t seq = x.shape().extent(0);
    auto h = ds::layer_norm(x);
    auto q = heads_of(ds::matmul(h, w.w_q));
    auto k = ds::rename<TSeq, TKey>(heads_of(ds::matmul(h, w.w_k)));
    auto v = ds::rename<TSeq, TKey>(heads_of(ds::matmul(h, w.w_v)));
    auto z = ds::matmul(ds::softmax(ds::masked_fill(ds::matmul(q, ds::transpose(k)) * 0.4f, ds::causal_mask(TSeq{seq}, TKey{seq}),
                                                    -std::numeric_limits<float>::infinity())),
                        v);
    return x + ds::matmul(ds::view<TSeq, TInner>(ds::transpose<THeads, TSeq>(z)), w.w_o);
}
auto tiny_loss(const tiny_model& w, const ds::tensor<float, TSeq, TModel>& x, const ds::tensor<std::int64_t, TSeq>& targets) {
    return ds::nn::cross_entropy<TVocab>(ds::matmul(tiny_block(w, x), w.w_out), targets);
}

// The model, its gradients, one sequence and its targets, and AdamW's state.
struct tiny_training {
    tiny_model m = random_model(), g = m;
    ds::tensor<float, TSeq, TModel> x = input();
    ds::tensor<std::int64_t, TSeq> targets = targets_of(19);
    ds::nn::adamw<tiny_model> opt{m, {.learning_rate = 1e-2}};

    static tiny_model random_model() {
        tiny_model m;
        std::uint64_t seed = 1;
        boost::hana::for_each(boost::hana::accessors<tiny_model>(), [&](auto accessor) { ds::fill_normal(boost::hana::second(accessor)(m), seed++, 0.0, 0.3); });
        return m;
    }
    static ds::tensor<float, TSeq, TModel> input() {
        ds::tensor<float, TSeq, TModel> x(TSeq{19});
        ds::fill_normal(x, 9);
        return x;
    }
    static ds::tensor<std::int64_t, TSeq> targets_of(std::size_t n) {
        ds::tensor<std::int64_t, TSeq> targets(TSeq{n});
        for (std::size_t i = 0; i < n; ++i) targets(i) = static_cast<std::int64_t>(i * 5 % 7);
        return targets;
    }
};

}  // namespace

// Runs `step` on a new tiny_training at 1 and 2 threads: the first step sizes the workspace
// (and what else the step keeps), three more allocate nothing, and the loss falls.
template <class Step>
void require_steps_allocate_nothing_after_the_first(Step step) {
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        tiny_training t;
        const double first = step(t);
        std::size_t before = allocations.load();
        double last = first;
        for (int repeat = 0; repeat < 3; ++repeat) last = step(t);
        REQUIRE(allocations.load() - before == 0);
        CHECK(last < first);  // and it learns
    }
    ds::set_num_threads(0);
}

TEST_CASE("a training step allocates nothing after the first: the loss, its gradients through fused attention, clipping, AdamW") {
    require_steps_allocate_nothing_after_the_first([](tiny_training& t) {
        const double loss = ds::backward(tiny_loss(t.m, t.x, t.targets), t.m, t.g);
        ds::nn::clip_grad_norm(t.g, 1.0);
        t.opt.step(t.m, t.g);
        return loss;
    });
}

TEST_CASE("a training step through a tape allocates nothing after the first: its values, their gradients and its programs") {
    ds::tape<float> tape;
    require_steps_allocate_nothing_after_the_first([&](tiny_training& t) {
        const auto r = tape.eval(tiny_block(t.m, t.x));
        const auto s = tape.eval(r + ds::nn::gelu(r));
        const double loss = tape.backward(ds::nn::cross_entropy<TVocab>(ds::matmul(s, t.m.w_out), t.targets), t.m, t.g);
        t.opt.step(t.m, t.g);
        return loss;
    });
}
