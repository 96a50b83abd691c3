// expect: dimsum: assign: a view of a temporary or of a formula is read only: evaluate it into a tensor first, or view a named tensor
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq", 4>;
using Model = ds::axis<"model", 8>;

int main() {
    ds::tensor<float, Seq, Model> x;
    ds::tensor<float, Model> row;
#ifdef DIMSUM_KO
    ds::select<Seq>(x * 2.0f, 0) = row;  // a row of a formula: nowhere to write it
#else
    ds::select<Seq>(x, 0) = row;  // a row of a named tensor: a writable view
#endif
}
