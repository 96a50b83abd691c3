// The laws of the layout algebra (evaluation/layout.hpp), checked as CuTe checks its own: on
// many random layouts (row-major, transposed, padded, with negative and zero strides), by
// enumerating every index and comparing the offsets that layout::at gives.
#include <dimsum/evaluation/layout.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace dimsum::evaluation;
using index_t = std::array<std::size_t, max_rank>;
using offsets_t = std::vector<std::ptrdiff_t>;

namespace Catch {
template <>
struct StringMaker<layout> {  // CuTe's notation: (extents):(strides)+offset
    static std::string convert(const layout& l) {
        std::string e, s;
        for (std::size_t i = 0; i < l.rank; ++i) {
            e.append(i ? "," : "").append(std::to_string(l.extents[i]));  // not "," + ...: g++ 12's -Wrestrict
            s.append(i ? "," : "").append(std::to_string(l.strides[i]));
        }
        return "(" + e + "):(" + s + ")+" + std::to_string(l.offset);
    }
};
}  // namespace Catch

namespace {

constexpr int trials = 2000;  // random layouts per law; the whole file runs in well under a second

// Calls f(index) for every index of l, the last axis fastest; once for rank 0, never if empty.
template <class F>
void for_each_index(const layout& l, F f) {
    if (l.size() == 0) return;
    index_t index{};
    for (std::size_t axis = l.rank;; axis = l.rank) {
        f(index);
        while (axis > 0 && ++index[axis - 1] == l.extents[axis - 1]) index[--axis] = 0;
        if (axis == 0) return;
    }
}

// For every index j of `shape` in row-major order, the offset of `source` at the index whose
// axis a is along(j, a).
template <class Along>
offsets_t offsets_through(const layout& shape, const layout& source, Along along) {
    offsets_t o;
    for_each_index(shape, [&](const index_t& j) {
        index_t i{};
        for (std::size_t a = 0; a < source.rank; ++a) i[a] = along(j, a);
        o.push_back(source.at(i.data()));
    });
    return o;
}

// The offsets l visits in row-major order.
offsets_t offsets(const layout& l) {
    return offsets_through(l, l, [](const index_t& j, std::size_t a) { return j[a]; });
}

std::size_t uniform(std::mt19937& rng, std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
}

order_t random_order(std::mt19937& rng, std::size_t rank, bool shuffled = true) {
    order_t order{};
    std::iota(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(rank), std::size_t{0});
    if (shuffled) std::shuffle(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(rank), rng);
    return order;
}

order_t inverse(const order_t& order, std::size_t rank) {
    order_t inv{};
    for (std::size_t i = 0; i < rank; ++i) inv[order[i]] = i;
    return inv;
}

// Rank 0..5, extents 1..5 (a third of them 1): row-major over the axes taken in a random order
// half the time (transposed), with gaps between rows a third of the time (padded), then some
// strides negated and some made 0 (broadcast), at a random offset.
layout random_layout(std::mt19937& rng) {
    layout l{};
    l.rank = uniform(rng, 0, 5);
    for (std::size_t i = 0; i < l.rank; ++i) l.extents[i] = uniform(rng, 0, 2) == 0 ? 1 : uniform(rng, 2, 5);
    const order_t order = random_order(rng, l.rank, uniform(rng, 0, 1));
    const bool padded = uniform(rng, 0, 2) == 0, negative = uniform(rng, 0, 3) == 0, zero = uniform(rng, 0, 3) == 0;
    std::ptrdiff_t stride = 1;
    for (std::size_t k = l.rank; k-- > 0;) {
        const std::size_t axis = order[k];
        l.strides[axis] = stride;
        stride *= static_cast<std::ptrdiff_t>(l.extents[axis] + (padded ? uniform(rng, 0, 2) : 0));
    }
    for (std::size_t i = 0; i < l.rank; ++i) {
        if (negative && uniform(rng, 0, 1)) l.strides[i] = -l.strides[i];
        if (zero && uniform(rng, 0, 2) == 0) l.strides[i] = 0;
    }
    l.offset = static_cast<std::ptrdiff_t>(uniform(rng, 0, 50));
    return l;
}

// The row-major layout of random extents of size n (rank 0..5, some extents 1): n's prime
// factors dealt out to random axes.
layout random_row_major_of_size(std::mt19937& rng, std::size_t n) {
    extents_t extents{};
    const std::size_t rank = std::max(uniform(rng, 0, 5), std::size_t{n > 1});
    std::fill_n(extents.begin(), rank, std::size_t{1});
    for (std::size_t p = 2; n > 1; ++p)
        for (; n % p == 0; n /= p) extents[uniform(rng, 0, rank - 1)] *= p;
    return row_major(rank, extents);
}

// Whether any strides give `shape`'s extents the offsets `seq` in row-major order. They can only
// be the steps from the first offset to that of each unit index, so try those.
bool expressible(const offsets_t& seq, layout shape) {
    if (seq.empty()) return shape.size() == 0;
    const layout position = row_major(shape.rank, shape.extents);  // of each index in seq
    shape.offset = seq.front();
    for (std::size_t i = 0; i < shape.rank; ++i)
        shape.strides[i] = shape.extents[i] > 1 ? seq[static_cast<std::size_t>(position.strides[i])] - seq.front() : 0;
    return offsets(shape) == seq;
}

}  // namespace

