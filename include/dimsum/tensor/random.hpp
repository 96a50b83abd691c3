#pragma once
// Seeded random initialisation. Element i (in row-major order) is a pure function of the
// seed and i (SplitMix64), so the numbers are the same on every platform and standard
// library, and a few lines of NumPy reproduce them (tests/reference/generate.py does).

#include <cmath>
#include <cstdint>
#include <numbers>

#include "dimsum/core/next_index.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum {

namespace detail {

constexpr std::uint64_t splitmix64(std::uint64_t seed, std::uint64_t i) {
    std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1), from the top 53 bits.
constexpr double unit_uniform(std::uint64_t seed, std::uint64_t i) {
    return static_cast<double>(splitmix64(seed, i) >> 11) * 0x1p-53;
}

// Calls v[index] = draw(i) for each element, i counting in row-major order.
template <class T, class... A, class Draw>
void fill_each(const tensor_view<T, A...>& v, Draw draw) {
    std::array<std::size_t, sizeof...(A)> index{};
    auto extents = v.shape().extents();
    std::size_t n = v.size();
    for (std::size_t i = 0; i < n; ++i) {
        v.data()[v.offset(index)] = static_cast<T>(draw(i));
        next_index(index.data(), extents.data(), extents.size());
    }
}

}  // namespace detail

// Uniform in [low, high).
template <class T, class... A>
void fill_uniform(const tensor_view<T, A...>& v, std::uint64_t seed, double low = -1.0, double high = 1.0) {
    detail::fill_each(v, [&](std::uint64_t i) { return low + (high - low) * detail::unit_uniform(seed, i); });
}

// Normal with the given mean and standard deviation (Box-Muller on draws 2i and 2i + 1).
template <class T, class... A>
void fill_normal(const tensor_view<T, A...>& v, std::uint64_t seed, double mean = 0.0, double stddev = 1.0) {
    detail::fill_each(v, [&](std::uint64_t i) {
        double u = 1.0 - detail::unit_uniform(seed, 2 * i);  // in (0, 1]: the log stays finite
        double w = detail::unit_uniform(seed, 2 * i + 1);
        return mean + stddev * std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * w);
    });
}

template <class T, class... A>
void fill_uniform(tensor<T, A...>& t, std::uint64_t seed, double low = -1.0, double high = 1.0) {
    fill_uniform(t.view(), seed, low, high);
}
template <class T, class... A>
void fill_normal(tensor<T, A...>& t, std::uint64_t seed, double mean = 0.0, double stddev = 1.0) {
    fill_normal(t.view(), seed, mean, stddev);
}

}  // namespace dimsum
