// Laws that hold whatever the data: each side computed by dimsum, on random data of odd
// sizes, with operands transposed and viewed.
#include "support.hpp"

namespace ds = dimsum;

using Batch = ds::axis<"batch">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Inner = ds::axis<"inner">;

template <class A, class B>
void require_same(const A& a, const B& b, double tol = 0) {
    test::require_close(ds::eval(a), test::to_xt(ds::eval(b)), tol, tol);
}

TEST_CASE("a permutation followed by its inverse is the identity") {
    for (std::size_t n : test::odd_sizes) {
        ds::tensor<double, Batch, Rows, Cols> x(Batch{3}, Rows{n}, Cols{7});
        ds::fill_uniform(x, n);
        require_same(ds::permute<1, 2, 0>(ds::permute<2, 0, 1>(x)), x);
        require_same(ds::permute<Batch, Rows, Cols>(ds::permute<Cols, Batch, Rows>(x * 1.0)), x);
        require_same(ds::transpose(ds::transpose(x + 0.0)), x);
    }
}

TEST_CASE("splitting an axis and merging it back is the identity") {
    using Half = ds::axis<"half", 2>;
    using Rest = ds::axis<"rest">;
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{17}}) {
        ds::tensor<float, Rows, Cols> x(Rows{n}, Cols{6});
        ds::fill_uniform(x, n);
        auto split = ds::view<Rows, Half, Rest>(ds::transpose(ds::transpose(x)));  // a lazy node over a view
        require_same(ds::view<Rows, Cols>(split), x);
        // Through a transpose, which makes the merge need a copy.
        auto swapped = ds::transpose<Half, Rest>(ds::view<Rows, Half, Rest>(x));
        require_same(ds::view<Rows, Cols>(ds::transpose<Rest, Half>(swapped)), x);
    }
}

TEST_CASE("(A B)^T = B^T A^T") {
    for (std::size_t m : test::odd_sizes) {
        ds::tensor<double, Rows, Inner> a(Rows{m}, Inner{17});
        ds::tensor<double, Inner, Cols> b(Inner{17}, Cols{7});
        ds::fill_uniform(a, m);
        ds::fill_uniform(b, m + 1);
        require_same(ds::transpose(ds::matmul(a, b)), ds::matmul(ds::transpose(b), ds::transpose(a)), 1e-13);
    }
}

TEST_CASE("softmax rows sum to one and ignore a constant added to the row") {
    for (std::size_t n : test::odd_sizes) {
        ds::tensor<double, Rows, Cols> x(Rows{5}, Cols{n});
        ds::tensor<double, Rows, ds::dim<1>> shift(Rows{5});
        ds::fill_uniform(x, n, -50, 50);
        ds::fill_uniform(shift, n + 1, -100, 100);
        ds::tensor<double, Rows> ones(Rows{5});
        ones.fill(1.0);
        require_same(ds::sum<Cols>(ds::softmax(x)), ones, 1e-14);
        require_same(ds::softmax(x + shift), ds::softmax(x), 1e-13);
    }
}

TEST_CASE("where with a mask and its complement partitions the elements") {
    using Q = ds::axis<"q">;
    using K = ds::axis<"k">;
    ds::tensor<float, Batch, Q, K> a(Batch{2}, Q{7}, K{17}), b(Batch{2}, Q{7}, K{17});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(b, 2);
    auto mask = ds::causal_mask(Q{7}, K{17});
    require_same(ds::where(mask, a, b) + ds::where(mask, b, a), a + b, 1e-6);
    require_same(ds::masked_fill(a, mask, 0.0f) + ds::where(mask, a, 0.0f), a);
}

TEST_CASE("the mean is the sum divided by the count, and max bounds every element") {
    ds::tensor<double, Batch, Rows> x(Batch{3}, Rows{65});
    ds::fill_uniform(x, 3);
    require_same(ds::mean<Rows>(x), ds::sum<Rows>(x) / 65.0, 1e-15);
    auto top = ds::eval(ds::max<Rows>(x));
    require_same(ds::max<Rows>(ds::max(x, ds::view<Batch, ds::dim<1>>(top))), top);
}
