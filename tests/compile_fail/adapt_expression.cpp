// expect: dimsum: adapt: this xtensor expression is a formula (or a view through index lists), not memory at strides: evaluate it first
// max-lines: 10
// An xtensor formula has no memory for a view to read: adapting one is one compile error that
// says to evaluate it first, not a cascade from inside xtensor.
#include <dimsum/interop/xtensor.hpp>

#include <xtensor/xarray.hpp>

namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;

int main() {
    xt::xarray<double> a = xt::zeros<double>({3, 4});
    xt::xarray<double> b = xt::ones<double>({3, 4});
#ifdef DIMSUM_KO
    auto sum = ds::adapt<Rows, Cols>(a + b);
#else
    xt::xarray<double> evaluated = a + b;
    auto sum = ds::adapt<Rows, Cols>(evaluated);
#endif
    (void)sum;
}