TEST_CASE("permute then unpermute by the same order, or permute then permute by the inverse, is the identity") {
    std::mt19937 rng(1);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        const order_t order = random_order(rng, l.rank);
        const order_t inv = inverse(order, l.rank);
        const layout p = permute(l, order);
        CAPTURE(l, p);
        REQUIRE(unpermute(p, order) == l);
        REQUIRE(permute(p, inv) == l);
        // p at index j reads l at the index whose axis order[a] is j[a]
        REQUIRE(offsets(p) == offsets_through(p, l, [&](const index_t& j, std::size_t a) { return j[inv[a]]; }));
    }
}

TEST_CASE("coalesce keeps the offsets in row-major order with the fewest axes, row-major coalesces to <= 1 axis") {
    std::mt19937 rng(2);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        const layout c = coalesce(l);
        CAPTURE(l, c);
        REQUIRE(offsets(c) == offsets(l));
        REQUIRE(c.rank <= l.rank);
        for (std::size_t a = 0; a < c.rank; ++a) REQUIRE(c.extents[a] != 1);
        for (std::size_t a = 0; a + 1 < c.rank; ++a) REQUIRE_FALSE(continues(c, a));  // else one fold more
        REQUIRE(coalesce(row_major(l.rank, l.extents)).rank <= 1);
    }
}

