#pragma once
// What kernels see of a tensor: a pointer and a layout (layout.hpp), the rank known only at
// run time. Kernels written over it are compiled once per element type, not once per formula,
// which keeps formulas quick to compile. Its views are layout's functions applied to `where`.

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
    T* data = nullptr;  // element (0, ..., 0)
    layout where{};     // offsets from data: where.offset is 0

    std::size_t size() const { return where.size(); }
    T& at(const std::size_t* index) const { return data[where.at(index)]; }
};

// The layout of a view, offsets counted from its data.
template <class T, class... A>
layout layout_of(const tensor_view<T, A...>& v) {
    static_assert(sizeof...(A) <= max_rank, "dimsum: evaluation handles tensors of at most 8 axes (evaluation::max_rank)");
    layout l{sizeof...(A), {}, {}, 0};
    for (std::size_t i = 0; i < sizeof...(A); ++i) {
        l.extents[i] = v.extent(i);
        l.strides[i] = v.strides()[i];
    }
    return l;
}
template <class T, class... A>
strided<T> to_strided(const tensor_view<T, A...>& v) {
    return {v.data(), layout_of(v)};
}

// Layout l at address `base`: its offset moved into the pointer. Built in the result (the
// layout copied whole, then its offset cleared): a layout changed in a copy and then copied
// again is a wide load of what a narrow store has just written, which stalls.
template <class T>
strided<T> strided_at(T* base, const layout& l) {
    strided<T> s{base + l.offset, l};
    s.where.offset = 0;
    return s;
}

// The same elements read as `rank` axes (layout.hpp's broadcast).
template <class T>
strided<T> broadcast_to_rank(const strided<T>& s, std::size_t rank) {
    return {s.data, broadcast(s.where, rank)};
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
