#pragma once
// Type-level building blocks: pick, drop and join axes of a shape.

#include <array>
#include <cstddef>
#include <utility>

#include "dimsum/shape/shape.hpp"

namespace dimsum::detail {

template <class S, class Indices>
struct pick;
template <class S, std::size_t... I>
struct pick<S, std::index_sequence<I...>> {
    using type = shape<typename S::template axis_at<I>...>;
};
// The axes of S at the positions Indices, in that order.
template <class S, class Indices>
using pick_t = typename pick<S, Indices>::type;

template <class S, auto Positions, class = std::make_index_sequence<Positions.size()>>
struct pick_array;
template <class S, auto Positions, std::size_t... I>
struct pick_array<S, Positions, std::index_sequence<I...>> {
    using type = shape<typename S::template axis_at<Positions[I]>...>;
};
// The same, with the positions given as a constexpr std::array.
template <class S, auto Positions>
using pick_array_t = typename pick_array<S, Positions>::type;

template <std::size_t Offset, class Seq>
struct offset_sequence;
template <std::size_t Offset, std::size_t... I>
struct offset_sequence<Offset, std::index_sequence<I...>> {
    using type = std::index_sequence<(Offset + I)...>;
};

// Axes [First, First + Count) of S.
template <class S, std::size_t First, std::size_t Count>
using slice_t = pick_t<S, typename offset_sequence<First, std::make_index_sequence<Count>>::type>;

template <class A, class B>
struct concat;
template <class... A, class... B>
struct concat<shape<A...>, shape<B...>> {
    using type = shape<A..., B...>;
};
template <class A, class B>
using concat_t = typename concat<A, B>::type;

// The positions 0 .. R-1 but `axis`, in order.
template <std::size_t R>
constexpr std::array<std::size_t, R - 1> positions_without(std::size_t axis) {
    std::array<std::size_t, R - 1> kept{};
    for (std::size_t i = 0, k = 0; i < R; ++i) {
        if (i != axis) kept[k++] = i;
    }
    return kept;
}

// S without the axis at position I.
template <class S, std::size_t I>
using remove_t = concat_t<slice_t<S, 0, I>, slice_t<S, I + 1, S::rank - I - 1>>;

// The run-time extents of the axes at `positions`, gathered into a shape of type Result.
template <class Result, class S, std::size_t N>
Result gather_extents(const S& s, const std::array<std::size_t, N>& positions, std::string_view op) {
    std::array<std::size_t, N> extents{};
    for (std::size_t i = 0; i < N; ++i) extents[i] = s.extent(positions[i]);
    return Result::from_extents(extents, op);
}

}  // namespace dimsum::detail
