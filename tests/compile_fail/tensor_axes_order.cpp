// expect: dimsum: shape: (batch=?, seq=?, model=768) is sized by its run-time axes or by all its axes, in order, not by (seq=?, batch=?)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;

int main() {
#ifdef DIMSUM_KO
    ds::tensor<float, Batch, Seq, Model> x(Seq{10}, Batch{2});
#else
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{10});
#endif
    (void)x;
}
