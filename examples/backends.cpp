// Where formulas run: the CPU backend (SIMD, OpenMP) by default, the reference backend when
// asked for; how many threads; and a formula evaluated in a loop without allocating.
#include <dimsum/dimsum.hpp>

#include <cmath>
#include <iostream>

namespace ds = dimsum;

using Tokens = ds::axis<"tokens">;
using Model = ds::axis<"model", 256>;
using Hidden = ds::axis<"hidden", 1024>;

int main() {
    ds::tensor<float, Tokens, Model> x(Tokens{100});
    ds::tensor<float, Model, Hidden> w;
    ds::tensor<float, Hidden> bias;
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2, -0.0625, 0.0625);
    ds::fill_uniform(bias, 3);

    ds::set_num_threads(2);  // as OMP_NUM_THREADS would; set_num_threads(0) returns to the default

    // The product's bias and tanh are applied as each block of it is finished (an epilogue).
    ds::tensor<float, Tokens, Hidden> h(Tokens{100});
    for (int step = 0; step < 3; ++step) h = ds::tanh(ds::matmul(x, w) + bias);  // allocates only the first time

    // The reference backend: plain loops, accumulating in double. The oracle of the tests.
    auto oracle = ds::eval(ds::tanh(ds::matmul(x, w) + bias), ds::backend::reference::evaluator{});

    double worst = 0;
    for (std::size_t i = 0; i < h.size(); ++i) worst = std::fmax(worst, std::fabs(h.data()[i] - oracle.data()[i]));
    std::cout << "h " << h.shape() << ": largest difference from the reference backend " << worst << "\n";
    return worst < 1e-5 ? 0 : 1;
}
