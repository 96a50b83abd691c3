#pragma once
// Size arithmetic that reports overflow as a shape_error instead of wrapping.

#include <cstddef>
#include <string_view>

#include "dimsum/core/shape_error.hpp"

namespace dimsum::detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_overflow(std::size_t a, std::size_t b, std::string_view op,
                                                                   char operation = '*') {
    message m;
    m << "dimsum: " << op << ": size overflows: " << a << ' ' << operation << ' ' << b;
    throw shape_error(m);
}

inline std::size_t checked_multiply(std::size_t a, std::size_t b, std::string_view op) {
    std::size_t product = 0;
    if (__builtin_mul_overflow(a, b, &product)) throw_overflow(a, b, op);
    return product;
}

inline std::size_t checked_add(std::size_t a, std::size_t b, std::string_view op) {
    std::size_t sum = 0;
    if (__builtin_add_overflow(a, b, &sum)) throw_overflow(a, b, op, '+');
    return sum;
}

}  // namespace dimsum::detail
