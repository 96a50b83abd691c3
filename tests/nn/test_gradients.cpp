// The gradients of a parameter struct (ds::backward, ds::gradients): one program for the loss
// and every gradient, against each parameter's own ds::grad (itself checked against finite
// differences: tests/ops/test_grad.cpp), on the reference and CPU backends; a parameter the
// loss does not read, an absent optional one, a mismatched struct; that planning them
// together computes the shared forward once; a transformer block's gradients and three AdamW
// steps against PyTorch (tests/reference/generate_gradients.py); a tape of several formulas
// (ds::tape) against the one formula they make and against PyTorch; SGD, clipping, the
// losses, and a resumed run continuing bit for bit.
#include "support.hpp"

#include <dimsum/backend/cpu/bf16_paths.hpp>
#include <dimsum/interop/parameters.hpp>

#include <boost/hana/define_struct.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

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

std::string reference_file(const std::string& name) { return test::data_path("gradients/", name, ".npy"); }

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

// the residual stream after the attention, then after the feed-forward, then the loss
auto block_attention(const block& w, const ds::tensor<double, Seq, Model>& x) {
    const std::size_t seq = x.shape().extent(0);
    auto h = ds::layer_norm(x);
    auto q = split_heads(ds::matmul(h, w.w_q));
    auto k = ds::rename<Seq, Key>(split_heads(ds::matmul(h, w.w_k)));
    auto v = ds::rename<Seq, Key>(split_heads(ds::matmul(h, w.w_v)));
    auto scores = ds::matmul(q, ds::transpose(k)) / 2.0;
    auto attended = ds::matmul(ds::softmax(ds::masked_fill(scores, ds::causal_mask(Seq{seq}, Key{seq}),
                                                           -std::numeric_limits<double>::infinity())),
                               v);
    return x + ds::matmul(ds::view<Seq, HeadsHead>(ds::transpose<Heads, Seq>(attended)), w.w_o);
}
auto block_feed_forward(const block& w, const auto& r) {
    return r + ds::matmul(ds::gelu(ds::matmul(ds::layer_norm(r), w.w_1) + w.b_1), w.w_2);
}
auto block_loss(const block& w, const ds::tensor<double, Seq, Model>& x, const ds::tensor<std::int64_t, Seq>& targets) {
    return ds::nn::cross_entropy<Vocab>(ds::matmul(block_feed_forward(w, block_attention(w, x)), w.w_out), targets);
}

// The gradients of the block's loss are PyTorch's (generate_gradients.py's grad_ files).
void require_pytorch_gradients(const block_and_input& g) {
    const double tolerance = 1e-10;
    auto require = [&]<class... A>(const ds::tensor<double, A...>& got, const std::string& name) {
        test::require_close(got, test::to_xt(ds::load_npy<double, A...>(reference_file("grad_" + name))), tolerance, tolerance);
    };
    require(g.x, "x");
    require(g.weights.w_q, "w_q");
    require(g.weights.w_k, "w_k");
    require(g.weights.w_v, "w_v");
    require(g.weights.w_o, "w_o");
    require(g.weights.w_1, "w_1");
    require(g.weights.b_1, "b_1");
    require(g.weights.w_2, "w_2");
    require(g.weights.w_out, "w_out");
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
            require_pytorch_gradients(g);
        }
    }
}

// check(tape) with a new tape on the CPU backend at 1 and 2 threads, then on the reference backend.
template <class Check>
void on_each_backend(Check check) {
    for (int threads : {1, 2}) {
        INFO("threads=" << threads);
        ds::set_num_threads(threads);
        ds::tape<double> on_cpu;
        check(on_cpu);
    }
    ds::set_num_threads(0);
    ds::tape<double, ds::backend::reference::evaluator> on_reference;
    check(on_reference);
}

TEST_CASE("a tape through the block recorded in two formulas gives PyTorch autograd's gradients, float64") {
    const block_and_input p{load_block(""), ds::load_npy<double, Seq, Model>(reference_file("x"))};
    const auto targets = ds::load_npy<std::int64_t, Seq>(reference_file("targets"));
    const double want_loss = ds::load_npy<double>(reference_file("loss")).data()[0];
    auto check = [&](auto& tape) {
        for (int step = 0; step < 2; ++step) {  // the second step on the first's memory
            INFO("step " << step);
            block_and_input g = p;
            const auto r = tape.eval(block_attention(p.weights, p.x));
            const auto m = tape.eval(block_feed_forward(p.weights, r));
            REQUIRE(tape.size() == 2);
            const double value = tape.backward(ds::nn::cross_entropy<Vocab>(ds::matmul(m, p.weights.w_out), targets), p, g);
            CHECK(tape.size() == 0);
            CHECK(std::abs(value - want_loss) <= 1e-12);
            require_pytorch_gradients(g);
        }
    };
    on_each_backend(check);
}

