// dimsum::dist under mpirun (tests/CMakeLists.txt runs it on 1, 2, 3 and 4 ranks): the
// collectives against sums computed on each rank from every rank's data (each rank can make
// them: the data are seeded by rank), and the tensor-parallel layers against the
// single-process ones, whether sharded from the full layer or read slice by slice from its
// checkpoint. Every rank runs every test case; a failure on any rank fails mpirun.
#include <catch2/catch.hpp>

#include "../support/catch_session.hpp"

#include <dimsum/dimsum.hpp>
#include <dimsum/dist/group.hpp>
#include <dimsum/dist/layers.hpp>
#include <dimsum/interop/parameters.hpp>

#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace ds = dimsum;
namespace dist = dimsum::dist;

namespace {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Model = ds::axis<"model", 24>;
using Heads = ds::axis<"heads", 12>;
using Head = ds::axis<"head", 2>;
using Hidden = ds::axis<"hidden", 48>;

// Rank r's data for a test: integers (exact in any order of summation), different per rank.
ds::tensor<double, Rows, Cols> data_of(int rank, std::size_t rows, std::size_t cols) {
    ds::tensor<double, Rows, Cols> x(Rows{rows}, Cols{cols});
    for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) x(i, j) = double((rank + 1) * 1000 + int(i * cols + j) % 97);
    }
    return x;
}

double largest_difference(const double* a, const double* b, std::size_t n) {
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
    return worst;
}

template <class A, class B>
double largest_difference(const A& got, const B& want) {
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(double(got.data()[i]) - double(want.data()[i])) / (1 + std::abs(double(want.data()[i]))));
    }
    return worst;
}

using full_attention = ds::nn::multi_head_attention<double, Model, Heads, Head>;

full_attention random_attention(bool fused, bool biases) {
    full_attention l;
    if (fused) {
        ds::fill_uniform(l.w_qkv.emplace(), 1, -0.5, 0.5);
        if (biases) ds::fill_uniform(l.b_qkv.emplace(), 2);
    } else {
        ds::fill_uniform(l.w_q.emplace(), 3, -0.5, 0.5);
        ds::fill_uniform(l.w_k.emplace(), 4, -0.5, 0.5);
        ds::fill_uniform(l.w_v.emplace(), 5, -0.5, 0.5);
        if (biases) {
            ds::fill_uniform(l.b_q.emplace(), 6);
            ds::fill_uniform(l.b_k.emplace(), 7);
            ds::fill_uniform(l.b_v.emplace(), 8);
        }
    }
    ds::fill_uniform(l.w_o, 9, -0.5, 0.5);
    if (biases) ds::fill_uniform(l.b_o.emplace(), 10);
    return l;
}

// The BERT layer of examples/bert_layer.cpp, in one process: the reference of the split one.
using full_encoder = ds::nn::encoder_layer<double, Model, Heads, Head, Hidden>;

full_encoder random_encoder() {
    full_encoder full;
    full.epsilon = 1e-12;  // BERT's: shard() keeps it
    full.attention = random_attention(true, true);
    ds::fill_uniform(full.ln1_weight, 20, 0.5, 1.5);
    ds::fill_uniform(full.ln1_bias, 21);
    ds::fill_uniform(full.w_ff1, 22, -0.3, 0.3);
    ds::fill_uniform(full.b_ff1, 23);
    ds::fill_uniform(full.w_ff2, 24, -0.3, 0.3);
    ds::fill_uniform(full.b_ff2, 25);
    ds::fill_uniform(full.ln2_weight, 26, 0.5, 1.5);
    ds::fill_uniform(full.ln2_bias, 27);
    return full;
}

