// dimsum_bench's attention cases: one multi-head attention layer forward (fused QKV
// projection with biases, attention, output projection with bias) against PyTorch at its
// best: the faster of torch.nn.MultiheadAttention and a hand-written version, of 1 and 2
// threads (scripts/attention_torch.py, run by /usr/bin/python3). Each case also runs in bf16
// (`bf16_attention_` rows: weights, input and KV cache in bf16, against the PyTorch module
// moved to torch.bfloat16). Then the memory the layer and causal attention alone need,
// against sequence length. Then attention's fused backward: causal attention of given Q, K
// and V, forward and backward, against PyTorch's autograd (scripts/attention_backward_torch.py).

#include <unistd.h>

#include <dimsum/dimsum.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"

namespace dimsum_bench {

namespace ds = dimsum;

namespace {

using B = ds::axis<"batch">;

struct attention_case {
    std::string name;
    std::size_t batch, seq, model, heads;
    enum class kind { plain, causal, decode } what = kind::plain;  // decode: one query, `seq` cached keys
    bool bf16 = false;  // weights, input, output (and a decoding step's KV cache) in bf16

    std::size_t head() const { return model / heads; }
    // "batch,seq,model,heads[,causal|decode][,bf16]", as attention_torch.py and --attention-memory read it
    std::string spec() const {
        std::string s = std::to_string(batch) + "," + std::to_string(seq) + "," + std::to_string(model) + "," +
                        std::to_string(heads);
        if (what == kind::causal) s += ",causal";
        if (what == kind::decode) s += ",decode";
        if (bf16) s += ",bf16";
        return s;
    }
    // The work that must be done: the projections, then Q K^T and P V, of which a causal
    // mask leaves half.
    double flops() const {
        double b = double(batch), s = double(seq), m = double(model), products = 4.0 * b * double(heads) * double(head());
        if (what == kind::decode) return 2.0 * b * m * m * 2.0 + products * s;  // q and output projections of one token
        return 2.0 * b * s * m * m * 4.0 + products * s * s * (what == kind::causal ? 0.5 : 1.0);
    }
};

std::optional<attention_case> parse_attention_case(const std::string& spec) {
    attention_case c;
    char rest[32] = "";
    int fields = std::sscanf(spec.c_str(), "%zu,%zu,%zu,%zu,%31s", &c.batch, &c.seq, &c.model, &c.heads, rest);
    if (fields < 4 || c.heads == 0 || c.model % c.heads != 0) return std::nullopt;
    std::string m = fields == 5 ? rest : "";
    if (m == "bf16" || m.ends_with(",bf16")) {
        c.bf16 = true;
        m = m.size() > 4 ? m.substr(0, m.size() - 5) : "";
    }
    if (m == "causal") c.what = attention_case::kind::causal;
    else if (m == "decode") c.what = attention_case::kind::decode;
    else if (!m.empty()) return std::nullopt;
    // the name: no commas (a CSV field), e.g. attention_causal_1x2048x1024x16, bf16_attention_8x128x768x12
    c.name = std::string(c.bf16 ? "bf16_" : "") + "attention_" + (m.empty() ? std::string() : m + "_") +
             std::to_string(c.batch) + "x" + std::to_string(c.seq) + "x" + std::to_string(c.model) + "x" +
             std::to_string(c.heads);
    return c;
}

// The layer of one case, at one of the two sizes the cases use (model and heads are static
// extents: one instantiation each), in float or bf16 (T).
template <std::size_t ModelExtent, std::size_t HeadsExtent, class T>
struct attention_layer {
    using Model = ds::axis<"model", ModelExtent>;
    using Heads = ds::axis<"heads", HeadsExtent>;
    using Head = ds::axis<"head", ModelExtent / HeadsExtent>;
    using Seq = ds::axis<"seq">;
    using Cached = ds::axis<"cached">;
    using layer_type = ds::nn::multi_head_attention<T, Model, Heads, Head>;
    using Inner = typename layer_type::Inner;
    using Part = ds::axis<"part", 3>;  // query, key, value: w_qkv's three blocks of columns

    attention_case c;
    layer_type layer;
    ds::tensor<T, B, Seq, Model> x, y;                     // (batch, seq, model); decoding: seq = 1
    ds::tensor<T, B, Heads, Cached, Head> k_cache, v_cache;  // decoding: the keys and values so far
    ds::nn::attention_options options;

