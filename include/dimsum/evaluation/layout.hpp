#pragma once
// Where an array's elements lie, without the memory: extents, strides and the offset of the
// first element, counted in elements. Every change of view that evaluation makes (permute,
// select, reshape, broadcast, fold, tile) is a function from layout to layout here, so that a
// plan (plan.hpp) can say where every value lives before any memory exists, and a backend adds
// its own base pointer (host or device) when it runs. Everything is constexpr over plain
// arrays, so that device code can call it (nvcc's --expt-relaxed-constexpr).
//
// The laws these functions keep are tested in tests/evaluation/test_layout.cpp: a permutation then
// its inverse is the identity; coalesce keeps the offset of every index; a reshape of a
// row-major layout is the row-major layout of the new extents.

#include <array>
#include <cstddef>
#include <optional>

namespace dimsum::evaluation {

inline constexpr std::size_t max_rank = 8;

using extents_t = std::array<std::size_t, max_rank>;
using strides_t = std::array<std::ptrdiff_t, max_rank>;
using order_t = std::array<std::size_t, max_rank>;  // a permutation: result axis i is axis order[i]

struct layout {
    std::size_t rank = 0;
    extents_t extents{};
    strides_t strides{};
    std::ptrdiff_t offset = 0;  // of element (0, ..., 0)

