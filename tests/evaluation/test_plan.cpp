// The planner (evaluation/plan.hpp), the attention matcher (evaluation/attention_pattern.hpp)
// and the program pass that uses it (evaluation/passes.hpp) on small formulas: which entries a
// formula becomes, what the matcher takes out of the score function and what it must refuse,
// what the pass makes of a program alone. And explain()'s text for the README's attention.
#include "support.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "multi_head_attention.hpp"

namespace {

namespace ds = dimsum;
namespace ev = dimsum::evaluation;

using Batch = ds::axis<"batch">;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head", 4>;
using Model = ds::axis<"model", 6>;

constexpr float infinity = std::numeric_limits<float>::infinity();

struct planned {
    ev::program program;
    std::vector<ev::binding> bindings;
    ev::plan plan;

    std::vector<ev::entry_kind> kinds() const {
        std::vector<ev::entry_kind> k;
        for (const ev::entry& e : plan.entries) k.push_back(e.kind);
        return k;
    }
};

// The plan of e into a row-major destination, or one laid out as `destination`, of float or
// of `destination_type`.
template <class E>
planned plan_of(const E& e, ev::planner_options options = {}, std::optional<ev::layout> destination = std::nullopt,
                ev::element_type destination_type = ev::element_type::float32) {
    planned p;
    ev::lower<float>(e, p.program, p.bindings);
    const ev::step& root = p.program.steps[p.program.root];
    ev::make_plan(p.program, p.bindings, destination.value_or(ev::row_major(root.rank, root.extents)), destination_type,
                  options, p.plan);
    return p;
}

// A formula lowered, no pass run.
template <class E>
ev::program lowered(const E& e) {
    ev::program p;
    std::vector<ev::binding> bindings;
    ev::lower<float>(e, p, bindings);
    return p;
}

// What the matcher finds at the formula's root, in the program as lowered.
template <class E>
std::optional<ev::attention_match> match_of(const E& e) {
    const ev::program p = lowered(e);
    return ev::match_attention(p.steps, p.root);
}

struct qkv {
    ds::tensor<float, Batch, Query, Head> q{Batch{2}, Query{5}};
    ds::tensor<float, Batch, Key, Head> k{Batch{2}, Key{7}};
    ds::tensor<float, Batch, Key, Head> v{Batch{2}, Key{7}};
    ds::tensor<float, Query, Key> mask{Query{5}, Key{7}};

    auto scores() const { return ds::matmul(q, ds::transpose(k)); }
    auto causal() const { return ds::causal_mask(Query{5}, Key{7}); }
};

using kinds = std::vector<ev::entry_kind>;

}  // namespace

TEST_CASE("the matcher takes the scale out however it is written") {
    qkv t;
    auto times = match_of(ds::matmul(ds::softmax(t.scores() * 0.5f), t.v));
    REQUIRE(times);
    CHECK(times->scale == 0.5);
    CHECK(!times->divides);
    CHECK(times->score_function == times->scores);
    CHECK(!times->causal);

    auto before = match_of(ds::matmul(ds::softmax(0.5f * t.scores()), t.v));
    REQUIRE(before);
    CHECK(before->scale == 0.5);
    CHECK(before->score_function == before->scores);

    auto divided = match_of(ds::matmul(ds::softmax(t.scores() / 8.0f), t.v));
    REQUIRE(divided);
    CHECK(divided->scale == 8.0);
    CHECK(divided->divides);
    CHECK(ev::scale_of<float>(*divided) == 0.125f);

    auto plain = match_of(ds::matmul(ds::softmax(t.scores()), t.v));
    REQUIRE(plain);
    CHECK(plain->scale == 1.0);
    CHECK(plain->score_function == plain->scores);
}

TEST_CASE("the matcher takes a causal mask applied last, and only then") {
    qkv t;
    auto last = match_of(ds::matmul(ds::softmax(ds::masked_fill(t.scores() * 0.5f, t.causal(), -infinity)), t.v));
    REQUIRE(last);
    CHECK(last->causal);
    CHECK(last->scale == 0.5);
    CHECK(last->score_function == last->scores);

    // masked first, then scaled: the kernel cannot skip tiles for it, so the mask stays in the score function
    auto not_last = match_of(ds::matmul(ds::softmax(ds::masked_fill(t.scores(), t.causal(), -infinity) * 0.5f), t.v));
    REQUIRE(not_last);
    CHECK(!not_last->causal);
    CHECK(not_last->score_function != not_last->scores);

    // a causal mask that fills with another number is an ordinary score function
    auto finite = match_of(ds::matmul(ds::softmax(ds::masked_fill(t.scores(), t.causal(), -1e4f)), t.v));
    REQUIRE(finite);
    CHECK(!finite->causal);
    CHECK(finite->score_function != finite->scores);
}

TEST_CASE("additive and padding masks stay in the score function") {
    qkv t;
    auto additive = match_of(ds::matmul(ds::softmax(t.scores() * 0.5f + t.mask), t.v));
    REQUIRE(additive);
    CHECK(additive->score_function != additive->scores);
    CHECK(additive->scale == 1.0);  // the scale is part of the score function here

    // a padding mask: 0 for the keys that count, -infinity for the padding, the same for every query
    ds::tensor<float, Key> padding(Key{7});
    auto padded = match_of(ds::matmul(ds::softmax(t.scores() / 2.0f + padding), t.v));
    REQUIRE(padded);
    CHECK(!padded->causal);
    CHECK(padded->score_function != padded->scores);
}

TEST_CASE("formulas that are not attention do not match") {
    qkv t;
    // softmax along the queries, not the keys
    CHECK(!match_of(ds::matmul(ds::softmax<Query>(t.scores()), t.v)));
    // no product of queries and keys inside the softmax
    CHECK(!match_of(ds::matmul(ds::softmax(t.mask), t.v)));
    // scores that the score function broadcasts to a larger shape
    ds::tensor<float, ds::axis<"extra", 3>, Batch, Query, Key> bias(Batch{2}, Query{5}, Key{7});
    CHECK(!match_of(ds::matmul(ds::softmax(t.scores() + bias), t.v)));
    // a plain product
    CHECK(!match_of(ds::matmul(t.q, ds::transpose(t.k))));
}