    explicit attention_layer(const attention_case& which) : c(which) {
        const bool decode = c.what == attention_case::kind::decode;
        const double bound = 1.0 / std::sqrt(double(ModelExtent));  // as torch.nn.Linear
        layer.w_qkv.emplace();
        ds::fill_uniform(*layer.w_qkv, 11, -bound, bound);
        ds::fill_uniform(layer.b_qkv.emplace(), 12, -0.1, 0.1);
        ds::fill_uniform(layer.w_o, 13, -bound, bound);
        ds::fill_uniform(layer.b_o.emplace(), 14, -0.1, 0.1);
        x = ds::tensor<T, B, Seq, Model>(B{c.batch}, Seq{decode ? 1 : c.seq});
        y = x;
        ds::fill_normal(x, 15);
        if (decode) {
            k_cache = ds::tensor<T, B, Heads, Cached, Head>(B{c.batch}, Heads{}, Cached{c.seq}, Head{});
            v_cache = k_cache;
            ds::fill_normal(k_cache, 16);
            ds::fill_normal(v_cache, 17);
        }
        options.causal = c.what == attention_case::kind::causal;
    }

    // y = the layer of x, on `backend`.
    template <class Backend>
    void run_on(Backend backend) {
        if (c.what != attention_case::kind::decode) return layer.forward_on(backend, x, x, y.view(), options);
        // One new token: its query attends to the cached keys and values.
        auto w = ds::view<Model, Part, Inner>(std::as_const(*layer.w_qkv));  // (model, part, heads x head)
        auto b = ds::view<Part, Inner>(std::as_const(*layer.b_qkv));          // (part, heads x head)
        auto q = ds::transpose<Seq, Heads>(
            ds::view<B, Seq, Heads, Head>(ds::matmul(x, ds::select<Part>(w, 0)) + ds::select<Part>(b, 0)));  // (batch, heads, 1, head)
        auto z = ds::nn::attention(q, k_cache, v_cache);  // (batch, heads, 1, head)
        ds::evaluation::assign_with(backend, y.view(),
                                    ds::matmul(ds::view<B, Seq, Inner>(ds::transpose<Heads, Seq>(z)), layer.w_o) + *layer.b_o);
    }
    void run() { run_on(ds::backend::cpu::evaluator{}); }
    void poison_output() { y.fill(T(std::numeric_limits<float>::quiet_NaN())); }

    // The largest difference from the same layer evaluated step by step (no fusion),
    // relative to the output's largest value.
    double error() {
        auto fused = y;
        run_on(ds::backend::cpu::evaluator{.fuse_attention = false});
        double worst = 0, scale = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            worst = std::max(worst, std::abs(double(fused.data()[i]) - double(y.data()[i])));
            scale = std::max(scale, std::abs(double(y.data()[i])));
            if (std::isnan(double(fused.data()[i]))) worst = std::numeric_limits<double>::quiet_NaN();
        }
        y = fused;
        return worst / scale;
    }
};

// Calls f(layer) with the layer of case c.
template <class F>
void with_attention_layer(const attention_case& c, F&& f) {
    auto of_type = [&]<class T>(T) {
        if (c.model == 768 && c.heads == 12) {
            attention_layer<768, 12, T> layer(c);
            return f(layer);
        }
        if (c.model == 1024 && c.heads == 16) {
            attention_layer<1024, 16, T> layer(c);
            return f(layer);
        }
        throw std::runtime_error("attention case " + c.spec() + ": model and heads must be 768,12 or 1024,16");
    };
    if (c.bf16) return of_type(ds::bf16{});
    return of_type(float{});
}

// The time of one call: after two calls to warm up, the mean over a batch of calls lasting
// the time budget (one call with --quick). attention_torch.py measures the same way; each
// side keeps its fastest batch over its turns.
template <class F>
double batch_seconds(const options& opt, F&& f) {
    f();
    f();
    auto start = clock_type::now();
    int calls = 0;
    double spent = 0;
    do {
        f();
        ++calls;
        spent = std::chrono::duration<double>(clock_type::now() - start).count();
    } while (!opt.quick && spent < 0.2);
    return spent / calls;
}

// This process's resident memory now, and its peak since reset_peak_memory(), in bytes.
std::size_t resident_bytes(const char* field) {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.starts_with(field)) return std::stoul(line.substr(std::strlen(field))) * 1024;  // kB
    }
    return 0;
}
void reset_peak_memory() {
    std::ofstream("/proc/self/clear_refs") << "5";  // the peak (VmHWM) starts again from the current size
}