// A file rank 0 writes with `save` and every rank then reads: its name is the same on every
// rank and unique to this mpirun (rank 0's process id), and it is removed once all have read.
class shared_file {
public:
    template <class Save>
    shared_file(const dist::group& g, const std::string& name, Save save) : team_(g) {
        ds::tensor<double, Rows> id(Rows{1});
        id(0) = g.rank() == 0 ? double(getpid()) : 0.0;
        dist::all_reduce(g, id);
        path_ = std::filesystem::temp_directory_path() / ("dimsum_dist_" + std::to_string(long(id(0))) + "_" + name);
        if (g.rank() == 0) save(path_);
        g.barrier();
    }
    ~shared_file() {
        team_.barrier();
        if (team_.rank() == 0) std::filesystem::remove_all(path_);
    }
    shared_file(const shared_file&) = delete;
    shared_file& operator=(const shared_file&) = delete;
    const std::filesystem::path& path() const { return path_; }

private:
    dist::group team_;
    std::filesystem::path path_;
};

template <class T, class... A>
bool same_bits(const ds::tensor<T, A...>& a, const ds::tensor<T, A...>& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class Layer>
bool same_attention(const Layer& a, const Layer& b) {
    return a.owned.first == b.owned.first && a.owned.count == b.owned.count && same_bits(a.w_q, b.w_q) &&
           same_bits(a.w_k, b.w_k) && same_bits(a.w_v, b.w_v) && same_bits(a.b_q, b.b_q) && same_bits(a.b_k, b.b_k) &&
           same_bits(a.b_v, b.b_v) && same_bits(a.w_o, b.w_o) && bool(a.b_o) == bool(b.b_o) &&
           (!a.b_o || same_bits(*a.b_o, *b.b_o));
}

// The bytes of float64 values a rank's attention part holds.
template <class Layer>
std::size_t bytes_held(const Layer& l) {
    return 8 * (l.w_q.size() + l.w_k.size() + l.w_v.size() + l.b_q.size() + l.b_k.size() + l.b_v.size() + l.w_o.size() +
                (l.b_o ? l.b_o->size() : 0));
}

}  // namespace

TEST_CASE("split: each rank owns consecutive heads; a count the ranks do not divide is the same error on every rank") {
    const dist::group world = dist::group::world();
    const dist::share mine = world.split(12, "heads");
    ds::tensor<double, Rows> firsts(Rows{std::size_t(world.size())}), mine_first(Rows{1});
    mine_first(0) = double(mine.first);
    dist::all_gather<Rows>(world, mine_first.view(), firsts.view());
    for (int r = 0; r < world.size(); ++r) CHECK(firsts(std::size_t(r)) == double(std::size_t(r) * mine.count));
    CHECK(mine.count * std::size_t(world.size()) == 12);
    if (7 % world.size() != 0) {
        CHECK_THROWS_WITH(world.split(7, "heads"),
                          "dimsum: dist: 7 heads do not split over " + std::to_string(world.size()) + " ranks");
    }
}

TEST_CASE("all_reduce sums every rank's tensor, contiguous or transposed; started, it overlaps other work") {
    const dist::group world = dist::group::world();
    for (auto [rows, cols] : {std::array<std::size_t, 2>{1, 1}, {3, 17}, {65, 7}}) {
        INFO("rows " << rows << " cols " << cols);
        ds::tensor<double, Rows, Cols> want(Rows{rows}, Cols{cols});
        for (int r = 0; r < world.size(); ++r) want = want + data_of(r, rows, cols);
        auto x = data_of(world.rank(), rows, cols);
        dist::all_reduce(world, x);
        CHECK(largest_difference(x.data(), want.data(), x.size()) == 0);

        ds::tensor<double, Cols, Rows> t = ds::transpose(data_of(world.rank(), rows, cols));
        auto strided = ds::transpose(t.view());  // (rows, cols), not contiguous
        dist::all_reduce(world, strided);
        ds::tensor<double, Rows, Cols> back = strided;
        CHECK(largest_difference(back.data(), want.data(), back.size()) == 0);

        auto y = data_of(world.rank(), rows, cols);
        dist::pending sum = dist::all_reduce_start(world, y);
        ds::tensor<double, Rows, Cols> meanwhile = ds::exp(want * 0.0);  // other work while it runs
        sum.wait();
        CHECK(largest_difference(y.data(), want.data(), y.size()) == 0);
        CHECK(meanwhile(0, 0) == 1.0);
    }
}

