#pragma once
// view<To...>(x): the same elements, in row-major order, under other axes, e.g. splitting
// model=768 into heads=12, head=64 and merging them back.
//
// A run-time extent of the result is taken from the source axis of the same name (the k-th
// `seq` of the result from the k-th `seq` of the source); at most one may have no such
// source axis, and its extent is inferred from the element count. When both sides have the
// same run-time axes, the static extents must multiply out, which the compiler checks.

#include "dimsum/shape/pick.hpp"

namespace dimsum::detail {

// The position of the source axis a result axis takes its extent from, if any.
inline constexpr std::size_t no_source = static_cast<std::size_t>(-1);

template <class From, class To>
constexpr std::array<std::size_t, To::rank> reshape_sources() {
    std::array<std::size_t, To::rank> source{};
    std::array<bool, From::rank> used{};
    for (std::size_t i = 0; i < To::rank; ++i) {
        source[i] = no_source;
        if (To::axes[i].is_static() || !To::axes[i].is_named()) continue;
        for (std::size_t j = 0; j < From::rank; ++j) {
            if (!used[j] && From::axes[j].name == To::axes[i].name) {
                used[j] = true;
                source[i] = j;
                break;
            }
        }
    }
    return source;
}

template <class S>
constexpr std::size_t static_product() {
    std::size_t p = 1;
    for (axis_desc a : S::axes) p *= a.is_static() ? a.extent : 1;
    return p;
}

// Whether the run-time axes of A all appear, by name, among those of B.
template <class A, class B>
constexpr bool dynamic_names_within() {
    std::array<bool, B::rank> used{};
    for (axis_desc a : A::axes) {
        if (a.is_static()) continue;
        bool found = false;
        for (std::size_t j = 0; j < B::rank && !found; ++j) {
            if (!used[j] && !B::axes[j].is_static() && a.is_named() && B::axes[j].name == a.name) {
                used[j] = found = true;
            }
        }
        if (!found) return false;
    }
    return true;
}

template <class From, class To>
constexpr message reshape_error() {
    message m;
    constexpr auto source = reshape_sources<From, To>();
    std::size_t unknown = 0;
    for (std::size_t i = 0; i < To::rank; ++i) unknown += !To::axes[i].is_static() && source[i] == no_source;
    if (unknown > 1) {
        m << "dimsum: view: cannot infer more than one run-time extent of ";
        write_static_shape<To>(m) << " from ";
        return write_static_shape<From>(m);
    }
    if (dynamic_names_within<From, To>() && dynamic_names_within<To, From>() &&
        static_product<From>() != static_product<To>()) {
        m << "dimsum: view: sizes do not multiply out: ";
        write_static_shape<From>(m) << " has " << static_product<From>() << " elements per run-time index, ";
        write_static_shape<To>(m) << " has " << static_product<To>();
    }
    return m;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_reshape(shape_ref from, std::size_t total, shape_ref to,
                                                                 std::size_t known, bool inferred) {
    message m;
    m << "dimsum: view: sizes do not multiply out: " << from << " has " << total << " elements, ";
    m << to << " would have ";
    if (inferred) m << "a multiple of ";
    m << known;
    throw shape_error(m);
}

// The run-time extents of the result of a view into out; source[i] as from reshape_sources.
inline void reshape_extents(shape_ref from, shape_ref to, const std::size_t* source, std::size_t* out) {
    std::size_t known = 1, unknown_position = no_source, total = 1;
    for (std::size_t i = 0; i < from.rank; ++i) total = checked_multiply(total, from.extents[i], "view");
    for (std::size_t i = 0; i < to.rank; ++i) {
        if (to.axes[i].is_static()) out[i] = to.axes[i].extent;
        else if (source[i] != no_source) out[i] = from.extents[source[i]];
        else {
            unknown_position = i;
            continue;
        }
        known = checked_multiply(known, out[i], "view");
    }
    if (unknown_position != no_source) out[unknown_position] = known == 0 ? 0 : total / known;
    std::size_t result_total = unknown_position == no_source ? known : known * out[unknown_position];
    if (result_total != total) throw_reshape(from, total, {to.axes, nullptr, to.rank}, known, unknown_position != no_source);
}

// Only to be used once reshape_error<From, To>() is empty.
template <class From, class To>
To reshape_extents(const From& from) {
    static constexpr auto source = reshape_sources<From, To>();
    auto from_extents = from.extents();
    std::array<std::size_t, To::rank> out{};
    reshape_extents({From::axes.data(), from_extents.data(), From::rank}, {To::axes.data(), nullptr, To::rank},
                    source.data(), out.data());
    return To::from_extents(out, "view");
}

}  // namespace dimsum::detail