// Causal attention of given Q, K and V (batch 1, `heads` heads of 64, `seq` queries and keys)
// and a cotangent of its output; run() computes the gradients of Q, K and V (ds::backward of
// the attention weighed by the cotangent: the forward, then the backward, one program).
struct attention_backward_problem {
    using Heads = ds::axis<"heads">;
    using Seq = ds::axis<"seq">;
    using Head = ds::axis<"head">;
    using tensor = ds::tensor<float, B, Heads, Seq, Head>;
    tensor q, k, v, cotangent, dq, dk, dv;
    attention_backward_problem(std::size_t seq, std::size_t heads)
        : q(B{1}, Heads{heads}, Seq{seq}, Head{64}), k(q.shape()), v(q.shape()), cotangent(q.shape()), dq(q.shape()),
          dk(q.shape()), dv(q.shape()) {
        ds::fill_normal(q, 1);
        ds::fill_normal(k, 2);
        ds::fill_normal(v, 3);
        ds::fill_normal(cotangent, 4);
        dq.fill(0);
        dk.fill(0);
        dv.fill(0);
    }
    auto loss() const {
        auto z = ds::nn::causal_attention(q, k, v);
        return ds::sum<B>(ds::sum<Heads>(ds::sum<Seq>(ds::sum<Head>(z * cotangent))));
    }
    template <class Backend = ds::backend::cpu::evaluator>
    void run(Backend backend = {}) {
        ds::backward(loss(), std::tie(q, k, v), std::tie(dq, dk, dv), backend);
    }
    // The largest difference from the gradients computed step by step, over the largest gradient.
    double error_against_step_by_step() {
        run();
        const tensor fused_q = dq, fused_k = dk, fused_v = dv;
        run(ds::backend::cpu::evaluator{.fuse_attention = false});
        double error = 0, largest = 0;
        for (const auto& [fused, plain] : {std::pair{&fused_q, &dq}, std::pair{&fused_k, &dk}, std::pair{&fused_v, &dv}}) {
            for (std::size_t i = 0; i < plain->size(); ++i) {
                error = std::max(error, double(std::abs(fused->data()[i] - plain->data()[i])));
                largest = std::max(largest, double(std::abs(plain->data()[i])));
            }
        }
        return error / largest;
    }
};

}  // namespace

// --attention-memory=backward:SEQ: the memory attention's forward and backward (16 heads of
// 64) needs beyond Q, K, V, the cotangent and the gradients, in MB.
int measure_attention_backward_memory(const options& opt, const std::string& seq) {
    ds::set_num_threads(opt.threads.back());
    attention_backward_problem problem(std::stoul(seq), 16);
    problem.run();  // the gradients' pages touched: what is measured next is beyond them
    std::size_t before = resident_bytes("VmRSS:");
    reset_peak_memory();
    for (int call = 0; call < 2; ++call) problem.run();
    std::printf("%.2f\n", double(resident_bytes("VmHWM:") - before) * 1e-6);
    return 0;
}

// --attention-memory=[core:]SPEC (in a fresh process, see attention_memory_mb): the memory
// one call of the layer (with core:, of causal attention alone) needs beyond its inputs,
// weights and output, in MB.
int measure_attention_memory(const options& opt, std::string spec) {
    if (spec.starts_with("backward:")) return measure_attention_backward_memory(opt, spec.substr(9));
    const bool core = spec.starts_with("core:");  // the attention formula only, not the layer
    if (core) spec = spec.substr(5);
    std::optional<attention_case> c = parse_attention_case(spec);
    if (!c) {
        std::fprintf(stderr, "dimsum_bench: bad attention case %s\n", spec.c_str());
        return 2;
    }
    ds::set_num_threads(opt.threads.back());
    auto measure = [](auto&& run) {
        std::size_t before = resident_bytes("VmRSS:");
        reset_peak_memory();
        for (int call = 0; call < 2; ++call) run();
        std::printf("%.2f\n", double(resident_bytes("VmHWM:") - before) * 1e-6);
    };
    if (core) {  // the attention alone: Q, K, V and the output (batch, heads, seq, head) exist already
        using Heads = ds::axis<"heads">;
        using Seq = ds::axis<"seq">;
        using Head = ds::axis<"head">;
        ds::tensor<float, B, Heads, Seq, Head> q(B{c->batch}, Heads{c->heads}, Seq{c->seq}, Head{c->head()});
        auto k = q, v = q, z = q;
        ds::fill_normal(q, 1);
        ds::fill_normal(k, 2);
        ds::fill_normal(v, 3);
        measure([&] { ds::assign(z, ds::nn::causal_attention(q, k, v)); });
        return 0;
    }
    with_attention_layer(*c, [&](auto& layer) { measure([&] { layer.run(); }); });
    return 0;
}