TEST_CASE("all_gather joins along a named axis in rank order; reduce_scatter sums and cuts along it") {
    const dist::group world = dist::group::world();
    const auto ranks = std::size_t(world.size());
    for (std::size_t cols : {1, 5}) {
        // all_gather along cols, the inner axis: rank r's block at columns [r cols, (r + 1) cols)
        auto local = data_of(world.rank(), 3, cols);
        ds::tensor<double, Rows, Cols> all(Rows{3}, Cols{cols * ranks});
        dist::all_gather<Cols>(world, local.view(), all.view());
        for (std::size_t r = 0; r < ranks; ++r) {
            auto theirs = data_of(int(r), 3, cols);
            for (std::size_t i = 0; i < 3; ++i) {
                for (std::size_t j = 0; j < cols; ++j) CHECK(all(i, r * cols + j) == theirs(i, j));
            }
        }
        // reduce_scatter along rows: rank r gets rows [r 2, (r + 1) 2) of the sum
        auto in = data_of(world.rank(), 2 * ranks, cols);
        ds::tensor<double, Rows, Cols> out(Rows{2}, Cols{cols});
        dist::reduce_scatter<Rows>(world, in.view(), out.view());
        ds::tensor<double, Rows, Cols> sum(Rows{2 * ranks}, Cols{cols});
        for (int r = 0; r < world.size(); ++r) sum = sum + data_of(r, 2 * ranks, cols);
        for (std::size_t i = 0; i < 2; ++i) {
            for (std::size_t j = 0; j < cols; ++j) CHECK(out(i, j) == sum(std::size_t(world.rank()) * 2 + i, j));
        }
    }
}

TEST_CASE("bf16 collectives travel as bf16 and sum in float, rounded at each step") {
    const dist::group world = dist::group::world();
    const auto ranks = std::size_t(world.size());
    // small integers: exact in bf16 (to 256), so every order of summation gives the same sum
    auto small = [](int rank, std::size_t rows, std::size_t cols) {
        ds::tensor<ds::bf16, Rows, Cols> x(Rows{rows}, Cols{cols});
        for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = ds::bf16(float(rank + 1 + int(i % 7)));
        return x;
    };
    auto x = small(world.rank(), 5, 13);
    dist::all_reduce(world, x);
    ds::tensor<ds::bf16, Cols, Rows> t = ds::transpose(small(world.rank(), 5, 13));
    auto strided = ds::transpose(t.view());  // (rows, cols), not contiguous
    dist::all_reduce(world, strided);
    for (std::size_t i = 0; i < x.size(); ++i) {
        float want = 0;
        for (int r = 0; r < world.size(); ++r) want += float(r + 1 + int(i % 7));
        CHECK(float(x.data()[i]) == want);
        CHECK(float(strided(i / 13, i % 13)) == want);
    }
    // a sum that rounds: 1 + 2^-8 + 2^-8 + ... is 1 in bf16 when added in turn from 1, and the
    // all-reduce is within one rounding per step of the exact sum
    ds::tensor<ds::bf16, Rows, Cols> y(Rows{1}, Cols{8});
    for (std::size_t i = 0; i < 8; ++i) y(0, i) = ds::bf16(world.rank() == 0 ? 1.0f : std::ldexp(1.0f, -8));
    dist::all_reduce(world, y);
    const double exact = 1.0 + double(ranks - 1) * std::ldexp(1.0, -8);
    for (std::size_t i = 0; i < 8; ++i) CHECK(std::abs(double(y(0, i)) - exact) <= double(ranks) * std::ldexp(1.0, -8));

    // all_gather moves the bits; reduce_scatter sums and cuts
    auto local = small(world.rank(), 3, 2);
    local(0, 0) = std::numeric_limits<ds::bf16>::quiet_NaN();
    ds::tensor<ds::bf16, Rows, Cols> all(Rows{3}, Cols{2 * ranks});
    dist::all_gather<Cols>(world, local.view(), all.view());
    for (std::size_t r = 0; r < ranks; ++r) {
        auto theirs = small(int(r), 3, 2);
        CHECK(isnan(all(0, r * 2)));
        for (std::size_t i = 0; i < 3; ++i) {
            for (std::size_t j = 0; j < 2; ++j) {
                if (i + j > 0) CHECK(all(i, r * 2 + j).bits == theirs(i, j).bits);
            }
        }
    }
    auto in = small(world.rank(), 2 * ranks, 3);
    ds::tensor<ds::bf16, Rows, Cols> out(Rows{2}, Cols{3});
    dist::reduce_scatter<Rows>(world, in.view(), out.view());
    for (std::size_t i = 0; i < 2; ++i) {
        for (std::size_t j = 0; j < 3; ++j) {
            const std::size_t flat = (std::size_t(world.rank()) * 2 + i) * 3 + j;
            float want = 0;
            for (int r = 0; r < world.size(); ++r) want += float(r + 1 + int(flat % 7));
            CHECK(float(out(i, j)) == want);
        }
    }
}