namespace {

// A model of four recorded formulas: a residual stream read by three of them and the loss, a
// weight shared by two, a formula nothing reads, and a parameter nothing reads.
struct stack {
    BOOST_HANA_DEFINE_STRUCT(stack,
        (ds::tensor<double, In, Hidden>, w_in),
        (ds::tensor<double, Hidden>, b_in),
        (ds::tensor<double, Hidden, Hidden>, w_shared),
        (ds::tensor<double, Hidden, Out>, w_out),
        (ds::tensor<double, Out>, unused));
};

auto stack_input(const stack& p, const ds::tensor<double, Batch, In>& x) { return ds::tanh(ds::matmul(x, p.w_in) + p.b_in); }
auto stack_middle(const stack& p, const auto& h1) { return h1 + ds::sigmoid(ds::matmul(h1, p.w_shared)); }
auto stack_top(const stack& p, const auto& h2, const auto& h1) { return ds::silu(ds::matmul(h2, ds::transpose(p.w_shared))) + h1; }
auto stack_loss(const stack& p, const auto& h3, const auto& h1, const ds::tensor<double, Batch, Out>& y) {
    auto error = ds::matmul(h3, p.w_out) - y;
    return ds::mean<Batch>(ds::sum<Out>(error * error)) + 0.01 * ds::sum<Batch>(ds::sum<Hidden>(h1 * h1));
}

stack make_stack(std::size_t in, std::size_t hidden, std::size_t out) {
    stack p{ds::tensor<double, In, Hidden>(In{in}, Hidden{hidden}), ds::tensor<double, Hidden>(Hidden{hidden}),
            ds::tensor<double, Hidden, Hidden>(Hidden{hidden}, Hidden{hidden}), ds::tensor<double, Hidden, Out>(Hidden{hidden}, Out{out}),
            ds::tensor<double, Out>(Out{out})};
    std::uint64_t seed = 1;
    ds::detail::parameters::for_each_present(p, "", [&](const std::string&, auto& t) { ds::fill_uniform(t, seed++, -1.0, 1.0); });
    return p;
}

}  // namespace

TEST_CASE("a tape's gradients through several recorded formulas are those of the one formula they make") {
    for (std::size_t batch : {1, 6, 19}) {
        INFO("batch=" << batch);
        stack p = make_stack(3, 9, 2);
        ds::tensor<double, Batch, In> x(Batch{batch}, In{3}), dx(Batch{batch}, In{3});
        ds::tensor<double, Batch, Out> y(Batch{batch}, Out{2});
        ds::fill_uniform(x, 40 + batch, -1.0, 1.0);
        ds::fill_uniform(y, 41 + batch, -1.0, 1.0);
        // the one formula, differentiated in one program on the reference backend
        auto h1 = stack_input(p, x);
        auto h3 = stack_top(p, stack_middle(p, h1), h1);
        ds::backend::reference::evaluator reference;
        stack want = p;
        ds::tensor<double, Batch, In> want_dx(Batch{batch}, In{3});
        const double want_loss = ds::backward(stack_loss(p, h3, h1, y), std::tie(x, p), std::tie(want_dx, want), reference);
        auto check = [&](auto& tape) {
            for (int step = 0; step < 2; ++step) {
                INFO("step " << step);
                stack g = p;
                g.unused.fill(std::numeric_limits<double>::quiet_NaN());  // overwritten with zeros
                const auto t1 = tape.eval(stack_input(p, x));
                const auto t2 = tape.eval(stack_middle(p, t1));
                tape.eval(ds::exp(t1 * 0.5));  // read by nothing after it: no gradient flows through it
                const auto t3 = tape.eval(stack_top(p, t2, t1));
                const double value = tape.backward(stack_loss(p, t3, t1, y), std::tie(x, p), std::tie(dx, g));
                CHECK(std::abs(value - want_loss) <= 1e-13 * std::abs(want_loss));
                test::require_close(dx, test::to_xt(want_dx), 1e-12, 1e-13);
                test::require_close(g.w_in, test::to_xt(want.w_in), 1e-12, 1e-13);
                test::require_close(g.b_in, test::to_xt(want.b_in), 1e-12, 1e-13);
                test::require_close(g.w_shared, test::to_xt(want.w_shared), 1e-12, 1e-13);
                test::require_close(g.w_out, test::to_xt(want.w_out), 1e-12, 1e-13);
                for (std::size_t i = 0; i < 2; ++i) CHECK(g.unused(i) == 0);
            }
        };
        on_each_backend(check);
    }
}