namespace {

// The extra memory of case c, measured in a fresh copy of this program (a process's peak
// memory only grows, and this one has run other cases); NaN if that failed.
double attention_memory_mb_of(const options& opt, const std::string& spec) {
    std::string command = "'/proc/" + std::to_string(getpid()) + "/exe' --threads=" + std::to_string(opt.threads.back()) +
                          " --attention-memory=" + spec;
    std::FILE* child = popen(command.c_str(), "r");
    if (!child) return std::numeric_limits<double>::quiet_NaN();
    double mb = std::numeric_limits<double>::quiet_NaN();
    if (std::fscanf(child, "%lf", &mb) != 1) mb = std::numeric_limits<double>::quiet_NaN();
    if (pclose(child) != 0) mb = std::numeric_limits<double>::quiet_NaN();
    return mb;
}
double attention_memory_mb(const options& opt, const attention_case& c, bool core = false) {
    return attention_memory_mb_of(opt, (core ? "core:" : "") + c.spec());
}

struct torch_result {
    double ms = 0, extra_mb = 0;
    std::string how;  // e.g. "module, 2 threads"
};

// PyTorch's best of each case (one timed batch per configuration: one turn), by case name;
// empty, with `why`, when it cannot run. `verify`: check its two versions agree first.
std::map<std::string, torch_result> torch_attention(const options& opt, const std::vector<attention_case>& cases,
                                                    bool verify, std::string& why) {
    std::map<std::string, torch_result> results;
    std::string arguments = std::string("'" DIMSUM_TORCH_SCRIPT "' --rounds=1") + (opt.quick ? " --quick" : "") +
                            (verify ? "" : " --no-verify");
    for (const attention_case& c : cases) arguments += " --case " + c.name + ":" + c.spec();
    read_torch_script(arguments, "torch_attention", why, [&](const char* line) {
        char name[128], impl[32];
        int threads;
        torch_result r;
        if (std::sscanf(line, "torch_attention_best,%127[^,],%31[^,],%d,%lf,%lf", name, impl, &threads, &r.ms, &r.extra_mb) == 5) {
            r.how = std::string(impl) + " on " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");  // no comma: a CSV field
            results[name] = r;
        }
    });
    if (results.empty() && why.empty()) why = "attention_torch.py gave no result";
    return results;
}

}  // namespace

