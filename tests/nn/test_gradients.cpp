// The gradients of a parameter struct (ds::backward, ds::gradients): one program for the loss
// and every gradient, against each parameter's own ds::grad (itself checked against finite
// differences: tests/ops/test_grad.cpp), on the reference and CPU backends; a parameter the
// loss does not read, an absent optional one, a mismatched struct; that planning them
// together computes the shared forward once; a transformer block's gradients and three AdamW
// steps against PyTorch (tests/reference/generate_gradients.py); SGD, clipping, the losses,
// and a resumed run continuing bit for bit.
#include "support.hpp"

#include <dimsum/interop/parameters.hpp>

#include <boost/hana/define_struct.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using In = ds::axis<"in">;
using Hidden = ds::axis<"hidden">;
using Out = ds::axis<"out">;

struct mlp {
    BOOST_HANA_DEFINE_STRUCT(mlp,
        (ds::tensor<double, In, Hidden>, w1),
        (ds::tensor<double, Hidden>, b1),
        (ds::tensor<double, Hidden, Out>, w2),
        (std::optional<ds::tensor<double, Out>>, b2),
        (ds::tensor<double, Out>, unused));
};

mlp make_mlp(std::size_t in, std::size_t hidden, std::size_t out, bool with_b2) {
    mlp m{ds::tensor<double, In, Hidden>(In{in}, Hidden{hidden}), ds::tensor<double, Hidden>(Hidden{hidden}),
          ds::tensor<double, Hidden, Out>(Hidden{hidden}, Out{out}), std::nullopt, ds::tensor<double, Out>(Out{out})};
    ds::fill_uniform(m.w1, 1, -1.0, 1.0);
    ds::fill_uniform(m.b1, 2, -1.0, 1.0);
    ds::fill_uniform(m.w2, 3, -1.0, 1.0);
    ds::fill_uniform(m.unused, 4, -1.0, 1.0);
    if (with_b2) {
        m.b2 = ds::tensor<double, Out>(Out{out});
        ds::fill_uniform(*m.b2, 5, -1.0, 1.0);
    }
    return m;
}

// mean over the batch of the squared error of the MLP's output against y (the bias b2 if set)
auto loss_of(const mlp& m, const ds::tensor<double, Batch, In>& x, const ds::tensor<double, Batch, Out>& y) {
    auto hidden = ds::tanh(ds::matmul(x, m.w1) + m.b1);
    auto out = ds::matmul(hidden, ds::transpose(ds::transpose(m.w2)));  // w2 read through views of itself
    auto error = out + (m.b2 ? *m.b2 : m.unused) * (m.b2 ? 1.0 : 0.0) - y;
    return ds::mean<Batch>(ds::sum<Out>(error * error));
}

}  // namespace

