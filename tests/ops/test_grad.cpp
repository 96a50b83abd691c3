// Gradients (ds::grad, ds::vjp) against central finite differences in double, computed on the
// reference backend from the forward formula alone: every differentiable function and
// operation, on odd shapes, with broadcast, transposed, sliced and strided operands. The CPU
// backend's gradients (on 1 and 2 threads) against the reference backend's, in double and in
// float, NaN and infinity included.
#include "support.hpp"

#include <dimsum/backend/cpu/attention_gradient.hpp>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Inner = ds::axis<"inner">;

ds::backend::reference::evaluator reference;

// The value of a formula of no axes, on the reference backend.
template <class F>
double value_of(const F& f) {
    return static_cast<double>(ds::eval(f, reference).data()[0]);
}

// d loss / d x by central differences: each element of x moved by h either way in turn, the
// loss evaluated from the formula, which reads x's memory (written here through the view).
template <class V, class F>
xt::xarray<double> central_differences(const V& x, const F& loss, double h = 1e-6) {
    constexpr std::size_t rank = V::rank;
    std::vector<std::size_t> shape(rank);
    for (std::size_t i = 0; i < rank; ++i) shape[i] = x.extent(i);
    xt::xarray<double> out(shape);
    std::array<std::size_t, rank> index{};
    for (std::size_t k = 0; k < out.size(); ++k) {
        using T = std::remove_const_t<std::remove_reference_t<decltype(*x.data())>>;
        T& element = const_cast<T&>(x.data()[x.offset(index)]);
        const auto kept = element;
        element = kept + h;
        const double up = value_of(loss);
        element = kept - h;
        const double down = value_of(loss);
        element = kept;
        out.data()[k] = (up - down) / (2 * h);
        for (std::size_t i = rank; i-- > 0;) {
            if (++index[i] < x.extent(i)) break;
            index[i] = 0;
        }
    }
    return out;
}

// grad(loss, x) on the reference backend against central differences, and on the CPU backend
// (1 and 2 threads) against the reference backend.
template <class X, class F>
void check_gradient(X& x, const F& loss, double rtol = 1e-6, double atol = 1e-8) {
    const xt::xarray<double> want = central_differences(test::as_view(x), loss);
    const auto on_reference = ds::eval(ds::grad(loss, x), reference);
    test::require_close(on_reference, want, rtol, atol);
    for (int threads : {1, 2}) {
        INFO("cpu, threads=" << threads);
        ds::set_num_threads(threads);
        test::require_close(ds::eval(ds::grad(loss, x)), test::to_xt(on_reference), 1e-12, 1e-13);
    }
}

template <class T, class... A>
ds::tensor<T, A...> random_tensor(std::uint64_t seed, double low, double high, A... extents) {
    ds::tensor<T, A...> t(extents...);
    ds::fill_uniform(t, seed, low, high);
    return t;
}

}  // namespace

TEST_CASE("grad of every unary function against central differences, both backends") {
    for (std::size_t cols : {1, 3, 17}) {
        INFO("cols=" << cols);
        // positive, away from 0 (log, sqrt, rsqrt); signed away from 0 for abs
        auto x = random_tensor<double>(cols, 0.3, 1.7, Rows{3}, Cols{cols});
        auto s = random_tensor<double>(cols + 1, 0.3, 1.7, Rows{3}, Cols{cols});
        for (std::size_t i = 0; i < s.size(); i += 2) s.data()[i] = -s.data()[i];
        const auto w = random_tensor<double>(cols + 2, -1.0, 1.0, Rows{3}, Cols{cols});
        auto total = [&](auto&& f) { return ds::sum<Rows>(ds::sum<Cols>(f * w)); };
        check_gradient(x, total(ds::exp(x)));
        check_gradient(x, total(ds::log(x)));
        check_gradient(x, total(ds::sqrt(x)));
        check_gradient(x, total(ds::rsqrt(x)));
        check_gradient(x, total(-x));
        check_gradient(s, total(ds::tanh(s)));
        check_gradient(s, total(ds::abs(s)));
        check_gradient(s, total(ds::erf(s)));
        check_gradient(s, total(ds::sigmoid(s)));
        check_gradient(s, total(ds::silu(s)));
        check_gradient(s, total(ds::gelu(s)));
        check_gradient(s, total(ds::grad(total(ds::gelu(s)), s)));  // gelu's derivative's own rule
        check_gradient(s, total(ds::sin(s)));
        check_gradient(s, total(ds::cos(s)));
        check_gradient(s, total(ds::exp(ds::sin(s)) * ds::tanh(s)));  // chained, s read three times
    }
}

TEST_CASE("grad of binary functions with broadcast operands: each operand's gradient summed over its broadcast axes") {
    for (std::size_t cols : {1, 5, 17}) {
        INFO("cols=" << cols);
        auto a = random_tensor<double>(1, 0.3, 1.7, Batch{2}, Rows{3}, Cols{cols});
        auto b = random_tensor<double>(2, 0.3, 1.7, Cols{cols});           // broadcast along batch and rows
        auto c = random_tensor<double>(3, -1.0, 1.0, Rows{3}, Cols{1});    // broadcast along cols (extent 1)
        const auto w = random_tensor<double>(4, -1.0, 1.0, Batch{2}, Rows{3}, Cols{cols});
        auto total = [&](auto&& f) { return ds::sum<Batch>(ds::sum<Rows>(ds::sum<Cols>(f * w))); };
        check_gradient(a, total(a + b));
        check_gradient(b, total(a + b));
        check_gradient(b, total(a - b));
        check_gradient(a, total(a * b * c));
        check_gradient(b, total(a * b * c));
        check_gradient(c, total(a * b * c));
        check_gradient(a, total(a / b));
        check_gradient(b, total(a / b));
        check_gradient(a, total(ds::pow(a, b)));
        check_gradient(b, total(ds::pow(a, b)));
        check_gradient(c, total(ds::pow(a, c)));
        check_gradient(a, total(ds::max(a, b)));  // random values: no ties
        check_gradient(b, total(ds::min(a, b)));
        check_gradient(a, total(a * 2.5 + 1.0));
        check_gradient(a, total(ds::where(a > b, a * a, b)));
        check_gradient(b, total(ds::where(a > b, a * a, b)));
    }
}