TEST_CASE("coalesce_together keeps every array's offsets in row-major order, and is coalesce for one array") {
    std::mt19937 rng(12);
    for (int t = 0; t < trials; ++t) {
        // arrays of the same extents: the first random, the others the same layout or another
        // order of the same extents (a transposed operand), broadcast along some axes
        layout arrays[3] = {random_layout(rng), {}, {}};
        const layout& first = arrays[0];
        for (layout* other : {&arrays[1], &arrays[2]}) {
            *other = first;
            if (uniform(rng, 0, 1)) {
                const order_t order = random_order(rng, first.rank);
                std::ptrdiff_t stride = 1;
                for (std::size_t k = first.rank; k-- > 0;) {
                    other->strides[order[k]] = uniform(rng, 0, 4) == 0 ? 0 : stride;
                    stride *= static_cast<std::ptrdiff_t>(first.extents[order[k]]);
                }
            }
        }
        const std::size_t count = uniform(rng, 1, 3);
        extents_t extents = first.extents;
        strides_t strides[3] = {arrays[0].strides, arrays[1].strides, arrays[2].strides};
        const std::size_t rank = coalesce_together(first.rank, extents, count, [&](std::size_t a) -> strides_t& { return strides[a]; });
        for (std::size_t a = 0; a < count; ++a) {
            const layout merged{rank, extents, strides[a], arrays[a].offset};
            CAPTURE(a, arrays[a], merged);
            REQUIRE(offsets(merged) == offsets(arrays[a]));
            REQUIRE(merged.rank <= first.rank);
        }
        if (count == 1 && first.size() != 0) {
            const layout c = coalesce(first);
            REQUIRE(rank == c.rank);
            for (std::size_t i = 0; i < rank; ++i) REQUIRE((extents[i] == c.extents[i] && strides[0][i] == c.strides[i]));
        }
    }
    // a pass's result and a transposed input: nothing folds; the same layout twice: one axis
    extents_t e{2, 3};
    strides_t s[2] = {{3, 1}, {1, 2}};
    REQUIRE(coalesce_together(2, e, 2, [&](std::size_t a) -> strides_t& { return s[a]; }) == 2);
    strides_t same[2] = {{3, 1}, {3, 1}};
    REQUIRE(coalesce_together(2, e, 2, [&](std::size_t a) -> strides_t& { return same[a]; }) == 1);
    REQUIRE((e[0] == 6 && same[0][0] == 1 && same[1][0] == 1));
}

TEST_CASE("a reshape of a row-major layout is the row-major layout of the new extents") {
    std::mt19937 rng(3);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        const layout from = row_major(l.rank, l.extents), to = random_row_major_of_size(rng, l.size());
        CAPTURE(from, to);
        const std::optional<layout> r = reshape(from, to.rank, to.extents);
        REQUIRE(r.has_value());
        CAPTURE(*r);
        REQUIRE(*r == to);
    }
}

TEST_CASE("reshape succeeds exactly when some strides reach the same offsets in row-major order, and keeps them") {
    std::mt19937 rng(4);
    int succeeded = 0;
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng), to = random_row_major_of_size(rng, l.size());
        CAPTURE(l, to);
        // never to another size: twice as many, or as many as l's first axes hold
        const layout twice = random_row_major_of_size(rng, 2 * l.size());
        const std::size_t part = std::accumulate(l.extents.begin(), l.extents.begin() + uniform(rng, 0, l.rank), std::size_t{1}, std::multiplies<>());
        const layout fewer = random_row_major_of_size(rng, part);
        REQUIRE_FALSE(reshape(l, twice.rank, twice.extents));
        REQUIRE((part == l.size() || !reshape(l, fewer.rank, fewer.extents)));
        const std::optional<layout> r = reshape(l, to.rank, to.extents);
        REQUIRE(r.has_value() == expressible(offsets(l), to));
        if (!r) continue;
        ++succeeded;
        REQUIRE((r->rank == to.rank && r->extents == to.extents));
        REQUIRE(offsets(*r) == offsets(l));
    }
    REQUIRE((succeeded > trials / 10 && succeeded < trials * 9 / 10));  // both outcomes are tried often
    // Merging the axes of a transposed matrix needs a copy.
    REQUIRE_FALSE(reshape(permute(row_major(2, {2, 3}), {1, 0}), 1, {6}));
}

TEST_CASE("select(l, axis, i) reads l at the index with i put in at axis") {
    std::mt19937 rng(5);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        if (l.rank == 0) continue;
        const std::size_t axis = uniform(rng, 0, l.rank - 1), i = uniform(rng, 0, l.extents[axis] - 1);
        const layout s = select(l, axis, i);
        CAPTURE(l, axis, i, s);
        REQUIRE(s.rank == l.rank - 1);
        REQUIRE(offsets(s) == offsets_through(s, l, [&](const index_t& j, std::size_t a) {
                    return a < axis ? j[a] : a == axis ? i : j[a - 1];
                }));
    }
}

