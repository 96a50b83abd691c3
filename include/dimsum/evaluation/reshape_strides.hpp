#pragma once
// Whether a strided array can take new extents without copying, and with which strides: the
// test NumPy makes before a reshape. Axes of extent 1 constrain nothing; every group of old
// axes that merges or splits must be laid out contiguously with respect to each other.

#include <array>
#include <cstddef>
#include <optional>

#include "dimsum/evaluation/strided.hpp"

namespace dimsum::evaluation {

using extents_t = std::array<std::size_t, max_rank>;
using strides_array = std::array<std::ptrdiff_t, max_rank>;

// Neither shape may hold an extent of 0.
inline std::optional<strides_array> reshape_strides(const extents_t& old_extents, const strides_array& old_strides,
                                                    std::size_t old_rank, const extents_t& new_extents,
                                                    std::size_t new_rank) {
    // Squeeze out the old extents of 1.
    extents_t oe{};
    strides_array os{};
    std::size_t squeezed = 0;
    for (std::size_t i = 0; i < old_rank; ++i) {
        if (old_extents[i] != 1) {
            oe[squeezed] = old_extents[i];
            os[squeezed++] = old_strides[i];
        }
    }
    strides_array strides{};
    std::size_t oi = 0, ni = 0;
    while (ni < new_rank && oi < squeezed) {
        // Grow a group on each side until both hold the same number of elements.
        std::size_t oj = oi + 1, nj = ni + 1;
        std::size_t old_count = oe[oi], new_count = new_extents[ni];
        while (old_count != new_count) {
            if (new_count < old_count) {
                if (nj == new_rank) return std::nullopt;
                new_count *= new_extents[nj++];
            } else {
                if (oj == squeezed) return std::nullopt;
                old_count *= oe[oj++];
            }
        }
        for (std::size_t k = oi; k + 1 < oj; ++k) {
            if (os[k] != static_cast<std::ptrdiff_t>(oe[k + 1]) * os[k + 1]) return std::nullopt;
        }
        strides[nj - 1] = os[oj - 1];
        for (std::size_t k = nj - 1; k > ni; --k) strides[k - 1] = strides[k] * static_cast<std::ptrdiff_t>(new_extents[k]);
        ni = nj;
        oi = oj;
    }
    // What remains on the new side must be extents of 1.
    for (; ni < new_rank; ++ni) {
        if (new_extents[ni] != 1) return std::nullopt;
        strides[ni] = 0;
    }
    if (oi != squeezed) return std::nullopt;
    return strides;
}

}  // namespace dimsum::evaluation
