// expect: dimsum: matmul: contracted axes differ: model=768 vs heads=12
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Seq   = ds::axis<"seq">;
using Model = ds::axis<"model", 768>;
using Heads = ds::axis<"heads", 12>;
using Head  = ds::axis<"head", 64>;

int main() {
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{10});
#ifdef DIMSUM_KO
    ds::tensor<float, Heads, Head> w_k;  // should be (model, model)
#else
    ds::tensor<float, Model, Model> w_k;
#endif
    auto k = ds::eval(ds::matmul(x, w_k));
    (void)k;
}
