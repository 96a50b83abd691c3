// expect: dimsum: view: sizes do not multiply out: (batch=?, seq=?, model=768) has 768 elements per run-time index, (batch=?, seq=?, heads=12, head=60) has 720
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;
#ifdef DIMSUM_KO
using Head = ds::axis<"head", 60>;
#else
using Head = ds::axis<"head", 64>;
#endif

int main() {
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{10});
    auto heads = ds::view<Batch, Seq, Heads, Head>(x);
    (void)heads;
}
