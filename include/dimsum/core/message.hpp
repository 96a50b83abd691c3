#pragma once
// One formatter for shape messages, usable at compile time (static diagnostics) and at
// run time (shape_error), so that both kinds of error read the same.

#include <cstddef>
#include <string>
#include <string_view>

namespace dimsum {

// Fixed capacity, because it must be a literal type; text beyond it is cut, never overrun.
struct message {
    static constexpr std::size_t capacity = 400;
    char text[capacity]{};
    std::size_t length = 0;

    constexpr message& operator<<(std::string_view s) {
        for (char c : s) {
            if (length + 1 < capacity) text[length++] = c;
        }
        return *this;
    }
    constexpr message& operator<<(const char* s) { return *this << std::string_view(s); }
    constexpr message& operator<<(char c) { return *this << std::string_view(&c, 1); }
    constexpr message& operator<<(std::size_t value) {
        char digits[24]{};
        std::size_t n = 0;
        do {
            digits[n++] = static_cast<char>('0' + value % 10);
            value /= 10;
        } while (value != 0);
        while (n != 0) *this << digits[--n];
        return *this;
    }

    constexpr std::string_view view() const { return {text, length}; }
    std::string str() const { return std::string(view()); }
};

}  // namespace dimsum
