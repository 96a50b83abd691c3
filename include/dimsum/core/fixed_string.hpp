#pragma once
// A string usable as a template argument, so that axis names live in types.

#include <cstddef>
#include <string_view>

namespace dimsum {

template <std::size_t N>
struct fixed_string {
    char data[N]{};  // NUL-terminated; N counts the terminator

    constexpr fixed_string() = default;
    constexpr fixed_string(const char (&text)[N]) {
        for (std::size_t i = 0; i < N; ++i) data[i] = text[i];
    }

    constexpr std::string_view view() const { return {data, N - 1}; }
    constexpr bool empty() const { return N == 1; }
};

template <std::size_t N, std::size_t M>
constexpr bool operator==(const fixed_string<N>& a, const fixed_string<M>& b) {
    return a.view() == b.view();
}

}  // namespace dimsum
