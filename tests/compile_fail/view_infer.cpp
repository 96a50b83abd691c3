// expect: dimsum: view: cannot infer more than one run-time extent of (rows=?, cols=?) from (n=?)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using N = ds::axis<"n">;
using Rows = ds::axis<"rows">;

int main() {
    ds::tensor<float, N> x(N{12});
#ifdef DIMSUM_KO
    auto m = ds::view<Rows, ds::axis<"cols">>(x);
#else
    auto m = ds::view<Rows, ds::axis<"cols", 4>>(x);
#endif
    (void)m;
}
