#pragma once
// A shape: an ordered list of axes whose static extents live in the type and whose dynamic
// extents, only those, are stored in the value.

#include <array>
#include <cstddef>
#include <ostream>
#include <tuple>

#include "dimsum/core/checked_math.hpp"
#include "dimsum/shape/axis.hpp"

namespace dimsum {

// A shape as plain data, for code that need not know its type: errors, kernels.
struct shape_ref {
    const axis_desc* axes;
    const std::size_t* extents;  // null: print what the type says (`seq=?`)
    std::size_t rank;
};

constexpr message& operator<<(message& m, shape_ref s) {
    m << '(';
    for (std::size_t i = 0; i < s.rank; ++i) {
        m << (i ? ", " : "");
        if (s.extents) write_axis(m, s.axes[i], s.extents[i]);
        else m << s.axes[i];
    }
    return m << ')';
}

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_given_extent(std::string_view op, axis_desc a,
                                                                      std::size_t given) {
    message m;
    m << "dimsum: " << op << ": axis " << a << " given extent " << given;
    throw shape_error(m);
}
}  // namespace detail

template <axis_type... Axes>
class shape {
public:
    static constexpr std::size_t rank = sizeof...(Axes);
    static constexpr std::array<axis_desc, rank> axes = {describe_axis<Axes>...};
    static constexpr std::size_t dynamic_count = ((Axes::static_extent == dynamic ? 1 : 0) + ... + 0);

    template <std::size_t I>
    using axis_at = std::tuple_element_t<I, std::tuple<Axes...>>;

    // Run-time extents start at 0: an empty shape until given extents.
    constexpr shape() = default;

    // From the run-time extents of the dynamic axes, in their order.
    constexpr explicit shape(const std::array<std::size_t, dynamic_count>& dynamic_extents)
        : dynamic_(dynamic_extents) {}

    // From axis values, e.g. `shape<Batch, Seq, Model>(Batch{2}, Seq{10})`: one per run-time
    // axis, or one per axis, in order, each of that axis's type.
    template <axis_type... Given>
        requires(sizeof...(Given) > 0)
    constexpr explicit shape(Given... given) {
        constexpr message error = given_axes_error<Given...>();
        if constexpr (error.length != 0) {
            fail<error>();
        } else {
            std::array<std::size_t, sizeof...(Given)> values{given.extent...};
            for (std::size_t i = 0, d = 0; i < values.size(); ++i) {
                if (values.size() == dynamic_count) dynamic_[i] = values[i];
                else if (!axes[i].is_static()) dynamic_[d++] = values[i];
            }
        }
    }

    // From every extent; a static axis given another extent is a shape_error.
    static shape from_extents(const std::array<std::size_t, rank>& all, std::string_view op) {
        shape s;
        std::size_t d = 0;
        for (std::size_t i = 0; i < rank; ++i) {
            if (axes[i].is_static()) {
                if (all[i] != axes[i].extent) detail::throw_given_extent(op, axes[i], all[i]);
            } else {
                s.dynamic_[d++] = all[i];
            }
        }
        return s;
    }

    constexpr std::size_t extent(std::size_t i) const {
        return axes[i].is_static() ? axes[i].extent : dynamic_[dynamic_position[i]];
    }
    constexpr std::array<std::size_t, rank> extents() const {
        std::array<std::size_t, rank> all{};
        for (std::size_t i = 0; i < rank; ++i) all[i] = extent(i);
        return all;
    }
    // The number of elements; throws shape_error where it overflows.
    std::size_t size() const {
        std::size_t n = 1;
        for (std::size_t i = 0; i < rank; ++i) n = detail::checked_multiply(n, extent(i), "size");
        return n;
    }

    friend constexpr bool operator==(const shape&, const shape&) = default;

private:
    // Empty when Given are the run-time axes, or all the axes, in order.
    template <class... Given>
    static constexpr message given_axes_error() {
        constexpr axis_desc given[] = {describe_axis<Given>...};
        constexpr std::size_t count = sizeof...(Given);
        bool ok = count == rank || count == dynamic_count;
        for (std::size_t i = 0, d = 0; ok && i < rank; ++i) {
            if (count == rank) ok = given[i].name == axes[i].name && given[i].extent == axes[i].extent;
            else if (!axes[i].is_static()) ok = given[d].name == axes[i].name && given[d++].extent == dynamic;
        }
        message m;
        if (!ok) {
            m << "dimsum: shape: ";
            write_static(m) << " is sized by its run-time axes or by all its axes, in order, not by (";
            for (std::size_t i = 0; i < count; ++i) m << (i ? ", " : "") << given[i];
            m << ')';
        }
        return m;
    }
    static constexpr message& write_static(message& m) {
        return m << shape_ref{axes.data(), nullptr, rank};
    }

    static constexpr std::array<std::size_t, rank> dynamic_position = [] {
        std::array<std::size_t, rank> pos{};
        std::size_t d = 0;
        for (std::size_t i = 0; i < rank; ++i) pos[i] = axes[i].is_static() ? 0 : d++;
        return pos;
    }();

    std::array<std::size_t, dynamic_count> dynamic_{};
};

template <class T>
struct is_shape : std::false_type {};
template <class... A>
struct is_shape<shape<A...>> : std::true_type {};

// `(batch=?, seq=?, model=768)`: what the type alone says.
template <class S>
constexpr message& write_static_shape(message& m) {
    return m << shape_ref{S::axes.data(), nullptr, S::rank};
}

// `(batch=2, seq=10, model=768)`: with the run-time extents.
template <class... A>
message& operator<<(message& m, const shape<A...>& s) {
    auto extents = s.extents();
    return m << shape_ref{shape<A...>::axes.data(), extents.data(), sizeof...(A)};
}

template <class... A>
std::ostream& operator<<(std::ostream& os, const shape<A...>& s) {
    message m;
    m << s;
    return os << m.view();
}

}  // namespace dimsum
