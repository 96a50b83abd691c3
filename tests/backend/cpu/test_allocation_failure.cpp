// Allocation failure: every allocation an evaluation makes is made to fail in turn, on 1 and
// 2 threads, for a formula of each kernel (a product shared by a team with an epilogue, one
// split by columns, a batch of products, fused attention with a score function and with its
// keys split between threads, softmax, layer_norm, a reduction, a fused pass, a copy). Each
// failure must reach the caller as std::bad_alloc, with no thread left waiting (ctest's
// timeout catches a hang), the destination untouched, and the next evaluation as good as if
// nothing had happened.
#include "../../parity/parity.hpp"  // its axes, and with_one_and_two_threads
#include "counting_new.hpp"

namespace {

using parity::with_one_and_two_threads;

constexpr float sentinel = 1234.5f;

// What became of `evaluate` with the n-th allocation failing, every allocation of it made
// anew (the workspace released first): whether that allocation was reached, and whether
// std::bad_alloc reached the caller.
struct outcome {
    bool reached = false, threw = false;
};
template <class F>
outcome fails_at(long n, F&& evaluate) {
    ds::release_workspace();
    outcome result;
    counting_new::fail_allocation(n);
    try {
        evaluate();
    } catch (const std::bad_alloc&) {
        result.threw = true;
    }
    result.reached = counting_new::fail_countdown.load() == 0;
    counting_new::fail_allocation(0);
    return result;
}

// Evaluates `formula` into `dst` with the 1st, 2nd, ... allocation failing, until one
// evaluation makes fewer allocations than the one that fails; then once more in full. A failure
// must throw and leave `dst` untouched (the caller takes every member's memory before any work
// is handed out: thread_team::run), unless the evaluation goes on without what was asked for
// (a worker of the team that could not be started: the loop runs on those there are), when its
// result must be whole.
template <class Dst, class Formula>
void survives_every_failure(Dst& dst, const Formula& formula) {
    auto want = ds::eval(formula, ds::backend::reference::evaluator{});
    std::size_t failures = 0;
    for (long n = 1;; ++n) {
        INFO("allocation " << n << " fails");
        std::fill(dst.data(), dst.data() + dst.size(), sentinel);
        const outcome o = fails_at(n, [&] { ds::assign(dst, formula); });
        if (!o.reached) break;
        if (o.threw) {
            ++failures;
            CHECK(std::all_of(dst.data(), dst.data() + dst.size(), [](float v) { return v == sentinel; }));  // and go on: a hang must show too
        } else {  // a failure that was not needed (a worker thread not started), or recovered from
            test::require_close(dst, test::to_xt(want), 1e-4, 1e-5);
        }
        REQUIRE(n < 10000);
    }
    INFO(failures << " evaluations failed before one succeeded");
    REQUIRE(failures > 0);  // the formula allocates: this test can fail
    test::require_close(dst, test::to_xt(want), 1e-4, 1e-5);
    std::fill(dst.data(), dst.data() + dst.size(), sentinel);
    ds::assign(dst, formula);  // with the workspace as the failures left it
    test::require_close(dst, test::to_xt(want), 1e-4, 1e-5);
}

}  // namespace

TEST_CASE("products: a failed allocation anywhere reaches the caller, and leaves the destination untouched") {
    with_one_and_two_threads([] {
        // one large product shared by the team (rows, with barriers), with an epilogue
        ds::tensor<float, M, K> a(M{256}, K{256});
        ds::tensor<float, K, N> b(K{256}, N{256});
        ds::tensor<float, N> bias(N{256});
        ds::fill_uniform(a, 1);
        ds::fill_uniform(b, 2);
        ds::fill_uniform(bias, 3);
        ds::tensor<float, M, N> c(M{256}, N{256});
        survives_every_failure(c, ds::tanh(ds::matmul(a, b)) + bias);
        // wider than tall: one block of rows, its tiles groups of columns
        ds::tensor<float, M, K> wide_a(M{64}, K{128});
        ds::tensor<float, K, N> wide_b(K{128}, N{1024});
        ds::fill_uniform(wide_a, 4);
        ds::fill_uniform(wide_b, 5);
        ds::tensor<float, M, N> wide_c(M{64}, N{1024});
        survives_every_failure(wide_c, ds::matmul(wide_a, wide_b) * 2.0f);
        // a batch of small products, whole items per thread
        ds::tensor<float, Batch, M, K> batch_a(Batch{6}, M{33}, K{17});
        ds::tensor<float, K, N> batch_b(K{17}, N{40});
        ds::fill_uniform(batch_a, 6);
        ds::fill_uniform(batch_b, 7);
        ds::tensor<float, Batch, M, N> batch_c(Batch{6}, M{33}, N{40});
        survives_every_failure(batch_c, ds::exp(ds::matmul(batch_a, batch_b) * 0.1f));
    });
}