TEST_CASE("gradients of a parameter struct: each member's ds::grad, the loss returned, zeros for what the loss does not read") {
    for (bool with_b2 : {false, true}) {
        for (std::size_t batch : {1, 5, 17}) {
            INFO("batch=" << batch << " b2=" << with_b2);
            const mlp m = make_mlp(3, 7, 2, with_b2);
            ds::tensor<double, Batch, In> x(Batch{batch}, In{3});
            ds::tensor<double, Batch, Out> y(Batch{batch}, Out{2});
            ds::fill_uniform(x, batch, -1.0, 1.0);
            ds::fill_uniform(y, batch + 1, -1.0, 1.0);
            const auto loss = loss_of(m, x, y);
            ds::backend::reference::evaluator reference;
            const double want_loss = ds::eval(loss, reference).data()[0];
            for (int threads : {1, 2}) {
                ds::set_num_threads(threads);
                mlp on_cpu = ds::gradients(loss, m);
                mlp on_reference = ds::gradients(loss, m, reference);
                test::require_close(on_reference.w1, test::to_xt(ds::eval(ds::grad(loss, m.w1), reference)), 1e-13, 1e-14);
                test::require_close(on_reference.b1, test::to_xt(ds::eval(ds::grad(loss, m.b1), reference)), 1e-13, 1e-14);
                test::require_close(on_reference.w2, test::to_xt(ds::eval(ds::grad(loss, m.w2), reference)), 1e-13, 1e-14);
                test::require_close(on_cpu.w1, test::to_xt(on_reference.w1), 1e-12, 1e-13);
                test::require_close(on_cpu.b1, test::to_xt(on_reference.b1), 1e-12, 1e-13);
                test::require_close(on_cpu.w2, test::to_xt(on_reference.w2), 1e-12, 1e-13);
                REQUIRE(on_cpu.b2.has_value() == with_b2);
                if (with_b2) test::require_close(*on_cpu.b2, test::to_xt(ds::eval(ds::grad(loss, *m.b2), reference)), 1e-12, 1e-13);
                // `unused` is read (times 0) without b2, not at all with it
                if (with_b2) {
                    for (std::size_t i = 0; i < 2; ++i) CHECK(on_cpu.unused(i) == 0);
                }
                mlp into = on_cpu;
                const double value = ds::backward(loss, m, into);
                CHECK(std::abs(value - want_loss) <= 1e-12 * std::abs(want_loss));
                test::require_same_bits(into.w1, on_cpu.w1);
            }
        }
    }
}

TEST_CASE("backward plans the loss and every gradient as one program: the forward once") {
    const mlp m = make_mlp(4, 16, 3, true);
    ds::tensor<double, Batch, In> x(Batch{8}, In{4});
    ds::tensor<double, Batch, Out> y(Batch{8}, Out{3});
    ds::fill_uniform(x, 1, -1.0, 1.0);
    ds::fill_uniform(y, 2, -1.0, 1.0);
    mlp grads = ds::gradients(loss_of(m, x, y), m);
    const auto& together = ds::backend::cpu::detail::state<double>::of_this_thread().plan;
    std::size_t products = 0;
    for (const auto& e : together.entries) products += e.kind == ds::evaluation::entry_kind::gemm;
    // x W1 and hidden W2 forward; W2's gradient, the hidden adjoint and W1's gradient backward
    CHECK(products == 5);
    CHECK(grads.w1.size() == 4 * 16);
}

TEST_CASE("backward's errors: a gradients struct that does not match, one that overlaps the loss's memory") {
    const mlp m = make_mlp(3, 5, 2, true);
    ds::tensor<double, Batch, In> x(Batch{2}, In{3});
    ds::tensor<double, Batch, Out> y(Batch{2}, Out{2});
    const auto loss = loss_of(m, x, y);
    mlp without_b2 = make_mlp(3, 5, 2, false);
    CHECK(test::error_of([&] { ds::backward(loss, m, without_b2); }) ==
          "dimsum: backward: the gradients' struct does not hold a tensor for every parameter");
    mlp wider = make_mlp(3, 6, 2, true);
    CHECK(test::error_of([&] { ds::backward(loss, m, wider); }) ==
          "dimsum: backward: the gradients' w1 does not match its parameter (ds::gradients makes a matching struct)");
    mlp same = m;
    CHECK(test::error_of([&] { ds::backward(loss_of(same, x, y), same, same); }) ==
          "dimsum: backward: the gradients' w1 overlaps memory the formula reads");
    // a view of w1's memory that no transpose, select, slice or view of w1 expresses (rows 5
    // elements apart in a (3, 5) matrix would read past its rows): refused, not zeros
    using A = ds::axis<"a">;
    using B = ds::axis<"b">;
    const ds::tensor_view<const double, A, B> odd(m.w1.data() + 1, ds::shape<A, B>::from_extents({2, 2}, "test"), {4, 1});
    ds::tensor<double, In, Hidden> g1(In{3}, Hidden{5});
    CHECK(test::error_of([&] { ds::backward(ds::sum<A>(ds::sum<B>(odd * 2.0)), m.w1, g1); }) ==
          "dimsum: backward: the formula reads a view of a tensor it differentiates that no transpose, select, slice or "
          "view of it expresses: differentiate with respect to that view");
}