TEST_CASE("recognise_attention, alone: one attention step in place of the outer product, nothing else changed") {
    qkv t;
    ds::tensor<float, Batch, Query, Head> y(Batch{2}, Query{5});
    auto f = ds::matmul(ds::softmax(ds::masked_fill(t.scores() * 0.5f + t.mask, t.causal(), -infinity)), t.v) + y;
    const ev::program before = lowered(f);
    ev::program after = before;
    ev::recognise_attention(after);

    // the root (an add) is as it was; its first operand, the outer product, is now attention
    REQUIRE(after.steps.size() == before.steps.size());
    const std::size_t outer = before.steps[before.root].operands[0];
    const std::optional<ev::attention_match> match = ev::match_attention(before.steps, outer);
    REQUIRE(match);
    for (std::size_t id = 0; id < before.steps.size(); ++id) {
        if (id != outer) CHECK(after.steps[id] == before.steps[id]);
    }
    const ev::step& attention = after.steps[outer];
    CHECK(attention.kind == ev::step_kind::attention);
    CHECK(ev::group_of(attention.kind) == ev::step_group::product);
    REQUIRE(attention.operand_count == 3);
    const ev::step& scores = before.steps[match->scores];
    CHECK(attention.operands[0] == scores.operands[0]);  // Q
    CHECK(attention.operands[1] == scores.operands[1]);  // K^T
    CHECK(attention.operands[2] == match->values);       // V
    CHECK(attention.extents == before.steps[outer].extents);
    REQUIRE(after.attentions.size() == 1);
    CHECK(attention.index == 0);
    CHECK(after.attentions[0] == *match);
    CHECK(after.attentions[0].causal);
    CHECK(after.attentions[0].score_function != after.attentions[0].scores);  // the additive mask stays

    // printed: the attention step with its scores, the softmax it replaced dead, the scores not
    const std::string text = ev::to_text(after);
    INFO(text);
    auto s = [](std::size_t id) { return "s" + std::to_string(id); };
    const std::string line = s(outer) + " = attention(" + s(scores.operands[0]) + ", " + s(scores.operands[1]) + ", " +
                             s(match->values) + ") [scores " + s(match->scores) + ", score_function " +
                             s(match->score_function) + ", causal] (batch=2, query=5, head=4) float";
    CHECK(text.find(line) != std::string::npos);
    const std::size_t softmax = before.steps[outer].operands[0];
    CHECK(text.find(s(softmax) + " = softmax(" + s(before.steps[softmax].operands[0]) + ") [axis 2]") != std::string::npos);
    auto line_of = [&](std::size_t id) {
        const std::size_t at = text.find("  s" + std::to_string(id) + " = ");
        return text.substr(at, text.find('\n', at) - at);
    };
    CHECK(line_of(softmax).find("(dead)") != std::string::npos);
    CHECK(line_of(match->scores).find("(dead)") == std::string::npos);
    CHECK(line_of(after.root).find("<- root") != std::string::npos);
    CHECK(ev::to_text(before).find("(dead)") == std::string::npos);

    // two attentions in one formula: two steps, two entries of the table
    ev::program two = lowered(ds::matmul(ds::softmax(t.scores()), t.v) * ds::matmul(ds::softmax(t.scores() / 8.0f), t.v));
    ev::recognise_attention(two);
    REQUIRE(two.attentions.size() == 2);
    CHECK(two.attentions[0].scale == 1.0);
    CHECK(two.attentions[1].divides);
    // a formula with no attention is left as it was
    const ev::program plain = lowered(ds::softmax(t.scores()) * 2.0f);
    ev::program untouched = plain;
    ev::recognise_attention(untouched);
    CHECK(untouched.steps == plain.steps);
    CHECK(untouched.attentions.empty());

    // ds::explain shows the program before and after each pass, then the plan
    const std::string passes = ds::explain(f, ds::explain_detail::passes);
    INFO(passes);
    CHECK(passes.find("program as lowered:\n" + ev::to_text(before)) == 0);
    CHECK(passes.find("after recognise_attention:\n" + ev::to_text(after) + "after group_epilogues:\n") != std::string::npos);
    ev::program grouped = after;
    ev::group_epilogues(grouped);
    CHECK(passes.find("after group_epilogues:\n" + ev::to_text(grouped) + "after find_rounded_alone:\n" + ev::to_text(grouped) +
                      "cpu plan") != std::string::npos);  // no cast<bf16>: nothing marked
    CHECK(passes.substr(passes.find("cpu plan")) == ds::explain(f));
    const std::string reference = ds::explain(f, ds::explain_detail::passes, ds::backend::reference::evaluator{});
    CHECK(reference.find("after recognise_attention: not run on this backend\nafter group_epilogues: not run on this backend\n"
                         "after find_rounded_alone: not run on this backend\nreference plan") != std::string::npos);
}

TEST_CASE("recognise_layer_norm_backward, alone: one layer_norm_gradient step in place of the formula differentiation made") {
    ds::tensor<float, Batch, Query, Model> x(Batch{2}, Query{3}), w(Batch{2}, Query{3});
    const ev::program before = lowered(ds::grad(ds::sum<Batch>(ds::sum<Query>(ds::sum<Model>(ds::layer_norm(x, 1e-3f) * w))), x));
    REQUIRE(before.layer_norm_backwards.size() == 1);
    const ev::layer_norm_backward record = before.layer_norm_backwards[0];
    const ev::step& forward = before.steps[record.forward];
    CHECK(forward.kind == ev::step_kind::layer_norm);
    ev::program after = before;
    ev::recognise_layer_norm_backward(after);

    // the recorded gradient step, and nothing else, is now the line kernel: the layer norm's
    // input and the cotangent, its axis and epsilon, the extents of the input
    REQUIRE(after.steps.size() == before.steps.size());
    for (std::size_t id = 0; id < before.steps.size(); ++id) {
        if (id != record.gradient) CHECK(after.steps[id] == before.steps[id]);
    }
    const ev::step& gradient = after.steps[record.gradient];
    CHECK(gradient.kind == ev::step_kind::layer_norm_gradient);
    CHECK(ev::group_of(gradient.kind) == ev::step_group::line);
    REQUIRE(gradient.operand_count == 2);
    CHECK(gradient.operands[0] == forward.operands[0]);
    CHECK(gradient.operands[1] == record.cotangent);
    CHECK(gradient.axis == 2);
    CHECK(gradient.number == Approx(1e-3));
    CHECK(gradient.extents == before.steps[forward.operands[0]].extents);

    // printed, with the means of the formula it replaced dead
    const std::string text = ev::to_text(after);
    INFO(text);
    auto s = [](std::size_t id) { return "s" + std::to_string(id); };
    CHECK(text.find(s(record.gradient) + " = layer_norm_gradient(" + s(forward.operands[0]) + ", " + s(record.cotangent) +
                    ") [axis 2, epsilon 0.001] (batch=2, query=3, model=6) float  <- root") != std::string::npos);
    auto dead_means = [](const std::string& program) {
        std::size_t dead = 0;
        for (std::size_t at = program.find(" = mean("); at != std::string::npos; at = program.find(" = mean(", at + 1)) {
            dead += program.substr(at, program.find('\n', at) - at).find("(dead)") != std::string::npos;
        }
        return dead;
    };
    CHECK(dead_means(text) == 4);  // of x, of the squared deviations, of g and of g y
    CHECK(dead_means(ev::to_text(before)) == 0);

    // planned on the CPU: one rowwise entry reads both; the reference does not run the pass
    const planned cpu = plan_of(ds::grad(ds::sum<Batch>(ds::sum<Query>(ds::sum<Model>(ds::layer_norm(x, 1e-3f) * w))), x),
                                ds::backend::cpu::evaluator{}.planning());
    std::size_t lines = 0;
    for (const ev::entry& e : cpu.plan.entries) {
        if (e.kind != ev::entry_kind::rowwise || e.line != ev::line_op::layer_norm_gradient) continue;
        ++lines;
        CHECK(e.operand_count == 2);
        CHECK(e.axis == 2);
    }
    CHECK(lines == 1);
    CHECK(ds::backend::reference::evaluator::planning.fuse_layer_norm_backward == false);
    // a program with no layer norm is left as it was
    ev::program plain = lowered(ds::grad(ds::sum<Batch>(ds::sum<Query>(ds::sum<Model>(ds::softmax(x) * w))), x));
    const ev::program kept = plain;
    ev::recognise_layer_norm_backward(plain);
    CHECK(plain.steps == kept.steps);
}

