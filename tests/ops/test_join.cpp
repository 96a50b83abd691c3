// concat and stack: against xtensor's concatenate and stack, on odd sizes, along every axis
// position, with empty, transposed, strided and computed operands, on both backends; their
// plans (each operand written into its slice, no copy between) and their errors.
#include "support.hpp"

#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model">;
using Part = ds::axis<"part">;

template <class E>
void require_both_backends(const E& formula, const xt::xarray<double>& want, double rtol = 1e-6) {
    test::require_close(ds::eval(formula), want, rtol, 0);
    test::require_close(ds::eval(formula, ds::backend::reference::evaluator{}), want, rtol, 0);
}

}  // namespace

TEST_CASE("concat along each axis of odd sizes, any number of operands, empty ones included") {
    for (std::size_t n : {0, 1, 3, 7, 17}) {
        ds::tensor<float, Batch, Seq, Model> a(Batch{2}, Seq{3}, Model{5}), b(Batch{2}, Seq{n}, Model{5}),
            c(Batch{2}, Seq{1}, Model{5});
        ds::fill_uniform(a, 1);
        ds::fill_uniform(b, 2);
        ds::fill_uniform(c, 3);
        const auto xa = test::to_xt(a), xb = test::to_xt(b), xc = test::to_xt(c);
        INFO("n=" << n);
        require_both_backends(ds::concat<Seq>(a, b), xt::concatenate(xt::xtuple(xa, xb), 1));
        require_both_backends(ds::concat<Seq>(a, b, c, b), xt::concatenate(xt::xtuple(xa, xb, xc, xb), 1));

        ds::tensor<float, Batch, Seq, Model> d(Batch{n}, Seq{3}, Model{5});
        ds::fill_uniform(d, 4);
        require_both_backends(ds::concat<Batch>(d, a), xt::concatenate(xt::xtuple(test::to_xt(d), xa), 0));

        ds::tensor<float, Batch, Seq, Model> e(Batch{2}, Seq{3}, Model{n});
        ds::fill_uniform(e, 5);
        require_both_backends(ds::concat<Model>(a, e, a), xt::concatenate(xt::xtuple(xa, test::to_xt(e), xa), 2));
    }
}

TEST_CASE("concat of transposed, strided and computed operands") {
    ds::tensor<double, Seq, Model> x(Seq{7}, Model{5});
    ds::tensor<double, Model, Seq> t(Model{5}, Seq{9});
    ds::tensor<double, Model, Model> w(Model{5}, Model{5});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(t, 2);
    ds::fill_uniform(w, 3);
    const auto xx = test::to_xt(x), xt_t = xt::xarray<double>(xt::transpose(test::to_xt(t))), xw = test::to_xt(w);
    // every other position of x along seq, the transpose of t, x * 2 + 1, and x w
    auto every_other = ds::slice<Seq>(x, 0, 7, 2);
    xt::xarray<double> want_product = xt::zeros<double>({std::size_t{7}, std::size_t{5}});
    for (std::size_t i = 0; i < 7; ++i) {
        for (std::size_t j = 0; j < 5; ++j) {
            for (std::size_t k = 0; k < 5; ++k) want_product(i, j) += xx(i, k) * xw(k, j);
        }
    }
    xt::xarray<double> want = xt::concatenate(
        xt::xtuple(xt::xarray<double>(xt::view(xx, xt::range(0, 7, 2), xt::all())), xt_t, xx * 2.0 + 1.0, want_product), 0);
    require_both_backends(ds::concat<Seq>(every_other, ds::transpose(t), x * 2.0 + 1.0, ds::matmul(x, w)), want, 1e-12);

    // a join inside a formula, and a formula of joins
    require_both_backends(ds::concat<Seq>(x, ds::transpose(t)) * 3.0, xt::concatenate(xt::xtuple(xx, xt_t), 0) * 3.0, 1e-12);
    ds::tensor<double, Seq, Model> out(Seq{16}, Model{5});
    out = ds::concat<Seq>(x, ds::transpose(t)) - 1.0;
    test::require_close(out, xt::concatenate(xt::xtuple(xx, xt_t), 0) - 1.0, 1e-12, 0);
    // into a transposed destination
    ds::tensor<double, Model, Seq> transposed(Model{5}, Seq{14});
    ds::transpose(transposed) = ds::concat<Seq>(x, x);
    test::require_close(transposed, xt::transpose(xt::concatenate(xt::xtuple(xx, xx), 0)), 0, 0);
}

