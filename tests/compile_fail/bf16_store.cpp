// expect: operands hold different element types: bf16 vs float (convert one: ds::cast<float>(x) or ds::cast<ds::bf16>(x))
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using N = ds::axis<"n", 8>;

int main() {
    ds::tensor<float, N> a;
#ifdef DIMSUM_KO
    ds::tensor<ds::bf16, N> y = a + a;  // a float formula stored in bf16 without a cast
#else
    ds::tensor<ds::bf16, N> y = ds::cast<ds::bf16>(a + a);
#endif
    (void)y;
}