TEST_CASE("group_epilogues, alone: an elementwise formula takes the product nothing else reads as its epilogue") {
    qkv t;
    ds::tensor<float, Head, Model> w;
    ds::tensor<float, Model> bias;
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});
    // the step of each kind in a grouped program (the last, if several)
    auto last_of = [](const ev::program& p, ev::step_kind kind) {
        std::size_t found = ev::no_step;
        for (std::size_t id = 0; id < p.steps.size(); ++id) {
            if (p.steps[id].kind == kind) found = id;
        }
        REQUIRE(found != ev::no_step);
        return found;
    };
    auto grouped = [](ev::program p) {
        ev::group_epilogues(p);
        return p;
    };

    // gelu(x W + bias): the formula's root takes the product (the add inside it is computed
    // inside it, never alone); nothing else changed
    const ev::program before = lowered(ds::gelu(ds::matmul(t.q, w) + bias));
    const ev::program after = grouped(before);
    const std::size_t product = last_of(after, ev::step_kind::matmul);
    REQUIRE(after.steps.size() == before.steps.size());
    for (std::size_t id = 0; id < after.steps.size(); ++id) {
        ev::step expected = before.steps[id];
        if (id == before.root) expected.epilogue = product;
        CHECK(after.steps[id] == expected);
    }
    const std::string text = ev::to_text(after);
    INFO(text);
    CHECK(text.find("gelu(s") != std::string::npos);
    CHECK(text.find("[epilogue of s" + std::to_string(product) + "] (batch=2, query=5, model=6) float  <- root") != std::string::npos);

    // a formula the planner writes whole inside a kernel's operand, or rounded by cast<bf16>
    // (computed, then rounded; the cast, a formula of its own too): its outermost step takes
    // the product, the steps inside it none
    for (const bool rounded : {false, true}) {
        const ev::program inner = rounded ? grouped(lowered(ds::cast<ds::bf16>(ds::gelu(ds::matmul(t.q, w) + bias))))
                                          : grouped(lowered(ds::softmax(ds::gelu(ds::matmul(t.q, w) + bias))));
        const std::size_t formula = inner.steps[inner.root].operands[0], product = last_of(inner, ev::step_kind::matmul);
        for (std::size_t id = 0; id < inner.steps.size(); ++id) {
            const bool takes_it = id == formula || (rounded && id == inner.root);
            CHECK(inner.steps[id].epilogue == (takes_it ? product : ev::no_step));
        }
    }

    // the product read twice by the formula is still its own
    const ev::program twice = grouped(lowered(ds::matmul(t.q, w) * ds::matmul(t.q, w) + y));
    CHECK(twice.steps[twice.root].epilogue == last_of(twice, ev::step_kind::matmul));

    // not grouped: a product something outside the formula reads too; one of other extents
    // (broadcast into the formula); attention's scores, which the attention kernel computes
    const ev::program shared = grouped(lowered((ds::matmul(t.q, w) + bias) * ds::softmax(ds::matmul(t.q, w))));
    for (const ev::step& s : shared.steps) CHECK(s.epilogue == ev::no_step);
    ds::tensor<float, Query, Head> q2(Query{5});
    const ev::program broadcast = grouped(lowered(ds::matmul(q2, w) + y));
    CHECK(broadcast.steps[broadcast.root].epilogue == ev::no_step);
    ev::program attention = lowered(ds::matmul(ds::softmax(t.scores() * 0.5f + t.mask), t.v));
    ev::recognise_attention(attention);
    ev::group_epilogues(attention);
    for (const ev::step& s : attention.steps) CHECK(s.epilogue == ev::no_step);

    // the planner follows the pass: one gemm with its epilogue; without the pass, none
    CHECK(plan_of(ds::gelu(ds::matmul(t.q, w) + bias)).kinds() == kinds{ev::entry_kind::gemm});
    CHECK(plan_of(ds::gelu(ds::matmul(t.q, w) + bias), {.fuse_epilogues = false}).kinds() ==
          kinds{ev::entry_kind::gemm, ev::entry_kind::fused});
}

TEST_CASE("find_rounded_alone, alone: a value that nothing reads but its cast<bf16> is marked dead once rounded") {
    ds::tensor<float, Batch, Key, Head> a(Batch{2}, Key{7});
    ds::tensor<float, Head, Model> w;
    ds::tensor<ds::bf16, Model, Model> w2;
    auto marked = [](const ev::program& p) {
        std::vector<std::size_t> ids;
        for (std::size_t id = 0; id < p.steps.size(); ++id) {
            if (p.steps[id].rounded_alone) ids.push_back(id);
        }
        return ids;
    };
    auto rounded = [](ev::program p) {
        ev::find_rounded_alone(p);
        return p;
    };

    // the product plus one, read by its cast alone: marked (and printed so); nothing else changed
    const ev::program before = lowered(ds::matmul(ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f), w2));
    const ev::program after = rounded(before);
    REQUIRE(after.steps.size() == before.steps.size());
    const std::vector<std::size_t> ids = marked(after);
    REQUIRE(ids.size() == 1);
    const ev::step& cast = after.steps[after.steps[after.root].operands[0]];
    CHECK(ev::rounds_to_bf16(cast));
    CHECK(ids[0] == cast.operands[0]);
    for (std::size_t id = 0; id < after.steps.size(); ++id) {
        ev::step expected = before.steps[id];
        expected.rounded_alone = id == ids[0];
        CHECK(after.steps[id] == expected);
    }
    CHECK(ev::to_text(after).find("s" + std::to_string(ids[0]) + " = add(") != std::string::npos);
    CHECK(ev::to_text(after).find("[rounded alone]") != std::string::npos);

    // read wide as well (by the sum): not marked; no cast at all: nothing marked
    ds::tensor<float, Batch, Key, Model> y(Batch{2}, Key{7});
    auto x = ds::matmul(a, w) + y;
    CHECK(marked(rounded(lowered(ds::cast<float>(ds::matmul(ds::cast<ds::bf16>(x), w2)) + x))).empty());
    CHECK(marked(rounded(lowered(ds::matmul(x, ds::cast<float>(w2))))).empty());
    // the planner follows the mark: rounded by the product that computes it, into a bf16
    // temporary, the float value kept nowhere (out_unread); read wide too, the float value kept
    const ev::planner_options reads_bf16{.read_bf16 = true};
    const auto alone = plan_of(ds::matmul(ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f), w2), reads_bf16);
    REQUIRE(alone.plan.entries[0].rounded_into);
    CHECK(alone.plan.entries[0].out_unread);
    const auto kept = plan_of(ds::cast<float>(ds::matmul(ds::cast<ds::bf16>(x), w2)) + x, reads_bf16);
    REQUIRE(kept.plan.entries[0].rounded_into);
    CHECK(!kept.plan.entries[0].out_unread);
}

