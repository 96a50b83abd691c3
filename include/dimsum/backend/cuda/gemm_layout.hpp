#pragma once
// dimsum's products are row-major and strided: C (m x n) = A (m x k) B (k x n), element (i, j)
// of each at i * row_stride + j * col_stride. cuBLAS's are column-major, each operand read
// as stored or transposed, with one leading dimension. This maps the one onto the other:
//   C with unit column stride (row-major, the common case) is the column-major C^T (n x m),
//   and C^T = B^T A^T: the call's A is dimsum's B and its B is dimsum's A ("swapped");
//   C with unit row stride (a transposed destination) is column-major as it is: C = A B.
// An operand that neither form reads (no unit stride, a zero or negative stride, a leading
// dimension too small) must first be copied row-major; a C that neither form writes, computed
// into a row-major temporary. Plain host code, tested in tests/cuda/test_gemm_layout.cpp.

#include <algorithm>
#include <optional>

namespace dimsum::backend::cuda {

// A matrix as dimsum's kernels see it: element (i, j) at i * row_stride + j * col_stride.
struct matrix_layout {
    long long rows = 0, cols = 0, row_stride = 0, col_stride = 0;
};

// How cuBLAS reads a matrix whose logical shape is that of a matrix_layout: stored column-major
// (element (i, j) at i + j * ld), or stored transposed (at j + i * ld).
struct blas_operand {
    bool transposed = false;
    long long ld = 1;
};

// The cuBLAS operand that reads m, if one does. A stride along an axis of extent 1 is never
// used, so it does not count.
constexpr std::optional<blas_operand> as_blas_operand(const matrix_layout& m) {
    const bool one_row = m.rows <= 1, one_col = m.cols <= 1;
    if (one_row || m.row_stride == 1) {  // column-major, ld = the column stride
        const long long ld = one_col ? std::max(1LL, m.rows) : m.col_stride;
        if (ld >= std::max(1LL, m.rows)) return blas_operand{false, ld};
    }
    if (one_col || m.col_stride == 1) {  // row-major: column-major transposed, ld = the row stride
        const long long ld = one_row ? std::max(1LL, m.cols) : m.row_stride;
        if (ld >= std::max(1LL, m.cols)) return blas_operand{true, ld};
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

constexpr matrix_layout transposed(const matrix_layout& x) { return {x.cols, x.rows, x.col_stride, x.row_stride}; }

constexpr blas_product plan_product(const matrix_layout& a, const matrix_layout& b, const matrix_layout& c) {
    blas_product p;
    auto fill = [&p](const matrix_layout& call_a, const matrix_layout& call_b, const blas_operand& out) {
        p.c_fits = true;
        p.ldc = out.ld;
        p.m = call_a.rows;
        p.n = call_b.cols;
        p.k = call_a.cols;
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

}  // namespace dimsum::backend::cuda
