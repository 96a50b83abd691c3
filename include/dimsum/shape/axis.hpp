#pragma once
// An axis: a name and an extent fixed at compile time or known only at run time.

#include <cstddef>
#include <span>
#include <type_traits>

#include "dimsum/core/fixed_string.hpp"
#include "dimsum/core/message.hpp"
#include "dimsum/core/shape_error.hpp"

namespace dimsum {

// The extent of an axis whose size is known only at run time.
inline constexpr std::size_t dynamic = std::dynamic_extent;

// `axis<"model", 768>` has a compile-time extent; `axis<"seq">` gets its extent at run time.
// A value of the type carries the extent, e.g. `Seq{128}`, to size a tensor.
namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_axis_extent(std::string_view name, std::size_t expected,
                                                                     std::size_t given) {
    message m;
    m << "dimsum: axis " << name << " has extent " << expected << ", not " << given;
    throw shape_error(m);
}
}  // namespace detail

template <fixed_string Name, std::size_t Extent = dynamic>
struct axis {
    static constexpr fixed_string name = Name;
    static constexpr std::size_t static_extent = Extent;
    static constexpr bool is_static = Extent != dynamic;

    std::size_t extent = is_static ? Extent : 0;

    constexpr axis() requires is_static = default;
    constexpr explicit axis(std::size_t n) : extent(n) {
        if (is_static && n != Extent) detail::throw_axis_extent(Name.view(), Extent, n);
    }
};

// Unnamed axes, for quick work: they match any axis by extent alone.
template <std::size_t Extent = dynamic>
using dim = axis<"", Extent>;

template <class T>
struct is_axis : std::false_type {};
template <fixed_string Name, std::size_t Extent>
struct is_axis<axis<Name, Extent>> : std::true_type {};

template <class T>
concept axis_type = is_axis<std::remove_cvref_t<T>>::value;

// What shape algebra needs to know of an axis, as a plain value.
struct axis_desc {
    std::string_view name;
    std::size_t extent;  // `dynamic` when known only at run time

    constexpr bool is_named() const { return !name.empty(); }
    constexpr bool is_static() const { return extent != dynamic; }
};

template <axis_type A>
inline constexpr axis_desc describe_axis = {A::name.view(), A::static_extent};

// `model=768`, `seq=?`, or for an unnamed axis just `768` / `?`.
constexpr message& operator<<(message& m, axis_desc a) {
    if (a.is_named()) m << a.name << '=';
    if (a.is_static()) return m << a.extent;
    return m << '?';
}

// The same with the run-time extent: `seq=128`.
constexpr message& write_axis(message& m, axis_desc a, std::size_t extent) {
    if (a.is_named()) m << a.name << '=';
    return m << extent;
}

}  // namespace dimsum