    constexpr std::size_t size() const {
        std::size_t n = 1;
        for (std::size_t i = 0; i < rank; ++i) n *= extents[i];
        return n;
    }
    constexpr std::ptrdiff_t at(const std::size_t* index) const {
        std::ptrdiff_t o = offset;
        for (std::size_t i = 0; i < rank; ++i) o += static_cast<std::ptrdiff_t>(index[i]) * strides[i];
        return o;
    }
    // The same elements at the same offsets: the axes past rank are not compared.
    friend constexpr bool operator==(const layout& a, const layout& b) {
        if (a.rank != b.rank || a.offset != b.offset) return false;
        for (std::size_t i = 0; i < a.rank; ++i) {
            if (a.extents[i] != b.extents[i] || a.strides[i] != b.strides[i]) return false;
        }
        return true;
    }
};

// The last axis varies fastest, with stride 1.
constexpr layout row_major(std::size_t rank, const extents_t& extents) {
    layout l{rank, extents, {}, 0};
    std::ptrdiff_t stride = 1;
    for (std::size_t i = rank; i-- > 0;) {
        l.strides[i] = stride;
        stride *= static_cast<std::ptrdiff_t>(extents[i]);
    }
    return l;
}

// Result axis i is axis order[i] of l.
constexpr layout permute(const layout& l, const order_t& order) {
    layout p = l;
    for (std::size_t i = 0; i < l.rank; ++i) {
        p.extents[i] = l.extents[order[i]];
        p.strides[i] = l.strides[order[i]];
    }
    return p;
}

// The inverse: l is the permuted layout, the result has the axes as they were before `order`.
constexpr layout unpermute(const layout& l, const order_t& order) {
    layout p = l;
    for (std::size_t i = 0; i < l.rank; ++i) {
        p.extents[order[i]] = l.extents[i];
        p.strides[order[i]] = l.strides[i];
    }
    return p;
}

// The positions begin, begin + spacing, ... (count of them) along `axis`: a narrower axis.
// An empty slice stays at l's offset (begin may be the extent: past the memory).
constexpr layout slice(const layout& l, std::size_t axis, std::size_t begin, std::size_t count, std::size_t spacing) {
    layout s = l;
    if (count != 0) s.offset += static_cast<std::ptrdiff_t>(begin) * l.strides[axis];
    s.extents[axis] = count;
    s.strides[axis] = l.strides[axis] * static_cast<std::ptrdiff_t>(spacing);
    return s;
}

// The elements at `index` along `axis`: one axis fewer.
constexpr layout select(const layout& l, std::size_t axis, std::size_t index) {
    layout s = l;
    s.offset += static_cast<std::ptrdiff_t>(index) * l.strides[axis];
    s.rank = l.rank - 1;
    for (std::size_t i = axis; i < s.rank; ++i) {
        s.extents[i] = l.extents[i + 1];
        s.strides[i] = l.strides[i + 1];
    }
    s.extents[s.rank] = 0;
    s.strides[s.rank] = 0;
    return s;
}

// An axis of extent 1 inserted before axis `position` (position = rank: after the last), with
// the row-major stride there, so that a contiguous layout stays one.
constexpr layout unsqueeze(const layout& l, std::size_t position) {
    layout u = l;
    u.rank = l.rank + 1;
    for (std::size_t i = l.rank; i > position; --i) {
        u.extents[i] = l.extents[i - 1];
        u.strides[i] = l.strides[i - 1];
    }
    u.extents[position] = 1;
    u.strides[position] = position < l.rank ? l.strides[position] * static_cast<std::ptrdiff_t>(l.extents[position]) : 1;
    return u;
}

// The same elements read as `rank` axes, right-aligned: missing leading axes and axes of
// extent 1 get stride 0, so that any index along them reads the one element there; the
// axes past `rank` are zero. Written over l (the planner builds many in place: a layout
// built apart and copied costs a stalled wide load of what was just stored).
constexpr void broadcast_in_place(layout& l, std::size_t rank) {
    const std::size_t lead = rank - l.rank;
    for (std::size_t i = rank; i-- > 0;) {  // from the last axis: axis i reads axis i - lead, not yet written
        l.extents[i] = i < lead ? 1 : l.extents[i - lead];
        l.strides[i] = i < lead || l.extents[i] == 1 ? 0 : l.strides[i - lead];
    }
    for (std::size_t i = rank; i < max_rank; ++i) {
        l.extents[i] = 0;
        l.strides[i] = 0;
    }
    l.rank = rank;
}
// The same, as a new layout.
constexpr layout broadcast(const layout& l, std::size_t rank) {
    layout b = l;
    broadcast_in_place(b, rank);
    return b;
}

// Whether l lays its elements out densely from offset 0: its strides are the row-major
// strides of some order of its axes (axes of extent 1 aside), so it covers [0, size()) once.
constexpr bool is_dense(const layout& l) {
    if (l.offset != 0) return false;
    std::ptrdiff_t expected = 1;  // the axes from the smallest stride up: each steps over the ones before
    std::size_t placed = 0;
    for (std::size_t i = 0; i < l.rank; ++i) placed += l.extents[i] == 1;
    while (placed < l.rank) {
        std::size_t next = l.rank;
        for (std::size_t i = 0; i < l.rank; ++i) {
            if (l.extents[i] != 1 && l.strides[i] == expected) next = i;
        }
        if (next == l.rank) return false;
        expected *= static_cast<std::ptrdiff_t>(l.extents[next]);
        ++placed;
    }
    return true;
}

// Whether axis `axis` and the next one are one axis: stepping off the end of the inner one
// lands where the next step of the outer one does (or the outer one has extent 1).
constexpr bool continues(const layout& l, std::size_t axis) {
    return l.extents[axis] == 1 || l.strides[axis] == l.strides[axis + 1] * static_cast<std::ptrdiff_t>(l.extents[axis + 1]);
}

// Axis `axis` merged into the next one, whose extent becomes the product; requires
// continues(l, axis). One axis fewer, the same offset for every index.
constexpr layout fold(const layout& l, std::size_t axis) {
    layout f = l;
    const std::size_t extent = l.extents[axis] * l.extents[axis + 1];
    for (std::size_t i = axis; i + 1 < l.rank; ++i) {
        f.extents[i] = l.extents[i + 1];
        f.strides[i] = l.strides[i + 1];
    }
    f.rank = l.rank - 1;
    f.extents[axis] = extent;
    f.extents[f.rank] = 0;
    f.strides[f.rank] = 0;
    return f;
}

// The fewest axes that reach the same offsets in the same order: axes of extent 1 dropped and
// axes that continue one another folded. An empty layout stays as it is.
constexpr layout coalesce(const layout& l) {
    if (l.size() == 0) return l;
    layout c{0, {}, {}, l.offset};
    for (std::size_t i = 0; i < l.rank; ++i) {
        if (l.extents[i] == 1) continue;
        c.extents[c.rank] = l.extents[i];
        c.strides[c.rank] = l.strides[i];
        ++c.rank;
        if (c.rank >= 2 && continues(c, c.rank - 2)) c = fold(c, c.rank - 2);
    }
    return c;
}

// coalesce for arrays indexed together (a pass's result and its inputs: one set of extents, a
// stride array each, strides_of(a) for array a): axes of extent 1 dropped, and an axis folded
// into the kept one before it where it continues that one in every array. In place; returns
// the new rank (0: a single value). Each array reaches the same offsets in the same order.
template <class StridesOf>
constexpr std::size_t coalesce_together(std::size_t rank, extents_t& extents, std::size_t arrays, StridesOf&& strides_of) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < rank; ++i) {
        if (extents[i] == 1) continue;
        bool folds = kept > 0;
        for (std::size_t a = 0; folds && a < arrays; ++a) {
            const strides_t& s = strides_of(a);
            folds = s[kept - 1] == s[i] * static_cast<std::ptrdiff_t>(extents[i]);
        }
        const std::size_t to = folds ? kept - 1 : kept++;
        extents[to] = folds ? extents[to] * extents[i] : extents[i];
        for (std::size_t a = 0; a < arrays; ++a) strides_of(a)[to] = strides_of(a)[i];
    }
    return kept;
}

