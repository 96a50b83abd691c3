// expect: dimsum: cast: from double to bf16 is not supported: a cast goes to bf16 from float, to double from float, to float from a tensor of double, or to float or double from bf16, int32 or int64
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using N = ds::axis<"n", 8>;

int main() {
#ifdef DIMSUM_KO
    ds::tensor<double, N> a;
#else
    ds::tensor<float, N> a;
#endif
    ds::tensor<ds::bf16, N> c = ds::cast<ds::bf16>(a * 2);
    (void)c;
}
