// expect: dimsum: softmax: no axis named key in (query=?, head=64)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head", 64>;

int main() {
    ds::tensor<float, Query, Head> q(Query{5});
#ifdef DIMSUM_KO
    auto weights = ds::eval(ds::softmax<Key>(q));
#else
    auto weights = ds::eval(ds::softmax<Query>(q));
#endif
    (void)weights;
}
