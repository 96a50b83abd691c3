// expect: dimsum: select: no axis named part in (seq=?, model=768)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Part = ds::axis<"part", 3>;

int main() {
#ifdef DIMSUM_KO
    ds::tensor<float, Seq, Model> qkv(Seq{4});
#else
    ds::tensor<float, Seq, Part, Model> qkv(Seq{4});
#endif
    auto q = ds::select<Part>(qkv, 0);
    (void)q;
}