TEST_CASE("backward_from chains the formulas by hand: the tape's gradients, each step its own program") {
    stack p = make_stack(4, 6, 3);
    ds::tensor<double, Batch, In> x(Batch{7}, In{4}), dx(Batch{7}, In{4}), tape_dx(Batch{7}, In{4});
    ds::tensor<double, Batch, Out> y(Batch{7}, Out{3});
    ds::fill_uniform(x, 1, -1.0, 1.0);
    ds::fill_uniform(y, 2, -1.0, 1.0);
    stack g = p, tape_g = p;
    ds::tape<double> tape;
    const auto h1 = tape.eval(stack_input(p, x));
    const auto h2 = tape.eval(stack_middle(p, h1));
    const double tape_loss = tape.backward(stack_loss(p, h2, h2, y), std::tie(x, p), std::tie(tape_dx, tape_g));
    // the same by hand: each formula's value kept, then each backward from the top
    ds::tensor<double, Batch, Hidden> t1 = stack_input(p, x), t2 = stack_middle(p, t1), d1(Batch{7}, Hidden{6}), d2(Batch{7}, Hidden{6});
    const double loss = ds::backward(stack_loss(p, t2, t2, y), std::tie(t2, p.w_out), std::tie(d2, g.w_out));
    ds::backward_from(stack_middle(p, t1), d2, std::tie(t1, p.w_shared), std::tie(d1, g.w_shared));
    ds::backward_from(stack_input(p, x), d1, std::tie(x, p.w_in, p.b_in), std::tie(dx, g.w_in, g.b_in));
    CHECK(loss == tape_loss);
    test::require_same_bits(dx, tape_dx);
    test::require_same_bits(g.w_in, tape_g.w_in);
    test::require_same_bits(g.b_in, tape_g.b_in);
    test::require_same_bits(g.w_shared, tape_g.w_shared);
    test::require_same_bits(g.w_out, tape_g.w_out);
    ds::tensor<double, Batch, Hidden> wrong(Batch{6}, Hidden{6});
    CHECK(test::error_of([&] { ds::backward_from(stack_input(p, x), wrong, x, dx); }) ==
          "dimsum: backward_from: the cotangent's extents are not the formula's");
}

TEST_CASE("a tape's errors end the step: a gradient that a recorded formula reads, a struct that does not match") {
    stack p = make_stack(3, 4, 2);
    ds::tensor<double, Batch, In> x(Batch{5}, In{3});
    ds::tensor<double, Batch, Out> y(Batch{5}, Out{2});
    ds::fill_uniform(x, 1, -1.0, 1.0);
    ds::tape<double> tape;
    stack g = p;
    {
        const auto t1 = tape.eval(stack_input(p, x) + ds::sum<Out>(g.w_out));  // reads g's memory
        CHECK(test::error_of([&] { tape.backward(stack_loss(p, t1, t1, y), p, g); }) ==
              "dimsum: tape::backward: a gradient overlaps memory a recorded formula reads");
        CHECK(tape.size() == 0);
    }
    {
        tape.eval(stack_input(p, x));
        stack wider = make_stack(3, 5, 2);
        const auto t1 = tape.eval(stack_input(p, x));
        CHECK(test::error_of([&] { tape.backward(stack_loss(p, t1, t1, y), p, wider); }) ==
              "dimsum: tape::backward: the gradients' w_in does not match its parameter (ds::gradients makes a matching struct)");
        CHECK(tape.size() == 0);
    }
    // and the next step runs
    const auto t1 = tape.eval(stack_input(p, x));
    const double value = tape.backward(stack_loss(p, t1, t1, y), p, g);
    const double want = ds::backward(stack_loss(p, stack_input(p, x), stack_input(p, x), y), p, g);
    CHECK(std::abs(value - want) <= 1e-13 * std::abs(want));
}

