// expect: dimsum: gather: the ids must hold int32_t or int64_t, not float
#include <dimsum/dimsum.hpp>
#include <cstdint>
namespace ds = dimsum;

using Vocab = ds::axis<"vocab", 10>;
using Model = ds::axis<"model", 4>;
using Seq = ds::axis<"seq", 3>;

int main() {
    ds::tensor<float, Vocab, Model> table;
#ifdef DIMSUM_KO
    ds::tensor<float, Seq> ids;
#else
    ds::tensor<std::int64_t, Seq> ids;
#endif
    auto rows = ds::eval(ds::gather<Vocab>(table, ids));  // (seq, model)
    (void)rows;
}
