// expect: dimsum: squeeze: model=768 is not of extent 1
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;

int main() {
    ds::tensor<float, Seq, Model> x(Seq{4});
    auto kept = ds::mean<Model>(x, ds::keep_axis);  // (seq, model=1)
#ifdef DIMSUM_KO
    auto rows = ds::squeeze<Model>(x);  // the reduced axis is in kept, not in x
#else
    auto rows = ds::squeeze<Model>(kept);
#endif
    (void)rows;
}
