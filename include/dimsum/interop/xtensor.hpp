#pragma once
// xtensor and dimsum over the same memory, either way, without a copy:
//
//   xt::xtensor<float, 2> a = ...;                                  // (4, 768)
//   auto x = dimsum::adapt<Seq, Model>(a);                           // tensor_view<float, Seq, Model>
//   auto t = dimsum::adapt<Model, Seq>(xt::transpose(a));            // strided, same memory
//   auto rows = dimsum::adapt<Seq, Model>(xt::view(a, xt::range(1, 4, 2), xt::all()));
//   auto y = dimsum::to_xtensor(some_tensor);                        // an xtensor adaptor over it
//
// adapt takes containers (xarray, xtensor, xtensor_fixed, adaptors) and their strided views
// (xt::view with ranges and indices, xt::transpose, xt::strided_view); a formula such as
// a + b has no memory to view and is a compile error asking to evaluate it first. Its shape
// and strides (in elements, as dimsum's) are checked as interop/buffer.hpp checks any
// buffer's: the rank at compile time where xtensor's type fixes it, static extents at
// compile time for xtensor_fixed, otherwise a shape_error naming the axis and the extents.
// A view of a const container is a view of const elements.
//
// Not part of <dimsum/dimsum.hpp>, so that code which does not include this header does not
// need xtensor: include <dimsum/interop/xtensor.hpp>.

#include <array>
#include <cstddef>
#include <type_traits>

#include <xtensor/xadapt.hpp>
#include <xtensor/xcontainer.hpp>
#include <xtensor/xexpression.hpp>
#include <xtensor/xstorage.hpp>

#include "dimsum/interop/buffer.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum {

namespace detail::xtensor {

// Containers, adaptors and views of them through strided slices: their elements lie at
// data() + data_offset() and the strides. Formulas and views through index lists have no
// data() at all.
template <class E>
concept strided_memory = requires(E& e) {
    { e.data() } -> std::convertible_to<const volatile void*>;
    e.data_offset();
    e.shape();
    e.strides();
};

template <class T>
concept float_or_double = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class E>
using element_of = std::remove_pointer_t<decltype(std::declval<E&>().data())>;

// A container that the caller passes as a temporary dies at the end of the statement,
// before any use of a view over it.
template <class E>
inline constexpr bool is_temporary_container =
    !std::is_lvalue_reference_v<E> && std::is_base_of_v<xt::xcontainer<std::remove_cvref_t<E>>, std::remove_cvref_t<E>>;

// Compile-time messages, as templates so that they are instantiated only where they apply.
template <class>
inline constexpr fixed_string not_strided{
    "dimsum: adapt: this xtensor expression is a formula (or a view through index lists), not memory at "
    "strides: evaluate it first, e.g. `xt::xarray<double> sum = a + b;`, then adapt that"};
template <class>
inline constexpr fixed_string temporary{
    "dimsum: adapt: the xtensor container is a temporary, which dies before the view is used: adapt a named one"};
template <class>
inline constexpr fixed_string element_types{"dimsum: adapt: the element type must be float or double"};

// The extents xtensor_fixed's type fixes (xt::fixed_shape<X...>), for a compile-time check.
template <class S>
struct fixed_extents {
    static constexpr bool known = false;
};
template <std::size_t... X>
struct fixed_extents<xt::fixed_shape<X...>> {
    static constexpr bool known = true;
    static constexpr std::array<std::size_t, sizeof...(X)> values{X...};
};

// Empty, or `dimsum: adapt: axis model=768 given extent 5`, the words of shape::from_extents.
template <class S, class Fixed>
constexpr message static_extent_error() {
    message m;
    if constexpr (Fixed::known) {
        if constexpr (Fixed::values.size() == S::rank) {
            for (std::size_t i = 0; i < S::rank; ++i) {
                if (S::axes[i].is_static() && S::axes[i].extent != Fixed::values[i]) {
                    m << "dimsum: adapt: axis " << S::axes[i] << " given extent " << Fixed::values[i];
                    break;
                }
            }
        }
    }
    return m;
}

}  // namespace detail::xtensor

// A view of the xtensor container or strided view `e`, with the axes Axes, over its memory.
template <axis_type... Axes, class E>
    requires xt::is_xexpression<std::remove_cvref_t<E>>::value
auto adapt(E&& e) {
    using source = std::remove_reference_t<E>;
    using shape_type = shape<Axes...>;
    if constexpr (!detail::xtensor::strided_memory<source>) {
        (void)sizeof(static_shape_error<detail::xtensor::not_strided<source>>);
        return invalid_expression{};
    } else if constexpr (detail::xtensor::is_temporary_container<E>) {
        (void)sizeof(static_shape_error<detail::xtensor::temporary<source>>);
        return invalid_expression{};
    } else if constexpr (!detail::xtensor::float_or_double<std::remove_const_t<detail::xtensor::element_of<source>>>) {
        (void)sizeof(static_shape_error<detail::xtensor::element_types<source>>);
        return invalid_expression{};
    } else {
        using element = detail::xtensor::element_of<source>;
        using fixed = detail::xtensor::fixed_extents<typename std::remove_cvref_t<E>::shape_type>;
        constexpr message extent_error = detail::xtensor::static_extent_error<shape_type, fixed>();
        if constexpr (extent_error.length != 0) {
            return fail<extent_error>();
        } else {
            // A view's first element lies data_offset() past the start of its container's data.
            element* first = e.data() + static_cast<std::ptrdiff_t>(e.data_offset());
            return adapt<Axes...>(first, e.shape(), e.strides());  // interop/buffer.hpp: checked
        }
    }
}

namespace detail::xtensor {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_negative_stride(shape_ref s) {
    message m;
    m << "dimsum: to_xtensor: " << s
      << " has a negative stride; xtensor's adaptors start at the first element of memory and cannot hold it";
    throw shape_error(m);
}

}  // namespace detail::xtensor

// An xtensor adaptor (xt::adapt, no ownership) over the view's memory, with its shape and
// strides: writable when the view is. It must not outlive the memory.
template <class T, axis_type... Axes>
auto to_xtensor(const tensor_view<T, Axes...>& v) {
    constexpr std::size_t rank = sizeof...(Axes);
    std::array<std::size_t, rank> extents = v.shape().extents();
    // xtensor places element (0, ..., 0) at the start of an adaptor's buffer and reaches the
    // others by the strides, so none may lie before it.
    auto range = detail::reach(extents.data(), v.strides().data(), rank);
    if (!range) detail::throw_reach_overflows({shape<Axes...>::axes.data(), extents.data(), rank});
    if (range->first < 0) detail::xtensor::throw_negative_stride({shape<Axes...>::axes.data(), extents.data(), rank});
    // The size an adaptor wants is the element count, whatever the strides: it checks that
    // count against the shape, and walks non-contiguous strides element by element.
    return xt::adapt(v.data(), v.size(), xt::no_ownership(), extents, v.strides());
}

template <class T, axis_type... Axes>
auto to_xtensor(tensor<T, Axes...>& t) {
    return to_xtensor(t.view());
}
template <class T, axis_type... Axes>
auto to_xtensor(const tensor<T, Axes...>& t) {
    return to_xtensor(t.view());
}
// The adaptor would outlive a temporary tensor's memory.
template <class T, axis_type... Axes>
auto to_xtensor(tensor<T, Axes...>&& t) = delete;

}  // namespace dimsum
