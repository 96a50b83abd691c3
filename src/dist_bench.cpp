// dimsum_dist_bench: a BERT-base encoder layer (batch 8, seq 128, model 768, 12 heads, hidden
// 3072, float) split over the ranks of an MPI job, against the same layer on one rank with as
// many threads as the job has ranks, side by side in one run:
//
//     mpirun --bind-to none -np 2 ./dimsum_dist_bench [--rounds=N] [--small]
//
// (--bind-to none: Open MPI binds each of 2 ranks to one core by default, which would give
// the one-rank case's threads a single core between them).
// 1. split: every rank runs dist::encoder_layer with one thread; the time of the call, and of
//    its two all-reduces of (batch, seq, model) floats timed alone;
// 2. one rank: rank 0 runs the whole layer with `ranks` threads while the other ranks sleep in
//    idle_barrier (they leave their cores to it);
// 3. overlap: two micro-batches of attention, the all-reduce of the first started before the
//    second is computed (all_reduce_start) against one after the other.
// Each time is the best of --rounds (5) rounds of 3 calls; the weights are random. Rank 0
// prints the table and the ratios.

#include <dimsum/dimsum.hpp>
#include <dimsum/dist/layers.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

namespace ds = dimsum;
namespace dist = dimsum::dist;

namespace {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;
using Head = ds::axis<"head", 64>;
using Hidden = ds::axis<"hidden", 3072>;
using activations = ds::tensor<float, Batch, Seq, Model>;
using full_attention = ds::nn::multi_head_attention<float, Model, Heads, Head>;

using full_encoder = ds::nn::encoder_layer<float, Model, Heads, Head, Hidden>;  // at BERT-base's sizes

full_encoder random_encoder() {
    full_encoder e;
    e.epsilon = 1e-12;  // BERT's
    ds::fill_uniform(e.attention.w_qkv.emplace(), 1, -0.05, 0.05);
    ds::fill_uniform(e.attention.b_qkv.emplace(), 2, -0.1, 0.1);
    ds::fill_uniform(e.attention.w_o, 3, -0.05, 0.05);
    ds::fill_uniform(e.attention.b_o.emplace(), 4, -0.1, 0.1);
    ds::fill_uniform(e.ln1_weight, 5, 0.9, 1.1);
    ds::fill_uniform(e.ln1_bias, 6, -0.1, 0.1);
    ds::fill_uniform(e.w_ff1, 7, -0.05, 0.05);
    ds::fill_uniform(e.b_ff1, 8, -0.1, 0.1);
    ds::fill_uniform(e.w_ff2, 9, -0.03, 0.03);
    ds::fill_uniform(e.b_ff2, 10, -0.1, 0.1);
    ds::fill_uniform(e.ln2_weight, 11, 0.9, 1.1);
    ds::fill_uniform(e.ln2_bias, 12, -0.1, 0.1);
    return e;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The best time of `rounds` rounds of 3 calls of f on every rank together, per call; the
// slowest rank's, since the layer is done when every rank is.
double best_time(const dist::group& g, int rounds, const std::function<void()>& f) {
    double best = 1e30;
    f();  // first call: the workspace and the pages are taken here
    for (int round = 0; round < rounds; ++round) {
        g.barrier();
        const auto start = std::chrono::steady_clock::now();
        for (int call = 0; call < 3; ++call) f();
        using Ranks = ds::axis<"ranks">;
        ds::tensor<double, Ranks> mine(Ranks{1}), all(Ranks{std::size_t(g.size())});
        mine(0) = seconds_since(start) / 3;
        dist::all_gather<Ranks>(g, mine.view(), all.view());
        best = std::min(best, *std::max_element(all.data(), all.data() + all.size()));
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    dist::session mpi(argc, argv);
    const dist::group world = dist::group::world();
    int rounds = 5;
    std::size_t batch = 8, seq = 128;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "--rounds=", 9) == 0) rounds = std::max(1, std::atoi(argv[i] + 9));
        if (std::strcmp(argv[i], "--small") == 0) batch = 2, seq = 16;
    }
    return dist::run_or_abort(world, [&] {
        const int ranks = world.size();
        const full_encoder full = random_encoder();
        const auto split = dist::encoder_layer<float, Model, Heads, Head, Hidden>::shard(full, world);
        activations x(Batch{batch}, Seq{seq});
        ds::fill_normal(x, 13);

        // 1. split, one thread per rank
        ds::set_num_threads(1);
        activations y;
        const double split_time = best_time(world, rounds, [&] { y = split(x); });
        activations sum(Batch{batch}, Seq{seq});
        const double comm_time = 2 * best_time(world, rounds, [&] { dist::all_reduce(world, sum); });

        // 2. the whole layer on rank 0 with `ranks` threads; the others sleep
        double one_rank_time = 0;
        if (world.rank() == 0) {
            ds::set_num_threads(ranks);
            activations z = full(x);
            one_rank_time = 1e30;
            for (int round = 0; round < rounds; ++round) {
                const auto start = std::chrono::steady_clock::now();
                for (int call = 0; call < 3; ++call) z = full(x);
                one_rank_time = std::min(one_rank_time, seconds_since(start) / 3);
            }
            ds::set_num_threads(1);
            double worst = 0;  // the split layer computes the same
            for (std::size_t i = 0; i < z.size(); ++i) worst = std::max(worst, double(std::abs(z.data()[i] - y.data()[i])));
            if (worst > 1e-3) throw std::runtime_error("dimsum_dist_bench: the split layer differs by " + std::to_string(worst));
        }
        world.idle_barrier();

        // 3. two micro-batches of attention, the first's all-reduce overlapping the second
        const std::size_t half = std::max<std::size_t>(batch / 2, 1);
        activations x1(Batch{half}, Seq{seq}), x2(Batch{half}, Seq{seq}), a1(Batch{half}, Seq{seq}), a2(Batch{half}, Seq{seq});
        ds::fill_normal(x1, 14);
        ds::fill_normal(x2, 15);
        const auto& attention = split.attention;
        const double in_turn = best_time(world, rounds, [&] {
            attention.compute_part(x1, a1.view());
            dist::all_reduce(world, a1);
            attention.compute_part(x2, a2.view());
            dist::all_reduce(world, a2);
        });
        const double overlapped = best_time(world, rounds, [&] {
            attention.compute_part(x1, a1.view());
            dist::pending first = dist::all_reduce_start(world, a1);
            attention.compute_part(x2, a2.view());
            first.wait();
            dist::all_reduce(world, a2);
        });

        if (world.rank() == 0) {
            std::printf("dimsum_dist_bench: BERT-base encoder layer, batch %zu, seq %zu, float, best of %d rounds\n", batch, seq,
                        rounds);
            std::printf("%-44s %10s\n", "case", "ms");
            std::printf("%-44s %10.2f\n", ("split over " + std::to_string(ranks) + " ranks x 1 thread").c_str(), split_time * 1e3);
            std::printf("%-44s %10.2f  (%.0f%% of the split layer)\n", "  of which its 2 all-reduces, timed alone",
                        comm_time * 1e3, 100 * comm_time / split_time);
            std::printf("%-44s %10.2f\n", ("1 rank x " + std::to_string(ranks) + " threads").c_str(), one_rank_time * 1e3);
            std::printf("ratio split / one rank: %.2f (below 1: the split is faster)\n", split_time / one_rank_time);
            std::printf("%-44s %10.2f\n", "attention, 2 micro-batches, sums in turn", in_turn * 1e3);
            std::printf("%-44s %10.2f  (saves %.2f ms)\n", "attention, 2 micro-batches, first sum overlapped", overlapped * 1e3,
                        (in_turn - overlapped) * 1e3);
        }
        return 0;
    });
}