TEST_CASE("grad of max and min at ties, and of where's and a comparison's operands, as PyTorch gives them") {
    ds::tensor<double, Cols> x(Cols{4}), y(Cols{4});
    for (std::size_t i = 0; i < 4; ++i) {
        x(i) = double(i);
        y(i) = 1.0;
    }
    // maximum: x wins at 2 and 3, ties at 1 (half each), loses at 0
    const auto gx = ds::eval(ds::grad(ds::sum<Cols>(ds::max(x, y)), x), reference);
    const auto gy = ds::eval(ds::grad(ds::sum<Cols>(ds::max(x, y)), y), reference);
    const double want_x[] = {0, 0.5, 1, 1}, want_y[] = {1, 0.5, 0, 0};
    for (std::size_t i = 0; i < 4; ++i) {
        CHECK(gx(i) == want_x[i]);
        CHECK(gy(i) == want_y[i]);
    }
    // a formula that reads x only through a mask: zeros
    const auto masked = ds::eval(ds::grad(ds::sum<Cols>(ds::where(x > 1.5, y, y * 2.0)), x));
    for (std::size_t i = 0; i < 4; ++i) CHECK(masked(i) == 0);
}

TEST_CASE("grad through matmul with batch axes, a broadcast operand and transposed views") {
    for (std::size_t k : {1, 4, 9}) {
        INFO("k=" << k);
        auto a = random_tensor<double>(k, -1.0, 1.0, Batch{3}, Rows{5}, Inner{k});
        auto b = random_tensor<double>(k + 1, -1.0, 1.0, Inner{k}, Cols{7});  // broadcast over the batch
        auto bt = random_tensor<double>(k + 2, -1.0, 1.0, Cols{7}, Inner{k});  // read transposed: an eager view
        const auto w = random_tensor<double>(k + 3, -1.0, 1.0, Batch{3}, Rows{5}, Cols{7});
        auto total = [&](auto&& f) { return ds::sum<Batch>(ds::sum<Rows>(ds::sum<Cols>(f * w))); };
        check_gradient(a, total(ds::matmul(a, b)));
        check_gradient(b, total(ds::matmul(a, b)));
        check_gradient(bt, total(ds::matmul(a, ds::transpose(bt))));
        check_gradient(a, total(ds::tanh(ds::matmul(a, ds::transpose(bt))) + ds::matmul(a, b)));
    }
}

TEST_CASE("grad of softmax, layer_norm, rms_norm and the reductions along each axis") {
    for (std::size_t cols : {1, 6, 13}) {
        INFO("cols=" << cols);
        auto x = random_tensor<double>(cols, -2.0, 2.0, Rows{4}, Cols{cols});
        const auto w = random_tensor<double>(cols + 1, -1.0, 1.0, Rows{4}, Cols{cols});
        const auto v = random_tensor<double>(cols + 2, -1.0, 1.0, Cols{cols});
        const auto u = random_tensor<double>(cols + 3, -1.0, 1.0, Rows{4});
        auto total = [&](auto&& f) { return ds::sum<Rows>(ds::sum<Cols>(f * w)); };
        check_gradient(x, total(ds::softmax(x)));
        check_gradient(x, total(ds::softmax<Rows>(x)));
        check_gradient(x, total(ds::layer_norm(x)), 1e-5);
        check_gradient(x, total(ds::layer_norm<Rows>(x, 1e-3)), 1e-5);
        check_gradient(x, ds::sum<Rows>(ds::sum<Cols>(x) * u));
        check_gradient(x, ds::sum<Cols>(ds::mean<Rows>(x) * v));
        check_gradient(x, ds::sum<Rows>(ds::max<Cols>(x) * u));  // random values: one maximum per line
        const auto gain = random_tensor<double>(cols + 4, 0.5, 1.5, Cols{cols});
        check_gradient(x, total(ds::nn::rms_norm(x, gain)), 1e-5);
    }
}

TEST_CASE("grad through views: transpose, view, select, slice with steps, concat, squeeze and unsqueeze") {
    for (std::size_t cols : {2, 7}) {
        INFO("cols=" << cols);
        auto x = random_tensor<double>(cols, -1.0, 1.0, Rows{6}, Cols{cols});
        const auto w = random_tensor<double>(cols + 1, -1.0, 1.0, Cols{cols}, Rows{6});
        const auto y = ds::eval(ds::exp(x));  // a formula's views are lazy nodes, a tensor's eager
        auto e = ds::exp(x);
        check_gradient(x, ds::sum<Cols>(ds::sum<Rows>(ds::transpose(ds::exp(x)) * w)));
        check_gradient(x, ds::sum<Cols>(ds::sum<Rows>(ds::transpose(x) * w)));  // an eager view of x
        using Twice = ds::axis<"twice", 2>;
        using Third = ds::axis<"third", 3>;
        check_gradient(x, ds::sum<Cols>(ds::sum<Third>(ds::sum<Twice>(ds::view<Twice, Third, Cols>(x) *
                                                                     ds::view<Twice, Third, Cols>(e)))));  // eager
        using Pair = ds::axis<"pair", 2>;
        using Half = ds::axis<"half">;
        check_gradient(x, ds::sum<Half>(ds::sum<Pair>(ds::sum<Cols>(ds::view<Pair, Half, Cols>(e * e)))));
        check_gradient(x, ds::sum<Cols>(ds::select<Rows>(e, 2) * ds::select<Rows>(x, 4)));
        check_gradient(x, ds::sum<Rows>(ds::sum<Cols>(ds::slice<Rows>(e, 1, 6, 2) * ds::slice<Rows>(x, 0, 5, 2))));
        check_gradient(x, ds::sum<Rows>(ds::sum<Cols>(ds::concat<Rows>(e, ds::slice<Rows>(x, 2, 4)) *
                                                         ds::concat<Rows>(ds::slice<Rows>(x, 1, 3), e))));
        using One = ds::axis<"one", 1>;
        check_gradient(x, ds::sum<Rows>(ds::sum<Cols>(ds::squeeze<One>(ds::unsqueeze<One, 1>(e)) * y)));
    }
}