namespace {

// The block of tests/reference/generate_gradients.py, in double: weights, and the input x
// (whose gradient PyTorch gives too), loaded from its files.
using Seq = ds::axis<"seq">;
using Key = ds::axis<"key">;
using Model = ds::axis<"model">;
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 4>;
using HeadsHead = ds::axis<"heads_head", 8>;
using Vocab = ds::axis<"vocab", 5>;

struct block {
    BOOST_HANA_DEFINE_STRUCT(block,
        (ds::tensor<double, Model, HeadsHead>, w_q),
        (ds::tensor<double, Model, HeadsHead>, w_k),
        (ds::tensor<double, Model, HeadsHead>, w_v),
        (ds::tensor<double, HeadsHead, Model>, w_o),
        (ds::tensor<double, Model, Hidden>, w_1),
        (ds::tensor<double, Hidden>, b_1),
        (ds::tensor<double, Hidden, Model>, w_2),
        (ds::tensor<double, Model, Vocab>, w_out));
};

struct block_and_input {
    BOOST_HANA_DEFINE_STRUCT(block_and_input, (block, weights), (ds::tensor<double, Seq, Model>, x));
};

std::string reference_file(const std::string& name) { return std::string(DIMSUM_TEST_DATA) + "/gradients/" + name + ".npy"; }

block load_block(const std::string& prefix) {
    return block{ds::load_npy<double, Model, HeadsHead>(reference_file(prefix + "w_q")),
                 ds::load_npy<double, Model, HeadsHead>(reference_file(prefix + "w_k")),
                 ds::load_npy<double, Model, HeadsHead>(reference_file(prefix + "w_v")),
                 ds::load_npy<double, HeadsHead, Model>(reference_file(prefix + "w_o")),
                 ds::load_npy<double, Model, Hidden>(reference_file(prefix + "w_1")),
                 ds::load_npy<double, Hidden>(reference_file(prefix + "b_1")),
                 ds::load_npy<double, Hidden, Model>(reference_file(prefix + "w_2")),
                 ds::load_npy<double, Model, Vocab>(reference_file(prefix + "w_out"))};
}

// (seq, heads_head) -> (heads, seq, head)
auto split_heads(auto&& t) { return ds::transpose<Seq, Heads>(ds::view<Seq, Heads, Head>(std::forward<decltype(t)>(t))); }

auto block_loss(const block& w, const ds::tensor<double, Seq, Model>& x, const ds::tensor<std::int64_t, Seq>& targets) {
    const std::size_t seq = x.shape().extent(0);
    auto h = ds::layer_norm(x);
    auto q = split_heads(ds::matmul(h, w.w_q));
    auto k = ds::rename<Seq, Key>(split_heads(ds::matmul(h, w.w_k)));
    auto v = ds::rename<Seq, Key>(split_heads(ds::matmul(h, w.w_v)));
    auto scores = ds::matmul(q, ds::transpose(k)) / 2.0;
    auto attended = ds::matmul(ds::softmax(ds::masked_fill(scores, ds::causal_mask(Seq{seq}, Key{seq}),
                                                           -std::numeric_limits<double>::infinity())),
                               v);
    auto r = x + ds::matmul(ds::view<Seq, HeadsHead>(ds::transpose<Heads, Seq>(attended)), w.w_o);
    auto m = r + ds::matmul(ds::gelu(ds::matmul(ds::layer_norm(r), w.w_1) + w.b_1), w.w_2);
    return ds::nn::cross_entropy<Vocab>(ds::matmul(m, w.w_out), targets);
}

}  // namespace