// Positions of an array: extents[i] of them from first[i] along axis i (the part of a
// result that a kernel's tile covers, which its epilogue then rewrites).
struct box {
    extents_t first{}, extents{};
};

// Where box b starts, counted from l's offset.
constexpr std::ptrdiff_t offset_in(const layout& l, const box& b) {
    std::ptrdiff_t o = 0;
    for (std::size_t i = 0; i < l.rank; ++i) o += static_cast<std::ptrdiff_t>(b.first[i]) * l.strides[i];
    return o;
}

// The part of l in box b: the same strides.
constexpr layout tile(const layout& l, const box& b) {
    layout t = l;
    t.offset += offset_in(l, b);
    for (std::size_t i = 0; i < l.rank; ++i) t.extents[i] = b.extents[i];
    return t;
}

// ---- two axes: the tiles of products and attention

// A layout of exactly two axes, rows and columns, whose offset the holder of the pointer
// keeps: element (i, j) at i * row_stride + j * col_stride. It is what a product's or
// attention's kernel passes through its inner loops, where a layout (eight extents and eight
// strides) would not stay in registers; each function below is layout's, on two axes.
struct matrix_layout {
    std::size_t rows = 0, cols = 0;
    std::ptrdiff_t row_stride = 0, col_stride = 0;

    constexpr std::ptrdiff_t at(std::size_t row, std::size_t col) const {
        return static_cast<std::ptrdiff_t>(row) * row_stride + static_cast<std::ptrdiff_t>(col) * col_stride;
    }
    friend constexpr bool operator==(const matrix_layout&, const matrix_layout&) = default;
};

// The last two axes of l (l.rank >= 2), at their first element.
constexpr matrix_layout last_two_axes(const layout& l) {
    const std::size_t r = l.rank;
    return {l.extents[r - 2], l.extents[r - 1], l.strides[r - 2], l.strides[r - 1]};
}
// permute with the two axes swapped.
constexpr matrix_layout transposed(const matrix_layout& m) { return {m.cols, m.rows, m.col_stride, m.row_stride}; }

// l with `rank` new extents and no copy, if its strides allow it: the test NumPy makes before
// a reshape. Axes of extent 1 constrain nothing; every group of old axes that merges or splits
// must continue one another. An empty l takes any extents of size 0.
constexpr std::optional<layout> reshape(const layout& l, std::size_t rank, const extents_t& extents) {
    layout r{rank, extents, {}, l.offset};
    if (l.size() == 0) {  // no element to place: any strides do, the row-major ones read best
        r = row_major(rank, extents);
        r.offset = l.offset;
        if (r.size() != 0) return std::nullopt;
        return r;
    }
    const layout old = coalesce(l);  // no extents of 1; as few axes as possible
    std::size_t oi = 0, ni = 0;
    while (ni < rank && oi < old.rank) {
        // grow a group on each side until both hold the same number of elements
        std::size_t oj = oi + 1, nj = ni + 1;
        std::size_t old_count = old.extents[oi], new_count = extents[ni];
        while (old_count != new_count) {
            if (new_count < old_count) {
                if (nj == rank) return std::nullopt;
                new_count *= extents[nj++];
            } else {
                if (oj == old.rank) return std::nullopt;
                old_count *= old.extents[oj++];
            }
        }
        if (oj != oi + 1) return std::nullopt;  // coalesced axes that still do not continue
        r.strides[nj - 1] = old.strides[oi];
        for (std::size_t k = nj - 1; k > ni; --k) r.strides[k - 1] = r.strides[k] * static_cast<std::ptrdiff_t>(extents[k]);
        ni = nj;
        oi = oj;
    }
    for (; ni < rank; ++ni) {  // what remains on the new side must be extents of 1
        if (extents[ni] != 1) return std::nullopt;
        r.strides[ni] = 1;  // any stride does; 1 is the row-major one
    }
    if (oi != old.rank) return std::nullopt;
    return r;
}

}  // namespace dimsum::evaluation
