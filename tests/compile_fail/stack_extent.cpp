// expect: dimsum: stack: 3 operands along part=2
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq", 4>;

int main() {
    ds::tensor<float, Seq> a, b, c;
#ifdef DIMSUM_KO
    auto stacked = ds::eval(ds::stack<ds::axis<"part", 2>, 0>(a, b, c));
#else
    auto stacked = ds::eval(ds::stack<ds::axis<"part", 3>, 0>(a, b, c));
#endif
    (void)stacked;
}