TEST_CASE("the gradients of a transformer block and its cross-entropy (an ignored target) are PyTorch autograd's, float64") {
    const block_and_input p{load_block(""), ds::load_npy<double, Seq, Model>(reference_file("x"))};
    const auto targets = ds::load_npy<std::int64_t, Seq>(reference_file("targets"));
    const double want_loss = ds::load_npy<double>(reference_file("loss")).data()[0];
    const auto loss = block_loss(p.weights, p.x, targets);
    ds::backend::reference::evaluator reference;
    for (int threads : {1, 2}) {
        ds::set_num_threads(threads);
        for (bool on_reference : {false, true}) {
            INFO("threads=" << threads << " reference=" << on_reference);
            block_and_input g = p;
            const double value = on_reference ? ds::backward(loss, p, g, reference) : ds::backward(loss, p, g);
            CHECK(std::abs(value - want_loss) <= 1e-12);
            const double tolerance = 1e-10;
            test::require_close(g.x, test::to_xt(ds::load_npy<double, Seq, Model>(reference_file("grad_x"))), tolerance, tolerance);
            test::require_close(g.weights.w_q, test::to_xt(ds::load_npy<double, Model, HeadsHead>(reference_file("grad_w_q"))), tolerance, tolerance);
            test::require_close(g.weights.w_k, test::to_xt(ds::load_npy<double, Model, HeadsHead>(reference_file("grad_w_k"))), tolerance, tolerance);
            test::require_close(g.weights.w_v, test::to_xt(ds::load_npy<double, Model, HeadsHead>(reference_file("grad_w_v"))), tolerance, tolerance);
            test::require_close(g.weights.w_o, test::to_xt(ds::load_npy<double, HeadsHead, Model>(reference_file("grad_w_o"))), tolerance, tolerance);
            test::require_close(g.weights.w_1, test::to_xt(ds::load_npy<double, Model, Hidden>(reference_file("grad_w_1"))), tolerance, tolerance);
            test::require_close(g.weights.b_1, test::to_xt(ds::load_npy<double, Hidden>(reference_file("grad_b_1"))), tolerance, tolerance);
            test::require_close(g.weights.w_2, test::to_xt(ds::load_npy<double, Hidden, Model>(reference_file("grad_w_2"))), tolerance, tolerance);
            test::require_close(g.weights.w_out, test::to_xt(ds::load_npy<double, Model, Vocab>(reference_file("grad_w_out"))), tolerance, tolerance);
        }
    }
}

TEST_CASE("AdamW: three steps are torch.optim.AdamW's, and a run resumed from saved parameters and state continues bit for bit") {
    const auto x = ds::load_npy<double, Seq, Model>(reference_file("x"));
    const auto targets = ds::load_npy<std::int64_t, Seq>(reference_file("targets"));
    block w = load_block("");
    block g = w;
    ds::nn::adamw opt(w, {.learning_rate = 0.01, .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8, .weight_decay = 0.1});
    for (int step = 0; step < 3; ++step) {
        ds::backward(block_loss(w, x, targets), w, g);
        opt.step(w, g);
    }
    const block want = load_block("adamw_");
    test::require_close(w.w_q, test::to_xt(want.w_q), 1e-12, 1e-13);
    test::require_close(w.b_1, test::to_xt(want.b_1), 1e-12, 1e-13);
    test::require_close(w.w_out, test::to_xt(want.w_out), 1e-12, 1e-13);
    test::require_close(w.w_2, test::to_xt(want.w_2), 1e-12, 1e-13);
    CHECK(opt.state.steps.data()[0] == 3);

    // two more steps straight on, against two more after a save and a load of both
    test::temp_dir dir;
    ds::save(w, dir.dir / "weights.npz");
    ds::save(opt.state, dir.dir / "optimizer.npz");
    for (int step = 0; step < 2; ++step) {
        ds::backward(block_loss(w, x, targets), w, g);
        opt.step(w, g);
    }
    block resumed = load_block("");  // other values, overwritten by the load
    ds::nn::adamw again(resumed, opt.options);
    ds::load(resumed, dir.dir / "weights.npz");
    ds::load(again.state, dir.dir / "optimizer.npz");
    for (int step = 0; step < 2; ++step) {
        ds::set_num_threads(step + 1);  // the threads do not change an update
        ds::backward(block_loss(resumed, x, targets), resumed, g);
        again.step(resumed, g);
    }
    test::require_same_bits(resumed.w_q, w.w_q);
    test::require_same_bits(resumed.w_out, w.w_out);
    test::require_same_bits(again.state.v.w_1, opt.state.v.w_1);
}

