#pragma once
// Walking every index of a shape in row-major order, as an odometer.

#include <cstddef>

#include "dimsum/core/host_device.hpp"

namespace dimsum::detail {

// Advances `index` (rank entries) to the next index within `extents`, the last axis fastest;
// returns false, with index back at all zeros, after the last one. Host and device: the
// CUDA backend's kernels walk indices with it too.
DIMSUM_HD inline bool next_index(std::size_t* index, const std::size_t* extents, std::size_t rank) {
    for (std::size_t i = rank; i-- > 0;) {
        if (++index[i] < extents[i]) return true;
        index[i] = 0;
    }
    return false;
}

}  // namespace dimsum::detail