TEST_CASE("ranks that pass different shapes all get the same shape_error, and none waits") {
    const dist::group world = dist::group::world();
    if (world.size() == 1) return;
    auto x = data_of(world.rank(), 2, world.rank() == 1 ? 4 : 3);  // rank 1 differs
    const auto before = x;
    CHECK_THROWS_WITH(dist::all_reduce(world, x),
                      "dimsum: all_reduce: the ranks pass different sizes (from 6 to 8 elements; this rank " +
                          std::to_string(x.size()) + ")");
    CHECK(largest_difference(x.data(), before.data(), x.size()) == 0);
    world.barrier();  // every rank is still here
}

TEST_CASE("tensor-parallel attention equals the single-process layer, fused or separate projections, every mask") {
    const dist::group world = dist::group::world();
    ds::tensor<double, Batch, Seq, Model> x(Batch{2}, Seq{9});
    ds::fill_normal(x, 11);
    std::vector<std::size_t> lengths{9, 4};
    for (bool fused : {false, true}) {
        const full_attention full = random_attention(fused, true);
        const auto split = dist::multi_head_attention<double, Model, Heads, Head>::shard(full, world);
        CHECK(split.owned.count == 12 / std::size_t(world.size()));
        for (bool causal : {false, true}) {
            for (bool padded : {false, true}) {
                INFO("fused " << fused << " causal " << causal << " padded " << padded);
                ds::nn::attention_options options{.causal = causal};
                if (padded) options.key_lengths = lengths;
                CHECK(largest_difference(split(x, options), full(x, options)) < 1e-12);
            }
        }
    }
    // a group of one (MPI_COMM_SELF) is the single-process layer, on every rank alone
    const dist::group self(MPI_Comm_c2f(MPI_COMM_SELF));
    const full_attention full = random_attention(false, false);
    const auto whole = dist::multi_head_attention<double, Model, Heads, Head>::shard(full, self);
    CHECK(whole.owned.count == 12);
    CHECK(largest_difference(whole(x), full(x)) < 1e-13);
}

