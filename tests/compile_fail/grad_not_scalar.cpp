// expect: dimsum: grad: the formula is of (rows=?, cols=4), not a scalar: sum it, or give ds::vjp a cotangent of its shape
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols", 4>;

int main() {
    ds::tensor<float, Rows, Cols> x(Rows{3});
#ifdef DIMSUM_KO
    auto g = ds::eval(ds::grad(ds::exp(x), x));
#else
    auto g = ds::eval(ds::grad(ds::sum<Rows>(ds::sum<Cols>(ds::exp(x))), x));
#endif
    (void)g;
}
