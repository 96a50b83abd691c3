// The BERT layer of bert_layer.hpp split over MPI ranks (dist::encoder_layer): each rank owns
// heads / ranks of its heads and hidden / ranks of its feed-forward units, and two all-reduces
// per layer join the ranks' parts. Run with
//
//     mpirun -np 2 ./tensor_parallel [--weights PATH]
//
// (across machines: mpirun --hostfile hosts -np N ...). Every rank reads only its part of the
// checkpoint (by default the committed tests/reference/bert/weights.safetensors): its columns
// and rows of the projections, and the small vectors every rank needs. Each runs the layer on
// the same input, and checks the whole output against PyTorch's, with and
// without key padding; rank 0 prints. A rank count that does not divide the heads, or any
// other error on any rank, ends every rank with one message (dist::run_or_abort).

#include <dimsum/dimsum.hpp>
#include <dimsum/dist/layers.hpp>
#include <dimsum/interop/npy.hpp>
#include <dimsum/interop/parameters.hpp>

#include "bert_layer.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dist = dimsum::dist;

int main(int argc, char** argv) {
    dist::session mpi(argc, argv);
    const dist::group world = dist::group::world();
    std::string weights = DIMSUM_BERT_DATA "/weights.safetensors";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--weights") weights = argv[i + 1];
    }
    const std::string dir = DIMSUM_BERT_DATA;
    return dist::run_or_abort(world, [&] {
        using namespace bert;
        ds::checkpoint file(weights);
        const auto layer = dist::encoder_layer<float, Model, Heads, Head, Hidden>::load_shard(file, world, "", epsilon);
        std::uint64_t whole = 0;  // the bytes of every array in the file, for comparison
        for (const std::string& name : file.names()) {
            const ds::stored_array array = *file.find(name);
            std::uint64_t count = 4;  // float32
            for (std::size_t extent : array.shape) count *= extent;
            whole += count;
        }

        activations x = ds::load_npy<float, Batch, Seq, Model>(dir + "/x.npy");
        auto want = ds::load_npy<double, Batch, Seq, Model>(dir + "/out.npy");
        auto want_padded = ds::load_npy<double, Batch, Seq, Model>(dir + "/out_padded.npy");
        auto lengths_file = ds::load_npy<double, Batch>(dir + "/lengths.npy");
        std::vector<std::size_t> lengths(lengths_file.data(), lengths_file.data() + lengths_file.size());

        const double plain = difference(layer(x), want);
        const double padded = difference(layer(x, {.key_lengths = lengths}), want_padded);
        if (world.rank() == 0) {
            std::printf("BERT encoder layer over %d ranks (rank 0: heads %zu to %zu of 2)\n", world.size(),
                        layer.attention.owned.first, layer.attention.owned.first + layer.attention.owned.count);
            std::printf("rank 0 read %llu of the checkpoint's %llu bytes of weights\n",
                        static_cast<unsigned long long>(file.bytes_read()), static_cast<unsigned long long>(whole));
            std::printf("largest difference from torch.nn.TransformerEncoderLayer: %.2e; with key padding: %.2e\n", plain,
                        padded);
        }
        return plain <= 1e-4 && padded <= 1e-4 ? 0 : 1;
    });
}
