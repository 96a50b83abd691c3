// expect: dimsum: prepack: every use of the packing but a product reads the matrix itself, so it takes a named tensor or a view, not a temporary
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Inner = ds::axis<"inner", 8>;
using Cols = ds::axis<"cols", 4>;

int main() {
    ds::tensor<float, Inner, Cols> w;
#ifdef DIMSUM_KO
    ds::prepack(ds::eval(w * 2.0f));  // the temporary dies, the packing would read it
#else
    const auto packed = ds::prepack(w);
    auto y = ds::eval(ds::matmul(ds::tensor<float, ds::axis<"rows", 3>, Inner>(), packed));
    (void)y;
#endif
}
