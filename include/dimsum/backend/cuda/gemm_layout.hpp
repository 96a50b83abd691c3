#pragma once
// dimsum's products are row-major and strided: C (m x n) = A (m x k) B (k x n), element (i, j)
// of each at i * row_stride + j * col_stride. cuBLAS's are column-major, each operand read
// as stored or transposed, with one leading dimension. This maps the one onto the other:
//   C with unit column stride (row-major, the common case) is the column-major C^T (n x m),
//   and C^T = B^T A^T: the call's A is dimsum's B and its B is dimsum's A ("swapped");
//   C with unit row stride (a transposed destination) is column-major as it is: C = A B.
// An operand that neither form reads (no unit stride, a zero or negative stride, a leading
// dimension too small) must first be copied row-major; a C that neither form writes, computed
// into a row-major temporary. Batch axes become cuBLAS's strided batch (the innermost) and a
// call per item of the others (gemm_calls). Plain host code, run by the CUDA backend's tests
// on the host stand-in (tests/cuda/).

#include <algorithm>
#include <cstddef>
#include <optional>

#include "dimsum/backend/cuda/kernels.hpp"
#include "dimsum/evaluation/layout.hpp"

namespace dimsum::backend::cuda {

// A matrix as dimsum's kernels see it: element (i, j) at i * row_stride + j * col_stride.
using evaluation::matrix_layout;

// How cuBLAS reads a matrix whose logical shape is that of a matrix_layout: stored column-major
// (element (i, j) at i + j * ld), or stored transposed (at j + i * ld).
struct blas_operand {
    bool transposed = false;
    long long ld = 1;
};

// The cuBLAS operand that reads m, if one does. A stride along an axis of extent 1 is never
// used, so it does not count.
constexpr std::optional<blas_operand> as_blas_operand(const matrix_layout& m) {
    const auto rows = static_cast<long long>(m.rows), cols = static_cast<long long>(m.cols);
    const bool one_row = rows <= 1, one_col = cols <= 1;
    if (one_row || m.row_stride == 1) {  // column-major, ld = the column stride
        const long long ld = one_col ? std::max(1LL, rows) : m.col_stride;
        if (ld >= std::max(1LL, rows)) return blas_operand{false, ld};
    }
    if (one_col || m.col_stride == 1) {  // row-major: column-major transposed, ld = the row stride
        const long long ld = one_row ? std::max(1LL, cols) : m.row_stride;
        if (ld >= std::max(1LL, cols)) return blas_operand{true, ld};
    }
    return std::nullopt;
}

// The cuBLAS form of C = A B, or what stops it.
struct blas_product {
    bool c_fits = false;  // C is written by one of the two forms; else a temporary
    bool pack_a = false, pack_b = false;  // dimsum's A or B must be copied row-major first
    bool swapped = false;  // the call's A is dimsum's B (C^T = B^T A^T)
    long long m = 0, n = 0, k = 0;  // the call's
    blas_operand a{}, b{};          // the call's
    long long ldc = 1;
};

constexpr blas_product plan_product(const matrix_layout& a, const matrix_layout& b, const matrix_layout& c) {
    blas_product p;
    auto fill = [&p](const matrix_layout& call_a, const matrix_layout& call_b, const blas_operand& out) {
        p.c_fits = true;
        p.ldc = out.ld;
        p.m = static_cast<long long>(call_a.rows);
        p.n = static_cast<long long>(call_b.cols);
        p.k = static_cast<long long>(call_a.cols);
        const auto x = as_blas_operand(call_a), y = as_blas_operand(call_b);
        if (x) p.a = *x;
        if (y) p.b = *y;
        p.pack_a = p.swapped ? !y : !x;
        p.pack_b = p.swapped ? !x : !y;
    };
    if (const auto out = as_blas_operand(transposed(c)); out && !out->transposed) {
        p.swapped = true;
        fill(transposed(b), transposed(a), *out);
    } else if (const auto direct = as_blas_operand(c); direct && !direct->transposed) {
        fill(a, b, *direct);
    }
    return p;
}
inline blas_product plan_product(const evaluation::layout& a, const evaluation::layout& b, const evaluation::layout& c) {
    return plan_product(evaluation::last_two_axes(a), evaluation::last_two_axes(b), evaluation::last_two_axes(c));
}

// Device memory of `type` seen through a layout, as a product's operand.
struct gemm_operand {
    const void* first = nullptr;  // element 0's address (after the layout's offset)
    evaluation::layout where{};
};

// Calls run(call) with each cuBLAS call of C = A B (C of rank r >= 2, A and B of the same rank,
// an axis of extent 1 broadcast to C's), given a form (plan_product) that needs no packing:
// cuBLAS's strided batch along the innermost batch axis, one call per item of the outer ones.
template <class Run>
void gemm_calls(gemm_call call, const blas_product& form, const gemm_operand& a, const gemm_operand& b,
                const gemm_operand& c, Run&& run) {
    call.m = form.m;
    call.n = form.n;
    call.k = form.k;
    call.transpose_a = form.a.transposed;
    call.transpose_b = form.b.transposed;
    call.lda = form.a.ld;
    call.ldb = form.b.ld;
    call.ldc = form.ldc;
    const gemm_operand& first = form.swapped ? b : a;
    const gemm_operand& second = form.swapped ? a : b;
    // an operand's stride along a batch axis, 0 where it has one item for all of C's
    const auto along = [](const gemm_operand& x, std::size_t axis) -> std::ptrdiff_t {
        return x.where.extents[axis] == 1 ? 0 : x.where.strides[axis];
    };
    const std::size_t batch_axes = c.where.rank - 2;
    std::size_t outer = 1;  // items of the batch axes before the innermost
    if (batch_axes > 0) {
        const std::size_t inner = batch_axes - 1;
        for (std::size_t i = 0; i < inner; ++i) outer *= c.where.extents[i];
        call.batch = static_cast<long long>(c.where.extents[inner]);
        call.stride_a = along(first, inner);
        call.stride_b = along(second, inner);
        call.stride_c = c.where.strides[inner];
    }
    const auto bytes = static_cast<std::ptrdiff_t>(size_of(call.type));
    const auto shifted = [bytes](const void* p, std::ptrdiff_t elements) { return static_cast<const char*>(p) + elements * bytes; };
    for (std::size_t item = 0; item < outer; ++item) {
        std::ptrdiff_t at_first = 0, at_second = 0, at_c = 0;  // the item's offsets along the outer axes
        std::size_t rest = item;
        for (std::size_t i = batch_axes > 0 ? batch_axes - 1 : 0; i-- > 0;) {
            const auto index = static_cast<std::ptrdiff_t>(rest % c.where.extents[i]);
            rest /= c.where.extents[i];
            at_first += index * along(first, i);
            at_second += index * along(second, i);
            at_c += index * c.where.strides[i];
        }
        call.a = shifted(first.first, at_first);
        call.b = shifted(second.first, at_second);
        call.c = const_cast<char*>(shifted(c.first, at_c));
        run(call);
    }
}

}  // namespace dimsum::backend::cuda
