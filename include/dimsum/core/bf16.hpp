#pragma once
// bfloat16: the upper 16 bits of an IEEE float (sign, 8 exponent bits, 7 mantissa bits), a
// storage type. Arithmetic on it is float arithmetic: formulas over bf16 tensors compute in
// float and round once, when a value is stored into bf16 memory or cast to bf16.
//
// Conversions are explicit and follow the usual rules: float and double round to the nearest
// bf16, ties to even; infinities stay infinite; NaN stays NaN (quiet, with its sign and the
// top of its payload); a value past the largest finite bf16 (by half an ulp or more) becomes
// infinity. bf16 to float or double is exact.

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>

namespace dimsum {

namespace detail {

// float -> bf16 bits, to nearest, ties to even: add 0x7fff, plus 1 when the kept part is odd,
// then truncate. NaN is kept quiet (the carry could otherwise turn it into infinity).
constexpr std::uint16_t bf16_bits_of(float f) {
    const auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// double -> bf16 bits, rounded once: the double is first rounded to float *to odd* (truncated,
// its last bit set when anything was cut), which keeps enough to round correctly again to the
// 8 bits of bf16; rounding to float to nearest first would round some values twice.
// constexpr, with no library call, so that device code shares it (backend/cuda/).
constexpr std::uint16_t bf16_bits_of(double d) {
    if (d != d) return bf16_bits_of(static_cast<float>(d));  // NaN
    float f = static_cast<float>(d);
    const auto u = std::bit_cast<std::uint32_t>(f);
    const bool finite = (u & 0x7f800000u) != 0x7f800000u;
    if (finite && static_cast<double>(f) != d) {
        const double magnitude = d < 0 ? -d : d, rounded = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
        const std::uint32_t toward_zero = rounded > magnitude ? u - 1 : u;  // rounded away from zero: step back
        f = std::bit_cast<float>(toward_zero | 1u);
    }
    return bf16_bits_of(f);
}

}  // namespace detail

struct bf16 {
    std::uint16_t bits = 0;

    constexpr bf16() = default;
    constexpr explicit bf16(float f) : bits(detail::bf16_bits_of(f)) {}
    constexpr explicit bf16(double d) : bits(detail::bf16_bits_of(d)) {}
    constexpr explicit bf16(int i) : bf16(static_cast<float>(i)) {}  // small integers (0, 1) exactly

    static constexpr bf16 from_bits(std::uint16_t b) {
        bf16 x;
        x.bits = b;
        return x;
    }

    constexpr explicit operator float() const { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
    constexpr explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
};

// Arithmetic rounds float arithmetic's result: what one step of a formula over bf16 would give
// if stored at once (formulas themselves round only when they store).
constexpr float widen(bf16 x) { return static_cast<float>(x); }
constexpr bf16 operator+(bf16 a, bf16 b) { return bf16(widen(a) + widen(b)); }
constexpr bf16 operator-(bf16 a, bf16 b) { return bf16(widen(a) - widen(b)); }
constexpr bf16 operator*(bf16 a, bf16 b) { return bf16(widen(a) * widen(b)); }
constexpr bf16 operator/(bf16 a, bf16 b) { return bf16(widen(a) / widen(b)); }
constexpr bf16 operator-(bf16 a) { return bf16::from_bits(static_cast<std::uint16_t>(a.bits ^ 0x8000u)); }
constexpr bool operator==(bf16 a, bf16 b) { return widen(a) == widen(b); }  // NaN unequal, -0 == 0
constexpr bool operator<(bf16 a, bf16 b) { return widen(a) < widen(b); }
constexpr bool operator<=(bf16 a, bf16 b) { return widen(a) <= widen(b); }
constexpr bool operator>(bf16 a, bf16 b) { return widen(a) > widen(b); }
constexpr bool operator>=(bf16 a, bf16 b) { return widen(a) >= widen(b); }

// The functions of dimsum's formulas on one value, found by argument-dependent lookup.
inline bf16 exp(bf16 a) { return bf16(std::exp(widen(a))); }
inline bf16 log(bf16 a) { return bf16(std::log(widen(a))); }
inline bf16 sqrt(bf16 a) { return bf16(std::sqrt(widen(a))); }
inline bf16 tanh(bf16 a) { return bf16(std::tanh(widen(a))); }
inline bf16 abs(bf16 a) { return bf16::from_bits(static_cast<std::uint16_t>(a.bits & 0x7fffu)); }
inline bf16 erf(bf16 a) { return bf16(std::erf(widen(a))); }
inline bf16 sin(bf16 a) { return bf16(std::sin(widen(a))); }
inline bf16 cos(bf16 a) { return bf16(std::cos(widen(a))); }
inline bf16 pow(bf16 a, bf16 b) { return bf16(std::pow(widen(a), widen(b))); }
constexpr bool isnan(bf16 a) { return (a.bits & 0x7fffu) > 0x7f80u; }

// Printed as the float it is.
inline std::ostream& operator<<(std::ostream& out, bf16 x) { return out << widen(x); }

}  // namespace dimsum

template <>
class std::numeric_limits<dimsum::bf16> {
    using bf16 = dimsum::bf16;

public:
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = true;
    static constexpr bool has_quiet_NaN = true;
    static constexpr bool has_signaling_NaN = true;
    static constexpr bool is_iec559 = false;  // no IEEE interchange format of this width
    static constexpr bool is_bounded = true;
    static constexpr int radix = 2;
    static constexpr int digits = 8;  // with the implicit bit
    static constexpr int digits10 = 2;
    static constexpr int max_digits10 = 4;
    static constexpr int min_exponent = -125;
    static constexpr int max_exponent = 128;
    static constexpr float_round_style round_style = round_to_nearest;

    static constexpr bf16 min() noexcept { return bf16::from_bits(0x0080); }     // 2^-126
    static constexpr bf16 max() noexcept { return bf16::from_bits(0x7f7f); }     // (2 - 2^-7) 2^127
    static constexpr bf16 lowest() noexcept { return bf16::from_bits(0xff7f); }
    static constexpr bf16 epsilon() noexcept { return bf16::from_bits(0x3c00); } // 2^-7
    static constexpr bf16 round_error() noexcept { return bf16::from_bits(0x3f00); }  // 0.5
    static constexpr bf16 infinity() noexcept { return bf16::from_bits(0x7f80); }
    static constexpr bf16 quiet_NaN() noexcept { return bf16::from_bits(0x7fc0); }
    static constexpr bf16 signaling_NaN() noexcept { return bf16::from_bits(0x7fa0); }
    static constexpr bf16 denorm_min() noexcept { return bf16::from_bits(0x0001); }  // 2^-133
};
