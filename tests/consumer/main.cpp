#include <dimsum/dimsum.hpp>

#include <cmath>

namespace ds = dimsum;

int main() {
    using Rows = ds::axis<"rows", 2>;
    using Cols = ds::axis<"cols", 3>;
    ds::tensor<double, Rows, Cols> x({1.0, 2.0, 3.0, -1.0, 0.0, 1.0});
    auto row_sums = ds::eval(ds::sum<Cols>(ds::softmax(x)));
    return std::abs(row_sums(0) - 1.0) < 1e-12 && std::abs(row_sums(1) - 1.0) < 1e-12 ? 0 : 1;
}