TEST_CASE("the planner fuses what it can and says where each value lives") {
    qkv t;
    ds::tensor<float, Head, Model> w;
    ds::tensor<float, Model> bias;
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});

    // a product with a bias and an activation: one gemm, the rest its epilogue
    auto projected = plan_of(ds::tanh(ds::matmul(t.q, w) + bias));
    CHECK(projected.kinds() == kinds{ev::entry_kind::gemm});
    CHECK(projected.plan.entries[0].epilogue == projected.program.root);
    CHECK(projected.plan.temporaries.empty());
    // without fusion (the reference backend's plan), the product gets a temporary
    auto unfused = plan_of(ds::tanh(ds::matmul(t.q, w) + bias), {false, false});
    CHECK(unfused.kinds() == kinds{ev::entry_kind::gemm, ev::entry_kind::fused});
    CHECK(unfused.plan.temporaries.size() == 1);

    // elementwise: one pass; a transpose written out: a copy; views of tensors: no entry at all
    CHECK(plan_of(ds::exp(y) * 2.0f + y).kinds() == kinds{ev::entry_kind::fused});
    CHECK(plan_of(ds::transpose<Query, Batch>(y)).kinds() == kinds{ev::entry_kind::copy});
    auto view = plan_of(ds::matmul(ds::transpose(t.k), t.v));
    CHECK(view.kinds() == kinds{ev::entry_kind::gemm});
    CHECK(view.plan.temporaries.empty());

    // attention: one entry, no (query, key) temporary; unfused: matmul, softmax, matmul
    auto attention = plan_of(ds::matmul(ds::softmax(t.scores() * 0.5f), t.v));
    CHECK(attention.kinds() == kinds{ev::entry_kind::attention});
    CHECK(attention.plan.temporaries.empty());
    auto steps = plan_of(ds::matmul(ds::softmax(t.scores() * 0.5f), t.v), {false, true});
    CHECK(steps.kinds() == kinds{ev::entry_kind::gemm, ev::entry_kind::rowwise, ev::entry_kind::gemm});

    // a softmax: one rowwise entry straight into the destination
    auto softmax = plan_of(ds::softmax(y));
    CHECK(softmax.kinds() == kinds{ev::entry_kind::rowwise});
    CHECK(softmax.plan.entries[0].out.memory == ev::memory_kind::destination);
}

TEST_CASE("an entry's formula is data: functions, constants, inputs typed and broadcast, the kernel's own value") {
    using node = ev::formula_node;
    using fn_kind = ev::formula_node::kind;
    qkv t;
    ds::tensor<float, Head, Model> w;
    ds::tensor<float, Model> bias;
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});
    auto formula = [](const planned& p, const ev::entry& e) {
        return std::vector<node>(p.plan.nodes.begin() + std::ptrdiff_t(e.first_node),
                                 p.plan.nodes.begin() + std::ptrdiff_t(e.first_node + e.node_count));
    };

    // exp(y) * 2 + bias: y, exp, 2, *, bias (broadcast to rank 3: stride 0 along batch and query), +
    auto pass = plan_of(ds::exp(y) * 2.0f + bias);
    REQUIRE(pass.kinds() == kinds{ev::entry_kind::fused});
    const std::vector<node> nodes = formula(pass, pass.plan.entries[0]);
    REQUIRE(nodes.size() == 6);
    auto place_of = [&](const node& n) { return pass.plan.inputs[n.input]; };
    CHECK(nodes[0].what == fn_kind::input);
    CHECK((place_of(nodes[0]).memory == ev::memory_kind::binding && place_of(nodes[0]).index == 0));
    CHECK(place_of(nodes[0]).where == ev::row_major(3, {2, 5, 6}));
    CHECK((nodes[1].what == fn_kind::function && nodes[1].op == ds::op_code::exp && nodes[1].operand_count == 1));
    CHECK(nodes[1].operands[0] == 0);
    CHECK((nodes[2].what == fn_kind::constant && nodes[2].constant == 2.0));
    CHECK((nodes[3].op == ds::op_code::multiply && nodes[3].operands[0] == 1 && nodes[3].operands[1] == 2));
    CHECK(nodes[4].what == fn_kind::input);
    CHECK(place_of(nodes[4]).index == 1);
    CHECK(place_of(nodes[4]).where == ev::broadcast(ev::row_major(1, {6}), 3));
    CHECK((nodes[5].op == ds::op_code::add && nodes[5].operands[0] == 3 && nodes[5].operands[1] == 4));
    for (const node& n : nodes) CHECK(!n.kernel_value);

    // a value read twice is one node
    auto twice = plan_of(ds::exp(y) * ds::exp(y));
    CHECK(formula(twice, twice.plan.entries[0]).size() == 3);

    // a gemm's epilogue reads the product as the kernel's own value; product + a vector along
    // its columns is a bias the kernels may add themselves, anything else is not
    auto biased = plan_of(ds::matmul(t.q, w) + bias);
    REQUIRE(biased.kinds() == kinds{ev::entry_kind::gemm});
    const ev::entry& gemm = biased.plan.entries[0];
    const std::vector<node> epilogue = formula(biased, gemm);
    REQUIRE(epilogue.size() == 3);
    CHECK(epilogue[0].kernel_value);
    REQUIRE(gemm.bias_node == 1);
    CHECK(biased.plan.inputs[epilogue[1].input].index == 2);  // q, w, bias
    auto swapped = plan_of(bias + ds::matmul(t.q, w));
    CHECK(swapped.plan.entries[0].bias_node == 0);
    CHECK(plan_of(ds::tanh(ds::matmul(t.q, w) + bias)).plan.entries[0].bias_node == ev::no_step);
    CHECK(plan_of(ds::matmul(t.q, w) + y).plan.entries[0].bias_node == ev::no_step);  // a matrix, not one vector
    CHECK(plan_of(ds::matmul(t.q, w) * bias).plan.entries[0].bias_node == ev::no_step);
    CHECK(plan_of(ds::matmul(t.q, w)).plan.entries[0].node_count == 0);

    // attention's score function: the scores are the kernel's own value, the mask an input
    auto masked = plan_of(ds::matmul(ds::softmax(t.scores() * 0.5f + t.mask), t.v));
    REQUIRE(masked.kinds() == kinds{ev::entry_kind::attention});
    std::size_t kernel_values = 0, inputs = 0;
    for (const node& n : formula(masked, masked.plan.entries[0])) {
        kernel_values += n.kernel_value;
        inputs += n.what == fn_kind::input && !n.kernel_value;
    }
    CHECK(kernel_values == 1);
    CHECK(inputs == 1);
    CHECK(masked.plan.entries[0].operand_count == 3);  // Q, K^T, V
    CHECK(masked.plan.entries[0].operands[1].where == ev::permute(ev::row_major(3, {2, 7, 4}), {0, 2, 1}));
}

