// expect: dimsum: grad: the formula reads no tensor of double, so it has no gradient with respect to x (rows=?)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Rows = ds::axis<"rows">;

int main() {
    ds::tensor<float, Rows> x(Rows{3});
    ds::tensor<double, Rows> y(Rows{3});
#ifdef DIMSUM_KO
    auto g = ds::grad(ds::sum<Rows>(x * x), y);
#else
    auto g = ds::grad(ds::sum<Rows>(x * x), x);
#endif
    (void)g;
}
