// expect: dimsum: multiply: cannot broadcast model=768 with model=512 in (seq=?, model=768) and (model=512)
#include <dimsum/dimsum.hpp>
namespace ds = dimsum;

using Seq = ds::axis<"seq">;

int main() {
    ds::tensor<float, Seq, ds::axis<"model", 768>> x(Seq{3});
#ifdef DIMSUM_KO
    ds::tensor<float, ds::axis<"model", 512>> scale;
#else
    ds::tensor<float, ds::axis<"model", 768>> scale;
#endif
    auto y = ds::eval(x * scale);
    (void)y;
}