TEST_CASE("rowwise, gather and indices entries say what they compute, with no step to read") {
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});
    auto normed = plan_of(ds::layer_norm<Query>(y, 1e-3));
    REQUIRE(normed.kinds() == kinds{ev::entry_kind::rowwise});
    CHECK(normed.plan.entries[0].line == ev::line_op::layer_norm);
    CHECK(normed.plan.entries[0].axis == 1);
    CHECK(normed.plan.entries[0].number == Approx(1e-3));  // (the step holds it as the formula had it)
    auto summed = plan_of(ds::sum<Model>(y));
    CHECK(summed.plan.entries[0].line == ev::line_op::sum);
    CHECK(summed.plan.entries[0].axis == 2);
    CHECK(plan_of(ds::mean<Batch>(y)).plan.entries[0].line == ev::line_op::mean);
    CHECK(plan_of(ds::max<Batch>(y)).plan.entries[0].line == ev::line_op::max);
    CHECK(plan_of(ds::softmax<Query>(y)).plan.entries[0].line == ev::line_op::softmax);

    ds::tensor<std::int32_t, Query> ids(Query{5});
    auto gathered = plan_of(ds::gather<Batch>(y, ids));
    REQUIRE(gathered.kinds() == kinds{ev::entry_kind::gather});
    const ev::entry& gather = gathered.plan.entries[0];
    CHECK(gather.axis == 0);
    REQUIRE(gather.operand_count == 2);
    CHECK((gather.operands[0].memory == ev::memory_kind::binding && gather.operands[0].type == ev::element_type::float32));
    CHECK((gather.operands[1].memory == ev::memory_kind::binding && gather.operands[1].type == ev::element_type::int32));

    auto masked = plan_of(ds::masked_fill(ds::tensor<float, Query, Key>(Query{5}, Key{7}), ds::causal_mask(Query{5}, Key{7}), 0.0f));
    REQUIRE(masked.kinds() == kinds{ev::entry_kind::indices, ev::entry_kind::fused});
    CHECK(masked.plan.entries[0].causal);
}

TEST_CASE("a product's batch is folded into its rows in the plan, with everything laid out alongside its result") {
    using Outer = ds::axis<"outer">;
    qkv t;
    ds::tensor<float, Head, Model> w;
    ds::tensor<float, Model> bias;
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});
    ds::tensor<float, Query, Batch, Model> y_across(Query{5}, Batch{2});
    ds::tensor<float, Outer, Batch, Query, Head> x4(Outer{3}, Batch{2}, Query{5});
    auto text_of = [](const planned& p) { return ev::explain(p.program, p.plan, "cpu"); };

    // x W + bias + y: A, C, the bias and y have rows that follow one another, W is one matrix
    // for every item: one product of 10 rows, its epilogue's inputs folded alike
    auto epilogue = plan_of(ds::matmul(t.q, w) + bias + y);
    REQUIRE(epilogue.kinds() == kinds{ev::entry_kind::gemm});
    const ev::entry& gemm = epilogue.plan.entries[0];
    CHECK(gemm.operands[0].where == ev::row_major(2, {10, 4}));
    CHECK(gemm.operands[1].where == ev::row_major(2, {4, 6}));
    CHECK(gemm.out.where == ev::row_major(2, {10, 6}));
    std::vector<ev::layout> inputs;
    for (std::size_t n = gemm.first_node; n < gemm.first_node + gemm.node_count; ++n) {
        const ev::formula_node& node = epilogue.plan.nodes[n];
        if (node.what == ev::formula_node::kind::input && !node.kernel_value) inputs.push_back(epilogue.plan.inputs[node.input].where);
    }
    REQUIRE(inputs.size() == 2);
    CHECK(inputs[0] == ev::layout{2, {10, 6}, {0, 1}, 0});  // the bias: one row for every row
    CHECK(inputs[1] == ev::row_major(2, {10, 6}));
    CHECK(text_of(epilogue).find("[1 batch axis folded into 10 rows]") != std::string::npos);

    // two batch axes at once
    auto deep = plan_of(ds::matmul(x4, w));
    CHECK(deep.plan.entries[0].out.where == ev::row_major(2, {30, 6}));
    CHECK(text_of(deep).find("[2 batch axes folded into 30 rows]") != std::string::npos);

    // not folded: a right operand of its own per item, or an epilogue input whose rows do not
    // follow one another
    auto batched = plan_of(ds::matmul(t.q, ds::transpose(t.k)));
    CHECK(batched.plan.entries[0].out.where == ev::row_major(3, {2, 5, 7}));
    CHECK(text_of(batched).find("folded") == std::string::npos);
    auto across = plan_of(ds::matmul(t.q, w) + ds::transpose<Query, Batch>(y_across));
    REQUIRE(across.kinds() == kinds{ev::entry_kind::gemm});
    CHECK(across.plan.entries[0].out.where == ev::row_major(3, {2, 5, 6}));
    CHECK(across.plan.entries[0].operands[1].where == ev::broadcast(ev::row_major(2, {4, 6}), 3));
}

TEST_CASE("a reshape the layout cannot express is planned as one copy, or none where a kernel writes through it") {
    using Flat = ds::axis<"flat">;
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});
    // (query, batch, model) of a (batch, query, model) tensor, flattened: one copy into a temporary
    auto flattened = plan_of(ds::view<Flat>(ds::transpose<Query, Batch>(y)) + 1.0f);
    CHECK(flattened.kinds() == kinds{ev::entry_kind::copy, ev::entry_kind::fused});
    REQUIRE(flattened.plan.temporaries.size() == 1);
    CHECK(flattened.plan.temporaries[0].size == 60);

    // a product's heads merged back into rows: the product is written through the inverse
    // permutation into the copy, so there is no copy entry at all
    ds::tensor<float, Batch, Key, Head> a(Batch{2}, Key{7});
    ds::tensor<float, Head, Model> w;
    auto merged = plan_of(ds::view<Flat>(ds::transpose<Key, Batch>(ds::matmul(a, w))) + 1.0f);
    CHECK(merged.kinds() == kinds{ev::entry_kind::gemm, ev::entry_kind::fused});
    CHECK(!(merged.plan.entries[0].out.where == ev::row_major(3, {2, 7, 6})));  // written transposed

    // the same at the root: the product written through the inverse permutation into the
    // destination, no temporary; the values those of the reference backend
    ds::fill_uniform(a, 1);
    ds::fill_uniform(w, 2);
    const auto rows = ds::view<Flat>(ds::transpose<Key, Batch>(ds::matmul(a, w)));
    auto at_root = plan_of(rows);
    CHECK(at_root.kinds() == kinds{ev::entry_kind::gemm});
    CHECK(at_root.plan.temporaries.empty());
    const ds::tensor<float, Flat> got = rows;
    test::require_close(got, test::to_xt(ds::eval(rows, ds::backend::reference::evaluator{})), 1e-6, 1e-6);
    // and of an elementwise pass: one fused entry into the destination
    auto passed = plan_of(ds::view<Flat>(ds::transpose<Key, Batch>(ds::exp(a))));
    CHECK(passed.kinds() == kinds{ev::entry_kind::fused});
    CHECK(passed.plan.temporaries.empty());
}

