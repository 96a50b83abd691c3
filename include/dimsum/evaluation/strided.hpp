#pragma once
// What the reference kernels see of a tensor: a pointer, extents and strides, with the rank
// known only at run time. Kernels written over it are compiled once per element type, not
// once per formula, which keeps formulas quick to compile.

#include <array>
#include <cstddef>
#include <stdexcept>

#include "dimsum/core/next_index.hpp"
#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum::evaluation {

inline constexpr std::size_t max_rank = 8;

template <class T>
struct strided {
    T* data = nullptr;
    std::size_t rank = 0;
    std::array<std::size_t, max_rank> extents{};
    std::array<std::ptrdiff_t, max_rank> strides{};

    std::size_t size() const {
        std::size_t n = 1;
        for (std::size_t i = 0; i < rank; ++i) n *= extents[i];
        return n;
    }
    T& at(const std::size_t* index) const {
        std::ptrdiff_t offset = 0;
        for (std::size_t i = 0; i < rank; ++i) offset += static_cast<std::ptrdiff_t>(index[i]) * strides[i];
        return data[offset];
    }
};

template <class T, class... A>
strided<T> to_strided(const tensor_view<T, A...>& v) {
    static_assert(sizeof...(A) <= max_rank, "dimsum: the reference backend handles at most 8 axes");
    strided<T> s{v.data(), sizeof...(A), {}, {}};
    for (std::size_t i = 0; i < sizeof...(A); ++i) {
        s.extents[i] = v.extent(i);
        s.strides[i] = v.strides()[i];
    }
    return s;
}

// The same elements read as `rank` axes: missing leading axes and axes of extent 1 get
// stride 0, so that any index along them reads the one element there (broadcasting).
template <class T>
strided<T> broadcast_to_rank(strided<T> s, std::size_t rank) {
    strided<T> out{s.data, rank, {}, {}};
    std::size_t lead = rank - s.rank;
    for (std::size_t i = 0; i < rank; ++i) {
        out.extents[i] = i < lead ? 1 : s.extents[i - lead];
        out.strides[i] = i < lead || out.extents[i] == 1 ? 0 : s.strides[i - lead];
    }
    return out;
}

// Calls f(index) for every index of `extents` (the first `rank`) in row-major order.
template <class F>
void for_each_index(const std::array<std::size_t, max_rank>& extents, std::size_t rank, F&& f) {
    for (std::size_t i = 0; i < rank; ++i) {
        if (extents[i] == 0) return;
    }
    std::array<std::size_t, max_rank> index{};
    do {
        f(index.data());
    } while (dimsum::detail::next_index(index.data(), extents.data(), rank));
}

}  // namespace dimsum::evaluation
