// expect: dimsum: transpose: no axis named heads in (batch=?, seq=?, model=768)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;

int main() {
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{10});
#ifdef DIMSUM_KO
    auto t = ds::transpose<Seq, Heads>(x);
#else
    auto t = ds::transpose<Seq, Model>(x);
#endif
    (void)t;
}
