// Test helpers: independent copies of dimsum tensors into xtensor, and comparisons.
#pragma once

#include <dimsum/dimsum.hpp>

#include <catch2/catch.hpp>
#include <xtensor/xarray.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace test {

namespace ds = dimsum;

#ifdef DIMSUM_TEST_DATA
// The path of a file of test data (tests/reference/), its parts appended in order:
// data_path("gradients/", name, ".npy"). (Appended, not a chain of +, which g++ 12 at -O1
// misreads as a write out of a short string's bounds, -Warray-bounds.)
template <class... Parts>
std::string data_path(const Parts&... parts) {
    std::string path(DIMSUM_TEST_DATA);
    path += '/';
    (path.append(parts), ...);
    return path;
}
#endif

// That got and want hold the same bits, element by element (NaN payloads too).
template <class V>
void require_same_bits(const V& got, const V& want) {
    REQUIRE(got.size() == want.size());
    std::size_t differ = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(got.data() + i, want.data() + i, sizeof(*got.data())) != 0 && differ++ == 0) first = i;
    }
    INFO(differ << " elements differ, the first at " << first);
    REQUIRE(differ == 0);
}

// The sizes every shape test walks through: 1, small odd sizes, and one past a power of two.
inline constexpr std::size_t odd_sizes[] = {1, 3, 7, 17, 65};

template <class T, class... A>
ds::tensor_view<const T, A...> as_view(const ds::tensor<T, A...>& t) { return t.view(); }
template <class T, class... A>
ds::tensor_view<const T, A...> as_view(const ds::tensor_view<T, A...>& v) { return v; }

// An xtensor copy, read element by element through the view's own pointer and strides: it
// shares no code with dimsum's evaluation.
template <class V>
xt::xarray<double> to_xt(const V& source) {
    auto v = as_view(source);
    constexpr std::size_t rank = decltype(v)::rank;
    std::vector<std::size_t> shape(rank);
    for (std::size_t i = 0; i < rank; ++i) shape[i] = v.extent(i);
    xt::xarray<double> out(shape);
    std::array<std::size_t, rank> index{};
    for (std::size_t k = 0; k < out.size(); ++k) {
        out.data()[k] = static_cast<double>(v.data()[v.offset(index)]);
        for (std::size_t i = rank; i-- > 0;) {
            if (++index[i] < v.extent(i)) break;
            index[i] = 0;
        }
    }
    return out;
}

// Compares every element: |got - want| <= atol + rtol |want|, NaN matching NaN and
// infinities matching exactly. On failure, says where.
template <class V>
void require_close(const V& got_source, const xt::xarray<double>& want, double rtol = 1e-5, double atol = 1e-6) {
    xt::xarray<double> got = to_xt(got_source);
    REQUIRE(std::vector<std::size_t>(got.shape().begin(), got.shape().end()) ==
            std::vector<std::size_t>(want.shape().begin(), want.shape().end()));
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
        double g = got.data()[k], w = want.data()[k];
        bool ok = (std::isnan(g) && std::isnan(w)) || (std::isinf(w) && g == w) ||
                  std::abs(g - w) <= atol + rtol * std::abs(w);
        if (!ok && bad++ == 0) first_bad = k;
    }
    if (bad != 0) {
        INFO(bad << " of " << got.size() << " elements differ; first at flat index " << first_bad << ": got "
                  << got.data()[first_bad] << ", want " << want.data()[first_bad]);
        REQUIRE(bad == 0);
    }
}

// The message of the shape_error (or other exception) that f throws, or "" if none. A
// shape_error's " (at FILE:LINE)" is left out when it names the calling test's own file (the
// line the operation was built on); a site inside dimsum's headers would stay, and fail.
template <class F>
std::string error_of(F&& f, const char* file = __builtin_FILE()) {
    try {
        f();
    } catch (const ds::shape_error& e) {
        std::string what = e.what();
        if (e.site() && std::string_view(e.site()->file_name()) == file) {
            const std::string site = " (at " + std::string(file) + ":" + std::to_string(e.site()->line()) + ")";
            if (what.ends_with(site)) what.resize(what.size() - site.size());
        }
        return what;
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

// A fresh directory for the files a test writes, removed with everything in it afterwards.
struct temp_dir {
    std::filesystem::path dir;
    temp_dir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "dimsum_test_XXXXXX").string();
        REQUIRE(mkdtemp(pattern.data()) != nullptr);
        dir = pattern;
    }
    ~temp_dir() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    std::string path(const std::string& name) const { return (dir / name).string(); }
    std::string write(const std::string& name, const std::string& bytes) const {
        std::ofstream out(path(name), std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        REQUIRE(out.good());
        return path(name);
    }
};

// The products of two bf16 operands the CPU backend has run, on every path.
inline std::size_t bf16_products_run() {
    std::size_t n = 0;
    for (const auto path : ds::backend::cpu::bf16_paths) n += ds::backend::cpu::bf16_products(path);
    return n;
}

}  // namespace test
