#pragma once
// The reference kernels: plain loops over strided arrays, accumulating in double (long double
// for double tensors). They know nothing of formulas.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "dimsum/core/functors.hpp"
#include "dimsum/evaluation/codes.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::backend::reference {

// The plain data of evaluation/ that this backend's loops walk.
using evaluation::broadcast_to_rank;
using evaluation::for_each_index;
using evaluation::max_rank;
using evaluation::strided;
using evaluation::to_strided;

template <class T>
using accumulator_t = std::conditional_t<std::is_same_v<T, float>, double, long double>;

// out (..., m, n) = a (..., m, k) x b (..., k, n); a and b already have out's rank, with
// zero strides where their batch axes broadcast.
template <class T>
void matmul(strided<const T> a, strided<const T> b, strided<T> out) {
    const std::size_t r = out.where.rank, depth = a.where.extents[r - 1];
    const std::ptrdiff_t a_step = a.where.strides[r - 1], b_step = b.where.strides[r - 2];
    for_each_index(out.where.extents, r, [&](const std::size_t* index) {
        // a's row and b's column of this element, from depth 0 on (index's own position along
        // the depth axis of each is its column and row, which the depth replaces)
        std::array<std::size_t, max_rank> ia{}, ib{};
        std::copy_n(index, r, ia.begin());
        std::copy_n(index, r, ib.begin());
        ia[r - 1] = 0;
        ib[r - 2] = 0;
        const std::ptrdiff_t a_first = a.where.at(ia.data()), b_first = b.where.at(ib.data());
        accumulator_t<T> sum = 0;
        for (std::size_t k = 0; k < depth; ++k) {
            const auto step = static_cast<std::ptrdiff_t>(k);
            sum += static_cast<accumulator_t<T>>(a.data[a_first + step * a_step]) * b.data[b_first + step * b_step];
        }
        out.at(index) = static_cast<T>(sum);
    });
}

// Calls f(index) once per line along `axis`; the line is index with index[axis] = 0 .. n-1.
template <class F>
void for_each_line(std::array<std::size_t, max_rank> extents, std::size_t rank, std::size_t axis, F&& f) {
    extents[axis] = 1;
    for_each_index(extents, rank, f);
}

// The indices of one line (for_each_line): at(j) is its j-th, valid until the next call.
class line_index {
public:
    line_index(const std::size_t* first, std::size_t rank, std::size_t axis) : axis_(axis) {
        std::copy_n(first, rank, index_.begin());
    }
    const std::size_t* at(std::size_t j) {
        index_[axis_] = j;
        return index_.data();
    }

private:
    std::array<std::size_t, max_rank> index_{};
    std::size_t axis_;
};

// out = exp(x - max) / sum(exp(x - max)) along axis. A line of -infinity only (every value
// masked) gets weights 0.
template <class T>
void softmax(strided<const T> x, strided<T> out, std::size_t axis) {
    using acc = accumulator_t<T>;
    std::size_t n = x.where.extents[axis];
    for_each_line(x.where.extents, x.where.rank, axis, [&](const std::size_t* first) {
        line_index line(first, x.where.rank, axis);
        auto element = [&](std::size_t j) -> acc { return x.at(line.at(j)); };
        // pass 1: the maximum, so that exp never overflows
        acc top = -std::numeric_limits<acc>::infinity();
        for (std::size_t j = 0; j < n; ++j) top = fn::maximum{}(top, element(j));
        if (top == -std::numeric_limits<acc>::infinity()) {  // every value masked: no weight anywhere
            for (std::size_t j = 0; j < n; ++j) out.at(line.at(j)) = T(0);
            return;
        }
        // pass 2: the normaliser
        acc total = 0;
        for (std::size_t j = 0; j < n; ++j) total += std::exp(element(j) - top);
        // pass 3: the weights
        for (std::size_t j = 0; j < n; ++j) out.at(line.at(j)) = static_cast<T>(std::exp(element(j) - top) / total);
    });
}