TEST_CASE("SGD with momentum and weight decay, and clipping by the global norm, against loops") {
    mlp m = make_mlp(3, 4, 2, false);
    mlp g = make_mlp(3, 4, 2, false);
    ds::fill_uniform(g.w1, 11, -1.0, 1.0);
    ds::fill_uniform(g.b1, 12, -1.0, 1.0);
    ds::fill_uniform(g.w2, 13, -1.0, 1.0);
    ds::fill_uniform(g.unused, 14, -1.0, 1.0);
    double squares = 0;
    for (std::size_t i = 0; i < g.w1.size(); ++i) squares += g.w1.data()[i] * g.w1.data()[i];
    for (std::size_t i = 0; i < g.b1.size(); ++i) squares += g.b1.data()[i] * g.b1.data()[i];
    for (std::size_t i = 0; i < g.w2.size(); ++i) squares += g.w2.data()[i] * g.w2.data()[i];
    for (std::size_t i = 0; i < g.unused.size(); ++i) squares += g.unused.data()[i] * g.unused.data()[i];
    const double w10 = g.w1.data()[0];
    CHECK(std::abs(ds::nn::clip_grad_norm(g, 0.5) - std::sqrt(squares)) <= 1e-12);
    CHECK(std::abs(g.w1.data()[0] - w10 * 0.5 / (std::sqrt(squares) + 1e-6)) <= 1e-15);

    const mlp start = m;
    ds::nn::sgd opt(m, {.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 0.01});
    opt.step(m, g);
    opt.step(m, g);
    for (std::size_t i = 0; i < m.w2.size(); ++i) {
        const double p0 = start.w2.data()[i], grad = g.w2.data()[i];
        const double b1 = grad + 0.01 * p0, p1 = p0 - 0.1 * b1;
        const double b2 = 0.9 * b1 + (grad + 0.01 * p1), p2 = p1 - 0.1 * b2;
        CHECK(std::abs(m.w2.data()[i] - p2) <= 1e-15);
    }
}

TEST_CASE("mean_squared_error and cross_entropy: formulas of no axes, against loops") {
    ds::tensor<double, Batch, Out> a(Batch{3}, Out{4}), b(Batch{3}, Out{4});
    ds::fill_uniform(a, 1, -1.0, 1.0);
    ds::fill_uniform(b, 2, -1.0, 1.0);
    double want = 0;
    for (std::size_t i = 0; i < a.size(); ++i) want += (a.data()[i] - b.data()[i]) * (a.data()[i] - b.data()[i]) / 12;
    CHECK(std::abs(ds::eval(ds::nn::mean_squared_error(a, b)).data()[0] - want) <= 1e-15);

    using Classes = ds::axis<"classes">;
    ds::tensor<double, Batch, Classes> logits(Batch{3}, Classes{4});
    ds::fill_uniform(logits, 3, -30.0, 30.0);  // large: the shift by the maximum matters
    ds::tensor<std::int32_t, Batch> targets(Batch{3});
    targets(0) = 2;
    targets(1) = -100;
    targets(2) = 0;
    double total = 0;
    for (std::size_t r : {0, 2}) {
        double top = -1e300, sum = 0;
        for (std::size_t c = 0; c < 4; ++c) top = std::max(top, logits(r, c));
        for (std::size_t c = 0; c < 4; ++c) sum += std::exp(logits(r, c) - top);
        total += std::log(sum) + top - logits(r, std::size_t(targets(r)));
    }
    CHECK(std::abs(ds::eval(ds::nn::cross_entropy<Classes>(logits, targets)).data()[0] - total / 2) <= 1e-12);
}
