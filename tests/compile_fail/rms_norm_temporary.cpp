// expect: dimsum: nn::rms_norm reads x twice: give it a named tensor or a formula, not a temporary tensor
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq", 4>;
using Model = ds::axis<"model", 8>;

int main() {
    ds::tensor<float, Seq, Model> x;
    ds::tensor<float, Model> g;
#ifdef DIMSUM_KO
    auto y = ds::eval(ds::nn::rms_norm(ds::eval(x * 2.0f), g));  // the temporary dies before y is computed
#else
    auto y = ds::eval(ds::nn::rms_norm(x * 2.0f, g));  // a formula is held by value
#endif
    (void)y;
}