TEST_CASE("a tensor-parallel BERT layer equals the single-process one") {
    const dist::group world = dist::group::world();
    const full_encoder full = random_encoder();
    auto split = dist::encoder_layer<double, Model, Heads, Head, Hidden>::shard(full, world);
    ds::tensor<double, Batch, Seq, Model> x(Batch{3}, Seq{5});
    ds::fill_normal(x, 12);
    const auto y = split(x);
    CHECK(largest_difference(y, full(x)) < 1e-12);
    CHECK(largest_difference(split(x, {.causal = true}), full(x, {.causal = true})) < 1e-12);
    // with this rank's projections packed once: the same values, bit for bit (15 rows: the
    // products take the same path packed or not)
    REQUIRE(split.packed_bytes() == 0);
    split.prepack();
    CHECK(split.packed_bytes() >= split.w_ff1.size() * 2 * sizeof(double));
    CHECK(largest_difference(split(x), y) == 0);
    split.unpack();
    CHECK(split.packed_bytes() == 0);
}

TEST_CASE("each rank reads only its slice of the full checkpoint, and holds what shard() cuts from the full layer") {
    const dist::group world = dist::group::world();
    using split_attention = dist::multi_head_attention<double, Model, Heads, Head>;
    for (const char* format : {"layer.safetensors", "layer.npz", "layer"}) {
        for (bool fused : {false, true}) {
            INFO(format << " fused " << fused);
            const full_attention full = random_attention(fused, !fused);  // separate: biases; fused: none
            shared_file file(world, format, [&](const auto& path) { ds::save(full, path, {.prefix = "attention."}); });
            ds::checkpoint in(file.path());
            const auto read = split_attention::load_shard(in, world, "attention.");
            CHECK(same_attention(read, split_attention::shard(full, world)));
            CHECK(in.bytes_read() == bytes_held(read) - (fused ? 8 * 3 * read.b_q.size() : 0));  // absent biases: zeros
        }
    }

    const full_encoder full = random_encoder();
    shared_file file(world, "bert.safetensors", [&](const auto& path) { ds::save(full, path); });
    ds::checkpoint in(file.path());
    using split_encoder = dist::encoder_layer<double, Model, Heads, Head, Hidden>;
    const auto read = split_encoder::load_shard(in, world, "", full.epsilon);
    const auto cut = split_encoder::shard(full, world);
    CHECK(same_attention(read.attention, cut.attention));
    CHECK((same_bits(read.w_ff1, cut.w_ff1) && same_bits(read.b_ff1, cut.b_ff1) && same_bits(read.w_ff2, cut.w_ff2)));
    CHECK((same_bits(read.ln1_weight, cut.ln1_weight) && same_bits(read.ln2_bias, cut.ln2_bias) &&
           same_bits(read.b_ff2, cut.b_ff2)));
    const std::size_t replicated = 8 * 24 * 5;  // two layer norms and b_ff2
    CHECK(in.bytes_read() == bytes_held(read.attention) + 8 * (read.w_ff1.size() + read.b_ff1.size() + read.w_ff2.size()) +
                                 replicated);
    ds::tensor<double, Batch, Seq, Model> x(Batch{2}, Seq{7});
    ds::fill_normal(x, 13);
    CHECK(largest_difference(read(x), full(x)) < 1e-12);
}

TEST_CASE("a checkpoint of another layer is the same shape_error on every rank, never a wrong slice") {
    const dist::group world = dist::group::world();
    struct narrower {  // w_q of 20 columns where the layer has heads x head = 24
        BOOST_HANA_DEFINE_STRUCT(narrower,
            (ds::tensor<double, Model, ds::axis<"inner", 20>>, w_q));
    };
    shared_file file(world, "narrow.safetensors", [](const auto& path) { ds::save(narrower{}, path); });
    ds::checkpoint in(file.path());
    std::string message;
    try {
        dist::multi_head_attention<double, Model, Heads, Head>::load_shard(in, world);
    } catch (const ds::shape_error& e) {
        message = e.what();
    }
    CHECK(message == "dimsum: dist: load_shard: " + file.path().string() +
                         ", parameter 'w_q': axis 1 is 20 in the file, 24 in the layer");
}

int main(int argc, char** argv) {
    dist::session mpi(argc, argv);
    return run_catch_session(argc, argv);
}
