// expect: dimsum: sum: no axis named key in (query=?, head=64)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head", 64>;

int main() {
    ds::tensor<float, Query, Head> q(Query{5});
#ifdef DIMSUM_KO
    auto total = ds::eval(ds::sum<Key>(q));
#else
    auto total = ds::eval(ds::sum<Query>(q));
#endif
    (void)total;
}
