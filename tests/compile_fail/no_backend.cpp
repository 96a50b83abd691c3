// expect: dimsum: assigning a formula needs a backend: include <dimsum/dimsum.hpp>
// max-lines: 15
// Tensors and operations included without a backend: assigning a formula is one compile
// error that names the header, where it once compiled and failed at link time.
#include <dimsum/ops/elementwise.hpp>
#include <dimsum/tensor/tensor.hpp>
#ifndef DIMSUM_KO
#include <dimsum/dimsum.hpp>
#endif
namespace ds = dimsum;

using Seq = ds::axis<"seq">;

int main() {
    ds::tensor<float, Seq> x(Seq{4});
    ds::tensor<float, Seq> y = x * 2.0f;
    (void)y;
}
