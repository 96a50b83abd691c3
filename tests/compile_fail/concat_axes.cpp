// expect: dimsum: concat along seq: the other axes of the operands differ: (seq=4, model=8) and (seq=3, model=6)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;

int main() {
    ds::tensor<float, ds::axis<"seq", 4>, ds::axis<"model", 8>> a;
#ifdef DIMSUM_KO
    ds::tensor<float, ds::axis<"seq", 3>, ds::axis<"model", 6>> b;
#else
    ds::tensor<float, ds::axis<"seq", 3>, ds::axis<"model", 8>> b;
#endif
    auto joined = ds::eval(ds::concat<Seq>(a, b));
    (void)joined;
}
