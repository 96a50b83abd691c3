#pragma once
// Compile-time shape errors.
//
// C++20's static_assert takes only a literal message, which cannot name extents. Instead a
// failed check instantiates `sizeof` of an incomplete class whose template argument is the
// formatted message, so g++'s first error line reads, e.g.
//   invalid application of 'sizeof' to incomplete type 'dimsum::static_shape_error<
//   dimsum::fixed_string<62>{"dimsum: matmul: contracted axes differ: model=768 vs heads=12"}>'
// The operation that failed returns `invalid_expression`, which every later operation and
// tensor accepts silently, so one mistake gives one error rather than a cascade.

#include <cstddef>
#include <type_traits>

#include "dimsum/core/fixed_string.hpp"
#include "dimsum/core/message.hpp"

namespace dimsum {

template <fixed_string Message>
struct static_shape_error;  // never defined, on purpose

// The result of an operation whose shapes did not check; see above.
struct invalid_expression {
    template <class T>
    operator T() const { return T{}; }
};

namespace detail {

template <message M>
consteval auto to_fixed_string() {
    fixed_string<M.length + 1> s;
    for (std::size_t i = 0; i < M.length; ++i) s.data[i] = M.text[i];
    return s;
}

}  // namespace detail

// Used as `return fail<check.error>();` in the branch where a static check failed.
template <message M>
constexpr invalid_expression fail() {
    (void)sizeof(static_shape_error<detail::to_fixed_string<M>()>);
    return {};
}

template <class T>
inline constexpr bool is_invalid = std::is_same_v<std::remove_cvref_t<T>, invalid_expression>;

template <class... T>
inline constexpr bool any_invalid = (is_invalid<T> || ...);

}  // namespace dimsum
