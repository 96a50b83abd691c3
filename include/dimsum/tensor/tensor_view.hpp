#pragma once
// A non-owning view: a pointer, a shape and strides (in elements) over memory someone else
// owns. tensor_view<const T, ...> reads; tensor_view<T, ...> also writes.

#include <array>
#include <cstdint>
#include <optional>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "dimsum/core/concepts.hpp"
#include "dimsum/core/static_error.hpp"
#include "dimsum/shape/shape.hpp"

namespace dimsum {

template <std::size_t Rank>
using strides_t = std::array<std::ptrdiff_t, Rank>;

namespace detail {

// Writes the row-major strides of `extents` into `strides` and returns the element count;
// throws shape_error where an offset would overflow ptrdiff_t.
inline std::size_t row_major(const std::size_t* extents, std::size_t rank, std::ptrdiff_t* strides) {
    std::size_t step = 1;
    for (std::size_t i = rank; i-- > 0;) {
        strides[i] = static_cast<std::ptrdiff_t>(step);
        step = checked_multiply(step, extents[i], "strides");
    }
    if (step > static_cast<std::size_t>(PTRDIFF_MAX)) throw_overflow(step, 1, "strides");
    return step;
}

}  // namespace detail

// Row-major strides of a shape; throws shape_error where the size overflows.
template <class S>
strides_t<S::rank> row_major_strides(const S& s) {
    strides_t<S::rank> strides{};
    auto extents = s.extents();
    detail::row_major(extents.data(), S::rank, strides.data());
    return strides;
}

namespace detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_index(long long given, axis_desc a, std::size_t extent) {
    message m;
    m << "dimsum: index ";
    if (given < 0) m << '-' << static_cast<std::size_t>(-(given + 1)) + 1;
    else m << static_cast<std::size_t>(given);
    m << " out of range for axis ";
    write_axis(m, a, extent);
    throw std::out_of_range(m.str());
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_outside(shape_ref s, std::size_t memory_size) {
    message m;
    m << "dimsum: tensor_view: " << s << " with these strides reaches outside the " << memory_size
      << " elements given";
    throw shape_error(m);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_reach_overflows(shape_ref s) {
    message m;
    m << "dimsum: tensor_view: " << s << " with these strides reaches beyond the address space (the offset overflows)";
    throw shape_error(m);
}

// The lowest and one past the highest element offset a strided layout reaches; {0, 0} when
// it holds no element; nullopt when an offset overflows ptrdiff_t.
inline std::optional<std::pair<std::ptrdiff_t, std::ptrdiff_t>> reach(const std::size_t* extents,
                                                                      const std::ptrdiff_t* strides, std::size_t rank) {
    std::ptrdiff_t low = 0, high = 0;
    for (std::size_t i = 0; i < rank; ++i) {
        if (extents[i] == 0) return std::pair<std::ptrdiff_t, std::ptrdiff_t>{0, 0};
    }
    for (std::size_t i = 0; i < rank; ++i) {
        std::ptrdiff_t r = 0;
        if (extents[i] - 1 > static_cast<std::size_t>(PTRDIFF_MAX) ||
            __builtin_mul_overflow(static_cast<std::ptrdiff_t>(extents[i] - 1), strides[i], &r) ||
            __builtin_add_overflow(r < 0 ? low : high, r, r < 0 ? &low : &high)) {
            return std::nullopt;
        }
    }
    if (high == PTRDIFF_MAX) return std::nullopt;
    return std::pair<std::ptrdiff_t, std::ptrdiff_t>{low, high + 1};
}

}  // namespace detail

namespace detail {
template <class>
inline constexpr fixed_string needs_backend{
    "dimsum: assigning a formula needs a backend: include <dimsum/dimsum.hpp> (or <dimsum/backend/default.hpp>)"};
}  // namespace detail

// What `dst = formula` evaluates with: a customisation point that backend/default.hpp
// specialises for Enable = void. Without that header, assigning a formula is one compile
// error naming the header to include, not an undefined reference at link time.
template <class Enable>
struct default_assignment {
    template <class Dst, class E>
    static void run(Dst&&, const E&) {
        (void)sizeof(static_shape_error<detail::needs_backend<E>>);
    }
};

// Stores a formula into a tensor or view of the same shape, on the default backend; what
// `dst = formula` calls.
template <class Dst, class E>
void assign(Dst&& dst, const E& e, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    default_assignment<std::enable_if_t<sizeof(E) != 0>>::run(std::forward<Dst>(dst), e);
}

template <class T, axis_type... Axes>
class tensor_view {
public:
    using shape_type = ::dimsum::shape<Axes...>;
    using value_type = std::remove_const_t<T>;
    using element_type = T;
    static constexpr std::size_t rank = shape_type::rank;
    using strides_type = strides_t<rank>;