TEST_CASE("cast<bf16> that a product reads gets a bf16 temporary, only where the backend reads bf16") {
    using Rows = ds::axis<"rows">;
    ds::tensor<ds::bf16, Batch, Key, Head> a(Batch{2}, Key{7});
    ds::tensor<ds::bf16, Head, Model> w;
    ds::tensor<ds::bf16, Model, Model> w2;
    const ev::planner_options reads_bf16{.read_bf16 = true};
    auto bf16_temporaries = [](const planned& p) {
        std::size_t n = 0;
        for (const ev::temporary& t : p.plan.temporaries) n += t.type == ev::element_type::bf16;
        return n;
    };

    // computed by a gemm: rounded by it, block by block, into a bf16 temporary of its layout,
    // which the next gemm reads as bf16
    auto projected = plan_of(ds::matmul(ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f), w2), reads_bf16);
    REQUIRE(projected.kinds() == kinds{ev::entry_kind::gemm, ev::entry_kind::gemm});
    const ev::entry& first = projected.plan.entries[0];
    const ev::entry& second = projected.plan.entries[1];
    REQUIRE(first.rounded_into);
    CHECK(first.rounded_into->type == ev::element_type::bf16);
    CHECK(projected.plan.temporaries[first.rounded_into->index].type == ev::element_type::bf16);
    CHECK(projected.plan.temporaries[first.out.index].type == ev::element_type::float32);
    CHECK(first.rounded_into->where == first.out.where);
    CHECK(first.out_unread);  // its float value read by no one: a kernel may write only the bf16
    // every operand where it lies, as bf16: a and w in their bindings, the rounded product in its temporary
    REQUIRE(first.operand_count == 2);
    CHECK((first.operands[0].memory == ev::memory_kind::binding && first.operands[0].index == 0));
    CHECK((first.operands[1].memory == ev::memory_kind::binding && first.operands[1].index == 1));
    CHECK(first.operands[0].type == ev::element_type::bf16);
    // w the same for both batch items, whose rows follow one another: one product of 14 rows
    CHECK(first.operands[1].where == ev::row_major(2, {4, 6}));
    CHECK(first.operands[0].where == ev::row_major(2, {14, 4}));
    CHECK(first.out.where == ev::row_major(2, {14, 6}));
    REQUIRE(second.operand_count == 2);
    CHECK(second.operands[0].memory == ev::memory_kind::temporary);
    CHECK(second.operands[0].index == first.rounded_into->index);
    CHECK(second.operands[0].type == ev::element_type::bf16);
    CHECK((second.operands[1].memory == ev::memory_kind::binding && second.operands[1].type == ev::element_type::bf16));
    CHECK(!second.rounded_into);

    // read as float too: still rounded by its gemm, its float value kept for the other reader
    auto x = ds::matmul(a, w) + 1.0f;
    auto read_twice = plan_of(ds::matmul(ds::cast<ds::bf16>(x), w2) + x, reads_bf16);
    REQUIRE(read_twice.plan.entries.size() >= 2);
    REQUIRE(read_twice.plan.entries[0].rounded_into);
    CHECK(!read_twice.plan.entries[0].out_unread);

    // computed by a pass: the pass writes the bf16 temporary itself, reading a where it lies
    auto passed = plan_of(ds::matmul(ds::cast<ds::bf16>(ds::exp(a)), w), reads_bf16);
    REQUIRE(passed.kinds() == kinds{ev::entry_kind::fused, ev::entry_kind::gemm});
    CHECK(passed.plan.temporaries.size() == 1);  // no float value of exp(a), no widened a
    CHECK(bf16_temporaries(passed) == 1);
    const ev::place& pass_out = passed.plan.entries[0].out;
    CHECK(pass_out.memory == ev::memory_kind::temporary);
    CHECK(pass_out.type == ev::element_type::bf16);
    CHECK(passed.plan.entries[1].operands[0].type == ev::element_type::bf16);
    CHECK(passed.plan.entries[1].operands[0].index == pass_out.index);

    // heads merged back into rows: the rounded values stored transposed, so the reshape is a
    // view of the bf16 temporary and there is no copy
    auto merged = plan_of(ds::matmul(ds::view<Rows, Model>(ds::transpose<Key, Batch>(ds::cast<ds::bf16>(ds::matmul(a, w)))), w2),
                          reads_bf16);
    REQUIRE(merged.kinds() == kinds{ev::entry_kind::gemm, ev::entry_kind::gemm});
    REQUIRE(merged.plan.entries[0].rounded_into);
    CHECK(!(merged.plan.entries[0].out.where == ev::row_major(3, {2, 7, 6})));  // written transposed
    CHECK(merged.plan.entries[1].operands[0].type == ev::element_type::bf16);
    CHECK(merged.plan.entries[1].operands[0].index == merged.plan.entries[0].rounded_into->index);

    // read by no product, or planned for a backend that reads no bf16 (the reference's): the
    // cast is an elementwise step like any other
    auto alone = plan_of(ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f), reads_bf16);
    CHECK(alone.kinds() == kinds{ev::entry_kind::gemm});
    CHECK(bf16_temporaries(alone) == 0);
    auto reference = plan_of(ds::matmul(ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f), w2), {false, false});
    for (const ev::entry& e : reference.plan.entries) {
        CHECK(e.kind != ev::entry_kind::narrow);
        if (e.kind == ev::entry_kind::convert) continue;  // reads a binding of bf16, into float
        for (std::size_t o = 0; o < e.operand_count; ++o) CHECK(e.operands[o].type == ev::element_type::float32);
    }
    CHECK(bf16_temporaries(reference) == 0);
}

