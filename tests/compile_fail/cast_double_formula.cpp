// expect: dimsum: cast: from a formula of double to float: evaluate it into a ds::tensor<double> first, then cast that tensor (a formula computes in one type; cast<float> rounds the values of a tensor or view of double)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using N = ds::axis<"n", 8>;

int main() {
    ds::tensor<double, N> angles;
#ifdef DIMSUM_KO
    ds::tensor<float, N> c = ds::cast<float>(ds::cos(angles));
#else
    ds::tensor<double, N> cosines = ds::cos(angles);
    ds::tensor<float, N> c = ds::cast<float>(cosines);
#endif
    (void)c;
}
