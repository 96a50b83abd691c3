// expect: dimsum: matmul: both operands need two or more axes: (model=768) x (model=768, model=768)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Model = ds::axis<"model", 768>;

int main() {
    ds::tensor<float, Model, Model> w;
#ifdef DIMSUM_KO
    ds::tensor<float, Model> v;
#else
    ds::tensor<float, ds::dim<1>, Model> v;
#endif
    auto y = ds::eval(ds::matmul(v, w));
    (void)y;
}