void bench_attention(bench& s) {
    const bool small = s.opt.small;
    std::vector<attention_case> cases;
    auto add = [&](const std::string& spec) {
        if (auto c = parse_attention_case(spec); c && s.selected(c->name)) cases.push_back(*c);
    };
    if (small) {
        add("2,24,768,12");
        add("2,24,768,12,bf16");
        add("1,40,1024,16,causal");
        add("1,300,1024,16,decode");
    } else {
        add("8,128,768,12");
        add("1,512,768,12");
        add("1,2048,1024,16,causal");
        add("1,4096,1024,16,causal");
        add("1,4096,1024,16,decode");
        for (const char* spec : {"8,128,768,12", "1,512,768,12", "1,2048,1024,16,causal", "1,4096,1024,16,causal", "1,4096,1024,16,decode"}) {
            add(std::string(spec) + ",bf16");
        }
    }
    if (cases.empty()) return;

    std::string why = small ? "--small" : "";
    std::fprintf(s.out.table, "\n%-34s %7s %9s %8s %6s  %9s %-20s %7s  %8s %8s\n", "attention case", "threads", "ms",
                 "GFLOP/s", "peak", "torch ms", "torch ran as", "speedup", "MB", "torch MB");
    std::fprintf(s.out.table, "(peak: of the FMA units; for bf16 on the bf16 path %s, of its instructions)\n",
                 std::string(ds::backend::cpu::name(ds::backend::cpu::current_bf16_path())).c_str());
    for (const attention_case& c : cases) {
        double mb = attention_memory_mb(s.opt, c);
        with_attention_layer(c, [&](auto& layer) {
            layer.poison_output();
            layer.run();
            // in bf16, the two may round the output (and the intermediates each formula
            // stores) to neighbouring values: a few ulps of 2^-8 at the largest output
            s.out.check(c.name + ": dimsum against its unfused formula", layer.error(), c.bf16 ? 3e-2 : 1e-4);
            // Turns, as for the GEMM: dimsum with each thread count, then PyTorch, and again;
            // each keeps its best. PyTorch's turn runs in fresh processes.
            std::vector<double> seconds(s.opt.threads.size(), std::numeric_limits<double>::infinity());
            std::optional<torch_result> torch_best;
            for (int turn = 0; turn < rounds(s.opt); ++turn) {
                for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
                    ds::set_num_threads(s.opt.threads[t]);
                    settle(s.opt);
                    seconds[t] = std::min(seconds[t], batch_seconds(s.opt, [&] { layer.run(); }));
                }
                if (!small && (turn == 0 || torch_best)) {
                    auto found = torch_attention(s.opt, {c}, turn == 0, why);
                    if (auto r = found.find(c.name); r != found.end() && (!torch_best || r->second.ms < torch_best->ms)) {
                        torch_best = r->second;
                    }
                }
            }
            if (!torch_best) std::fprintf(s.out.table, "skipped: pytorch: %s; %s is compared with the FMA peak only\n",
                                          why.c_str(), c.name.c_str());
            for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
                const int threads = s.opt.threads[t];
                const double gflops = c.flops() / seconds[t] * 1e-9;
                const peak_of_case peak = case_peak(s.limits, c.bf16, t);
                const torch_result* t_best = torch_best ? &*torch_best : nullptr;
                std::fprintf(s.out.table, "%-34s %7d %9.2f %8.1f %5.0f%%  %9.2f %-20s %7.2f  %8.1f %8.1f\n", s.out.row_name(c.name).c_str(),
                             threads, seconds[t] * 1e3, gflops, 100.0 * gflops / peak.gflops, t_best ? t_best->ms : NAN,
                             t_best ? t_best->how.c_str() : "-", t_best ? t_best->ms * 1e-3 / seconds[t] : NAN, mb,
                             t_best ? t_best->extra_mb : NAN);
                if (s.out.csv) {
                    auto csv_row = [&](const char* baseline, double mine, double theirs, const char* unit, const std::string& how) {
                        std::fprintf(s.out.csv, "%s,%d,%.6g,%s,%.6g,%.6g,%s,%s\n", s.out.row_name(c.name).c_str(), threads, mine, baseline,
                                     theirs, mine / theirs, unit, how.c_str());
                    };
                    if (t_best) csv_row("pytorch", gflops, c.flops() / t_best->ms * 1e-6, "GFLOP/s", t_best->how);
                    csv_row(peak.name, gflops, peak.gflops, "GFLOP/s", peak.how);
                    if (t_best && t == s.opt.threads.size() - 1) {
                        csv_row("pytorch_memory", mb, t_best->extra_mb, "MB", "peak memory beyond inputs and weights");
                    }
                }
            }
        });
        std::fflush(s.out.table);
    }
}

