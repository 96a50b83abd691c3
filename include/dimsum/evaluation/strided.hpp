#pragma once
// What kernels see of a tensor: a pointer, extents and strides, with the rank known only at
// run time. Kernels written over it are compiled once per element type, not once per formula,
// which keeps formulas quick to compile. A strided array is a layout (layout.hpp) placed at an
// address.

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "dimsum/core/next_index.hpp"
#include "dimsum/evaluation/layout.hpp"
#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum::evaluation {

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
    static_assert(sizeof...(A) <= max_rank, "dimsum: evaluation handles tensors of at most 8 axes (evaluation::max_rank)");
    strided<T> s{v.data(), sizeof...(A), {}, {}};
    for (std::size_t i = 0; i < sizeof...(A); ++i) {
        s.extents[i] = v.extent(i);
        s.strides[i] = v.strides()[i];
    }
    return s;
}

// The layout of s, offsets counted from s.data.
template <class T>
layout layout_of(const strided<T>& s) {
    return {s.rank, s.extents, s.strides, 0};
}

// Layout l at address `base`.
template <class T>
strided<T> strided_at(T* base, const layout& l) {
    return {base + l.offset, l.rank, l.extents, l.strides};
}

// The same elements read as `rank` axes (layout.hpp's broadcast).
template <class T>
strided<T> broadcast_to_rank(const strided<T>& s, std::size_t rank) {
    return strided_at(s.data, broadcast(layout_of(s), rank));
}

// What kernels see of a tensor of integers (int32 or int64): its memory and layout, each
// element read as int64.
class integers {
public:
    integers(const void* data, bool wide, const layout& where) : data_(data), wide_(wide), where_(where) {}

    const layout& where() const { return where_; }
    std::int64_t at(const std::size_t* index) const { return at_offset(where_.at(index)); }
    std::int64_t at_offset(std::ptrdiff_t offset) const {
        return wide_ ? static_cast<const std::int64_t*>(data_)[offset] : static_cast<const std::int32_t*>(data_)[offset];
    }

private:
    const void* data_;
    bool wide_;
    layout where_;
};

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
