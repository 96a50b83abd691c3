// expect: dimsum: where condition: takes masks (bool), not float; compare first, e.g. x > 0
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Q = ds::axis<"q", 4>;

int main() {
    ds::tensor<float, Q, Q> scores;
#ifdef DIMSUM_KO
    auto masked = ds::eval(ds::where(scores, scores, 0.0f));
#else
    auto masked = ds::eval(ds::where(ds::causal_mask(Q{}, Q{}), scores, 0.0f));
#endif
    (void)masked;
}
