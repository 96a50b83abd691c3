// expect: dimsum: slice: [96, 160) does not lie within model=128
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 128>;

int main() {
    ds::tensor<float, Seq, Model> x(Seq{4});
#ifdef DIMSUM_KO
    auto last = ds::slice<Model, 96, 160>(x);  // past the end of a static axis
#else
    auto last = ds::slice<Model, 96, 128>(x);
#endif
    (void)last;
}
