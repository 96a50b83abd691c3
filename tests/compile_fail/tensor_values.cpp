// expect: dimsum: tensor: 5 values given for (rows=2, cols=3), which holds 6
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Rows = ds::axis<"rows", 2>;
using Cols = ds::axis<"cols", 3>;

int main() {
#ifdef DIMSUM_KO
    ds::tensor<float, Rows, Cols> m({1.0, 2.0, 3.0, 4.0, 5.0});
#else
    ds::tensor<float, Rows, Cols> m({1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
#endif
    (void)m;
}
