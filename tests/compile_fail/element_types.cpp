// expect: dimsum: add: operands hold different element types: float vs double (convert one: ds::cast<double>(x) of float, or ds::cast<float>(x) of a tensor of double)
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
