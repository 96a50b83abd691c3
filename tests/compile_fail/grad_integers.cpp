// expect: dimsum: grad: with respect to int64 values: integers and masks carry no gradient
#include <dimsum/dimsum.hpp>
#include <cstdint>
namespace ds = dimsum;

using Vocab = ds::axis<"vocab">;
using Model = ds::axis<"model">;
using Seq = ds::axis<"seq">;

int main() {
    ds::tensor<float, Vocab, Model> table(Vocab{10}, Model{4});
    ds::tensor<std::int64_t, Seq> ids(Seq{3});
    auto loss = ds::sum<Seq>(ds::sum<Model>(ds::gather<Vocab>(table, ids)) * ds::cast<float>(ids));
#ifdef DIMSUM_KO
    auto g = ds::grad(loss, ids);
#else
    auto g = ds::grad(loss, table);
#endif
    (void)g;
}
