// dimsum_bench's training_step rows: one training step of a layer, the BERT-base encoder layer
// (as torch.nn.TransformerEncoderLayer) and a Llama-style decoder layer: the forward, the mean
// squared error against a target, the gradients of every weight and of the input
// (ds::backward: one program), and an AdamW step, against the same step in PyTorch
// (scripts/training_step_torch.py) at its best of 1 and 2 threads. In float, and in mixed
// precision (the bf16_ rows): the layer's weights and input in bf16, each product's activation
// rounded to bf16 (product_operand) and each gradient product's cotangent too
// (gradient_options::bf16_products), its gradients and AdamW's parameters in float; against
// PyTorch's autocast to bf16 over float parameters, which rounds the same operands.

#include <dimsum/dimsum.hpp>

#include <boost/hana/define_struct.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bench.hpp"

namespace dimsum_bench {

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;

// Each tensor of a layer's weights uniform in [-bound, bound], a seed each.
template <class Weights>
void fill_uniform_each(Weights& p, double bound) {
    std::uint64_t seed = 1;
    boost::hana::for_each(boost::hana::accessors<Weights>(), [&](auto member) {
        ds::fill_uniform(boost::hana::second(member)(p), seed++, -bound, bound);
    });
}

// The value of a layer's formula in float: as it is, or widened from bf16.
template <class F>
auto in_float(F&& f) {
    if constexpr (std::is_same_v<ds::value_type_of<F>, float>) return std::forward<F>(f);
    else return ds::cast<float>(std::forward<F>(f));
}

// What a product reads of an activation (a value the layer computed): in mixed precision the
// activation rounded to bf16, as PyTorch's autocast rounds a linear layer's input and the
// operands of attention's products (the queries, keys and values), so that the product
// multiplies two bf16 operands; in float, the activation itself.
template <class T, class F>
auto product_operand(F&& f) {
    if constexpr (std::is_same_v<T, ds::bf16>) return ds::cast<ds::bf16>(std::forward<F>(f));
    else return std::forward<F>(f);
}

// BERT-base's encoder layer (torch.nn.TransformerEncoderLayer: post-norm, GELU), of T.
template <class T>
struct bert {
    using Model = ds::axis<"model", 768>;
    using Heads = ds::axis<"heads", 12>;
    using Head = ds::axis<"head", 64>;
    using Inner = ds::axis<"heads*head", 768>;
    using Hidden = ds::axis<"hidden", 3072>;
    static constexpr const char* name = "bert_layer";

    // The weights, as PyTorch's module holds them (its in_proj split into the query, key and
    // value blocks).
    struct weights {
        BOOST_HANA_DEFINE_STRUCT(weights,
            (ds::tensor<T, Model, Inner>, w_q), (ds::tensor<T, Inner>, b_q),
            (ds::tensor<T, Model, Inner>, w_k), (ds::tensor<T, Inner>, b_k),
            (ds::tensor<T, Model, Inner>, w_v), (ds::tensor<T, Inner>, b_v),
            (ds::tensor<T, Inner, Model>, w_o), (ds::tensor<T, Model>, b_o),
            (ds::tensor<T, Model>, ln1_weight), (ds::tensor<T, Model>, ln1_bias),
            (ds::tensor<T, Model, Hidden>, w_1), (ds::tensor<T, Hidden>, b_1),
            (ds::tensor<T, Hidden, Model>, w_2), (ds::tensor<T, Model>, b_2),
            (ds::tensor<T, Model>, ln2_weight), (ds::tensor<T, Model>, ln2_bias));
    };