TEST_CASE("unsqueeze(l, p) reads l at the index without its axis p, and select(., p, 0) undoes it") {
    std::mt19937 rng(11);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        if (l.rank == max_rank) continue;
        const std::size_t p = uniform(rng, 0, l.rank);
        const layout u = unsqueeze(l, p);
        CAPTURE(l, p, u);
        REQUIRE(u.rank == l.rank + 1);
        REQUIRE(u.extents[p] == 1);
        REQUIRE(offsets(u) == offsets_through(u, l, [&](const index_t& j, std::size_t a) { return j[a < p ? a : a + 1]; }));
        REQUIRE(select(u, p, 0) == l);
        if (is_dense(l) && l.size() > 1) REQUIRE(is_dense(u));  // a contiguous layout stays one
    }
}

TEST_CASE("an empty slice stays at the layout's offset, however far its begin") {
    const layout l = row_major(2, {3, 4});
    CHECK(slice(l, 0, 3, 0, 1).offset == 0);
    CHECK(slice(l, 1, 4, 0, 2).offset == 0);
    CHECK(slice(l, 0, 2, 1, 1).offset == 8);
}

TEST_CASE("broadcast to a higher rank reads l at the right-aligned index, at 0 along axes of extent 1") {
    std::mt19937 rng(6);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        const std::size_t rank = uniform(rng, l.rank, 6), lead = rank - l.rank;
        layout b = broadcast(l, rank);
        CAPTURE(l, b);
        REQUIRE(b.rank == rank);
        layout in_place = l;  // the planner's form: the same layout, every field
        broadcast_in_place(in_place, rank);
        REQUIRE(in_place == b);
        for (std::size_t a = 0; a < rank; ++a) REQUIRE(b.extents[a] == (a < lead ? 1 : l.extents[a - lead]));
        // Widen every axis of extent 1: all its indices must read the one element there.
        for (std::size_t a = 0; a < rank; ++a) b.extents[a] = b.extents[a] == 1 ? 3 : b.extents[a];
        REQUIRE(offsets(b) == offsets_through(b, l, [&](const index_t& j, std::size_t a) {
                    return l.extents[a] == 1 ? 0 : j[a + lead];
                }));
    }
}

TEST_CASE("fold of an axis into the next keeps the offsets in row-major order exactly when continues says so") {
    std::mt19937 rng(7);
    int folded = 0;
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        if (l.rank < 2) continue;
        const std::size_t axis = uniform(rng, 0, l.rank - 2);
        const layout f = fold(l, axis);
        CAPTURE(l, axis, f);
        REQUIRE((f.rank == l.rank - 1 && f.size() == l.size()));
        REQUIRE(continues(l, axis) == (offsets(f) == offsets(l)));
        folded += continues(l, axis);
    }
    REQUIRE(folded > trials / 10);  // both outcomes are tried often
}

TEST_CASE("tile(l, box) at index j reads l at the box's first + j") {
    std::mt19937 rng(8);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        extents_t first{}, extents{};
        for (std::size_t a = 0; a < l.rank; ++a) {
            first[a] = uniform(rng, 0, l.extents[a] - 1);
            extents[a] = uniform(rng, 1, l.extents[a] - first[a]);
        }
        const layout box = tile(l, {first, extents});
        REQUIRE(box.offset == l.offset + offset_in(l, {first, extents}));
        CAPTURE(l, box);
        REQUIRE((box.rank == l.rank && box.extents == extents));
        REQUIRE(offsets(box) == offsets_through(box, l, [&](const index_t& j, std::size_t a) { return first[a] + j[a]; }));
    }
}