namespace {
using LModel = ds::axis<"model", 16>;
using LHeads = ds::axis<"heads", 4>;
using LKvHeads = ds::axis<"kv_heads", 2>;
using LHead = ds::axis<"head", 4>;
using LHidden = ds::axis<"hidden", 24>;
using encoder = ds::nn::encoder_layer<double, LModel, LHeads, LHead, LHidden>;
using decoder = ds::nn::decoder_layer<double, LModel, LHeads, LKvHeads, LHead, LHidden>;
}  // namespace

TEST_CASE("a tape trains the nn layers through their formulas: an encoder layer, then a decoder layer, against finite differences") {
    encoder e;
    decoder d;
    std::uint64_t seed = 1;
    e.attention.w_q.emplace();
    e.attention.w_k.emplace();
    e.attention.w_v.emplace();
    e.attention.b_q.emplace();  // two of the biases present, the others absent (zeros)
    e.attention.b_o.emplace();
    d.attention.w_q.emplace();
    d.attention.w_k.emplace();
    d.attention.w_v.emplace();
    ds::detail::parameters::for_each_present(e, "", [&](const std::string&, auto& t) { ds::fill_uniform(t, seed++, -0.4, 0.4); });
    ds::detail::parameters::for_each_present(d, "", [&](const std::string&, auto& t) { ds::fill_uniform(t, seed++, -0.4, 0.4); });
    ds::tensor<double, Batch, Seq, LModel> x(Batch{2}, Seq{7}), target(Batch{2}, Seq{7}), dx(Batch{2}, Seq{7});
    ds::fill_normal(x, 99);
    ds::fill_normal(target, 98);
    const ds::nn::rotary<double, Seq, LHead> rope(16);
    // the loss of the two layers, each evaluated whole: what the finite differences step
    auto loss = [&] {
        const ds::tensor<double, Batch, Seq, LModel> h = e.formula(x, ds::nn::causal_scores);
        return ds::eval(ds::nn::mean_squared_error(d.formula(h, rope), target)).data()[0];
    };
    encoder ge = e;
    decoder gd = d;
    ds::tape<double> tape;
    const auto h = tape.eval(e.formula(x, ds::nn::causal_scores));
    const auto y = tape.eval(d.formula(h, rope));
    const double value = tape.backward(ds::nn::mean_squared_error(y, target), std::tie(x, e, d), std::tie(dx, ge, gd));
    CHECK(std::abs(value - loss()) <= 1e-14);
    // central differences at a few elements of every tensor: the input and each layer's weights,
    // their gradients in the same order
    auto tensors = std::tie(x, e, d);
    const auto their_gradients = std::tie(dx, ge, gd);
    std::vector<const double*> gradients;
    ds::detail::for_each_tensor(their_gradients, [&](const std::string&, const auto& g) { gradients.push_back(g.data()); });
    std::size_t next = 0;
    ds::detail::for_each_tensor(tensors, [&](const std::string& name, auto& w) {
        INFO(name);
        const double* g = gradients.at(next++);
        for (std::size_t i = 0; i < w.size(); i += 1 + w.size() / 4) {
            const double keep = w.data()[i], step = 1e-6;
            w.data()[i] = keep + step;
            const double up = loss();
            w.data()[i] = keep - step;
            const double down = loss();
            w.data()[i] = keep;
            CHECK(std::abs((up - down) / (2 * step) - g[i]) <= 1e-8);
        }
    });
    CHECK(next == gradients.size());
}

