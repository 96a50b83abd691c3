// Parity tests: the CPU backend against the reference backend.
#pragma once

#include "../support/support.hpp"

#include <limits>

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Heads = ds::axis<"heads">;
using M = ds::axis<"m">;
using K = ds::axis<"k">;
using N = ds::axis<"n">;

namespace parity {

inline constexpr std::size_t sizes[] = {1, 3, 7, 17, 65, 257};

template <class T>
inline constexpr double tolerance = std::is_same_v<T, float> ? 2e-5 : 1e-12;

// The CPU backend's value of the formula matches the reference backend's.
template <class E>
void require_parity(const E& formula, double rtol, double atol) {
    auto fast = ds::eval(formula, ds::backend::cpu::evaluator{});
    auto reference = ds::eval(formula, ds::backend::reference::evaluator{});
    test::require_close(fast, test::to_xt(reference), rtol, atol);
}

// Runs the checks with 1 and with 2 threads: a 2-thread team splits the work even on a
// machine with one core.
template <class F>
void with_one_and_two_threads(F&& checks) {
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        checks();
    }
    ds::set_num_threads(0);
}

}  // namespace parity