// One decoding step's attention over a KV cache held in bf16 (the query in float, as a
// projection computes it), next to the same cache in float: the kernel reads the bf16 cache
// where it lies (no convert), and a step is a pass over the whole cache, so half the bytes is
// the speed-up to expect. Both read the same values with the same sums: the results must be
// the same bits.
void bench_bf16_kv_cache(bench& s) {
    using B = ds::axis<"batch">;
    using Heads = ds::axis<"heads">;
    using Seq = ds::axis<"seq">;
    using Cached = ds::axis<"cached">;
    using Head = ds::axis<"head">;
    const std::size_t heads = 16, head = 64;
    for (std::size_t cached : s.opt.small ? std::vector<std::size_t>{300} : std::vector<std::size_t>{4096, 16384}) {
        const std::string name = "bf16_kv_decode_" + std::to_string(heads) + "x" + std::to_string(cached) + "x" + std::to_string(head);
        if (!s.selected(name)) continue;
        ds::tensor<float, B, Heads, Seq, Head> q(B{1}, Heads{heads}, Seq{1}, Head{head}), z(q.shape()), z16(q.shape());
        ds::tensor<ds::bf16, B, Heads, Cached, Head> k16(B{1}, Heads{heads}, Cached{cached}, Head{head}), v16(k16.shape());
        ds::fill_normal(q, 1);
        ds::fill_normal(k16, 2);
        ds::fill_normal(v16, 3);
        const ds::tensor<float, B, Heads, Cached, Head> k = ds::cast<float>(k16), v = ds::cast<float>(v16);
        for (int threads : s.opt.threads) {
            fastest bf16_time, float_time;
            for (int round = 0; round < rounds(s.opt); ++round) {
                ds::set_num_threads(threads);
                settle(s.opt);
                bf16_time.keep(best_seconds(s.opt, [&] { ds::assign(z16, ds::nn::attention(q, ds::cast<float>(k16), ds::cast<float>(v16))); }), "");
                settle(s.opt);
                float_time.keep(best_seconds(s.opt, [&] { ds::assign(z, ds::nn::attention(q, k, v)); }), "");
                const bool same = std::memcmp(z.data(), z16.data(), z.size() * sizeof(float)) == 0;
                s.out.check(name + " (" + std::to_string(threads) + " threads): the same bits as in float", same ? 0.0 : 1.0, 0.0);
            }
            s.out.add({name, threads, 1.0 / bf16_time.seconds, "dimsum_float", 1.0 / float_time.seconds,
                       "steps/s", "K, V cache in bf16 read where it lies, against the cache in float"});
        }
    }
}

// Attention of Q, K and V stored in bf16 (the attention alone, as a model that keeps them in
// bf16 runs it), on each bf16 path this CPU runs, next to the same values in float in the
// same rounds: on widen the kernel reads bf16 where it lies (the float kernel's sums: the same
// bits); on avx512_bf16 and amx its products run on those instructions, P rounded to bf16,
// which moves an output by at most 2^-8 of the largest |v| (the scores' float sums, far less).
void bench_bf16_attention_core(bench& s) {
    namespace cpu = ds::backend::cpu;
    using B = ds::axis<"batch">;
    using Heads = ds::axis<"heads">;
    using Seq = ds::axis<"seq">;
    using Head = ds::axis<"head">;
    struct core_case {
        std::size_t batch, heads, seq;
        bool causal;
    };
    const std::vector<core_case> cases = s.opt.small ? std::vector<core_case>{{1, 4, 300, true}}
                                                     : std::vector<core_case>{{8, 12, 128, false}, {1, 16, 2048, true}, {1, 16, 4096, true}};
    const std::size_t head = 64;
    for (const core_case& c : cases) {
        const std::string shape = std::to_string(c.batch) + "x" + std::to_string(c.heads) + "x" + std::to_string(c.seq) + "x" +
                                  std::to_string(head);
        const std::string base = std::string("bf16_attention_core_") + (c.causal ? "causal_" : "") + shape;
        ds::tensor<ds::bf16, B, Heads, Seq, Head> q16(B{c.batch}, Heads{c.heads}, Seq{c.seq}, Head{head}), k16(q16.shape()), v16(q16.shape());
        ds::fill_normal(q16, 1);
        ds::fill_normal(k16, 2);
        ds::fill_normal(v16, 3);
        const ds::tensor<float, B, Heads, Seq, Head> q = ds::cast<float>(q16), k = ds::cast<float>(k16), v = ds::cast<float>(v16);
        ds::tensor<float, B, Heads, Seq, Head> z(q.shape()), z16(q.shape());
        double largest_value = 0;
        for (std::size_t i = 0; i < v.size(); ++i) largest_value = std::max(largest_value, std::abs(double(v.data()[i])));
        const double flops = 4.0 * double(c.batch * c.heads) * double(c.seq) * double(c.seq) * double(head) * (c.causal ? 0.5 : 1.0);
        auto attend = [&](const auto& qq, const auto& kk, const auto& vv, auto& out) {
            if (c.causal) ds::assign(out, ds::nn::causal_attention(qq, kk, vv));
            else ds::assign(out, ds::nn::attention(qq, kk, vv));
        };
        for (const cpu::bf16_path path : cpu::bf16_paths) {
            const std::string name = bf16_path_row(base, path);
            if (!s.selected(name) || !cpu::support_of(path).usable) continue;
            const cpu::scoped_bf16_path on_this_path(path);
            for (int threads : s.opt.threads) {
                fastest bf16_time, float_time;
                for (int round = 0; round < rounds(s.opt); ++round) {
                    ds::set_num_threads(threads);
                    settle(s.opt);
                    bf16_time.keep(best_seconds(s.opt, [&] { attend(ds::cast<float>(q16), ds::cast<float>(k16), ds::cast<float>(v16), z16); }), "");
                    settle(s.opt);
                    float_time.keep(best_seconds(s.opt, [&] { attend(q, k, v, z); }), "");
                    double worst = 0;
                    for (std::size_t i = 0; i < z.size(); ++i) {
                        const double d = std::abs(double(z16.data()[i]) - double(z.data()[i]));
                        worst = std::isnan(d) ? d : std::max(worst, d);
                    }
                    s.out.check(name + " (" + std::to_string(threads) + " threads): against float", worst,
                                path == cpu::bf16_path::widen ? 0.0 : largest_value / 256 + 1e-4);
                }
                const char* how = path == cpu::bf16_path::widen ? "Q K V in bf16 read where they lie, float kernel"
                                  : path == cpu::bf16_path::amx ? "Q K V in bf16, products on AMX tiles, P in bf16"
                                                                : "Q K V in bf16, products on vdpbf16ps, P in bf16";
                s.out.add({name, threads, flops / bf16_time.seconds * 1e-9, "dimsum_float", flops / float_time.seconds * 1e-9,
                           "GFLOP/s", how});
            }
        }
    }
}

