#pragma once
// Whether a strided view can take a new shape without copying, and with which strides: the
// test NumPy makes before a reshape. Axes of extent 1 are ignored; every group of old axes
// that merges or splits must be laid out contiguously with respect to each other.

#include <array>
#include <cstddef>
#include <optional>

namespace dimsum::backend::reference {

// The old shape is the first `old_rank_given` entries of the arrays.
template <std::size_t OldRank, std::size_t NewRank>
std::optional<std::array<std::ptrdiff_t, NewRank>> reshape_strides(const std::array<std::size_t, OldRank>& old_extents,
                                                                   const std::array<std::ptrdiff_t, OldRank>& old_strides,
                                                                   std::size_t old_rank_given,
                                                                   const std::array<std::size_t, NewRank>& new_extents) {
    std::array<std::ptrdiff_t, NewRank> strides{};
    // Squeeze out extents of 1 on the old side; they constrain nothing.
    std::array<std::size_t, OldRank> oe{};
    std::array<std::ptrdiff_t, OldRank> os{};
    std::size_t old_rank = 0;
    for (std::size_t i = 0; i < old_rank_given; ++i) {
        if (old_extents[i] == 0) return std::nullopt;  // empty: the caller copies nothing anyway
        if (old_extents[i] != 1) {
            oe[old_rank] = old_extents[i];
            os[old_rank++] = old_strides[i];
        }
    }
    std::size_t oi = 0, ni = 0;
    while (ni < NewRank && oi < old_rank) {
        // Grow one group on each side until both hold the same number of elements.
        std::size_t oj = oi + 1, nj = ni + 1;
        std::size_t old_count = oe[oi], new_count = new_extents[ni];
        while (old_count != new_count) {
            if (new_count < old_count) {
                if (nj == NewRank) return std::nullopt;
                new_count *= new_extents[nj++];
            } else {
                if (oj == old_rank) return std::nullopt;
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
    // What remains on the new side must be axes of extent 1.
    for (; ni < NewRank; ++ni) {
        if (new_extents[ni] != 1) return std::nullopt;
        strides[ni] = 0;
    }
    return oi == old_rank ? std::optional(strides) : std::nullopt;
}

}  // namespace dimsum::backend::reference
