// expect: dimsum: add: operands hold different element types: bf16 vs float (convert one: ds::cast<float>(x) or ds::cast<ds::bf16>(x))
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using N = ds::axis<"n", 8>;

int main() {
    ds::tensor<ds::bf16, N> a;
    ds::tensor<float, N> b;
#ifdef DIMSUM_KO
    ds::tensor<float, N> c = a + b;  // bf16 meets float without a cast
#else
    ds::tensor<float, N> c = ds::cast<float>(a) + b;
#endif
    (void)c;
}