// Memory against sequence length (causal, model 1024, 16 heads): it grows like seq, where
// the scores alone would grow like seq^2.
void bench_attention_memory(bench& s) {
    std::fprintf(s.out.table, "\n%-38s %7s %9s %14s %14s\n", "attention memory (causal, 1024, 16)", "seq", "layer MB",
                 "attention MB", "seq x seq MB");
    for (std::size_t seq : s.opt.small ? std::vector<std::size_t>{128, 256} : std::vector<std::size_t>{1024, 2048, 4096, 8192, 16384}) {
        attention_case c = *parse_attention_case("1," + std::to_string(seq) + ",1024,16,causal");
        c.name = "attention_memory_seq" + std::to_string(seq);
        if (!s.selected(c.name)) continue;
        double mb = attention_memory_mb(s.opt, c), core_mb = attention_memory_mb(s.opt, c, true);
        double scores_mb = 16.0 * double(seq) * double(seq) * sizeof(float) * 1e-6;
        std::fprintf(s.out.table, "%-38s %7zu %9.1f %14.1f %14.1f\n", c.name.c_str(), seq, mb, core_mb, scores_mb);
        if (s.out.csv) {
            std::fprintf(s.out.csv, "%s,%d,%.6g,seq_x_seq_scores,%.6g,%.6g,MB,the scores of all heads in float\n",
                         c.name.c_str(), s.opt.threads.back(), mb, scores_mb, mb / scores_mb);
            std::fprintf(s.out.csv, "%s_core,%d,%.6g,seq_x_seq_scores,%.6g,%.6g,MB,causal attention of given Q K V\n",
                         c.name.c_str(), s.opt.threads.back(), core_mb, scores_mb, core_mb / scores_mb);
        }
        if (!(mb < 1e9) || !(core_mb < 1e9)) {  // NaN: a child failed
            s.out.check(c.name + ": memory measurement", std::numeric_limits<double>::infinity(), 0);
        }
    }
}

}  // namespace dimsum_bench