// out = (x - mean) / sqrt(variance + epsilon) along axis, the biased variance taken about
// the mean.
template <class T>
void layer_norm(strided<const T> x, strided<T> out, std::size_t axis, T epsilon) {
    using acc = accumulator_t<T>;
    std::size_t n = x.where.extents[axis];
    for_each_line(x.where.extents, x.where.rank, axis, [&](const std::size_t* first) {
        line_index line(first, x.where.rank, axis);
        auto element = [&](std::size_t j) -> acc { return x.at(line.at(j)); };
        acc mean = 0, variance = 0;
        for (std::size_t j = 0; j < n; ++j) mean += element(j);
        mean /= static_cast<acc>(n);
        for (std::size_t j = 0; j < n; ++j) variance += (element(j) - mean) * (element(j) - mean);
        variance /= static_cast<acc>(n);
        acc inverse = 1 / std::sqrt(variance + static_cast<acc>(epsilon));
        for (std::size_t j = 0; j < n; ++j) out.at(line.at(j)) = static_cast<T>((element(j) - mean) * inverse);
    });
}

// out = reduction of x along axis; out has x's axes without it.
template <class Reduction, class T>
void reduce(strided<const T> x, strided<T> out, std::size_t axis) {
    using acc = accumulator_t<T>;
    std::size_t n = x.where.extents[axis];
    for_each_line(x.where.extents, x.where.rank, axis, [&](const std::size_t* first) {
        std::array<std::size_t, max_rank> index{}, kept{};
        std::copy_n(first, x.where.rank, index.begin());
        for (std::size_t i = 0, k = 0; i < x.where.rank; ++i) {
            if (i != axis) kept[k++] = index[i];
        }
        acc result = std::is_same_v<Reduction, fn::max> ? -std::numeric_limits<acc>::infinity() : acc(0);
        for (std::size_t j = 0; j < n; ++j) {
            index[axis] = j;
            acc v = x.at(index.data());
            if constexpr (std::is_same_v<Reduction, fn::max>) result = fn::maximum{}(result, v);
            else result += v;
        }
        if constexpr (std::is_same_v<Reduction, fn::mean>) result /= static_cast<acc>(n);
        out.at(kept.data()) = static_cast<T>(result);
    });
}

// out = causal_mask (1 where a key lies in its query's future; out (queries, keys)) or arange
// (out (n): 0, 1, ...).
template <class T>
void indices(bool causal, strided<T> out) {
    for_each_index(out.where.extents, out.where.rank, [&](const std::size_t* index) {
        if (!causal) out.at(index) = static_cast<T>(index[0]);
        else out.at(index) = evaluation::in_future(index[0], index[1], out.where.extents[0], out.where.extents[1]) ? T(1) : T(0);
    });
}

// Where the element of a table of rank `table_rank` lies for the element `index` of a gather's
// result (before..., ids..., after...): table (before..., ids[...], after...), ids along `axis`.
inline std::array<std::size_t, max_rank> table_index(const std::size_t* index, std::size_t axis, const evaluation::integers& ids,
                                                     std::size_t table_rank) {
    const std::size_t count = ids.where().rank;
    std::array<std::size_t, max_rank> at{};
    for (std::size_t i = 0; i < axis; ++i) at[i] = index[i];
    at[axis] = static_cast<std::size_t>(ids.at(index + axis));
    for (std::size_t i = axis + 1; i < table_rank; ++i) at[i] = index[i - 1 + count];
    return at;
}

// out (before..., ids..., after...) = table (before..., ids[...], after...). The ids are checked.
template <class T>
void gather(strided<const T> table, std::size_t axis, const evaluation::integers& ids, strided<T> out) {
    for_each_index(out.where.extents, out.where.rank, [&](const std::size_t* index) {
        out.at(index) = table.at(table_index(index, axis, ids, table.where.rank).data());
    });
}

// out (before..., extent, after...) = 0, then out (before..., ids[...], after...) += values
// (before..., ids..., after...), in the order of the values. The ids are checked.
template <class T>
void scatter_add(strided<const T> values, std::size_t axis, const evaluation::integers& ids, strided<T> out) {
    for_each_index(out.where.extents, out.where.rank, [&](const std::size_t* index) { out.at(index) = T(0); });
    for_each_index(values.where.extents, values.where.rank, [&](const std::size_t* index) {
        out.at(table_index(index, axis, ids, out.where.rank).data()) += values.at(index);
    });
}

}  // namespace dimsum::backend::reference
