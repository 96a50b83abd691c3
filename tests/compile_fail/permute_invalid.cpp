// expect: dimsum: permute: (0, 0, 1) is not a permutation of the axes of (batch=?, seq=?, model=768)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;

int main() {
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{10});
#ifdef DIMSUM_KO
    auto p = ds::permute<0, 0, 1>(x);
#else
    auto p = ds::permute<0, 2, 1>(x);
#endif
    (void)p;
}