TEST_CASE("grad through a permute of a view that splits an axis: heads split off a row's columns") {
    using Seq = ds::axis<"seq">;
    using Heads = ds::axis<"heads", 2>;
    using Width = ds::axis<"width", 3>;
    using Joined = ds::axis<"heads*width", 6>;
    for (std::size_t seq : {1, 4}) {
        INFO("seq=" << seq);
        auto x = random_tensor<double>(seq, -1.0, 1.0, Batch{2}, Seq{seq}, Joined{});
        const auto w = random_tensor<double>(seq + 1, -1.0, 1.0, Batch{2}, Heads{}, Seq{seq}, Width{});
        auto heads = [](auto& t) { return ds::permute<Batch, Heads, Seq, Width>(ds::view<Batch, Seq, Heads, Width>(t)); };
        auto total = [](auto&& f) { return ds::sum<Batch>(ds::sum<Heads>(ds::sum<Seq>(ds::sum<Width>(std::forward<decltype(f)>(f))))); };
        check_gradient(x, total(ds::sin(heads(x)) * w));
        // one pass, written into the gradient through the split and the permutation: no copy
        const std::string plan = ds::backend::cpu::evaluator{}.explain(ds::grad(total(ds::sin(heads(x)) * w), x));
        INFO(plan);
        CHECK(plan.find("copy") == std::string::npos);
        CHECK(plan.find("1 entry") != std::string::npos);
        // moved past the sequence too, as keys are read in scores; one head of it
        check_gradient(x, total(ds::permute<Batch, Heads, Seq, Width>(ds::permute<Batch, Heads, Width, Seq>(
                                    ds::view<Batch, Seq, Heads, Width>(x))) * heads(x) * w));
        check_gradient(x, ds::sum<Batch>(ds::sum<Seq>(ds::sum<Width>(ds::exp(ds::select<Heads>(heads(x), 1)) *
                                                                      ds::select<Heads>(w, 0)))));
        // the scores of x with itself, head by head
        using Key = ds::axis<"key">;
        auto keys = ds::permute<Batch, Heads, Width, Key>(ds::view<Batch, Key, Heads, Width>(x));
        check_gradient(x, ds::sum<Batch>(ds::sum<Heads>(ds::sum<Seq>(ds::sum<Key>(ds::tanh(ds::matmul(heads(x), keys)))))));
    }
    // a split within a split: rows of (2, 2, 3) columns read as (pair, outer, inner) moved
    using Pair = ds::axis<"pair", 2>;
    using Outer = ds::axis<"outer", 2>;
    using Twelve = ds::axis<"twelve", 12>;
    auto x = random_tensor<double>(9, -1.0, 1.0, Rows{3}, Twelve{});
    const auto w = random_tensor<double>(10, -1.0, 1.0, Width{}, Rows{3}, Pair{}, Outer{});
    check_gradient(x, ds::sum<Width>(ds::sum<Rows>(ds::sum<Pair>(ds::sum<Outer>(
                          ds::cos(ds::permute<Width, Rows, Pair, Outer>(ds::view<Rows, Pair, Outer, Width>(x))) * w)))));
}

TEST_CASE("grad of gather: the table's gradient added up at repeated ids, the same on 1 and 2 threads, bad ids refused") {
    using Vocab = ds::axis<"vocab">;
    using Seq = ds::axis<"seq">;
    for (std::size_t model : {1, 5, 64}) {
        INFO("model=" << model);
        auto table = random_tensor<double>(model, -1.0, 1.0, Vocab{7}, Cols{model});
        ds::tensor<std::int64_t, Batch, Seq> ids(Batch{3}, Seq{5});
        for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>((i * 5) % 7 % 4);  // repeats
        const auto w = random_tensor<double>(model + 1, -1.0, 1.0, Batch{3}, Seq{5}, Cols{model});
        auto loss = ds::sum<Batch>(ds::sum<Seq>(ds::sum<Cols>(ds::tanh(ds::gather<Vocab>(table, ids)) * w)));
        check_gradient(table, loss);
        // along an inner axis: the table's columns gathered
        auto by_columns = ds::sum<Vocab>(ds::sum<Seq>(ds::gather<Cols>(ds::exp(table), ds::select<Batch>(ids, 1)) * 0.5));
        if (model >= 4) check_gradient(table, by_columns);
    }
    auto table = random_tensor<double>(1, -1.0, 1.0, Vocab{3}, Cols{2});
    ds::tensor<std::int64_t, Seq> bad(Seq{2});
    bad(0) = 1;
    bad(1) = 3;
    const std::string plan = ds::backend::cpu::evaluator{}.explain(ds::grad(ds::sum<Seq>(ds::sum<Cols>(ds::gather<Vocab>(table, bad))), table));
    INFO(plan);
    CHECK(plan.find("scatter_add<vocab>") != std::string::npos);
    CHECK(test::error_of([&] { (void)ds::eval(ds::grad(ds::sum<Seq>(ds::sum<Cols>(ds::gather<Vocab>(table, bad))), table)); }) ==
          "dimsum: gather: id 3 at (seq=1) of the ids lies outside vocab=3");
}

TEST_CASE("grad with respect to a strided view, and vjp with a cotangent") {
    auto whole = random_tensor<double>(1, -1.0, 1.0, Rows{5}, Cols{9});
    auto part = ds::slice<Cols>(whole, 1, 8, 3);  // a view with gaps
    const auto w = random_tensor<double>(2, -1.0, 1.0, Rows{5}, Cols{3});
    check_gradient(part, ds::sum<Rows>(ds::sum<Cols>(ds::sin(part) * w)));

    auto x = random_tensor<double>(3, -1.0, 1.0, Rows{4}, Cols{5});
    const auto cotangent = random_tensor<double>(4, -1.0, 1.0, Rows{4}, Cols{5});
    const auto via_vjp = ds::eval(ds::vjp(ds::tanh(x) * x, x, cotangent), reference);
    const auto via_grad = ds::eval(ds::grad(ds::sum<Rows>(ds::sum<Cols>(ds::tanh(x) * x * cotangent)), x), reference);
    test::require_close(via_vjp, test::to_xt(via_grad), 1e-14, 1e-15);
    test::require_close(ds::eval(ds::vjp(ds::tanh(x) * x, x, cotangent * 2.0)), test::to_xt(via_grad) * 2.0, 1e-13, 1e-14);
}