    explicit bert(std::size_t) {}
    weights new_weights() const {
        weights p;
        fill_uniform_each(p, 1.0 / std::sqrt(768.0));  // as torch.nn.Linear
        for (auto* norm : {&p.ln1_weight, &p.ln2_weight}) norm->fill(T(1));
        for (auto* norm : {&p.ln1_bias, &p.ln2_bias}) norm->fill(T(0));
        return p;
    }
    // (batch, seq, heads x head) -> (batch, heads, seq, head)
    static auto heads_of(auto&& a) {
        return ds::permute<Batch, Heads, Seq, Head>(ds::view<Batch, Seq, Heads, Head>(std::forward<decltype(a)>(a)));
    }
    // h = layer_norm(x + attention(x)), then layer_norm(h + FFN(h)): one formula (the FFN is
    // nn::gelu_feed_forward, which rounds what its products read as product_operand does)
    auto formula(const weights& p, const ds::tensor<T, Batch, Seq, Model>& x) const {
        auto q = heads_of(product_operand<T>(ds::matmul(x, p.w_q) + p.b_q));  // (attention's products read them)
        auto k = heads_of(product_operand<T>(ds::matmul(x, p.w_k) + p.b_k));
        auto v = heads_of(product_operand<T>(ds::matmul(x, p.w_v) + p.b_v));
        auto z = ds::view<Batch, Seq, Inner>(ds::permute<Batch, Seq, Heads, Head>(product_operand<T>(ds::nn::attention(q, k, v))));
        auto h = ds::nn::layer_norm(x + (ds::matmul(z, p.w_o) + p.b_o), p.ln1_weight, p.ln1_bias, 1e-12);
        return ds::nn::layer_norm(h + ds::nn::gelu_feed_forward(h, p.w_1, p.b_1, p.w_2, p.b_2), p.ln2_weight, p.ln2_bias, 1e-12);
    }
    static double forward_flops(double batch, double seq) {
        return 2.0 * batch * seq * 768.0 * (4.0 * 768.0 + 2.0 * 3072.0) + 2.0 * 2.0 * batch * 12.0 * seq * seq * 64.0;
    }
};

// A Llama-style decoder layer of dimsum_bench's `small` decoder (decoder.cpp): pre-norm,
// RMSNorm, rotary embedding (half split), grouped-query causal attention (8 query heads
// over 2 key/value heads of 64), SwiGLU of 1408; of T.
template <class T>
struct decoder {
    using Model = ds::axis<"model", 512>;
    using KvHeads = ds::axis<"kv_heads", 2>;
    using Group = ds::axis<"group", 4>;     // query heads per key/value head
    using OneGroup = ds::axis<"group", 1>;  // keys and values, broadcast over the group
    using Head = ds::axis<"head", 64>;
    using Inner = ds::axis<"heads*head", 512>;
    using KvInner = ds::axis<"kv_heads*head", 128>;
    using Hidden = ds::axis<"hidden", 1408>;
    static constexpr const char* name = "decoder_layer";

    struct weights {
        BOOST_HANA_DEFINE_STRUCT(weights,
            (ds::tensor<T, Model>, attention_norm),
            (ds::tensor<T, Model, Inner>, w_q),
            (ds::tensor<T, Model, KvInner>, w_k),
            (ds::tensor<T, Model, KvInner>, w_v),
            (ds::tensor<T, Inner, Model>, w_o),
            (ds::tensor<T, Model>, ffn_norm),
            (ds::tensor<T, Model, Hidden>, w_1),
            (ds::tensor<T, Model, Hidden>, w_3),
            (ds::tensor<T, Hidden, Model>, w_2));
    };

    ds::nn::rotary<T, Seq, Head> rope;
    explicit decoder(std::size_t seq) : rope(seq) {}
    weights new_weights() const {
        weights p;
        fill_uniform_each(p, 1.0 / std::sqrt(512.0));
        p.attention_norm.fill(T(1));
        p.ffn_norm.fill(T(1));
        return p;
    }
    // x + attention(rms_norm(x)), then + SwiGLU(rms_norm(.)): one formula
    // (nn::swiglu rounds what its products read as product_operand does)
    auto formula(const weights& p, const ds::tensor<T, Batch, Seq, Model>& x) const {
        auto h = product_operand<T>(ds::nn::rms_norm(x, p.attention_norm, 1e-5));
        auto q = product_operand<T>(rope(ds::permute<Batch, KvHeads, Group, Seq, Head>(ds::view<Batch, Seq, KvHeads, Group, Head>(ds::matmul(h, p.w_q)))));
        auto k = product_operand<T>(rope(ds::permute<Batch, KvHeads, OneGroup, Seq, Head>(ds::view<Batch, Seq, KvHeads, OneGroup, Head>(ds::matmul(h, p.w_k)))));
        auto v = product_operand<T>(ds::permute<Batch, KvHeads, OneGroup, Seq, Head>(ds::view<Batch, Seq, KvHeads, OneGroup, Head>(ds::matmul(h, p.w_v))));
        auto z = product_operand<T>(ds::nn::causal_attention(q, k, v));  // (batch, kv_heads, group, seq, head)
        auto r = x + ds::matmul(ds::view<Batch, Seq, Inner>(ds::permute<Batch, Seq, KvHeads, Group, Head>(z)), p.w_o);
        return r + ds::nn::swiglu(ds::nn::rms_norm(r, p.ffn_norm, 1e-5), p.w_1, p.w_3, p.w_2);
    }
    // the projections (query 512, key and value 128 each, output 512), SwiGLU's three, and
    // the attention's two products over the half of the plane the causal mask leaves
    static double forward_flops(double batch, double seq) {
        return 2.0 * batch * seq * 512.0 * (512.0 + 2.0 * 128.0 + 512.0 + 3.0 * 1408.0) + 2.0 * 2.0 * batch * 8.0 * seq * seq * 64.0 / 2.0;
    }
};

// One layer's training problem: its weights, their gradients and AdamW's state, an input and
// a target. Of bf16 (Layer<ds::bf16>): the weights and the input in bf16, rounded from float
// parameters (`master`) that AdamW steps; the gradients in float.
template <template <class> class Layer, class T>
struct training_problem {
    static constexpr bool mixed = std::is_same_v<T, ds::bf16>;
    using Model = typename Layer<T>::Model;
    using float_weights = typename Layer<float>::weights;
    struct none {};
    Layer<T> layer;
    typename Layer<T>::weights params;
    std::conditional_t<mixed, float_weights, none> master;  // the float parameters (mixed only)
    float_weights grads;
    ds::tensor<T, Batch, Seq, Model> x;
    ds::tensor<float, Batch, Seq, Model> target, dx;
    ds::nn::adamw<float_weights> optimizer;

