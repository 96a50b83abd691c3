#include <dimsum/dimsum.hpp>

#include <cmath>
#include <cstdio>
#include <string_view>

namespace ds = dimsum;

int main() {
    using Rows = ds::axis<"rows", 2>;
    using Cols = ds::axis<"cols", 3>;
    ds::tensor<double, Rows, Cols> x({1.0, 2.0, 3.0, -1.0, 0.0, 1.0});
    auto row_sums = ds::eval(ds::sum<Cols>(ds::softmax(x)));
    if (!(std::abs(row_sums(0) - 1.0) < 1e-12 && std::abs(row_sums(1) - 1.0) < 1e-12)) return 1;

    // The instruction set the kernels were compiled for, against what the build asked for.
    const std::string_view isa = ds::backend::cpu::instruction_set();
    const std::string_view expected = EXPECTED_ISA;
    std::printf("kernels compiled for %s (expected: %s)\n", isa.data(), expected.data());
    if (expected == "sse2") return isa == "sse2" ? 0 : 1;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && isa == "sse2" ? 1 : 0;
}