TEST_CASE("grad of attention, causal and padded, for Q, K and V: fused forward on the CPU, step by step on the reference") {
    using Heads = ds::axis<"heads">;
    using Query = ds::axis<"query">;
    using Key = ds::axis<"key">;
    using Head = ds::axis<"head">;
    for (std::size_t keys : {1, 7, 33}) {
        INFO("keys=" << keys);
        auto q = random_tensor<double>(keys, -1.0, 1.0, Heads{2}, Query{keys}, Head{8});
        auto k = random_tensor<double>(keys + 1, -1.0, 1.0, Heads{2}, Key{keys}, Head{8});
        auto v = random_tensor<double>(keys + 2, -1.0, 1.0, Heads{2}, Key{keys}, Head{8});
        const auto w = random_tensor<double>(keys + 3, -1.0, 1.0, Heads{2}, Query{keys}, Head{8});
        auto attention = [&] {
            auto scores = ds::matmul(q, ds::transpose(k)) / std::sqrt(8.0);
            return ds::matmul(ds::softmax(ds::masked_fill(scores, ds::causal_mask(Query{keys}, Key{keys}),
                                                           -std::numeric_limits<double>::infinity())),
                              v);
        };
        auto loss = ds::sum<Heads>(ds::sum<Query>(ds::sum<Head>(attention() * w)));
        check_gradient(q, loss, 1e-5);
        check_gradient(k, loss, 1e-5);
        check_gradient(v, loss, 1e-5);
    }
}

TEST_CASE("gradients in float on the CPU backend against the reference backend in double") {
    for (std::size_t cols : {1, 7, 16, 17, 33}) {
        INFO("cols=" << cols);
        ds::tensor<float, Rows, Cols> x(Rows{5}, Cols{cols});
        ds::tensor<float, Cols, Inner> m(Cols{cols}, Inner{3});
        ds::fill_uniform(x, cols, -2.0, 2.0);
        ds::fill_uniform(m, cols + 1, -1.0, 1.0);
        auto loss = ds::sum<Rows>(ds::sum<Inner>(ds::matmul(ds::nn::gelu(ds::layer_norm(x)), m) * 0.5f));
        const auto in_double = ds::eval(
            ds::grad(ds::sum<Rows>(ds::sum<Inner>(ds::matmul(ds::nn::gelu(ds::layer_norm(ds::cast<double>(x))),
                                                              ds::cast<double>(m)) *
                                                  0.5)),
                     x),
            reference);
        for (int threads : {1, 2}) {
            ds::set_num_threads(threads);
            test::require_close(ds::eval(ds::grad(loss, x)), test::to_xt(in_double), 1e-4, 1e-5);
        }
    }
}

TEST_CASE("gradients of NaN and infinity: the CPU backend's the reference backend's, in every lane and tail") {
    const double special[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                              -std::numeric_limits<double>::infinity()};
    for (std::size_t cols : {1, 7, 8, 9, 16, 17}) {
        for (std::size_t at = 0; at < cols; ++at) {
            for (double value : special) {
                INFO("cols=" << cols << " at=" << at << " value=" << value);
                ds::tensor<float, Rows, Cols> x(Rows{2}, Cols{cols});
                ds::fill_uniform(x, cols + at, -2.0, 2.0);
                x(1, at) = static_cast<float>(value);
                auto loss = ds::sum<Rows>(ds::sum<Cols>(ds::silu(x) * ds::tanh(x) + ds::max(x, 0.5f) + ds::abs(x)));
                const auto cpu = ds::eval(ds::grad(loss, x));
                const auto ref = ds::eval(ds::grad(loss, x), reference);
                test::require_close(cpu, test::to_xt(ref), 1e-5, 1e-6);
                auto in_softmax = ds::sum<Rows>(ds::sum<Cols>(ds::softmax(x) * x));
                test::require_close(ds::eval(ds::grad(in_softmax, x)), test::to_xt(ds::eval(ds::grad(in_softmax, x), reference)),
                                    1e-5, 1e-6);
            }
        }
    }
}

TEST_CASE("a layer norm's gradient is one line kernel on the CPU: its plan, odd and strided lines, bf16, NaN and infinity in every lane") {
    // the CPU's plan: one rowwise entry for the input's gradient, where the formula took four
    // and the statistics four more; the reference runs the formula
    {
        auto x = random_tensor<float>(1, -1.0, 1.0, Rows{3}, Cols{40});
        const auto w = random_tensor<float>(2, -1.0, 1.0, Rows{3}, Cols{40});
        auto dx = x;
        ds::backward(ds::sum<Rows>(ds::sum<Cols>(ds::layer_norm(x) * w)), std::tie(x), std::tie(dx));
        const auto& s = ds::backend::cpu::detail::state<float>::of_this_thread();
        const std::string plan = ds::evaluation::explain(s.program, s.plan, "cpu");
        INFO(plan);
        // its cotangent w read where it lies (a seed of 1 times w is w: no pass copies it)
        CHECK(plan.find("rowwise    out (rows=3, cols=40) = layer_norm_gradient<cols>(in0, in1)") != std::string::npos);
        CHECK(plan.find("mean<") == std::string::npos);
        CHECK(plan.find("multiply(1") == std::string::npos);
    }
    // float lines of every length through a vector, its tail and a block of the sums (256),
    // contiguous (cols) and strided (rows), on 1 and 2 threads, against the formula
    for (std::size_t cols : {1, 15, 16, 17, 37, 300}) {
        INFO("cols=" << cols);
        auto x = random_tensor<float>(cols, -2.0, 2.0, Rows{5}, Cols{cols});
        const auto w = random_tensor<float>(cols + 1, -1.0, 1.0, Rows{5}, Cols{cols});
        auto along_cols = ds::sum<Rows>(ds::sum<Cols>(ds::layer_norm(x) * w));
        auto along_rows = ds::sum<Rows>(ds::sum<Cols>(ds::layer_norm<Rows>(x, 1e-3) * w));
        for (int threads : {1, 2}) {
            ds::set_num_threads(threads);
            test::require_close(ds::eval(ds::grad(along_cols, x)), test::to_xt(ds::eval(ds::grad(along_cols, x), reference)), 1e-4, 1e-5);
            test::require_close(ds::eval(ds::grad(along_rows, x)), test::to_xt(ds::eval(ds::grad(along_rows, x), reference)), 1e-4, 1e-5);
        }
        // a bf16 input read where it lies, and its gradient rounded to bf16 by the kernel
        ds::tensor<ds::bf16, Rows, Cols> xb = ds::cast<ds::bf16>(x);
        auto in_bf16 = ds::sum<Rows>(ds::sum<Cols>(ds::cast<float>(ds::layer_norm(xb)) * w));
        test::require_close(ds::eval(ds::grad(in_bf16, xb)), test::to_xt(ds::eval(ds::grad(in_bf16, xb), reference)), 1e-2, 1e-2);
    }
    ds::set_num_threads(2);
    // NaN and infinity in every lane and tail, in the input (its line's gradient all NaN) and in
    // the cotangent (spread through its line's means)
    const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()};
    for (std::size_t cols : {1, 7, 16, 17, 33}) {
        for (std::size_t at = 0; at < cols; ++at) {
            for (const float value : special) {
                INFO("cols=" << cols << " at=" << at << " value=" << value);
                auto x = random_tensor<float>(cols + at, -2.0, 2.0, Rows{2}, Cols{cols});
                auto cotangent = random_tensor<float>(cols + at + 1, -1.0, 1.0, Rows{2}, Cols{cols});
                const auto clean = x;
                x(1, at) = value;
                test::require_close(ds::eval(ds::vjp(ds::layer_norm(x), x, cotangent)),
                                    test::to_xt(ds::eval(ds::vjp(ds::layer_norm(x), x, cotangent), reference)), 1e-5, 1e-6);
                x = clean;
                cotangent(1, at) = value;
                test::require_close(ds::eval(ds::vjp(ds::layer_norm(x), x, cotangent)),
                                    test::to_xt(ds::eval(ds::vjp(ds::layer_norm(x), x, cotangent), reference)), 1e-5, 1e-6);
            }
        }
    }
}