TEST_CASE("concat writes each operand into its slice: no temporary in between") {
    ds::tensor<float, Seq, Model> x(Seq{4}, Model{8});
    ds::tensor<float, Model, Model> w(Model{8}, Model{8});
    ds::fill_uniform(x, 1);
    ds::fill_uniform(w, 2);
    auto y = ds::matmul(x, w);
    const std::string plan = ds::explain(ds::concat<Seq>(y + 1.0f, x, y));
    INFO(plan);
    // the product once (read twice, so held in a temporary, not fused into an epilogue), then
    // each part written into its slice of out
    CHECK(plan.find("1 temporary (128 B)") != std::string::npos);
    CHECK(plan.find("fused      out (seq=4, model=8) = add(t0, 1)") != std::string::npos);
    CHECK(plan.find("copy       out (seq=4, model=8) (from element 32) = in0") != std::string::npos);
    CHECK(plan.find("copy       out (seq=4, model=8) (from element 64) = t0") != std::string::npos);
    std::size_t gemms = 0;
    for (std::size_t at = plan.find("gemm"); at != std::string::npos; at = plan.find("gemm", at + 1)) ++gemms;
    CHECK(gemms == 1);
    auto z = ds::eval(ds::concat<Seq>(y + 1.0f, x, y));
    const auto xy = test::to_xt(ds::eval(y));
    test::require_close(z, xt::concatenate(xt::xtuple(xy + 1.0, test::to_xt(x), xy), 0), 1e-6, 1e-6);
}

TEST_CASE("stack: a new axis of the operands' count, at any position") {
    ds::tensor<float, Seq, Model> a(Seq{3}, Model{7}), b(Seq{3}, Model{7}), c(Seq{3}, Model{7});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(b, 2);
    ds::fill_uniform(c, 3);
    const auto xa = test::to_xt(a), xb = test::to_xt(b), xc = test::to_xt(c);
    auto first = ds::stack<Part, 0>(a, b, c);
    static_assert(std::is_same_v<ds::shape_of<decltype(first)>, ds::shape<ds::axis<"part", 3>, Seq, Model>>);
    require_both_backends(first, xt::stack(xt::xtuple(xa, xb, xc), 0));
    require_both_backends(ds::stack<Part, 1>(a, b), xt::stack(xt::xtuple(xa, xb), 1));
    require_both_backends(ds::stack<ds::axis<"part", 2>, 2>(a, b * 2.0f), xt::stack(xt::xtuple(xa, xb * 2.0), 2));
}

TEST_CASE("concat keeps static extents static, and checks run-time ones once") {
    using Seq4 = ds::axis<"seq", 4>;
    using Seq3 = ds::axis<"seq", 3>;
    using Model8 = ds::axis<"model", 8>;
    ds::tensor<float, Seq4, Model8> a;
    ds::tensor<float, Seq3, Model8> b;
    static_assert(std::is_same_v<ds::shape_of<decltype(ds::concat<Seq>(a, b, a))>, ds::shape<ds::axis<"seq", 11>, Model8>>);
    ds::tensor<float, Seq, Model8> c(Seq{5});
    static_assert(std::is_same_v<ds::shape_of<decltype(ds::concat<Seq>(a, c))>, ds::shape<Seq, Model8>>);
    CHECK(ds::concat<Seq>(a, c).shape().extent(0) == 9);

    ds::tensor<float, Seq, Model> x(Seq{2}, Model{8}), y(Seq{2}, Model{6});
    CHECK(test::error_of([&] { (void)ds::concat<Seq>(x, y); }) ==
          "dimsum: concat along seq: the other axes of the operands differ: (seq=2, model=8) and (seq=2, model=6)");
    CHECK(test::error_of([&] { (void)ds::concat<Model>(x, y); }).empty());
}