TEST_CASE("a matrix_layout is its layout's last two axes: at(), transposed and a tile's first element agree") {
    std::mt19937 rng(9);
    for (int t = 0; t < trials; ++t) {
        const layout l = random_layout(rng);
        if (l.rank < 2) continue;
        const std::size_t r = l.rank;
        const matrix_layout m = last_two_axes(l);
        CAPTURE(l);
        REQUIRE((m.rows == l.extents[r - 2] && m.cols == l.extents[r - 1]));
        index_t index{};  // the first element of a random batch item
        for (std::size_t a = 0; a + 2 < r; ++a) index[a] = uniform(rng, 0, l.extents[a] - 1);
        for (std::size_t i = 0; i < m.rows; ++i) {
            for (std::size_t j = 0; j < m.cols; ++j) {
                index[r - 2] = i;
                index[r - 1] = j;
                const std::ptrdiff_t from_item = l.at(index.data()) - m.at(i, j);  // the same for every (i, j)
                index[r - 2] = index[r - 1] = 0;
                REQUIRE(from_item == l.at(index.data()));
                REQUIRE(transposed(m).at(j, i) == m.at(i, j));
            }
        }
        order_t swap{};
        std::iota(swap.begin(), swap.begin() + static_cast<std::ptrdiff_t>(r), std::size_t{0});
        std::swap(swap[r - 2], swap[r - 1]);
        REQUIRE(last_two_axes(permute(l, swap)) == transposed(m));
        box part{};  // rows from i, columns from j: its first element is at(i, j) on
        for (std::size_t a = 0; a < r; ++a) part.extents[a] = l.extents[a];
        if (m.rows == 0 || m.cols == 0) continue;
        part.first[r - 2] = uniform(rng, 0, m.rows - 1);
        part.first[r - 1] = uniform(rng, 0, m.cols - 1);
        REQUIRE(offset_in(l, part) == m.at(part.first[r - 2], part.first[r - 1]));
    }
}

TEST_CASE("an empty layout visits no offset and reshapes only to size 0") {
    const layout empty = row_major(3, {2, 0, 3});
    REQUIRE(empty.size() == 0);
    REQUIRE(offsets(empty).empty());
    REQUIRE(coalesce(empty) == empty);
    REQUIRE(permute(empty, {2, 0, 1}).extents == extents_t{3, 2, 0});
    REQUIRE(select(empty, 0, 1).size() == 0);
    REQUIRE(tile(empty, {{1, 0, 1}, {1, 0, 2}}).size() == 0);
    const std::optional<layout> r = reshape(empty, 2, {0, 5});
    REQUIRE((r && r->size() == 0 && r->extents == extents_t{0, 5}));
    REQUIRE_FALSE(reshape(empty, 2, {2, 3}));  // a reshape never changes the size
}

TEST_CASE("a layout of rank 0 is one element, at its offset") {
    const layout scalar{0, {}, {}, 7};
    REQUIRE(scalar.size() == 1);
    REQUIRE(offsets(scalar) == offsets_t{7});
    REQUIRE((permute(scalar, {}) == scalar && unpermute(scalar, {}) == scalar && coalesce(scalar) == scalar));
    REQUIRE(coalesce(layout{2, {1, 1}, {5, 9}, 7}) == scalar);  // axes of extent 1 dropped
    REQUIRE(select(row_major(1, {4}), 0, 2) == layout{0, {}, {}, 2});
    REQUIRE(offsets(broadcast(scalar, 2)) == offsets_t{7});
    const std::optional<layout> ones = reshape(scalar, 2, {1, 1});
    REQUIRE((ones && offsets(*ones) == offsets_t{7}));
    REQUIRE(reshape(*ones, 0, {}) == scalar);
    REQUIRE_FALSE(reshape(scalar, 1, {2}));
}

TEST_CASE("the layout algebra runs at compile time") {
    constexpr layout m = row_major(2, {2, 3});  // (2,3):(3,1)
    STATIC_REQUIRE(reshape(m, 3, {3, 1, 2}) == row_major(3, {3, 1, 2}));
    STATIC_REQUIRE(!reshape(permute(m, {1, 0}), 1, {6}));
    STATIC_REQUIRE(unpermute(permute(m, {1, 0}), {1, 0}) == m);
    STATIC_REQUIRE(coalesce(row_major(4, {2, 1, 3, 4})) == row_major(1, {24}));
    STATIC_REQUIRE(select(m, 0, 1) == layout{1, {3}, {1}, 3});
}
