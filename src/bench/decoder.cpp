// dimsum_bench's decoder rows: one decoding step of examples/decoder.hpp's Llama-style
// decoder (a new token at position P of a KV cache of P positions, embedding to logits), in
// tokens per second against the same step in PyTorch (scripts/decoder_torch.py).

#include <dimsum/dimsum.hpp>


#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "bench.hpp"
#include "decoder.hpp"

namespace dimsum_bench {

namespace ds = dimsum;

namespace {

using llama::Batch;
using llama::Seq;

// The example's decoder (examples/decoder.cpp): per-call costs dominate.
using llama::tiny;
// A small model of a real shape (heads of 64, 4 query heads per key/value head): the
// products and the attention over the cache dominate.
struct small {
    using Vocab = ds::axis<"vocab", 4096>;
    using Model = ds::axis<"model", 512>;
    using Heads = ds::axis<"heads", 8>;
    using KvHeads = ds::axis<"kv_heads", 2>;
    using Head = ds::axis<"head", 64>;
    using Hidden = ds::axis<"hidden", 1408>;
};

template <class Sizes>
std::string spec(std::size_t positions) {
    return std::to_string(Sizes::Vocab::static_extent) + "," + std::to_string(Sizes::Model::static_extent) + "," +
           std::to_string(Sizes::Heads::static_extent) + "," + std::to_string(Sizes::KvHeads::static_extent) + "," +
           std::to_string(Sizes::Head::static_extent) + "," + std::to_string(Sizes::Hidden::static_extent) + "," +
           std::to_string(positions);
}

// PyTorch's milliseconds per step by (case, threads); empty, with `why`, if it cannot run.
std::map<std::pair<std::string, int>, double> torch_decoder(const options& opt,
                                                            const std::vector<std::pair<std::string, std::string>>& cases,
                                                            std::string& why) {
    std::map<std::pair<std::string, int>, double> results;
    std::string arguments = std::string("'" DIMSUM_DECODER_TORCH_SCRIPT "' --verify '" DIMSUM_DECODER_DATA "' --threads ") +
                            thread_list(opt) + (opt.quick ? " --seconds 0.01" : "");
    for (const auto& [name, c] : cases) arguments += " --case " + name + ":" + c;
    read_torch_script(arguments, "torch_decoder", why, [&](const char* line) {
        char name[128];
        int t;
        double ms;
        if (std::sscanf(line, "torch_decoder,%127[^,],%d,%lf", name, &t, &ms) == 3) results[{name, t}] = ms;
    });
    if (results.empty() && why.empty()) why = "decoder_torch.py gave no result";
    return results;
}

// One case: the decoder's step at `positions`, timed, and checked against the logits of the
// same tokens run as one prefill (no cache).
template <class Sizes>
struct decoder_case {
    std::string name;
    std::size_t positions;
    llama::decoder_weights<Sizes> w;
    ds::tensor<std::int64_t, Batch, Seq> prompt, history, token;  // positions + 1 tokens, the first positions, the last
    ds::tensor<float, Batch, typename Sizes::Vocab> logits, want;

