// Scores of self-attention have two axes called seq: name one of them to pick it.
// expect: dimsum: softmax: axis name seq is ambiguous in (seq=?, seq=?)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;
using Key = ds::axis<"key">;

int main() {
    ds::tensor<float, Seq, Seq> scores(Seq{5}, Seq{5});
#ifdef DIMSUM_KO
    auto weights = ds::eval(ds::softmax<Seq>(scores));
#else
    auto weights = ds::eval(ds::softmax(scores));  // the last axis
#endif
    (void)weights;
}
