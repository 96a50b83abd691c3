// expect: dimsum: logical_or: takes masks (bool), not float; compare first, e.g. x > 0
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Q = ds::axis<"q", 4>;

int main() {
    ds::tensor<float, Q, Q> scores;
#ifdef DIMSUM_KO
    auto hidden = ds::causal_mask(Q{}, Q{}) || scores;
#else
    auto hidden = ds::causal_mask(Q{}, Q{}) || scores < 0.0f;
#endif
    auto masked = ds::eval(ds::masked_fill(scores, hidden, 0.0f));
    (void)masked;
}