TEST_CASE("a cast<bf16> rounded into memory already is read there by a later formula, not computed again with its product") {
    ds::tensor<ds::bf16, Batch, Key, Head> a(Batch{3}, Key{5});
    ds::tensor<ds::bf16, Head, Model> w;
    ds::tensor<ds::bf16, Model, Model> w2;
    ds::tensor<float, Batch, Key, Model> weights(Batch{3}, Key{5});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(w, 2);
    ds::fill_uniform(w2, 3);
    ds::fill_uniform(weights, 4);
    // q is read by a product (so rounded into a bf16 temporary by the gemm that computes
    // a w + 1, whose float value nothing else reads: dead once rounded), then, in the second
    // sum's formula, planned after the first's, as a value
    auto q = ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f);
    auto f = ds::sum<Batch>(ds::sum<Key>(ds::sum<Model>(ds::cast<float>(ds::matmul(q, w2)) * weights))) +
             ds::sum<Batch>(ds::sum<Key>(ds::sum<Model>(ds::cast<float>(q) * ds::cast<float>(q))));
    const planned cpu = plan_of(f, {.read_bf16 = true});
    INFO(ev::explain(cpu.program, cpu.plan, "cpu"));
    std::size_t gemms = 0;
    for (const ev::entry& e : cpu.plan.entries) gemms += e.kind == ev::entry_kind::gemm;
    CHECK(gemms == 2);  // a w once (rounded into q's temporary), q w2
    const ev::entry& first = cpu.plan.entries[0];
    REQUIRE(first.rounded_into);
    bool squares_read_q = false;  // the second formula's input: q's bf16 temporary
    for (const ev::place& in : cpu.plan.inputs) {
        squares_read_q |= in.memory == ev::memory_kind::temporary && in.index == first.rounded_into->index &&
                          in.type == ev::element_type::bf16;
    }
    CHECK(squares_read_q);
    // and the same value as the reference backend's, which computes q once as a formula
    const double on_cpu = ds::eval(f).data()[0];
    const double on_reference = ds::eval(f, ds::backend::reference::evaluator{}).data()[0];
    CHECK(on_cpu == Approx(on_reference).epsilon(1e-5));
}

TEST_CASE("a destination of bf16 is rounded into by the kernel that computes the value, or by a last narrow entry") {
    using kinds = std::vector<ev::entry_kind>;
    ds::tensor<ds::bf16, Batch, Key, Head> a(Batch{2}, Key{7});
    ds::tensor<ds::bf16, Head, Model> w;
    const ev::planner_options reads_bf16{.read_bf16 = true};
    const ev::place out{ev::memory_kind::destination, 0, ev::row_major(3, {2, 7, 6}), ev::element_type::bf16};
    const ev::layout rows_of_out = ev::row_major(2, {14, 6});  // a product's batch folded into its rows
    const ev::element_type bf16 = ev::element_type::bf16;
    auto is_out = [&](const ev::place& p) {
        return p.memory == out.memory && (p.where == out.where || p.where == rows_of_out);
    };

    // a product: rounded into the destination block by block, its float value in a temporary
    // of the destination's layout; no narrow entry
    auto product = plan_of(ds::matmul(a, w) + 1.0f, reads_bf16, out.where, bf16);
    CHECK(product.plan.destination_type == bf16);
    REQUIRE(product.kinds() == kinds{ev::entry_kind::gemm});
    const ev::entry& gemm = product.plan.entries[0];
    CHECK(gemm.out.memory == ev::memory_kind::temporary);
    CHECK(gemm.out.where == rows_of_out);
    REQUIRE(gemm.rounded_into);
    CHECK(is_out(*gemm.rounded_into));
    CHECK(gemm.rounded_into->type == bf16);
    CHECK(gemm.out_unread);
    CHECK(product.plan.temporaries.size() == 1);  // the float value only
    CHECK(product.plan.temporaries[0].type == ev::element_type::float32);

    // cast<bf16> at the root rounds nothing more: the same plan
    auto cast = plan_of(ds::cast<ds::bf16>(ds::matmul(a, w) + 1.0f), reads_bf16, out.where, bf16);
    REQUIRE(cast.kinds() == kinds{ev::entry_kind::gemm});
    REQUIRE(cast.plan.entries[0].rounded_into);
    CHECK(is_out(*cast.plan.entries[0].rounded_into));

    // a pass, or a kernel along an axis, writes the destination itself, reading a where it lies
    auto passed = plan_of(ds::exp(a), reads_bf16, out.where, bf16);
    REQUIRE(passed.kinds() == kinds{ev::entry_kind::fused});
    CHECK(is_out(passed.plan.entries[0].out));
    CHECK(passed.plan.entries[0].out.type == bf16);
    CHECK(passed.plan.temporaries.empty());
    auto lines = plan_of(ds::softmax<Head>(a), reads_bf16, ev::row_major(3, {2, 7, 4}), bf16);
    REQUIRE(lines.kinds() == kinds{ev::entry_kind::rowwise});
    CHECK(lines.plan.entries[0].out.memory == ev::memory_kind::destination);
    REQUIRE(lines.plan.entries[0].operand_count == 1);
    CHECK(lines.plan.entries[0].operands[0].memory == ev::memory_kind::binding);
    CHECK(lines.plan.entries[0].operands[0].type == bf16);
    CHECK(lines.plan.temporaries.empty());

    // any other entry: a narrow entry into the destination after it
    auto joined = plan_of(ds::concat<Key>(a, a), reads_bf16, ev::row_major(3, {2, 14, 4}), bf16);
    REQUIRE(joined.kinds() == kinds{ev::entry_kind::copy, ev::entry_kind::copy, ev::entry_kind::narrow});
    const ev::entry& narrow = joined.plan.entries[2];
    CHECK(narrow.out.memory == ev::memory_kind::destination);
    CHECK(narrow.out.type == bf16);
    REQUIRE(narrow.operand_count == 1);  // the float value the copies wrote
    CHECK(narrow.operands[0].memory == joined.plan.entries[0].out.memory);
    CHECK(narrow.operands[0].index == joined.plan.entries[0].out.index);
    CHECK(narrow.operands[0].type == ev::element_type::float32);

    // a product into a destination of another dense order (transposed) is rounded into it as
    // well, its float value laid out alike; into one with gaps (a slice), the value in
    // row-major order, then a narrow entry
    const ev::layout transposed = ev::permute(ev::row_major(3, {7, 2, 6}), {1, 0, 2});
    auto swapped = plan_of(ds::matmul(a, w), reads_bf16, transposed, bf16);
    REQUIRE(swapped.kinds() == kinds{ev::entry_kind::gemm});
    REQUIRE(swapped.plan.entries[0].rounded_into);
    CHECK(swapped.plan.entries[0].out.where == transposed);
    const ev::layout gapped = ev::slice(ev::row_major(3, {2, 9, 6}), 1, 0, 7, 1);
    auto strided = plan_of(ds::matmul(a, w), reads_bf16, gapped, bf16);
    REQUIRE(strided.kinds() == kinds{ev::entry_kind::gemm, ev::entry_kind::narrow});
    CHECK(!strided.plan.entries[0].rounded_into);
    CHECK(strided.plan.entries[0].out.where == rows_of_out);
    CHECK(strided.plan.entries[1].out.where == gapped);

    // only where the backend's kernels write bf16
    CHECK_THROWS_AS(plan_of(ds::exp(a), {}, out.where, bf16), std::logic_error);
}

TEST_CASE("the same tensor read twice is one binding") {
    ds::tensor<float, Batch, Query, Model> y(Batch{2}, Query{5});
    planned p = plan_of(y * y + ds::exp(y));
    CHECK(p.bindings.size() == 1);
    CHECK(p.program.binding_count == 1);
}

