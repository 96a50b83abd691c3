// expect: dimsum: map: f cannot be called as f(float) (or is not const-callable)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Rows = ds::axis<"rows", 4>;
using Cols = ds::axis<"cols", 3>;

int main() {
    ds::tensor<float, Rows, Cols> x, y;
    auto f = [](float v, float w) { return v < 0.0f ? w : v; };
#ifdef DIMSUM_KO
    auto z = ds::eval(ds::map(f, x));  // one operand for a function of two
#else
    auto z = ds::eval(ds::map(f, x, y));
#endif
    (void)z;
}