    tensor_view() = default;

    // Over memory the caller vouches for: nothing is checked.
    tensor_view(T* data, const shape_type& s, const strides_type& strides)
        : data_(data), shape_(s), strides_(strides) {}
    tensor_view(T* data, const shape_type& s) : tensor_view(data, s, row_major_strides(s)) {}

    // Over a span, checked: every element the view can reach lies inside `memory`.
    tensor_view(std::span<T> memory, const shape_type& s, const strides_type& strides)
        : tensor_view(memory.data(), s, strides) {
        check_within(memory.size());
    }
    tensor_view(std::span<T> memory, const shape_type& s) : tensor_view(memory, s, row_major_strides(s)) {}

    // A writable view is also a read-only one.
    operator tensor_view<const T, Axes...>() const requires(!std::is_const_v<T>) {
        return {data_, shape_, strides_};
    }

    // Assignment writes elements, as for Eigen's Map: a view never rebinds.
    tensor_view& operator=(const tensor_view& other) requires(!std::is_const_v<T>) {
        assign(*this, other, call_site::unknown());  // an operator cannot learn its caller's line
        return *this;
    }
    template <operand E>
    tensor_view& operator=(const E& e) requires(!std::is_const_v<T>) {
        assign(*this, e, call_site::unknown());
        return *this;
    }
    tensor_view(const tensor_view&) = default;

    T* data() const { return data_; }
    const shape_type& shape() const { return shape_; }
    const strides_type& strides() const { return strides_; }
    std::size_t extent(std::size_t i) const { return shape_.extent(i); }
    std::size_t size() const { return shape_.size(); }

    bool is_contiguous() const { return strides_ == row_major_strides(shape_); }

    // Bounds-checked element access: std::out_of_range names the axis.
    template <std::integral... I>
        requires(sizeof...(I) == rank)
    T& operator()(I... index) const {
        std::array<std::size_t, rank> at{static_cast<std::size_t>(index)...};
        std::array<long long, rank> given{static_cast<long long>(index)...};
        for (std::size_t i = 0; i < rank; ++i) {
            if (given[i] < 0 || at[i] >= shape_.extent(i)) detail::throw_index(given[i], shape_type::axes[i], shape_.extent(i));
        }
        return data_[offset(at)];
    }

    // Unchecked: for evaluators, which walk only indices inside the shape.
    std::ptrdiff_t offset(const std::array<std::size_t, rank>& index) const {
        std::ptrdiff_t off = 0;
        for (std::size_t i = 0; i < rank; ++i) off += static_cast<std::ptrdiff_t>(index[i]) * strides_[i];
        return off;
    }

private:
    void check_within(std::size_t memory_size) const {
        auto extents = shape_.extents();
        auto range = detail::reach(extents.data(), strides_.data(), rank);
        if (!range) detail::throw_reach_overflows({shape_type::axes.data(), extents.data(), rank});
        auto [low, high] = *range;
        if (low < 0 || static_cast<std::size_t>(high) > memory_size) {
            detail::throw_outside({shape_type::axes.data(), extents.data(), rank}, memory_size);
        }
    }

    T* data_ = nullptr;
    shape_type shape_{};
    strides_type strides_{};
};

template <class T>
struct is_tensor_view : std::false_type {};
template <class T, class... A>
struct is_tensor_view<tensor_view<T, A...>> : std::true_type {};

// The view type over a given shape type.
template <class T, class S>
struct view_of_shape;
template <class T, class... A>
struct view_of_shape<T, shape<A...>> {
    using type = tensor_view<T, A...>;
};
template <class T, class S>
using view_of_shape_t = typename view_of_shape<T, S>::type;

}  // namespace dimsum
