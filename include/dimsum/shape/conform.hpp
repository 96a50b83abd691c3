#pragma once
// Whether a value of shape From can be stored where shape To is expected (assignment): same
// rank, each pair of axes matching by name (or one unnamed) and extent. No broadcasting.

#include "dimsum/shape/broadcast.hpp"

namespace dimsum::detail {

template <class To, class From>
constexpr message conform_error(std::string_view op) {
    message m;
    bool ok = To::rank == From::rank;
    for (std::size_t i = 0; ok && i < To::rank; ++i) {
        axis_desc t = To::axes[i], f = From::axes[i];
        ok = names_match(t, f) && (!t.is_static() || !f.is_static() || t.extent == f.extent);
    }
    if (!ok) {
        m << "dimsum: " << op << ": cannot store ";
        write_static_shape<From>(m) << " in ";
        write_static_shape<To>(m);
    }
    return m;
}

// The run-time check; only to be used once conform_error is empty.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cannot_store(std::string_view op, shape_ref from, shape_ref to) {
    message m;
    m << "dimsum: " << op << ": cannot store " << from << " in " << to;
    throw shape_error(m);
}

template <class To, class From>
To conform_extents(const From& from, std::string_view op) {
    auto extents = from.extents();
    for (std::size_t i = 0; i < To::rank; ++i) {
        if (To::axes[i].is_static() && To::axes[i].extent != extents[i]) {
            throw_cannot_store(op, {From::axes.data(), extents.data(), From::rank}, {To::axes.data(), nullptr, To::rank});
        }
    }
    return To::from_extents(extents, op);
}

}  // namespace dimsum::detail