TEST_CASE("grad's errors: a tensor the formula does not read, and one plan for the gradient") {
    auto x = random_tensor<double>(1, -1.0, 1.0, Rows{3}, Cols{4});
    auto other = random_tensor<double>(2, -1.0, 1.0, Rows{3}, Cols{4});
    CHECK(test::error_of([&] { (void)ds::eval(ds::grad(ds::sum<Rows>(ds::sum<Cols>(x * x)), other)); }) ==
          "dimsum: grad: the formula does not read this tensor (rows=3, cols=4): a gradient is with respect to a tensor or "
          "view the formula reads, the same memory seen the same way");
    ds::tensor<std::int64_t, Batch> ids(Batch{2});
    ids(0) = 2;
    ids(1) = 0;
    // a gather read by the formula but not on the path to x: no scatter needed
    const auto through_other = ds::eval(ds::grad(ds::sum<Batch>(ds::sum<Cols>(ds::gather<Rows>(other, ids) * ds::select<Rows>(x, 1))), x));
    CHECK(through_other(0, 0) == 0);
    CHECK(through_other(1, 0) == other(2, 0) + other(0, 0));
    // the gradient of a loss is one fused pass over x
    const std::string plan = ds::backend::cpu::evaluator{}.explain(ds::grad(ds::sum<Rows>(ds::sum<Cols>(ds::exp(x) * other)), x));
    INFO(plan);
    CHECK(plan.find("1 entry") != std::string::npos);
}

namespace {

using KvHeads = ds::axis<"kv_heads">;
using Group = ds::axis<"group">;
using Query = ds::axis<"query">;
using Key = ds::axis<"key">;
using Head = ds::axis<"head">;

// Grouped-query attention's operands: 3 query heads per key/value head, keys and values
// broadcast over the group; `w` weighs the output into a loss.
template <class T>
struct attention_operands {
    ds::tensor<T, Batch, KvHeads, Group, Query, Head> q, w;
    ds::tensor<T, Batch, KvHeads, Group, Key, Head> k, v;
    attention_operands(std::size_t queries, std::size_t keys, std::size_t head, std::uint64_t seed)
        : q(random_tensor<T>(seed, -1.0, 1.0, Batch{2}, KvHeads{2}, Group{3}, Query{queries}, Head{head})),
          w(random_tensor<T>(seed + 1, -1.0, 1.0, Batch{2}, KvHeads{2}, Group{3}, Query{queries}, Head{head})),
          k(random_tensor<T>(seed + 2, -1.0, 1.0, Batch{2}, KvHeads{2}, Group{1}, Key{keys}, Head{head})),
          v(random_tensor<T>(seed + 3, -1.0, 1.0, Batch{2}, KvHeads{2}, Group{1}, Key{keys}, Head{head})) {}
};

template <class F>
auto total5(const F& f) {
    return ds::sum<Batch>(ds::sum<KvHeads>(ds::sum<Group>(ds::sum<Query>(ds::sum<Head>(f)))));
}

// The gradients of `loss` for Q, K and V on the CPU backend, by the fused backward (1 and 2
// threads), against the step-by-step gradients: the CPU backend's without fusion, and in
// double the reference backend's. Each alone (the fused backward computing one of its three
// gradients), then two at a time (one left out). `fused`: whether the plan has the fused backward.
template <class T, class Loss>
void check_attention_gradients(attention_operands<T>& a, const Loss& loss, bool fused, double rtol, double atol) {
    const std::string plan = ds::backend::cpu::evaluator{}.explain(ds::grad(loss, a.k));
    INFO(plan);
    CHECK((plan.find("attention_backward") != std::string::npos) == fused);
    if (fused) CHECK(plan.find("(unread, not computed)") != std::string::npos);
    const ds::backend::cpu::evaluator step_by_step{.fuse_attention = false};
    auto step_by_step_grad = [&](auto& x) { return test::to_xt(ds::eval(ds::grad(loss, x), step_by_step)); };
    const xt::xarray<double> want_q = step_by_step_grad(a.q), want_k = step_by_step_grad(a.k), want_v = step_by_step_grad(a.v);
    auto check = [&](auto& x, const xt::xarray<double>& want) {
        if constexpr (std::is_same_v<T, double>) {
            test::require_close(ds::eval(ds::grad(loss, x), reference), want, 1e-12, 1e-13);
        }
        for (int threads : {1, 2}) {
            INFO("threads=" << threads);
            ds::set_num_threads(threads);
            test::require_close(ds::eval(ds::grad(loss, x)), want, rtol, atol);
        }
    };
    check(a.q, want_q);
    check(a.k, want_k);
    check(a.v, want_v);
    auto dq = a.q, dk = a.k, dv = a.v;  // (their extents; overwritten)
    for (int threads : {1, 2}) {
        INFO("two at a time, threads=" << threads);
        ds::set_num_threads(threads);
        ds::backward(loss, std::tie(a.q, a.k), std::tie(dq, dk));
        test::require_close(dq, want_q, rtol, atol);
        test::require_close(dk, want_k, rtol, atol);
        ds::backward(loss, std::tie(a.k, a.v), std::tie(dk, dv));
        test::require_close(dk, want_k, rtol, atol);
        test::require_close(dv, want_v, rtol, atol);
        ds::backward(loss, std::tie(a.q, a.v), std::tie(dq, dv));
        test::require_close(dq, want_q, rtol, atol);
        test::require_close(dv, want_v, rtol, atol);
    }
}

}  // namespace

