#pragma once
// Printing tensors with their axes:
//   (seq=3, head=3)
//   [[ 0.1000, -0.2500,  1.0000],
//    ...]]
// Like NumPy, large tensors show the first and last three entries of each axis.

#include <cstdio>
#include <ostream>
#include <string>

#include "dimsum/tensor/tensor.hpp"

namespace dimsum {

namespace detail {

inline constexpr std::size_t print_threshold = 1000;  // elements; beyond, summarise
inline constexpr std::size_t print_edge = 3;           // entries kept at each end

template <class View>
void print_rows(std::ostream& os, const View& v, std::array<std::size_t, View::rank>& index, std::size_t axis,
                bool summarise, std::size_t indent) {
    std::size_t n = v.extent(axis);
    os << '[';
    for (std::size_t i = 0; i < n; ++i) {
        if (summarise && n > 2 * print_edge && i == print_edge) {
            os << "...";
            i = n - print_edge - 1;
            os << (axis + 1 == View::rank ? ", " : ",\n" + std::string(indent + 1, ' '));
            continue;
        }
        index[axis] = i;
        if (axis + 1 == View::rank) {
            char text[32];
            std::snprintf(text, sizeof text, "%8.4f", static_cast<double>(v.data()[v.offset(index)]));
            os << text;
        } else {
            print_rows(os, v, index, axis + 1, summarise, indent + 1);
        }
        if (i + 1 != n) os << (axis + 1 == View::rank ? ", " : ",\n" + std::string(indent + 1, ' '));
    }
    os << ']';
}

}  // namespace detail

template <class T, class... A>
std::ostream& operator<<(std::ostream& os, const tensor_view<T, A...>& v) {
    using view_type = tensor_view<T, A...>;
    os << v.shape() << '\n';
    std::array<std::size_t, view_type::rank> index{};
    if constexpr (view_type::rank == 0) {
        return os << static_cast<double>(*v.data());
    } else {
        if (v.size() == 0) return os << "[]";
        detail::print_rows(os, v, index, 0, v.size() > detail::print_threshold, 0);
        return os;
    }
}

template <class T, class... A>
std::ostream& operator<<(std::ostream& os, const tensor<T, A...>& t) {
    return os << t.view();
}

}  // namespace dimsum
