// expect: dimsum: add: operands hold different element types: float vs double (float and double do not mix in a formula yet)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using N = ds::axis<"n", 8>;

int main() {
    ds::tensor<float, N> a;
#ifdef DIMSUM_KO
    ds::tensor<double, N> b;
#else
    ds::tensor<float, N> b;
#endif
    auto c = ds::eval(a + b);
    (void)c;
}