TEST_CASE("the fused attention backward is the step-by-step gradient: odd lengths, causal, padded, grouped heads") {
    constexpr float infinity = std::numeric_limits<float>::infinity();
    const std::pair<std::size_t, std::size_t> lengths[] = {{1, 1}, {7, 7}, {33, 33}, {257, 257}, {7, 33}, {33, 7}, {100, 257}};
    for (const auto& [queries, keys] : lengths) {
        for (std::size_t head : {8, 17}) {
            INFO("queries=" << queries << " keys=" << keys << " head=" << head);
            attention_operands<float> a(queries, keys, head, queries * 100 + keys + head);
            // padding: batch item 1 does not see its last key
            ds::tensor<float, Batch, KvHeads, Group, Query, Key> padding(Batch{2}, KvHeads{1}, Group{1}, Query{1}, Key{keys});
            padding.fill(0);
            if (keys > 1) padding(1, 0, 0, 0, keys - 1) = -infinity;
            auto scores = ds::matmul(a.q, ds::transpose(a.k)) / std::sqrt(float(head));
            auto causal = ds::masked_fill(scores, ds::causal_mask(Query{queries}, Key{keys}), -infinity);
            check_attention_gradients(a, total5(ds::matmul(ds::softmax(causal), a.v) * a.w), true, 1e-5, 2e-6);
            check_attention_gradients(a, total5(ds::matmul(ds::softmax(scores * 2.0f + padding), a.v) * a.w), true, 1e-5, 2e-6);
        }
    }
    // in double, against the reference backend too
    for (std::size_t length : {1, 7, 33}) {
        INFO("double, length=" << length);
        attention_operands<double> a(length, length, 8, length);
        auto scores = ds::matmul(a.q, ds::transpose(a.k)) * 0.3;
        auto causal = ds::masked_fill(scores, ds::causal_mask(Query{length}, Key{length}), -std::numeric_limits<double>::infinity());
        check_attention_gradients(a, total5(ds::matmul(ds::softmax(causal), a.v) * a.w), true, 1e-12, 1e-13);
    }
}

namespace {

// A layer's self-attention over x (batch 2, seq, model): projections, heads of `Width` split
// off the rows and merged back, weighed by w into a loss. Q, K, V and the attention's output
// are each a head's columns of a (batch, seq, heads x head) activation.
template <class T, std::size_t ModelWidth, std::size_t HeadCount, std::size_t Width>
struct heads_in_rows {
    using Seq = ds::axis<"seq">;
    using Model = ds::axis<"model", ModelWidth>;
    using Heads = ds::axis<"heads", HeadCount>;
    using HeadWidth = ds::axis<"head", Width>;
    using Joined = ds::axis<"heads*head", HeadCount * Width>;
    ds::tensor<T, Batch, Seq, Model> x;
    ds::tensor<T, Batch, Seq, Joined> w;
    ds::tensor<T, Model, Joined> w_q, w_k, w_v;
    explicit heads_in_rows(std::size_t seq)
        : x(random_tensor<T>(seq, -1.0, 1.0, Batch{2}, Seq{seq}, Model{})),
          w(random_tensor<T>(seq + 1, -1.0, 1.0, Batch{2}, Seq{seq}, Joined{})),
          w_q(random_tensor<T>(3, -0.5, 0.5, Model{}, Joined{})),
          w_k(random_tensor<T>(4, -0.5, 0.5, Model{}, Joined{})),
          w_v(random_tensor<T>(5, -0.5, 0.5, Model{}, Joined{})) {}
    static auto heads_of(auto&& rows) {
        return ds::permute<Batch, Heads, Seq, HeadWidth>(ds::view<Batch, Seq, Heads, HeadWidth>(std::forward<decltype(rows)>(rows)));
    }
    template <bool causal>
    auto loss() const {
        auto q = heads_of(ds::matmul(x, w_q));
        auto k = heads_of(ds::matmul(x, w_k));
        auto v = heads_of(ds::matmul(x, w_v));
        auto z = [&] {
            if constexpr (causal) return ds::nn::causal_attention(q, k, v);
            else return ds::nn::attention(q, k, v);
        }();
        return ds::sum<Batch>(ds::sum<Seq>(ds::sum<Joined>(ds::view<Batch, Seq, Joined>(ds::permute<Batch, Seq, Heads, HeadWidth>(z)) * w)));
    }
};

}  // namespace

TEST_CASE("the fused attention backward writes dQ and dK^T as the heads merged back into rows read them: no copy between") {
    heads_in_rows<float, 24, 3, 8> layer(19);
    auto &w_q = layer.w_q, &w_k = layer.w_k, &w_v = layer.w_v;
    const auto loss = layer.loss<false>();
    for (const std::string& plan : {ds::backend::cpu::evaluator{}.explain(ds::grad(loss, w_q)),
                                   ds::backend::cpu::evaluator{}.explain(ds::grad(loss, w_k))}) {
        INFO(plan);
        CHECK(plan.find("attention_backward") != std::string::npos);
        CHECK(plan.find("copy") == std::string::npos);  // dQ's and dK's heads read where they lie
    }
    const ds::backend::cpu::evaluator step_by_step{.fuse_attention = false};
    for (int threads : {1, 2}) {
        INFO("threads=" << threads);
        ds::set_num_threads(threads);
        test::require_close(ds::eval(ds::grad(loss, w_q)), test::to_xt(ds::eval(ds::grad(loss, w_q), step_by_step)), 1e-5, 1e-5);
        test::require_close(ds::eval(ds::grad(loss, w_k)), test::to_xt(ds::eval(ds::grad(loss, w_k), step_by_step)), 1e-5, 1e-5);
        test::require_close(ds::eval(ds::grad(loss, w_v)), test::to_xt(ds::eval(ds::grad(loss, w_v), step_by_step)), 1e-5, 1e-5);
    }
    ds::set_num_threads(0);
}

