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
template <class To, class From>
To conform_extents(const From& from, std::string_view op) {
    try {
        return To::from_extents(from.extents(), op);
    } catch (const shape_error&) {
        message m;
        m << "dimsum: " << op << ": cannot store " << from << " in ";
        write_static_shape<To>(m);
        throw shape_error(m);
    }
}

}  // namespace dimsum::detail
