// Names carry meaning: head and model never broadcast, whatever the extents.
// expect: dimsum: add: cannot broadcast head=64 with model=64 in (seq=?, head=64) and (seq=?, model=64)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;
using Head = ds::axis<"head", 64>;
using Model = ds::axis<"model", 64>;

int main() {
    ds::tensor<float, Seq, Head> a(Seq{3});
#ifdef DIMSUM_KO
    ds::tensor<float, Seq, Model> b(Seq{3});
#else
    auto b = ds::rename<Model, Head>(ds::tensor<float, Seq, Model>(Seq{3}));  // says they are the same
#endif
    auto c = ds::eval(a + b);
    (void)c;
}