TEST_CASE("the tiles the fused attention backward transposes its operands and dQ in: every edge, float, double and bf16") {
    // transpose_copy: dst (cols x rows) = src (rows x cols) transposed, both rows-apart layouts
    // wider than the matrix, in tiles of 16 with partial ones on both edges; what lies between
    // dst's rows is left as it was
    auto check = [](auto source_type, auto result_type, std::size_t rows, std::size_t cols) {
        using U = decltype(source_type);
        using T = decltype(result_type);
        const std::ptrdiff_t ld_src = static_cast<std::ptrdiff_t>(cols) + 3, ld_dst = static_cast<std::ptrdiff_t>(rows) + 5;
        std::vector<U> src(rows * static_cast<std::size_t>(ld_src));
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<U>(static_cast<float>(i % 251) - 125.0f);
        std::vector<T> dst(cols * static_cast<std::size_t>(ld_dst), T(-7));
        ds::backend::cpu::detail::transpose_copy(src.data(), ld_src, rows, cols, dst.data(), ld_dst);
        std::size_t wrong = 0;
        for (std::size_t j = 0; j < cols; ++j) {
            for (std::size_t i = 0; i < static_cast<std::size_t>(ld_dst); ++i) {
                const T want = i < rows ? static_cast<T>(static_cast<float>(src[i * static_cast<std::size_t>(ld_src) + j])) : T(-7);
                wrong += dst[j * static_cast<std::size_t>(ld_dst) + i] != want;
            }
        }
        INFO("rows " << rows << " cols " << cols);
        CHECK(wrong == 0);
    };
    for (std::size_t rows : {1, 7, 16, 17, 33}) {
        for (std::size_t cols : {1, 15, 16, 24, 40}) {
            check(float{}, float{}, rows, cols);
            check(double{}, double{}, rows, cols);
            check(ds::bf16{}, float{}, rows, cols);
        }
    }
}

TEST_CASE("the fused attention backward reads and writes heads that lie in a layer's rows, in whole and partial tiles") {
    // Q, K, V, O and dO each a head's columns of (batch, seq, heads x head) rows, and dQ, dK^T
    // and dV written there: heads of 24 (a whole tile of 16 and a partial one), sequences
    // shorter and longer than a tile, causal; float and double, against the step-by-step
    // gradients and the reference backend
    auto check = [](auto type, std::size_t seq, double rtol, double atol) {
        using T = decltype(type);
        heads_in_rows<T, 20, 3, 24> layer(seq);
        auto &x = layer.x, &w_q = layer.w_q, &w_k = layer.w_k, &w_v = layer.w_v;
        const auto loss = layer.template loss<true>();
        const std::string plan = ds::backend::cpu::evaluator{}.explain(ds::grad(loss, w_q));
        INFO(plan);
        CHECK(plan.find("attention_backward") != std::string::npos);
        const ds::backend::cpu::evaluator step_by_step{.fuse_attention = false};
        for (int threads : {1, 2}) {
            INFO("threads=" << threads);
            ds::set_num_threads(threads);
            auto dw_q = w_q, dw_k = w_k, dw_v = w_v, dx = x;
            ds::backward(loss, std::tie(x, w_q, w_k, w_v), std::tie(dx, dw_q, dw_k, dw_v));
            for (const auto& [got, of] : {std::pair{&dw_q, &w_q}, std::pair{&dw_k, &w_k}, std::pair{&dw_v, &w_v}}) {
                test::require_close(*got, test::to_xt(ds::eval(ds::grad(loss, *of), step_by_step)), rtol, atol);
            }
            test::require_close(dx, test::to_xt(ds::eval(ds::grad(loss, x), step_by_step)), rtol, atol);
            if constexpr (std::is_same_v<T, double>) test::require_close(dw_k, test::to_xt(ds::eval(ds::grad(loss, w_k), reference)), 1e-12, 1e-12);
        }
        ds::set_num_threads(0);
    };
    for (const std::size_t seq : {1, 16, 19, 40}) {
        INFO("seq " << seq);
        check(float{}, seq, 1e-5, 1e-5);
        check(double{}, seq, 1e-12, 1e-12);
    }
}

TEST_CASE("an attention rounded to bf16 for the product that reads it is computed once: its fused backward reads its float value") {
    using Seq = ds::axis<"seq">;
    using Model = ds::axis<"model", 24>;
    using Heads = ds::axis<"heads", 2>;
    using HeadWidth = ds::axis<"head", 32>;  // as wide as the kernel rounds its blocks
    using Joined = ds::axis<"heads*head", 64>;
    const std::size_t seq = 19;
    auto x = random_tensor<float>(1, -1.0, 1.0, Batch{2}, Seq{seq}, Model{});
    auto w = random_tensor<float>(2, -1.0, 1.0, Batch{2}, Seq{seq}, Model{});
    auto w_q = random_tensor<float>(3, -0.5, 0.5, Model{}, Joined{});
    auto w_k = random_tensor<float>(4, -0.5, 0.5, Model{}, Joined{});
    auto w_v = random_tensor<float>(5, -0.5, 0.5, Model{}, Joined{});
    ds::tensor<ds::bf16, Joined, Model> w_o(Joined{}, Model{});
    ds::fill_uniform(w_o, 6, -0.5, 0.5);
    auto heads_of = [](auto&& rows) {
        return ds::permute<Batch, Heads, Seq, HeadWidth>(ds::view<Batch, Seq, Heads, HeadWidth>(std::forward<decltype(rows)>(rows)));
    };
    auto z = ds::view<Batch, Seq, Joined>(ds::permute<Batch, Seq, Heads, HeadWidth>(ds::cast<ds::bf16>(
        ds::nn::attention(heads_of(ds::matmul(x, w_q)), heads_of(ds::matmul(x, w_k)), heads_of(ds::matmul(x, w_v))))));
    // (tanh: the backward reads the product's value, so the forward rounds the attention for it)
    auto loss = ds::sum<Batch>(ds::sum<Seq>(ds::sum<Model>(ds::tanh(ds::cast<float>(ds::matmul(z, w_o))) * w)));
    auto dw_q = w_q, dw_k = w_k, dw_v = w_v;
    ds::backward(loss, std::tie(w_q, w_k, w_v), std::tie(dw_q, dw_k, dw_v));
    const auto& s = ds::backend::cpu::detail::state<float>::of_this_thread();
    const std::string plan = ds::evaluation::explain(s.program, s.plan, "cpu");
    INFO(plan);
    std::size_t attentions = 0;
    for (std::size_t at = plan.find(". attention "); at != std::string::npos; at = plan.find(". attention ", at + 1)) ++attentions;
    CHECK(attentions == 1);
    CHECK(plan.find("attention_backward") != std::string::npos);
    test::require_close(ds::eval(ds::grad(loss, w_q)),
                        test::to_xt(ds::eval(ds::grad(loss, w_q), ds::backend::cpu::evaluator{.fuse_attention = false})), 1e-4, 1e-4);
}