TEST_CASE("a sub-formula used more than once is one step, computed once") {
    using Out = ds::axis<"out", 3>;
    ds::tensor<float, Batch, Query, Model> x(Batch{2}, Query{5});
    ds::tensor<float, Model, Out> w;
    ds::fill_uniform(x, 5);
    ds::fill_uniform(w, 6);
    auto h = ds::tanh(ds::matmul(x, w));
    planned p = plan_of(h * h + h);
    CHECK(p.program.steps.size() == 6);  // x, w, matmul, tanh, multiply, add
    CHECK(p.kinds() == kinds{ev::entry_kind::gemm});  // one product, tanh once in its epilogue
    auto want = test::to_xt(ds::eval(h));
    want = want * want + want;
    test::require_close(ds::eval(h * h + h), want, 1e-6, 1e-7);
    test::require_close(ds::eval(h * h + h, ds::backend::reference::evaluator{}), want, 1e-6, 1e-7);

    // a product read by a formula and by something else too is computed once, into a
    // temporary, not fused into the formula's epilogue and computed again
    auto product = ds::matmul(x, w);
    CHECK(plan_of(ds::softmax(product) + product).kinds() ==
          kinds{ev::entry_kind::gemm, ev::entry_kind::rowwise, ev::entry_kind::fused});
    auto y = test::to_xt(ds::eval(product)), s = test::to_xt(ds::eval(ds::softmax(product)));
    test::require_close(ds::eval(ds::softmax(product) + product), s + y, 1e-6, 1e-7);

    // a shared row-wise value and a shared attention are computed once too
    CHECK(plan_of(ds::softmax(x) * ds::softmax(x) + ds::exp(ds::softmax(x))).kinds() ==
          kinds{ev::entry_kind::rowwise, ev::entry_kind::fused});
    qkv t;
    ds::fill_uniform(t.q, 7);
    ds::fill_uniform(t.k, 8);
    ds::fill_uniform(t.v, 9);
    auto attention = ds::matmul(ds::softmax(t.scores() * 0.5f), t.v);
    CHECK(plan_of(attention * attention).kinds() == kinds{ev::entry_kind::attention, ev::entry_kind::fused});
    auto z = test::to_xt(ds::eval(attention));
    test::require_close(ds::eval(attention * attention), z * z, 1e-6, 1e-7);
    // the same operations over different tensors stay apart
    ds::tensor<float, Batch, Query, Model> other = x;
    CHECK(plan_of(ds::softmax(x) + ds::softmax(other)).kinds() ==
          kinds{ev::entry_kind::rowwise, ev::entry_kind::rowwise, ev::entry_kind::fused});
}

TEST_CASE("plans run by both backends agree with each other on odd sizes") {
    for (std::size_t keys : test::odd_sizes) {
        qkv t;
        t.k = ds::tensor<float, Batch, Key, Head>(Batch{2}, Key{keys});
        t.v = ds::tensor<float, Batch, Key, Head>(Batch{2}, Key{keys});
        t.mask = ds::tensor<float, Query, Key>(Query{5}, Key{keys});
        ds::fill_uniform(t.q, 1);
        ds::fill_uniform(t.k, 2);
        ds::fill_uniform(t.v, 3);
        ds::fill_uniform(t.mask, 4);
        auto f = ds::matmul(ds::softmax(t.scores() * 0.5f + t.mask), t.v);
        auto fast = ds::eval(f);
        auto slow = ds::eval(f, ds::backend::reference::evaluator{});
        test::require_close(fast, test::to_xt(slow), 1e-5, 1e-5);
    }
}

TEST_CASE("a gradient's plan computes each product once, and a shared weight's gradient in one product") {
    ds::tensor<float, Batch, Query, Head> x(Batch{2}, Query{5}), target(Batch{2}, Query{5});
    ds::tensor<float, Head, Model> w_1;
    ds::tensor<float, Model> b_1;
    ds::tensor<float, Model, Head> w_2;
    ds::fill_uniform(x, 1);
    ds::fill_uniform(target, 2);
    ds::fill_uniform(w_1, 3);
    ds::fill_uniform(b_1, 4);
    ds::fill_uniform(w_2, 5);
    auto check = [&](const auto& loss) {
        const auto gradient = ds::grad(loss, w_1);
        const planned p = plan_of(gradient);
        std::vector<std::size_t> products;
        for (const ev::entry& e : p.plan.entries) {
            if (e.kind != ev::entry_kind::gemm) continue;
            INFO(ev::explain(p.program, p.plan, "cpu"));
            CHECK(std::find(products.begin(), products.end(), e.step) == products.end());
            products.push_back(e.step);
        }
        // dW_1 = x^T dU over the rows of both batches: one product, no sum over the batch after it
        CHECK(p.plan.entries.back().kind == ev::entry_kind::gemm);
        CHECK(p.plan.entries.back().out.where.rank == 2);
        test::require_close(ds::eval(gradient), test::to_xt(ds::eval(gradient, ds::backend::reference::evaluator{})), 1e-5, 1e-5);
    };
    // gelu(x W_1 + b_1) in the forward, gelu' of the same sum in the backward: the sum is
    // read by two formulas, so neither gemm takes the product x W_1 as its epilogue's, and it
    // is computed once
    check(ds::nn::mean_squared_error(ds::matmul(ds::gelu(ds::matmul(x, w_1) + b_1), w_2), target));
    // layer_norm(x W_1 + b_1): the backward reads the sum's mean and (sum - mean)^2, formulas
    // that read the sum where the forward's gemm wrote it, not a product of their own
    check(ds::nn::mean_squared_error(ds::matmul(ds::layer_norm(ds::matmul(x, w_1) + b_1, 1e-5), w_2), target));
}

// The README shows this plan: the test keeps the two the same.
TEST_CASE("explain prints the README's attention plan") {
    using namespace mha;
    activations x(Batch{2}, Seq{10});
    weight w_q, w_k, w_v, w_o;
    auto q = split_heads(ds::matmul(x, w_q));
    auto k = split_heads(ds::matmul(x, w_k));
    auto v = split_heads(ds::matmul(x, w_v));
    const std::string text = ds::explain(ds::matmul(merge_heads(attention(q, k, v)), w_o));
    INFO(text);

    std::ifstream readme(DIMSUM_SOURCE_DIR "/README.md");
    REQUIRE(readme);
    std::stringstream contents;
    contents << readme.rdbuf();
    const std::string marker = "<!-- explain: tests/evaluation/test_plan.cpp -->\n```text\n";
    const std::string all = contents.str();
    const auto begin = all.find(marker);
    REQUIRE(begin != std::string::npos);
    const auto end = all.find("```", begin + marker.size());
    REQUIRE(end != std::string::npos);
    CHECK(all.substr(begin + marker.size(), end - begin - marker.size()) == text);

    // and what the README says of it
    CHECK(text.find("attention ") != std::string::npos);
    CHECK(text.find("[fused: no (queries, keys) matrix]") != std::string::npos);
}
