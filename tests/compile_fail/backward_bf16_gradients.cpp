// expect: dimsum: backward: gradients of the type the formula computes in (float for bf16 parameters)
// A bf16 model's gradients are computed in float and kept in float: a struct of bf16 for them
// would round each one, and an optimizer's float parameters want them whole.
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;

int main() {
    ds::tensor<ds::bf16, Rows, Cols> w(Rows{3}, Cols{4});
    auto loss = ds::sum<Rows>(ds::sum<Cols>(ds::cast<float>(w * w)));
#ifdef DIMSUM_KO
    ds::tensor<ds::bf16, Rows, Cols> g(Rows{3}, Cols{4});
#else
    ds::tensor<float, Rows, Cols> g(Rows{3}, Cols{4});
#endif
    ds::backward(loss, w, g);
}
