// expect: dimsum: this formula reads GPU memory (a cuda::tensor or a view of one), which this backend cannot: evaluate it with ds::backend::cuda::evaluator, or copy it to the host first (cuda::to_host)
#include <dimsum/dimsum.hpp>
#include <dimsum/backend/cuda/tensor.hpp>
namespace ds = dimsum;
namespace cuda = ds::backend::cuda;

using Rows = ds::axis<"rows", 3>;
using Cols = ds::axis<"cols", 4>;

int main() {
    const cuda::tensor<float, Rows, Cols> x{ds::shape<Rows, Cols>{}};
#ifdef DIMSUM_KO
    auto y = ds::eval(ds::exp(x) + 1.0f);  // the CPU backend cannot read x
#else
    auto y = cuda::eval(ds::exp(x) + 1.0f);
#endif
    (void)y;
}