    decoder_case(std::string n, std::size_t p) : name(std::move(n)), positions(p) {
        auto bound = [](std::size_t fan_in) { return 1.0 / std::sqrt(double(fan_in)); };
        const std::size_t model = Sizes::Model::static_extent;
        ds::fill_uniform(w.embedding, 1);
        ds::fill_uniform(w.block.attention_norm, 2, 0.8, 1.2);
        ds::fill_uniform(w.block.attention.w_q.emplace(), 3, -bound(model), bound(model));
        ds::fill_uniform(w.block.attention.w_k.emplace(), 4, -bound(model), bound(model));
        ds::fill_uniform(w.block.attention.w_v.emplace(), 5, -bound(model), bound(model));
        ds::fill_uniform(w.block.attention.w_o, 6, -bound(model), bound(model));
        ds::fill_uniform(w.block.ffn_norm, 7, 0.8, 1.2);
        ds::fill_uniform(w.block.w_1, 8, -bound(model), bound(model));
        ds::fill_uniform(w.block.w_3, 9, -bound(model), bound(model));
        ds::fill_uniform(w.block.w_2, 10, -bound(Sizes::Hidden::static_extent), bound(Sizes::Hidden::static_extent));
        ds::fill_uniform(w.norm, 11, 0.8, 1.2);
        ds::fill_uniform(w.output, 12, -bound(model), bound(model));
        prompt = ds::tensor<std::int64_t, Batch, Seq>(Batch{1}, Seq{positions + 1});
        sampler pick;
        for (std::size_t i = 0; i <= positions; ++i) prompt(0, i) = std::int64_t(pick.below(Sizes::Vocab::static_extent));
        history = ds::tensor<std::int64_t, Batch, Seq>(Batch{1}, Seq{positions});
        std::copy_n(prompt.data(), positions, history.data());
        token = ds::tensor<std::int64_t, Batch, Seq>(Batch{1}, Seq{1});
        token(0, 0) = prompt(0, positions);
        logits = ds::tensor<float, Batch, typename Sizes::Vocab>(Batch{1});
        // the whole sequence at once: the last position's logits are what the cached step must give
        llama::decoder<Sizes> whole(w, 1, positions + 1);
        want = logits;
        whole.step(prompt, want);
    }

    void run(bench& s, const std::map<std::pair<std::string, int>, double>& torch) {
        llama::decoder<Sizes> d(w, 1, positions + 1);
        d.step(history, logits);  // the cache holds `positions` positions
        auto step = [&] {
            d.rewind(positions);
            d.step(token, logits);
        };
        for (int threads : s.opt.threads) {
            fastest mine;
            for (int round = 0; round < rounds(s.opt); ++round) {
                ds::set_num_threads(threads);
                settle(s.opt);
                mine.keep(best_seconds(s.opt, step), "");
            }
            double worst = 0, scale = 0;
            for (std::size_t i = 0; i < logits.size(); ++i) {
                worst = std::max(worst, std::abs(double(logits.data()[i]) - double(want.data()[i])));
                scale = std::max(scale, std::abs(double(want.data()[i])));
            }
            s.out.check(name + " (" + std::to_string(threads) + " threads): the cached step against the whole sequence",
                        worst / scale, 1e-4);
            auto found = torch.find({name, threads});
            const double theirs = found == torch.end() ? std::nan("") : 1e3 / found->second;
            s.out.add({name, threads, 1.0 / mine.seconds, "torch", theirs, "tokens/s",
                       found == torch.end() ? "" : "by hand on " + std::to_string(threads) + (threads == 1 ? " thread" : " threads")});
        }
        ds::set_num_threads(0);
    }
};

}  // namespace

void bench_decoder(bench& s) {
    std::vector<std::pair<std::string, std::string>> cases;
    const std::vector<std::size_t> tiny_positions = s.opt.small ? std::vector<std::size_t>{16} : std::vector<std::size_t>{128, 4096};
    const std::vector<std::size_t> small_positions = s.opt.small ? std::vector<std::size_t>{} : std::vector<std::size_t>{128, 4096};
    auto name = [](const char* size, std::size_t positions) { return std::string("decoder_") + size + "_pos" + std::to_string(positions); };
    for (std::size_t p : tiny_positions) {
        if (s.selected(name("tiny", p))) cases.emplace_back(name("tiny", p), spec<tiny>(p));
    }
    for (std::size_t p : small_positions) {
        if (s.selected(name("small", p))) cases.emplace_back(name("small", p), spec<small>(p));
    }
    if (cases.empty()) return;
    std::string why = s.opt.small ? "--small" : "";
    std::map<std::pair<std::string, int>, double> torch;
    if (!s.opt.small) torch = torch_decoder(s.opt, cases, why);
    if (!why.empty()) std::fprintf(s.out.table, "decoder: PyTorch skipped (%s); its column is empty\n", why.c_str());
    for (std::size_t p : tiny_positions) {
        if (s.selected(name("tiny", p))) decoder_case<tiny>(name("tiny", p), p).run(s, torch);
    }
    for (std::size_t p : small_positions) {
        if (s.selected(name("small", p))) decoder_case<small>(name("small", p), p).run(s, torch);
    }
}

}  // namespace dimsum_bench
