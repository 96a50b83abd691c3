#pragma once
// Finding an axis of a shape by name, for transpose, softmax and reductions.

#include <string_view>

#include "dimsum/shape/shape.hpp"

namespace dimsum::detail {

struct axis_lookup {
    std::size_t position = 0;
    message error;  // empty when found
};

// The one axis of S named like `wanted` (and, if both are static, of the same extent).
template <class S>
constexpr axis_lookup find_axis(std::string_view op, axis_desc wanted) {
    axis_lookup found;
    std::size_t count = 0;
    for (std::size_t i = 0; i < S::rank; ++i) {
        if (S::axes[i].name == wanted.name) {
            if (count++ == 0) found.position = i;
        }
    }
    message& m = found.error;
    if (!wanted.is_named()) {
        m << "dimsum: " << op << ": an axis looked up by name must have one, in ";
        write_static_shape<S>(m);
    } else if (count == 0) {
        m << "dimsum: " << op << ": no axis named " << wanted.name << " in ";
        write_static_shape<S>(m);
    } else if (count > 1) {
        m << "dimsum: " << op << ": axis name " << wanted.name << " is ambiguous in ";
        write_static_shape<S>(m);
    } else if (axis_desc have = S::axes[found.position];
               wanted.is_static() && have.is_static() && wanted.extent != have.extent) {
        m << "dimsum: " << op << ": axis " << wanted << " differs from " << have << " in ";
        write_static_shape<S>(m);
    }
    return found;
}

}  // namespace dimsum::detail
