// Tensors and views: storage, element access, views over user memory, filling, printing.
#include "support.hpp"

#include <cstdint>

namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;
using Three = ds::axis<"three", 3>;

TEST_CASE("an owning tensor is row-major, 64-byte aligned and zero-filled") {
    for (std::size_t rows : test::odd_sizes) {
        ds::tensor<float, Rows, Cols> t(Rows{rows}, Cols{5});
        REQUIRE(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
        REQUIRE(t.size() == rows * 5);
        REQUIRE(t.strides() == std::array<std::ptrdiff_t, 2>{5, 1});
        for (std::size_t i = 0; i < t.size(); ++i) REQUIRE(t.data()[i] == 0.0f);
        t(rows - 1, 4) = 2.5f;
        REQUIRE(t.data()[rows * 5 - 1] == 2.5f);
    }
    ds::tensor<double, Three, Three> d;
    REQUIRE(d.size() == 9);
}

TEST_CASE("a tensor is sized by its run-time axes, or by all its axes") {
    ds::tensor<float, Rows, Three, Cols> a(Rows{2}, Cols{5});
    ds::tensor<float, Rows, Three, Cols> b(Rows{2}, Three{}, Cols{5});
    REQUIRE(a.shape() == b.shape());
    REQUIRE(a.shape().extents() == std::array<std::size_t, 3>{2, 3, 5});
    REQUIRE_THROWS_AS(Three{4}, ds::shape_error);
}

TEST_CASE("element access is bounds-checked") {
    ds::tensor<float, Rows, Three> t(Rows{2});
    REQUIRE(test::error_of([&] { t(2, 0); }) == "dimsum: index 2 out of range for axis rows=2");
    REQUIRE(test::error_of([&] { t(0, -1); }) == "dimsum: index -1 out of range for axis three=3");
    REQUIRE_THROWS_AS(t(0, 3), std::out_of_range);
}

TEST_CASE("a tensor can be given every value, counted at compile time") {
    ds::tensor<float, ds::axis<"two", 2>, Three> t({1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
    REQUIRE(t(1, 0) == 4.0f);
    REQUIRE(t(0, 2) == 3.0f);
}

TEST_CASE("copies are deep, moves are not") {
    ds::tensor<float, Rows, Three> a(Rows{4});
    ds::fill_uniform(a, 7);
    auto b = a;
    REQUIRE(b.data() != a.data());
    REQUIRE(std::equal(a.data(), a.data() + a.size(), b.data()));
    const float* memory = a.data();
    auto c = std::move(a);
    REQUIRE(c.data() == memory);
}

TEST_CASE("a view over the user's memory with its own strides") {
    std::vector<double> memory(4 * 6);
    for (std::size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<double>(i);
    // Every other column of a 4 x 6 row-major matrix: (rows=4, cols=3), strides (6, 2).
    ds::tensor_view<double, Rows, Cols> v(std::span<double>(memory), ds::shape<Rows, Cols>(Rows{4}, Cols{3}), {6, 2});
    REQUIRE(v(1, 2) == 10.0);
    REQUIRE(!v.is_contiguous());
    v(3, 1) = -1.0;
    REQUIRE(memory[3 * 6 + 2] == -1.0);

    // A view that would reach past the memory it is given is refused.
    REQUIRE(test::error_of([&] {
                ds::tensor_view<double, Rows, Cols>(std::span<double>(memory), ds::shape<Rows, Cols>(Rows{4}, Cols{4}),
                                                    {6, 2});
            }) == "dimsum: tensor_view: (rows=4, cols=4) with these strides reaches outside the 24 elements given");
    REQUIRE_THROWS_AS((ds::tensor_view<double, Rows, Cols>(std::span<double>(memory).first(10),
                                                             ds::shape<Rows, Cols>(Rows{2}, Cols{6}))),
                      ds::shape_error);
}

TEST_CASE("a view whose reach overflows is refused, not wrapped around") {
    std::vector<float> memory(16);
    // 9 rows 2^61 elements apart: (9 - 1) * 2^61 wraps to 0 in 64 bits
    REQUIRE(test::error_of([&] {
                ds::tensor_view<float, Rows, Cols>(std::span<float>(memory), ds::shape<Rows, Cols>(Rows{9}, Cols{1}),
                                                   {std::ptrdiff_t(1) << 61, 1});
            }) == "dimsum: tensor_view: (rows=9, cols=1) with these strides reaches beyond the address space "
                  "(the offset overflows)");
    REQUIRE_THROWS_AS((ds::tensor_view<float, Rows, Cols>(std::span<float>(memory), ds::shape<Rows, Cols>(Rows{3}, Cols{2}),
                                                          {PTRDIFF_MAX, -PTRDIFF_MAX})),
                      ds::shape_error);
    REQUIRE_THROWS_AS((ds::tensor_view<float, Rows, Cols>(std::span<float>(memory), ds::shape<Rows, Cols>(Rows{2}, Cols{2}),
                                                          {PTRDIFF_MAX / 2 + 1, 1})),
                      ds::shape_error);
}

TEST_CASE("a tensor larger than any address space is a shape_error, before any allocation") {
    REQUIRE_THROWS_MATCHES((ds::tensor<float, Rows>(Rows{std::size_t(1) << 61})), ds::shape_error,
                           Catch::Matchers::Predicate<ds::shape_error>([](const ds::shape_error& e) {
                               return std::string(e.what()).find("size overflows") != std::string::npos;
                           }));
    REQUIRE_THROWS_AS((ds::tensor<double, Rows, Cols>(Rows{std::size_t(1) << 32}, Cols{std::size_t(1) << 32})),
                      ds::shape_error);
}

TEST_CASE("seeded random values are reproducible and in range") {
    ds::tensor<double, Rows, Cols> a(Rows{17}, Cols{65}), b(Rows{17}, Cols{65});
    ds::fill_uniform(a, 42, -2.0, 3.0);
    ds::fill_uniform(b, 42, -2.0, 3.0);
    REQUIRE(std::equal(a.data(), a.data() + a.size(), b.data()));
    REQUIRE(*std::min_element(a.data(), a.data() + a.size()) >= -2.0);
    REQUIRE(*std::max_element(a.data(), a.data() + a.size()) < 3.0);
    ds::fill_uniform(b, 43, -2.0, 3.0);
    REQUIRE(!std::equal(a.data(), a.data() + a.size(), b.data()));
    // The first draws of seed 1 are fixed: tests/reference/generate.py makes the same ones.
    REQUIRE(ds::detail::splitmix64(1, 0) == 0x910a2dec89025cc1ull);

    ds::tensor<double, ds::axis<"n", 20000>> n;
    ds::fill_normal(n, 5, 1.0, 2.0);
    double mean = std::accumulate(n.data(), n.data() + n.size(), 0.0) / n.size();
    double var = 0;
    for (std::size_t i = 0; i < n.size(); ++i) var += (n.data()[i] - mean) * (n.data()[i] - mean);
    var /= n.size();
    REQUIRE(mean == Approx(1.0).margin(0.05));
    REQUIRE(std::sqrt(var) == Approx(2.0).margin(0.05));
}

TEST_CASE("tensors print their axes and values") {
    ds::tensor<float, ds::axis<"two", 2>, Three> t({1.0, 2.0, 3.0, 4.0, 5.0, 6.5});
    std::ostringstream os;
    os << t;
    REQUIRE(os.str() ==
            "(two=2, three=3)\n"
            "[[  1.0000,   2.0000,   3.0000],\n"
            " [  4.0000,   5.0000,   6.5000]]");

    ds::tensor<float, Rows> big(Rows{2000});
    std::ostringstream summary;
    summary << big;
    REQUIRE(summary.str() == "(rows=2000)\n[  0.0000,   0.0000,   0.0000, ...,   0.0000,   0.0000,   0.0000]");
}
