#pragma once
// Views over memory that other code owns and describes by extents and strides, as NumPy,
// DLPack and most C APIs do:
//
//   // (rows=4, cols=3), every other row of a (8, 3) row-major buffer
//   auto x = dimsum::adapt<Rows, Cols>(buffer.data(), {4, 3}, {6, 1});
//   // the same, and checked to lie inside the span
//   auto y = dimsum::adapt<Rows, Cols>(std::span(buffer), {4, 3}, {6, 1});
//   // row-major
//   auto z = dimsum::adapt<Rows, Cols>(buffer.data(), {8, 3});
//
// Extents and strides are counted in elements (NumPy's are in bytes: divide them by the
// itemsize), one per axis of the view, in any integer type and any sized range (std::array,
// std::vector, a std::span over a C API's array, xtensor's shape and strides) or a braced
// list. They are checked, unlike tensor_view's own pointer constructor, whose caller vouches
// for them: the count against the view's rank (at compile time where the range has a static
// size), no extent negative or beyond ptrdiff_t, static extents against the axes, no offset
// that overflows, and, from a span, every element inside it. Each mistake is a shape_error
// that names the axis and the values.
//
// Not part of <dimsum/dimsum.hpp>: include <dimsum/interop/buffer.hpp>.

#include <array>
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum {

// Extents or strides as a caller holds them.
template <class R>
concept integer_range = std::ranges::sized_range<R> && std::integral<std::ranges::range_value_t<R>> &&
                        !std::same_as<std::ranges::range_value_t<R>, bool>;

namespace detail::buffer {

// The number of values a range type holds, where its type says (std::array, std::span<T, N>,
// xtensor's fixed shapes); `dynamic` otherwise.
template <class R>
constexpr std::size_t static_size() {
    using type = std::remove_cvref_t<R>;
    if constexpr (requires { std::tuple_size<type>::value; }) return std::tuple_size<type>::value;
    else if constexpr (requires { { type::extent } -> std::convertible_to<std::size_t>; }) return type::extent;  // span
    else return dynamic;
}

// `dimsum: adapt: 3 extents given for (rows=?, cols=?), which has 2 axes`
template <class S>
constexpr message count_error(std::string_view op, std::string_view what, std::size_t given) {
    message m;
    m << "dimsum: " << op << ": " << given << ' ' << what << " given for ";
    write_static_shape<S>(m) << ", which has " << S::rank << (S::rank == 1 ? " axis" : " axes");
    return m;
}

// A count of extents or strides that the range's type fixes is checked at compile time.
template <class S, class R>
constexpr message static_count_error(std::string_view op, std::string_view what) {
    constexpr std::size_t count = static_size<R>();
    if constexpr (count != dynamic && count != S::rank) return count_error<S>(op, what, count);
    else return {};
}

template <class S>
[[noreturn, gnu::cold, gnu::noinline]] void throw_count(std::string_view op, std::string_view what, std::size_t given) {
    throw shape_error(count_error<S>(op, what, given));
}

// `-3` or `7`: a value of any integer type, for a message.
template <std::integral I>
message& write_integer(message& m, I value) {
    if constexpr (std::is_signed_v<I>) {
        if (value < 0) return m << '-' << static_cast<std::size_t>(-(value + 1)) + 1;
    }
    return m << static_cast<std::size_t>(value);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_bad_value(std::string_view op, axis_desc a,
                                                                   std::string_view what, const message& value,
                                                                   std::string_view why) {
    message m;
    m << "dimsum: " << op << ": axis " << a << " given " << what << ' ' << value.view() << ", " << why;
    throw shape_error(m);
}

// Every extent, as std::size_t, of a count and in a range an offset can reach.
template <class S, class Extents>
std::array<std::size_t, S::rank> checked_extents(const Extents& extents, std::string_view op) {
    const auto count = static_cast<std::size_t>(std::ranges::size(extents));
    if (count != S::rank) throw_count<S>(op, "extents", count);
    std::array<std::size_t, S::rank> all{};
    auto given = std::ranges::begin(extents);
    for (std::size_t i = 0; i < S::rank; ++i, ++given) {
        const auto value = *given;
        if constexpr (std::is_signed_v<decltype(value)>) {
            if (value < 0) {
                message v;
                throw_bad_value(op, S::axes[i], "extent", write_integer(v, value), "which is negative");
            }
        }
        if (!std::in_range<std::ptrdiff_t>(value)) {
            message v;
            throw_bad_value(op, S::axes[i], "extent", write_integer(v, value), "more than an offset can count");
        }
        all[i] = static_cast<std::size_t>(value);
    }
    return all;
}

// Every stride, as std::ptrdiff_t: an unsigned one beyond ptrdiff_t is refused, not wrapped.
template <class S, class Strides>
strides_t<S::rank> checked_strides(const Strides& strides, std::string_view op) {
    const auto count = static_cast<std::size_t>(std::ranges::size(strides));
    if (count != S::rank) throw_count<S>(op, "strides", count);
    strides_t<S::rank> all{};
    auto given = std::ranges::begin(strides);
    for (std::size_t i = 0; i < S::rank; ++i, ++given) {
        const auto value = *given;
        if (!std::in_range<std::ptrdiff_t>(value)) {
            message v;
            throw_bad_value(op, S::axes[i], "stride", write_integer(v, value), "more than an offset can count");
        }
        all[i] = static_cast<std::ptrdiff_t>(value);
    }
    return all;
}

// An axis of extent 1 is only ever read at index 0, so its stride is free; NumPy and xtensor
// report anything there (xtensor 0). It is set to what a row-major layout would have, so that
// memory laid out row-major gives a view that is_contiguous() and takes the fast paths.
inline void tidy_unit_strides(const std::size_t* extents, std::ptrdiff_t* strides, std::size_t rank) {
    for (std::size_t i = rank; i-- > 0;) {
        if (extents[i] != 1) continue;
        std::ptrdiff_t row_major = 1;
        if (i + 1 < rank &&
            __builtin_mul_overflow(strides[i + 1], static_cast<std::ptrdiff_t>(extents[i + 1]), &row_major)) {
            continue;  // no layout to agree with: any stride will do
        }
        strides[i] = row_major;
    }
}

// The shape and strides of a view over `extents` and `strides`, every check above made.
template <class S, class Extents, class Strides>
std::pair<S, strides_t<S::rank>> checked_layout(const Extents& extents, const Strides& strides, std::string_view op) {
    std::array<std::size_t, S::rank> all = checked_extents<S>(extents, op);
    strides_t<S::rank> steps = checked_strides<S>(strides, op);
    S s = S::from_extents(all, op);  // static extents: `axis model=768 given extent 5`
    if (!detail::reach(all.data(), steps.data(), S::rank)) {
        detail::throw_reach_overflows({S::axes.data(), all.data(), S::rank});
    }
    tidy_unit_strides(all.data(), steps.data(), S::rank);
    return {s, steps};
}

}  // namespace detail::buffer

// A view over `data` with the given extents and strides, in elements, one of each per axis,
// checked as above. Memory bounds are the caller's to vouch for: the span overload checks them.
template <axis_type... Axes, class T, class Extents = std::array<std::ptrdiff_t, sizeof...(Axes)>,
          class Strides = std::array<std::ptrdiff_t, sizeof...(Axes)>>
    requires integer_range<Extents> && integer_range<Strides>
tensor_view<T, Axes...> adapt(T* data, const Extents& extents, const Strides& strides) {
    using shape_type = shape<Axes...>;
    constexpr message extents_error = detail::buffer::static_count_error<shape_type, Extents>("adapt", "extents");
    constexpr message strides_error = detail::buffer::static_count_error<shape_type, Strides>("adapt", "strides");
    if constexpr (extents_error.length != 0) {
        return fail<extents_error>();
    } else if constexpr (strides_error.length != 0) {
        return fail<strides_error>();
    } else {
        auto [s, steps] = detail::buffer::checked_layout<shape_type>(extents, strides, "adapt");
        return {data, s, steps};
    }
}

// The same over a span: every element the view reaches must lie inside it.
template <axis_type... Axes, class T, class Extents = std::array<std::ptrdiff_t, sizeof...(Axes)>,
          class Strides = std::array<std::ptrdiff_t, sizeof...(Axes)>>
    requires integer_range<Extents> && integer_range<Strides>
tensor_view<T, Axes...> adapt(std::span<T> memory, const Extents& extents, const Strides& strides) {
    tensor_view<T, Axes...> view = adapt<Axes...>(memory.data(), extents, strides);
    return {memory, view.shape(), view.strides()};  // tensor_view's span constructor checks the bounds
}

// Row-major memory: the strides follow from the extents.
template <axis_type... Axes, class T, class Extents = std::array<std::ptrdiff_t, sizeof...(Axes)>>
    requires integer_range<Extents>
tensor_view<T, Axes...> adapt(T* data, const Extents& extents) {
    using shape_type = shape<Axes...>;
    constexpr message extents_error = detail::buffer::static_count_error<shape_type, Extents>("adapt", "extents");
    if constexpr (extents_error.length != 0) {
        return fail<extents_error>();
    } else {
        shape_type s = shape_type::from_extents(detail::buffer::checked_extents<shape_type>(extents, "adapt"), "adapt");
        return {data, s, row_major_strides(s)};  // row_major_strides: a shape_error where offsets overflow
    }
}

template <axis_type... Axes, class T, class Extents = std::array<std::ptrdiff_t, sizeof...(Axes)>>
    requires integer_range<Extents>
tensor_view<T, Axes...> adapt(std::span<T> memory, const Extents& extents) {
    tensor_view<T, Axes...> view = adapt<Axes...>(memory.data(), extents);
    return {memory, view.shape(), view.strides()};
}

}  // namespace dimsum