namespace dimsum_bench {

// Attention's forward and backward (the gradients of Q, K and V of causal attention, model
// 1024 in 16 heads), dimsum's fused backward against PyTorch's autograd at its best of 1 and 2
// threads, with the peak memory of each. GFLOP/s count the products the algorithm needs: the
// forward's two and the backward's five, each over the half of the (queries, keys) plane a
// causal mask leaves (the fused backward does one more, for each query's log-sum-exp).
void bench_attention_backward(bench& s) {
    const std::vector<std::size_t> lengths = s.opt.small ? std::vector<std::size_t>{40} : std::vector<std::size_t>{2048, 4096};
    bool header = false;
    for (std::size_t seq : lengths) {
        const std::string name = "attention_backward_causal_1024x16_seq" + std::to_string(seq);
        if (!s.selected(name)) continue;
        if (!header) {
            std::fprintf(s.out.table, "\n%-40s %7s %9s %8s %6s  %9s %-12s %7s  %8s %8s\n", "attention forward and backward",
                         "threads", "ms", "GFLOP/s", "peak", "torch ms", "torch ran as", "speedup", "MB", "torch MB");
            header = true;
        }
        const double flops = 7.0 * 2.0 * double(seq) * double(seq) * 64.0 * 16.0 / 2.0;
        attention_backward_problem problem(seq, 16);
        s.out.check(name + ": against the gradients step by step", problem.error_against_step_by_step(), 1e-4);
        const double mb = attention_memory_mb_of(s.opt, "backward:" + std::to_string(seq));
        std::vector<double> seconds(s.opt.threads.size(), std::numeric_limits<double>::infinity());
        std::string why = s.opt.small ? "--small" : "";
        double torch_ms = NAN, torch_mb = NAN;
        int torch_threads = 0;
        for (int turn = 0; turn < rounds(s.opt); ++turn) {
            for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
                ds::set_num_threads(s.opt.threads[t]);
                settle(s.opt);
                seconds[t] = std::min(seconds[t], batch_seconds(s.opt, [&] { problem.run(); }));
            }
            if (s.opt.small || (turn > 0 && !(torch_ms > 0))) continue;
            const std::string arguments = std::string("'" DIMSUM_ATTENTION_BACKWARD_TORCH_SCRIPT "' --rounds=1 --threads=") +
                                          thread_list(s.opt) + (s.opt.quick ? " --quick" : "") + " --case " + name + ":1," +
                                          std::to_string(seq) + ",16,64";
            read_torch_script(arguments, "torch_attention_backward", why, [&](const char* line) {
                char row[128];
                int threads;
                double ms, extra_mb;
                if (std::sscanf(line, "torch_attention_backward_best,%127[^,],%d,%lf,%lf", row, &threads, &ms, &extra_mb) == 4 &&
                    !(ms >= torch_ms)) {
                    torch_ms = ms;
                    torch_mb = extra_mb;
                    torch_threads = threads;
                }
            });
        }
        if (!(torch_ms > 0)) std::fprintf(s.out.table, "skipped: pytorch: %s; %s is compared with the FMA peak only\n", why.c_str(), name.c_str());
        const std::string how = "autograd on " + std::to_string(torch_threads) + (torch_threads == 1 ? " thread" : " threads");
        for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
            const double gflops = flops / seconds[t] * 1e-9;
            std::fprintf(s.out.table, "%-40s %7d %9.2f %8.1f %5.0f%%  %9.2f %-12s %7.2f  %8.1f %8.1f\n", s.out.row_name(name).c_str(),
                         s.opt.threads[t], seconds[t] * 1e3, gflops, 100.0 * gflops / s.limits.fma_peak[t], torch_ms,
                         torch_ms > 0 ? std::to_string(torch_threads).c_str() : "-", torch_ms * 1e-3 / seconds[t], mb, torch_mb);
            if (s.out.csv) {
                auto csv_row = [&](const char* baseline, double mine, double theirs, const char* unit, const std::string& what) {
                    std::fprintf(s.out.csv, "%s,%d,%.6g,%s,%.6g,%.6g,%s,%s\n", s.out.row_name(name).c_str(), s.opt.threads[t], mine,
                                 baseline, theirs, mine / theirs, unit, what.c_str());
                };
                if (torch_ms > 0) csv_row("pytorch", gflops, flops / torch_ms * 1e-6, "GFLOP/s", how);
                csv_row("fma_peak", gflops, s.limits.fma_peak[t], "GFLOP/s", "xsimd fma chains");
                if (torch_ms > 0 && t == s.opt.threads.size() - 1) {
                    csv_row("pytorch_memory", mb, torch_mb, "MB", "peak memory beyond Q K V and their gradients");
                }
            }
        }
        if (!(mb < 1e9)) s.out.check(name + ": memory measurement", std::numeric_limits<double>::infinity(), 0);
        std::fflush(s.out.table);
    }
}

}  // namespace dimsum_bench
