#pragma once
// The elementwise functions, one small type each, and their op codes. A functor is generic
// in its argument type, so that a backend can call it on scalars or on SIMD batches alike;
// `name` is what error messages call the operation; `code` is what a lowered program carries
// (evaluation/), so that every backend, a GPU's included, knows what a step computes without
// the formula's type.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string_view>
#include <type_traits>

#include "dimsum/core/bf16.hpp"
#include "dimsum/core/op_code.hpp"

namespace dimsum::fn {


struct add { static constexpr std::string_view name = "add"; static constexpr op_code code = op_code::add; constexpr auto operator()(auto a, auto b) const { return a + b; } };
struct subtract { static constexpr std::string_view name = "subtract"; static constexpr op_code code = op_code::subtract; constexpr auto operator()(auto a, auto b) const { return a - b; } };
struct multiply { static constexpr std::string_view name = "multiply"; static constexpr op_code code = op_code::multiply; constexpr auto operator()(auto a, auto b) const { return a * b; } };
struct divide { static constexpr std::string_view name = "divide"; static constexpr op_code code = op_code::divide; constexpr auto operator()(auto a, auto b) const { return a / b; } };
struct negate { static constexpr std::string_view name = "negate"; static constexpr op_code code = op_code::negate; constexpr auto operator()(auto a) const { return -a; } };

struct exp { static constexpr std::string_view name = "exp"; static constexpr op_code code = op_code::exp; auto operator()(auto a) const { using std::exp; return exp(a); } };
struct log { static constexpr std::string_view name = "log"; static constexpr op_code code = op_code::log; auto operator()(auto a) const { using std::log; return log(a); } };
struct sqrt { static constexpr std::string_view name = "sqrt"; static constexpr op_code code = op_code::sqrt; auto operator()(auto a) const { using std::sqrt; return sqrt(a); } };
struct tanh { static constexpr std::string_view name = "tanh"; static constexpr op_code code = op_code::tanh; auto operator()(auto a) const { using std::tanh; return tanh(a); } };
struct abs { static constexpr std::string_view name = "abs"; static constexpr op_code code = op_code::abs; auto operator()(auto a) const { using std::abs; return abs(a); } };
struct erf { static constexpr std::string_view name = "erf"; static constexpr op_code code = op_code::erf; auto operator()(auto a) const { using std::erf; return erf(a); } };
struct sin { static constexpr std::string_view name = "sin"; static constexpr op_code code = op_code::sin; auto operator()(auto a) const { using std::sin; return sin(a); } };
struct cos { static constexpr std::string_view name = "cos"; static constexpr op_code code = op_code::cos; auto operator()(auto a) const { using std::cos; return cos(a); } };

// 1 / sqrt(a), rounded as that division (not an approximate reciprocal square root).
struct rsqrt {
    static constexpr std::string_view name = "rsqrt";
    static constexpr op_code code = op_code::rsqrt;
    auto operator()(auto a) const {
        using std::sqrt;
        return decltype(a)(1) / sqrt(a);
    }
};

// The nearest bf16 to a (ties to even), as a value of a's own type: what cast<bf16> does to a
// float or double inside a formula, which goes on computing in float.
struct round_bf16 {
    static constexpr std::string_view name = "cast";
    static constexpr op_code code = op_code::round_bf16;
    template <class V>
    V operator()(V a) const {
        if constexpr (std::is_same_v<V, bf16>) return a;
        else return static_cast<V>(static_cast<float>(bf16(a)));
    }
};

// The logistic function 1 / (1 + e^-a), and SiLU (swish) a / (1 + e^-a) = a sigmoid(a),
// written with one division so that it rounds once. Both are 0 (or -0) for very negative a
// (e^-a is infinity), and NaN for NaN; silu(-infinity) is NaN (-infinity / infinity), as
// -infinity * sigmoid(-infinity) is in PyTorch.
struct sigmoid {
    static constexpr std::string_view name = "sigmoid";
    static constexpr op_code code = op_code::sigmoid;
    auto operator()(auto a) const {
        using std::exp;
        const decltype(a) one(1);
        return one / (one + exp(-a));
    }
};
struct silu {
    static constexpr std::string_view name = "silu";
    static constexpr op_code code = op_code::silu;
    auto operator()(auto a) const {
        using std::exp;
        return a / (decltype(a)(1) + exp(-a));
    }
};

// The element type of a scalar (itself) or of a SIMD batch (its value_type).
template <class V>
struct scalar_of {
    using type = V;
};
template <class V>
    requires requires { typename V::value_type; }
struct scalar_of<V> {
    using type = typename V::value_type;
};

// GELU, exactly: a Phi(a) = a (1 + erf(a / sqrt 2)) / 2 (Hendrycks and Gimpel 2016), as
// torch.nn.GELU() and BERT compute it. One function, not a formula of erf, so that
// gelu(x W + b) reads its argument once and computes it once.
struct gelu {
    static constexpr std::string_view name = "gelu";
    static constexpr op_code code = op_code::gelu;
    template <class V>
    auto operator()(V a) const {
        using std::erf;
        using scalar = typename scalar_of<V>::type;
        const V inverse_sqrt2(static_cast<scalar>(1.0 / std::numbers::sqrt2)), one(scalar(1)), half(scalar(0.5));
        return a * (erf(a * inverse_sqrt2) + one) * half;
    }
};

// max and min propagate NaN from either side, as torch.maximum does.
struct maximum {
    static constexpr std::string_view name = "max";
    static constexpr op_code code = op_code::maximum;
    constexpr auto operator()(auto a, auto b) const { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
};
struct minimum {
    static constexpr std::string_view name = "min";
    static constexpr op_code code = op_code::minimum;
    constexpr auto operator()(auto a, auto b) const { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
};

// a to the power b, as std::pow: pow(a, 0) is 1 and pow(1, b) is 1 even for NaN, as in
// C and PyTorch.
struct pow {
    static constexpr std::string_view name = "pow";
    static constexpr op_code code = op_code::pow;
    auto operator()(auto a, auto b) const {
        using std::pow;
        return pow(a, b);
    }
};

// Comparisons give masks (bool), as in C++: false whenever an operand is NaN, but for
// not_equal, which is then true.
struct less { static constexpr std::string_view name = "less"; static constexpr op_code code = op_code::less; constexpr auto operator()(auto a, auto b) const { return a < b; } };
struct less_equal { static constexpr std::string_view name = "less_equal"; static constexpr op_code code = op_code::less_equal; constexpr auto operator()(auto a, auto b) const { return a <= b; } };
struct greater { static constexpr std::string_view name = "greater"; static constexpr op_code code = op_code::greater; constexpr auto operator()(auto a, auto b) const { return a > b; } };
struct greater_equal { static constexpr std::string_view name = "greater_equal"; static constexpr op_code code = op_code::greater_equal; constexpr auto operator()(auto a, auto b) const { return a >= b; } };
struct equal { static constexpr std::string_view name = "equal"; static constexpr op_code code = op_code::equal; constexpr auto operator()(auto a, auto b) const { return a == b; } };
struct not_equal { static constexpr std::string_view name = "not_equal"; static constexpr op_code code = op_code::not_equal; constexpr auto operator()(auto a, auto b) const { return a != b; } };

// Logic of masks. A mask reaches a backend as 1 or 0 in the formula's element type; any value
// but 0 counts as true, as in where.
struct logical_and { static constexpr std::string_view name = "logical_and"; static constexpr op_code code = op_code::logical_and; constexpr bool operator()(auto a, auto b) const { return bool(a) && bool(b); } };
struct logical_or { static constexpr std::string_view name = "logical_or"; static constexpr op_code code = op_code::logical_or; constexpr bool operator()(auto a, auto b) const { return bool(a) || bool(b); } };
struct logical_not { static constexpr std::string_view name = "logical_not"; static constexpr op_code code = op_code::logical_not; constexpr bool operator()(auto a) const { return !bool(a); } };

// where(condition, a, b)
struct where {
    static constexpr std::string_view name = "where";
    static constexpr op_code code = op_code::where;
    constexpr auto operator()(bool condition, auto a, auto b) const { return condition ? a : b; }
};


// The function `op` on scalar arguments (a mask as 0 or 1): what each code means, and how
// the reference backend computes it.
template <class T>
T evaluate(op_code op, const T* a) {
    switch (op) {
        case op_code::add: return fn::add{}(a[0], a[1]);
        case op_code::subtract: return fn::subtract{}(a[0], a[1]);
        case op_code::multiply: return fn::multiply{}(a[0], a[1]);
        case op_code::divide: return fn::divide{}(a[0], a[1]);
        case op_code::negate: return fn::negate{}(a[0]);
        case op_code::exp: return fn::exp{}(a[0]);
        case op_code::log: return fn::log{}(a[0]);
        case op_code::sqrt: return fn::sqrt{}(a[0]);
        case op_code::tanh: return fn::tanh{}(a[0]);
        case op_code::abs: return fn::abs{}(a[0]);
        case op_code::erf: return fn::erf{}(a[0]);
        case op_code::sigmoid: return fn::sigmoid{}(a[0]);
        case op_code::silu: return fn::silu{}(a[0]);
        case op_code::gelu: return fn::gelu{}(a[0]);
        case op_code::sin: return fn::sin{}(a[0]);
        case op_code::cos: return fn::cos{}(a[0]);
        case op_code::rsqrt: return fn::rsqrt{}(a[0]);
        case op_code::round_bf16: return fn::round_bf16{}(a[0]);
        case op_code::maximum: return fn::maximum{}(a[0], a[1]);
        case op_code::minimum: return fn::minimum{}(a[0], a[1]);
        case op_code::pow: return fn::pow{}(a[0], a[1]);
        case op_code::less: return T(fn::less{}(a[0], a[1]));
        case op_code::less_equal: return T(fn::less_equal{}(a[0], a[1]));
        case op_code::greater: return T(fn::greater{}(a[0], a[1]));
        case op_code::greater_equal: return T(fn::greater_equal{}(a[0], a[1]));
        case op_code::equal: return T(fn::equal{}(a[0], a[1]));
        case op_code::not_equal: return T(fn::not_equal{}(a[0], a[1]));
        case op_code::logical_and: return T(fn::logical_and{}(a[0], a[1]));
        case op_code::logical_or: return T(fn::logical_or{}(a[0], a[1]));
        case op_code::logical_not: return T(fn::logical_not{}(a[0]));
        case op_code::where: return fn::where{}(a[0] != T(0), a[1], a[2]);
        case op_code::map: break;  // the user's function, which only the program holds
    }
    throw std::logic_error("dimsum: a map step is run by its program's host_function, not by op code");
}

// Reductions along an axis.
struct sum { static constexpr std::string_view name = "sum"; };
struct max { static constexpr std::string_view name = "max"; };
struct mean { static constexpr std::string_view name = "mean"; };

}  // namespace dimsum::fn
