// NaN and infinities in every lane position and every tail length: each elementwise
// function, reduction, softmax, layer_norm and the fused attention of the CPU backend against
// the reference backend. Built for every instruction set this machine can run (see
// tests/CMakeLists.txt): the SIMD code differs between them, and so did its NaN handling.
#include "parity.hpp"

#include <cmath>

using namespace parity;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float not_a_number = std::numeric_limits<float>::quiet_NaN();
constexpr float specials[] = {not_a_number, inf, -inf};

// Lines of 1 to 35 values: up to two AVX-512 vectors of float and every tail after them.
constexpr std::size_t longest = 35;

}  // namespace

TEST_CASE("elementwise functions: NaN and infinities in every lane and tail") {
    for (float special : specials) {
        for (std::size_t n = 1; n <= longest; ++n) {
            for (std::size_t p = 0; p < n; ++p) {
                INFO("special=" << special << " n=" << n << " position=" << p);
                ds::tensor<float, M, N> x(M{2}, N{n}), y(M{2}, N{n});
                ds::fill_uniform(x, n, -2.0, 2.0);
                ds::fill_uniform(y, n + 1, -2.0, 2.0);
                x(1, p) = special;
                y(0, n - 1 - p) = special;  // the other operand too, at the mirrored lane
                require_parity(ds::exp(x), tolerance<float>, 0);
                require_parity(ds::log(x), tolerance<float>, 0);
                require_parity(ds::sqrt(x), tolerance<float>, 0);
                require_parity(ds::tanh(x), tolerance<float>, 1e-7);
                require_parity(ds::abs(x) - x, 0, 0);
                require_parity(ds::erf(x), tolerance<float>, 1e-7);
                require_parity(ds::sigmoid(x), tolerance<float>, 1e-7);
                require_parity(ds::silu(x), tolerance<float>, 1e-7);
                require_parity(ds::gelu(x), tolerance<float>, 1e-7);
                require_parity(ds::sin(x) + ds::cos(x), tolerance<float>, 1e-7);
                require_parity(ds::rsqrt(x), tolerance<float>, 0);
                require_parity(ds::pow(x, y), 0, 0);  // lane by lane with std::pow: the same bits
                require_parity(ds::pow(x, 0.0f) + ds::pow(1.0f, x), 0, 0);  // 1 even for NaN
                require_parity(x + y, 0, 0);
                require_parity(x * y - y / x, tolerance<float>, 1e-7);
                require_parity(ds::max(x, y), 0, 0);
                require_parity(ds::max(y, x), 0, 0);
                require_parity(ds::min(x, y), 0, 0);
                require_parity(ds::min(y, x), 0, 0);
                require_parity(ds::max(x, 0.5f) + ds::min(0.5f, x), 0, 0);
                // comparisons and mask logic: 1 or 0 in every lane, NaN compares false but for !=
                require_parity(ds::where(x < y, 1.0f, 0.0f) + ds::where(x <= y, 2.0f, 0.0f) +
                                   ds::where(x > y, 4.0f, 0.0f) + ds::where(x >= y, 8.0f, 0.0f) +
                                   ds::where(x == x, 16.0f, 0.0f) + ds::where(x != y, 32.0f, 0.0f),
                               0, 0);
                require_parity(ds::where((x > 0.0f && y > 0.0f) || !(x == y), x, y), 0, 0);
            }
        }
    }
}

TEST_CASE("reductions, softmax and layer_norm: NaN and infinities in every lane and tail") {
    for (float special : specials) {
        for (std::size_t n = 1; n <= longest; ++n) {
            for (std::size_t p = 0; p < n; ++p) {
                INFO("special=" << special << " n=" << n << " position=" << p);
                ds::tensor<float, M, N> x(M{3}, N{n});
                ds::fill_uniform(x, n, -2.0, 2.0);
                x(1, p) = special;
                require_parity(ds::max<N>(x), 0, 0);
                require_parity(ds::max<M>(x), 0, 0);
                require_parity(ds::sum<N>(x), 1e-5, 1e-6);
                require_parity(ds::mean<N>(x), 1e-5, 1e-6);
                require_parity(ds::softmax(x), 1e-5, 1e-7);
                require_parity(ds::layer_norm(x), 1e-4, 1e-5);
                // a line that is -inf but for the special value
                for (std::size_t j = 0; j < n; ++j) x(2, j) = j == p ? special : -inf;
                require_parity(ds::softmax(x), 1e-5, 1e-7);
                require_parity(ds::max<N>(x), 0, 0);
            }
        }
    }
}

TEST_CASE("max along an axis and softmax: the value of the worked cases") {
    ds::tensor<float, M, N> x(M{1}, N{3});
    x(0, 0) = not_a_number;
    x(0, 1) = -inf;
    x(0, 2) = -inf;
    auto top = ds::eval(ds::max<N>(x));
    REQUIRE(std::isnan(top(0)));
    auto weights = ds::eval(ds::softmax(x));
    for (std::size_t j = 0; j < 3; ++j) REQUIRE(std::isnan(weights(0, j)));
    ds::tensor<float, N> one(N{1}), nan_one(N{1});
    one(0) = 1.0f;
    nan_one(0) = not_a_number;
    REQUIRE(std::isnan(ds::eval(ds::max(one, nan_one))(0)));
    REQUIRE(std::isnan(ds::eval(ds::min(one, nan_one))(0)));
}

TEST_CASE("fused attention: NaN in a query, a key, a value or the mask reaches exactly the outputs that read it") {
    using Query = ds::axis<"query">;
    using Key = ds::axis<"key">;
    using D = ds::axis<"d">;
    constexpr std::size_t queries = 5, d = 8;
    // every key position up to two vectors and a tail, and the sizes that once hid the fault
    std::vector<std::size_t> key_counts;
    for (std::size_t n = 1; n <= longest; ++n) key_counts.push_back(n);
    for (std::size_t n : {140, 150, 257}) key_counts.push_back(n);
    for (std::size_t keys : key_counts) {
        ds::tensor<float, Query, D> q(Query{queries}, D{d});
        ds::tensor<float, Key, D> k(Key{keys}, D{d});
        ds::tensor<float, Key, D> v(Key{keys}, D{d});
        ds::tensor<float, Query, Key> mask(Query{queries}, Key{keys});
        ds::fill_normal(q, keys);
        ds::fill_normal(k, keys + 1);
        ds::fill_normal(v, keys + 2);
        auto attention = [&] { return ds::matmul(ds::softmax(ds::matmul(q, ds::transpose(k)) * 0.35f + mask), v); };
        for (std::size_t at = 0; at < keys; at += keys > longest ? 7 : 1) {
            INFO("keys=" << keys << " at=" << at);
            std::size_t query = at % queries, column = at % d;
            float kept = q(query, column);
            q(query, column) = not_a_number;
            require_parity(attention(), 1e-4, 1e-6);
            q(query, column) = kept;
            kept = k(at, column);
            k(at, column) = not_a_number;
            require_parity(attention(), 1e-4, 1e-6);
            k(at, column) = kept;
            kept = v(at, column);
            v(at, column) = not_a_number;
            require_parity(attention(), 1e-4, 1e-6);
            v(at, column) = kept;
            mask(query, at) = not_a_number;
            require_parity(attention(), 1e-4, 1e-6);
            mask(query, at) = -inf;
            require_parity(attention(), 1e-4, 1e-6);
            mask(query, at) = 0;
        }
    }
}