namespace {
template <class T>
using small_decoder = ds::nn::decoder_layer<T, LModel, LHeads, LKvHeads, LHead, LHidden>;
template <class T>
struct two_decoders {
    BOOST_HANA_DEFINE_STRUCT(two_decoders, (small_decoder<T>, lower), (small_decoder<T>, upper));
};
template <class T>
two_decoders<T> make_two_decoders() {
    two_decoders<T> m;
    for (auto* layer : {&m.lower, &m.upper}) {
        layer->attention.w_q.emplace();
        layer->attention.w_k.emplace();
        layer->attention.w_v.emplace();
    }
    return m;
}

// For each tensor of `got` and `want` (structs alike, of float), the largest difference over the
// largest magnitude of want's: a relative error that an element near zero does not inflate.
template <class Got, class Want>
void require_within(const Got& got, const Want& want, double relative) {
    std::vector<std::pair<const float*, std::size_t>> wanted;
    ds::detail::for_each_tensor(want, [&](const std::string&, const auto& t) { wanted.emplace_back(t.data(), t.size()); });
    std::size_t k = 0;
    ds::detail::for_each_tensor(got, [&](const std::string& name, const auto& t) {
        INFO(name);
        REQUIRE(k < wanted.size());
        REQUIRE(t.size() == wanted[k].second);
        double worst = 0, scale = 0;
        for (std::size_t i = 0; i < t.size(); ++i) {
            const double w = wanted[k].first[i];
            worst = std::max(worst, std::abs(double(t.data()[i]) - w));
            scale = std::max(scale, std::abs(w));
        }
        CHECK(scale > 0);
        CHECK(worst <= relative * scale);
        ++k;
    });
    CHECK(k == wanted.size());
}
}  // namespace

TEST_CASE("a bf16 model trains in mixed precision: float gradients within bf16's rounding of the float model's, float parameters rounded into it") {
    // the same weights and input in float and in bf16 (values bf16 holds exactly)
    two_decoders<float> master = make_two_decoders<float>();
    std::uint64_t seed = 1;
    ds::detail::parameters::for_each_present(master, "", [&](const std::string&, auto& t) { ds::fill_uniform(t, seed++, -0.4, 0.4); });
    two_decoders<ds::bf16> model = make_two_decoders<ds::bf16>();
    ds::nn::sgd rounder(master, {.learning_rate = 0});
    two_decoders<float> grads = master, want = master;
    rounder.step(master, grads, model);  // a step of 0: model := master rounded; master unchanged
    ds::detail::parameters::for_each_present(master, "", [](const std::string&, auto& t) {
        for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = float(ds::bf16(t.data()[i]));
    });
    ds::tensor<float, Batch, Seq, LModel> x(Batch{2}, Seq{7}), target(Batch{2}, Seq{7});
    ds::fill_normal(x, 99);
    ds::fill_normal(target, 98);
    ds::tensor<ds::bf16, Batch, Seq, LModel> x16(Batch{2}, Seq{7});
    for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(x16.data()[i] = ds::bf16(x.data()[i]));
    const ds::nn::rotary<float, Seq, LHead> rope(16);
    const ds::nn::rotary<ds::bf16, Seq, LHead> rope16(16);

    // one layer: the float layer's gradients, and the bf16 layer's on each backend, its bf16
    // values rounded where its formula holds them, every gradient computed in float
    small_decoder<float> want_lower = master.lower;
    const float float_loss = ds::backward(ds::nn::mean_squared_error(master.lower.formula(x, rope), target), master.lower, want_lower);
    auto loss16 = [&] { return ds::nn::mean_squared_error(ds::cast<float>(model.lower.formula(x16, rope16)), target); };
    for (int threads : {1, 2}) {
        INFO("threads=" << threads);
        ds::set_num_threads(threads);
        CHECK(std::abs(ds::backward(loss16(), model.lower, grads.lower) - float_loss) <= 1e-2 * float_loss);
        require_within(grads.lower, want_lower, 2e-2);
    }
    ds::set_num_threads(0);
    small_decoder<float> on_reference = master.lower;
    ds::backward(loss16(), model.lower, on_reference, ds::backend::reference::evaluator{});
    require_within(on_reference, grads.lower, 1e-2);

    // two layers through a tape: the bf16 tape keeps each layer's value in bf16 and its
    // gradient in float; against a float tape over the float layers (one formula of both
    // layers is too large a C++ type: api.md)
    ds::tape<float> tape32;
    const auto h32 = tape32.eval(master.lower.formula(x, rope));
    const auto y32 = tape32.eval(master.upper.formula(h32, rope));
    const float float_loss2 = tape32.backward(ds::nn::mean_squared_error(y32, target), master, want);
    ds::tape<ds::bf16> tape;
    for (int step = 0; step < 2; ++step) {  // the second step on the first's memory
        const auto h = tape.eval(model.lower.formula(x16, rope16));
        const auto y = tape.eval(model.upper.formula(h, rope16));
        const float value = tape.backward(ds::nn::mean_squared_error(ds::cast<float>(y), target), model, grads);
        CHECK(std::abs(value - float_loss2) <= 1e-2 * float_loss2);
        require_within(grads, want, 2e-2);
    }

    // AdamW on the float parameters, the bf16 model rounded from them in the same pass: the
    // parameters those of a step without the copy, bit for bit
    two_decoders<float> alone = master;
    ds::nn::adamw opt(master, {.learning_rate = 1e-2}), opt_alone(alone, {.learning_rate = 1e-2});
    opt.step(master, grads, model);
    opt_alone.step(alone, grads);
    test::require_same_bits(master.upper.w_2, alone.upper.w_2);
    std::vector<const float*> updated;
    ds::detail::parameters::for_each_present(master, "", [&](const std::string&, const auto& t) { updated.push_back(t.data()); });
    std::size_t k = 0;
    ds::detail::parameters::for_each_present(model, "", [&](const std::string& name, const auto& t) {
        INFO(name);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < t.size(); ++i) wrong += t.data()[i].bits != ds::bf16(updated[k][i]).bits;
        CHECK(wrong == 0);
        ++k;
    });
    // a copy of other tensors is refused before anything moves
    small_decoder<ds::bf16> one_layer = model.lower;
    CHECK(test::error_of([&] { opt.step(master, grads, one_layer); }) ==
          "dimsum: adamw: the working copy's tensors do not match the parameters");
    test::require_same_bits(master.upper.w_2, alone.upper.w_2);
}