TEST_CASE("attention, softmax, layer_norm, reductions, fused passes and copies: every allocation may fail") {
    using Query = ds::axis<"query">;
    using Key = ds::axis<"key">;
    using D = ds::axis<"d">;
    with_one_and_two_threads([] {
        // fused causal attention with an additive mask (a score function run per tile)
        ds::tensor<float, Batch, Query, D> q(Batch{3}, Query{200}, D{16});
        ds::tensor<float, Batch, Key, D> k(Batch{3}, Key{200}, D{16}), v(Batch{3}, Key{200}, D{16});
        ds::tensor<float, Query, Key> mask(Query{200}, Key{200});
        ds::fill_normal(q, 8);
        ds::fill_normal(k, 9);
        ds::fill_normal(v, 10);
        ds::fill_uniform(mask, 11);
        auto scores = ds::matmul(q, ds::transpose(k)) * 0.25f + mask;
        ds::tensor<float, Batch, Query, D> o(Batch{3}, Query{200}, D{16});
        survives_every_failure(o, ds::matmul(ds::softmax(ds::masked_fill(scores, ds::causal_mask(Query{200}, Key{200}),
                                                                         -std::numeric_limits<float>::infinity())),
                                             v));
        // one item, few queries, many keys: the keys are split between threads
        ds::tensor<float, Query, D> q1(Query{5}, D{16});
        ds::tensor<float, Key, D> k1(Key{3000}, D{16}), v1(Key{3000}, D{16});
        ds::fill_normal(q1, 12);
        ds::fill_normal(k1, 13);
        ds::fill_normal(v1, 14);
        ds::tensor<float, Query, D> o1(Query{5}, D{16});
        survives_every_failure(o1, ds::matmul(ds::softmax(ds::matmul(q1, ds::transpose(k1)) / 4.0f), v1));
        // line kernels over enough lines to run in parallel, through a strided operand
        ds::tensor<float, M, N> x(M{300}, N{257}), y(M{300}, N{257});
        ds::fill_normal(x, 15);
        ds::fill_normal(y, 16);
        ds::tensor<float, M, N> out(M{300}, N{257});
        survives_every_failure(out, ds::softmax(x * y));
        survives_every_failure(out, ds::layer_norm(x + y) * 2.0f);
        ds::tensor<float, N, M> out_t(N{257}, M{300});
        survives_every_failure(out_t, ds::transpose(ds::exp(x) - y));  // a strided copy of a fused pass
        ds::tensor<float, M> sums(M{300});
        survives_every_failure(sums, ds::sum<N>(ds::exp(x)) + ds::max<N>(y));
    });
}

// After a failed evaluation, a small one: it must work, and ask for no more memory than it
// needs (the failure once made the next evaluation re-reserve the failed one's total).
void small_evaluations_work() {
    ds::tensor<float, M, N> x(M{64}, N{64});
    ds::fill_uniform(x, 17);
    counting_new::largest_request = 0;
    auto doubled = ds::eval(x * 2.0f);
    auto weights = ds::eval(ds::softmax(x + 1.0f));  // a 16 KiB temporary
    REQUIRE(counting_new::largest_request.load() < (std::size_t(1) << 20));
    REQUIRE(doubled(3, 5) == 2.0f * x(3, 5));
    test::require_close(weights, test::to_xt(ds::eval(ds::softmax(x + 1.0f), ds::backend::reference::evaluator{})));
}

TEST_CASE("a failed evaluation leaves the thread as usable as before, and holding no more") {
    // temporaries of 1 MiB each, in several blocks, then a failure at every later allocation
    ds::tensor<float, M, N> x(M{512}, N{512});
    ds::fill_uniform(x, 18);
    ds::tensor<float, M> sums(M{512});
    auto formula = ds::sum<N>(ds::softmax(ds::softmax(x + 1.0f) * 2.0f));
    for (long n = 1;; ++n) {
        INFO("allocation " << n << " fails");
        if (!fails_at(n, [&] { ds::assign(sums, formula); }).reached) break;
        small_evaluations_work();
        REQUIRE(n < 10000);
    }
    // softmax's operand, (2^20, 2^20) floats, must exist in memory: 4 TiB, more than any
    // machine here has, so the allocation itself fails
    ds::tensor<float, M, ds::dim<1>> column(M{std::size_t(1) << 20});
    ds::tensor<float, N> row(N{std::size_t(1) << 20});
    ds::tensor<float, M> huge_sums(M{std::size_t(1) << 20});
    REQUIRE_THROWS_AS(ds::assign(huge_sums, ds::sum<N>(ds::softmax(column + row))), std::bad_alloc);
    small_evaluations_work();
}