    training_problem(std::size_t batch, std::size_t seq)
        : layer(seq), params(layer.new_weights()), master(master_of(seq)), grads(stepped()), x(Batch{batch}, Seq{seq}),
          target(Batch{batch}, Seq{seq}), dx(target.shape()), optimizer(stepped(), {.learning_rate = 1e-4}) {
        if constexpr (mixed) {
            ds::nn::sgd<float_weights>(master, {.learning_rate = 0}).step(master, grads, params);  // params := master rounded
            ds::tensor<float, Batch, Seq, Model> x32(x.shape());
            ds::fill_normal(x32, 100);
            x = ds::cast<ds::bf16>(x32);
        } else {
            ds::fill_normal(x, 100);
        }
        ds::fill_normal(target, 101);
    }
    static auto master_of(std::size_t seq) {
        if constexpr (mixed) return Layer<float>(seq).new_weights();
        else return none{};
    }
    // the float parameters AdamW steps: the master copy, or the parameters themselves
    float_weights& stepped() {
        if constexpr (mixed) return master;
        else return params;
    }
    auto loss() const { return ds::nn::mean_squared_error(in_float(layer.formula(params, x)), target); }
    // one step: the loss, every gradient, and AdamW
    // in mixed precision, the backward's products on bf16 operands too, as autocast's
    static constexpr ds::gradient_options how{.bf16_products = mixed};
    void step() {
        ds::backward(loss(), std::tie(x, params), std::tie(dx, grads), how);
        if constexpr (mixed) optimizer.step(master, grads, params);
        else optimizer.step(params, grads);
    }
    // The largest difference between the gradients of the planned program and those of the
    // same program with attention step by step, relative to the largest gradient of all (one
    // scale: the key bias's gradient is zero but for rounding, as softmax ignores a constant
    // added to every score of a query); the weights are not stepped.
    double error_against_unfused() {
        ds::backward(loss(), std::tie(x, params), std::tie(dx, grads), how);
        const float_weights fused = grads;
        const auto fused_dx = dx;
        ds::backward(loss(), std::tie(x, params), std::tie(dx, grads), how, ds::backend::cpu::evaluator{.fuse_attention = false});
        double error = 0, largest = 0;
        auto compare = [&](const float* got, const float* want, std::size_t n) {
            for (std::size_t i = 0; i < n; ++i) {
                const double difference = std::abs(double(got[i]) - double(want[i]));
                error = std::isnan(difference) ? INFINITY : std::max(error, difference);
                largest = std::max(largest, double(std::abs(want[i])));
            }
        };
        compare(fused_dx.data(), dx.data(), dx.size());
        boost::hana::for_each(boost::hana::accessors<float_weights>(), [&](auto member) {
            const auto& want = boost::hana::second(member)(grads);
            compare(boost::hana::second(member)(fused).data(), want.data(), want.size());
        });
        return error / std::max(largest, 1e-30);
    }
};

// The time of one step: the mean over a batch of steps lasting at least a second (one step
// with --quick), after two steps to warm up. A step takes a fifth of a second: the 0.2 s
// batches of the other rows would time one step, and PyTorch's steps vary more than dimsum's
// (its allocator), so both sides time batches of a second, PyTorch the best of three per turn.
template <class Problem>
double step_seconds(const options& opt, Problem& problem) {
    problem.step();
    problem.step();
    auto start = clock_type::now();
    int calls = 0;
    double spent = 0;
    do {
        problem.step();
        ++calls;
        spent = std::chrono::duration<double>(clock_type::now() - start).count();
    } while (!opt.quick && spent < 1.0);
    return spent / calls;
}

// One training step of a layer, batch 8 x seq 128, against PyTorch. GFLOP/s count the products
// a step needs: the forward's, and twice those for the backward; the peak is the float FMA
// peak, or in mixed precision that of the bf16 instructions the products run on (case_peak).
template <template <class> class Layer, class T>
void bench_training_step_of(bench& s) {
    constexpr bool mixed = std::is_same_v<T, ds::bf16>;
    const std::size_t batch = s.opt.small ? 2 : 8, seq = s.opt.small ? 16 : 128;
    const std::string name = std::string(mixed ? "bf16_" : "") + "training_step_" + Layer<T>::name + "_" + std::to_string(batch) + "x" +
                             std::to_string(seq);
    if (!s.selected(name)) return;
    const double flops = 3.0 * Layer<T>::forward_flops(double(batch), double(seq));
    training_problem<Layer, T> problem(batch, seq);
    // in bf16, the fused and unfused attentions round different float sums to bf16
    s.out.check(name + ": against the gradients unfused", problem.error_against_unfused(), mixed ? 1e-2 : 1e-4);
    std::vector<double> seconds(s.opt.threads.size(), std::numeric_limits<double>::infinity());
    std::string why = s.opt.small ? "--small" : "";
    double torch_ms = NAN;
    int torch_threads = 0;
    for (int turn = 0; turn < rounds(s.opt); ++turn) {
        for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
            ds::set_num_threads(s.opt.threads[t]);
            settle(s.opt);
            seconds[t] = std::min(seconds[t], step_seconds(s.opt, problem));
        }
        if (s.opt.small || (turn > 0 && !(torch_ms > 0))) continue;
        const std::string arguments = std::string("'" DIMSUM_TRAINING_STEP_TORCH_SCRIPT "' --rounds=3 --min-time=1 --threads=") + thread_list(s.opt) +
                                      (s.opt.quick ? " --quick" : "") + " --case " + name + ":" + Layer<T>::name + "," +
                                      std::to_string(batch) + "," + std::to_string(seq) + (mixed ? ",bf16" : "");
        read_torch_script(arguments, "torch_training_step", why, [&](const char* line) {
            char row[128];
            int threads;
            double ms;
            if (std::sscanf(line, "torch_training_step_best,%127[^,],%d,%lf", row, &threads, &ms) == 3 && !(ms >= torch_ms)) {
                torch_ms = ms;
                torch_threads = threads;
            }
        });
    }
    if (!(torch_ms > 0)) std::fprintf(s.out.table, "skipped: pytorch: %s; %s is compared with the FMA peak only\n", why.c_str(), name.c_str());
    const std::string how = std::string(mixed ? "autocast to bf16, " : "") + "autograd, AdamW on " + std::to_string(torch_threads) +
                            (torch_threads == 1 ? " thread" : " threads");
    for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
        const double gflops = flops / seconds[t] * 1e-9;
        const peak_of_case peak = case_peak(s.limits, mixed, t);
        std::fprintf(s.out.table, "%-40s %7d %9.2f %8.1f %5.0f%%  %9.2f %-12s %7.2f\n", s.out.row_name(name).c_str(), s.opt.threads[t],
                     seconds[t] * 1e3, gflops, 100.0 * gflops / peak.gflops, torch_ms,
                     torch_ms > 0 ? std::to_string(torch_threads).c_str() : "-", torch_ms * 1e-3 / seconds[t]);
        if (s.out.csv) {
            auto csv_row = [&](const char* baseline, double theirs, const std::string& what) {
                std::fprintf(s.out.csv, "%s,%d,%.6g,%s,%.6g,%.6g,GFLOP/s,%s\n", s.out.row_name(name).c_str(), s.opt.threads[t], gflops,
                             baseline, theirs, gflops / theirs, what.c_str());
            };
            if (torch_ms > 0) csv_row("pytorch", flops / torch_ms * 1e-6, how);
            csv_row(peak.name, peak.gflops, peak.how);
        }
    }
    std::fflush(s.out.table);
}

}  // namespace

// One training step (forward, loss, backward, AdamW) of the BERT-base layer and of a decoder
// layer, in float, then in mixed precision.
void bench_training_step(bench& s) {
    std::fprintf(s.out.table, "\n%-40s %7s %9s %8s %6s  %9s %-12s %7s\n", "training step (forward, backward, AdamW)", "threads", "ms",
                 "GFLOP/s", "peak", "torch ms", "torch ran as", "speedup");
    bench_training_step_of<bert, float>(s);
    bench_training_step_of<decoder, float>(s);
    bench_training_step_of<bert, ds::bf16>(s);
    bench_training_step_of<decoder, ds::bf16>(s);
}

}  // namespace dimsum_bench
