// expect: dimsum: vjp: cannot store (cols=4, rows=?) in (rows=?, cols=4)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols", 4>;

int main() {
    ds::tensor<float, Rows, Cols> x(Rows{3}), cotangent(Rows{3});
#ifdef DIMSUM_KO
    auto g = ds::vjp(ds::tanh(x), x, ds::transpose(cotangent));
#else
    auto g = ds::vjp(ds::tanh(x), x, cotangent);
#endif
    (void)g;
}