TEST_CASE("a fused attention backward reads the bf16 queries, keys and values its forward read, where they lie") {
    // q, k and v rounded to bf16 as mixed precision rounds a product's operands: the forward
    // attention reads them as bf16, and each projection's float value is dead once rounded.
    // The fused backward reads the same bf16 temporaries, widened as it copies them: neither
    // the projections computed again (which, before, took three more products) nor widened
    // copies of them. Odd sequence lengths, and keys and values shared by two query heads.
    using Seq = ds::axis<"seq">;
    using Model = ds::axis<"model", 24>;
    using KvHeads = ds::axis<"kv_heads", 2>;
    using Group = ds::axis<"group", 2>;
    using OneGroup = ds::axis<"group", 1>;
    using HeadWidth = ds::axis<"head", 24>;
    using Joined = ds::axis<"heads*head", 96>;
    using KvJoined = ds::axis<"kv_heads*head", 48>;
    for (const std::size_t seq : {1, 19, 33}) {
        INFO("seq " << seq);
        auto x = random_tensor<float>(1, -1.0, 1.0, Batch{2}, Seq{seq}, Model{});
        auto w = random_tensor<float>(2, -1.0, 1.0, Batch{2}, KvHeads{}, Group{}, Seq{seq}, HeadWidth{});
        auto w_q = random_tensor<float>(3, -0.5, 0.5, Model{}, Joined{});
        auto w_k = random_tensor<float>(4, -0.5, 0.5, Model{}, KvJoined{});
        auto w_v = random_tensor<float>(5, -0.5, 0.5, Model{}, KvJoined{});
        auto q = ds::permute<Batch, KvHeads, Group, Seq, HeadWidth>(
            ds::view<Batch, Seq, KvHeads, Group, HeadWidth>(ds::cast<ds::bf16>(ds::matmul(x, w_q) + 0.25f)));
        auto shared = [](auto&& rows) {
            return ds::permute<Batch, KvHeads, OneGroup, Seq, HeadWidth>(
                ds::view<Batch, Seq, KvHeads, OneGroup, HeadWidth>(ds::cast<ds::bf16>(std::forward<decltype(rows)>(rows))));
        };
        auto o = ds::cast<float>(ds::nn::attention(q, shared(ds::matmul(x, w_k)), shared(ds::matmul(x, w_v))));
        auto loss = ds::sum<Batch>(ds::sum<KvHeads>(ds::sum<Group>(ds::sum<Seq>(ds::sum<HeadWidth>(o * w)))));
        auto dw_q = w_q;
        auto dw_k = w_k;
        auto dw_v = w_v;
        ds::backward(loss, std::tie(w_q, w_k, w_v), std::tie(dw_q, dw_k, dw_v));
        const auto& s = ds::backend::cpu::detail::state<float>::of_this_thread();
        const std::string plan = ds::evaluation::explain(s.program, s.plan, "cpu");
        INFO(plan);
        std::size_t gemms = 0, widened = 0;
        for (const auto& e : s.plan.entries) gemms += e.kind == ds::evaluation::entry_kind::gemm;
        CHECK(gemms == 6);  // the three projections, and the three weights' gradients
        for (std::size_t at = plan.find("= float(t"); at != std::string::npos; at = plan.find("= float(t", at + 1)) ++widened;
        CHECK(widened == 0);
        for (const char* kernel : {". attention ", ". attention_backward "}) {
            const std::size_t line = plan.find(kernel);
            REQUIRE(line != std::string::npos);
            CHECK(plan.substr(line, plan.find('\n', line) - line).find("[bf16 read where it lies]") != std::string::npos);
        }
        // the gradients the reference backend computes from the same rounded values (the
        // CPU's forward also rounds its probabilities to bf16 for the product with V: the
        // tolerance is bf16's)
        test::require_close(dw_q, test::to_xt(ds::eval(ds::grad(loss, w_q), reference)), 2e-2, 2e-2);
        test::require_close(dw_k, test::to_xt(ds::eval(ds::grad(loss, w_k), reference)), 2e-2, 2e-2);
        test::require_close(dw_v, test::to_xt(ds::eval(ds::grad(loss, w_v), reference)), 2e-2, 2e-2);
    }
}

TEST_CASE("the fused attention backward with NaN and infinity in every lane and tail of a query, and where it does not apply") {
    for (std::size_t head : {16, 17}) {
        for (std::size_t at = 0; at < head; ++at) {
            for (float value : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
                INFO("head=" << head << " at=" << at << " value=" << value);
                attention_operands<float> a(9, 9, head, at);
                a.q(1, 0, 2, 4, at) = value;
                auto scores = ds::matmul(a.q, ds::transpose(a.k)) * 0.25f;
                check_attention_gradients(a, total5(ds::matmul(ds::softmax(scores), a.v) * a.w), true, 1e-5, 2e-6);
            }
        }
    }
    // Score functions whose derivative is not a number where a score has weight (a soft cap),
    // and weights read by something else too: the gradients step by step, as differentiated.
    attention_operands<float> a(7, 11, 8, 5);
    auto scores = ds::matmul(a.q, ds::transpose(a.k)) * 0.25f;
    check_attention_gradients(a, total5(ds::matmul(ds::softmax(ds::tanh(scores) * 3.0f), a.v) * a.w), false, 1e-5, 2e-6);
    auto weights = ds::softmax(scores);
    check_attention_gradients(a, total5(ds::matmul(weights, a.v) * a.w) + ds::sum<Batch>(ds::sum<KvHeads>(ds::sum<Group>(
                                                                           ds::sum<Query>(ds::sum<Key>(weights * weights))))),
                              false, 1e-5, 2e-6);
}