namespace {
// C (rows x cols) = A^T B (A: depth x rows, B: depth x cols) in double, from float values.
std::vector<double> product_t(const float* a, const float* b, std::size_t depth, std::size_t rows, std::size_t cols) {
    std::vector<double> c(rows * cols, 0.0);
    for (std::size_t p = 0; p < depth; ++p) {
        for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < cols; ++j) c[i * cols + j] += double(a[p * rows + i]) * double(b[p * cols + j]);
        }
    }
    return c;
}
// The largest difference of got from want over want's largest magnitude.
double relative_error(const float* got, const std::vector<double>& want) {
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(double(got[i]) - want[i]));
        scale = std::max(scale, std::abs(want[i]));
    }
    return worst / scale;
}
}  // namespace

TEST_CASE("gradient_options::bf16_products: a gradient's product beside a bf16 operand reads its cotangent rounded to bf16, on each bf16 path") {
    namespace cpu = ds::backend::cpu;
    using bf16 = ds::bf16;
    const std::size_t rows = 37, in = 45, hidden = 29, out = 11;
    ds::tensor<bf16, Batch, In> x(Batch{rows}, In{in});
    ds::tensor<bf16, In, Hidden> w(In{in}, Hidden{hidden});
    ds::tensor<bf16, Hidden, Out> v(Hidden{hidden}, Out{out});
    ds::tensor<float, Batch, Hidden> t(Batch{rows}, Hidden{hidden});
    ds::tensor<float, Batch, Out> t2(Batch{rows}, Out{out});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    ds::fill_uniform(v, 3);
    ds::fill_uniform(t, 4);  // most of its values not bf16's
    ds::fill_uniform(t2, 5);
    std::vector<float> x32(x.size()), t32(t.data(), t.data() + t.size()), t_rounded(t.size());
    for (std::size_t i = 0; i < x.size(); ++i) x32[i] = float(x.data()[i]);
    for (std::size_t i = 0; i < t.size(); ++i) t_rounded[i] = float(bf16(t.data()[i]));
    // W's gradient of sum(x W * t): x^T t, or x^T round(t) with the option, in double
    const std::vector<double> exact = product_t(x32.data(), t32.data(), rows, in, hidden);
    const std::vector<double> rounded = product_t(x32.data(), t_rounded.data(), rows, in, hidden);
    CHECK(relative_error(t_rounded.data(), {t32.begin(), t32.end()}) > 1e-4);  // the rounding shows
    auto one_product = [&] { return ds::sum<Batch>(ds::sum<Hidden>(ds::cast<float>(ds::matmul(x, w)) * t)); };
    // two products, the second's left operand an activation rounded to bf16
    auto two_products = [&] {
        return ds::sum<Batch>(ds::sum<Out>(ds::cast<float>(ds::matmul(ds::cast<bf16>(ds::tanh(ds::matmul(x, w))), v)) * t2));
    };
    ds::tensor<float, Batch, In> dx(x.shape());
    ds::tensor<float, In, Hidden> dw(w.shape());
    ds::tensor<float, Hidden, Out> dv(v.shape());
    const ds::gradient_options bf16_products{.bf16_products = true};
    std::vector<cpu::bf16_path> paths{cpu::bf16_path::widen};
    for (const auto path : {cpu::bf16_path::avx512_bf16, cpu::bf16_path::amx}) {
        if (cpu::support_of(path).usable) paths.push_back(path);
    }
    for (const auto path : paths) {
        const cpu::scoped_bf16_path chosen(path);
        for (const int threads : {1, 2}) {
            INFO(cpu::name(path) << ", " << threads << " threads");
            ds::set_num_threads(threads);
            // the forward's product, and dW and dx on bf16 operands; without the option, the
            // backward's products widen t
            std::size_t before = test::bf16_products_run();
            ds::backward(one_product(), std::tie(x, w), std::tie(dx, dw), bf16_products);
            CHECK(test::bf16_products_run() - before == 3);
            CHECK(relative_error(dw.data(), rounded) <= 1e-5);
            before = test::bf16_products_run();
            ds::backward(one_product(), std::tie(x, w), std::tie(dx, dw));
            CHECK(test::bf16_products_run() - before == 1);
            CHECK(relative_error(dw.data(), exact) <= 1e-5);
            // two forward products, four backward: dV and the activation's adjoint beside the
            // rounded activation and V, dW and dx beside x and W
            before = test::bf16_products_run();
            ds::backward(two_products(), std::tie(x, w, v), std::tie(dx, dw, dv), bf16_products);
            CHECK(test::bf16_products_run() - before == 6);
        }
        ds::set_num_threads(0);
    }
    // the same program on the reference backend (in double, its cotangents rounded to bf16
    // where the CPU's are): within bf16's rounding of the CPU's
    ds::tensor<float, Batch, In> dx_reference(x.shape());
    ds::tensor<float, In, Hidden> dw_reference(w.shape());
    ds::tensor<float, Hidden, Out> dv_reference(v.shape());
    ds::backward(two_products(), std::tie(x, w, v), std::tie(dx, dw, dv), bf16_products);
    ds::backward(two_products(), std::tie(x, w, v), std::tie(dx_reference, dw_reference, dv_reference), bf16_products,
                 ds::backend::reference::evaluator{});
    require_within(std::tie(dx, dw, dv), std::tie(dx_reference, dw_reference, dv_reference), 1e-2);
    // a tape made with the option differentiates with it
    ds::tape<bf16> tape(bf16_products);
    const auto y = tape.eval(ds::matmul(x, w));
    tape.backward(ds::sum<Batch>(ds::sum<Hidden>(ds::cast<float>(y) * t)), std::tie(x, w), std::tie(dx, dw));
    CHECK(relative_error(dw.data(), rounded) <= 1e-5);
    // so do ds::grad and ds::vjp given it, on the CPU backend and on the reference backend;
    // without it, they widen the cotangent
    for (const auto& [options, want, products] : {std::tuple{bf16_products, &rounded, 1}, std::tuple{ds::gradient_options{}, &exact, 0}}) {
        INFO("bf16_products " << options.bf16_products);
        std::size_t before = test::bf16_products_run();
        dw = ds::grad(one_product(), w, options);
        CHECK(test::bf16_products_run() - before == std::size_t(products));  // dW = x^T round(t) with the option
        CHECK(relative_error(dw.data(), *want) <= 1e-5);
        dw = ds::eval(ds::grad(one_product(), w, options), ds::backend::reference::evaluator{});
        CHECK(relative_error(dw.data(), *want) <= 1e-5);
        before = test::bf16_products_run();
        dw = ds::vjp(ds::cast<float>(ds::matmul(x, w)), w, t, options);
        CHECK(test::bf16_products_run() - before == std::size_t(products));
        CHECK(relative_error(dw.data(), *want) <= 1e-5);
        dw = ds::eval(ds::vjp(ds::cast<float>(ds::matmul(x, w)), w, t, options), ds::backend::reference::evaluator{});
        CHECK(relative_error(dw.data(), *want) <= 1e-5);
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
