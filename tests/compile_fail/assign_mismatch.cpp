// expect: dimsum: assign: cannot store (seq=?, model=768) in (seq=?, heads=12)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;

int main() {
    ds::tensor<float, Seq, Model> x(Seq{4});
#ifdef DIMSUM_KO
    ds::tensor<float, Seq, Heads> y = x * 2.0f;
#else
    ds::tensor<float, Seq, Model> y = x * 2.0f;
#endif
    (void)y;
}
