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
#include <string_view>
#include <type_traits>

#include "dimsum/core/bf16.hpp"
#include "dimsum/core/host_device.hpp"
#include "dimsum/core/op_code.hpp"

namespace dimsum::fn {


struct add { static constexpr std::string_view name = "add"; static constexpr op_code code = op_code::add; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a + b; } };
struct subtract { static constexpr std::string_view name = "subtract"; static constexpr op_code code = op_code::subtract; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a - b; } };
struct multiply { static constexpr std::string_view name = "multiply"; static constexpr op_code code = op_code::multiply; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a * b; } };
struct divide { static constexpr std::string_view name = "divide"; static constexpr op_code code = op_code::divide; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a / b; } };
struct negate { static constexpr std::string_view name = "negate"; static constexpr op_code code = op_code::negate; DIMSUM_HD constexpr DIMSUM_HD auto operator()(auto a) const { return -a; } };

struct exp { static constexpr std::string_view name = "exp"; static constexpr op_code code = op_code::exp; DIMSUM_HD auto operator()(auto a) const { using std::exp; return exp(a); } };
struct log { static constexpr std::string_view name = "log"; static constexpr op_code code = op_code::log; DIMSUM_HD auto operator()(auto a) const { using std::log; return log(a); } };
struct sqrt { static constexpr std::string_view name = "sqrt"; static constexpr op_code code = op_code::sqrt; DIMSUM_HD auto operator()(auto a) const { using std::sqrt; return sqrt(a); } };
struct tanh { static constexpr std::string_view name = "tanh"; static constexpr op_code code = op_code::tanh; DIMSUM_HD auto operator()(auto a) const { using std::tanh; return tanh(a); } };
struct abs { static constexpr std::string_view name = "abs"; static constexpr op_code code = op_code::abs; DIMSUM_HD auto operator()(auto a) const { using std::abs; return abs(a); } };
struct erf { static constexpr std::string_view name = "erf"; static constexpr op_code code = op_code::erf; DIMSUM_HD auto operator()(auto a) const { using std::erf; return erf(a); } };
struct sin { static constexpr std::string_view name = "sin"; static constexpr op_code code = op_code::sin; DIMSUM_HD auto operator()(auto a) const { using std::sin; return sin(a); } };
struct cos { static constexpr std::string_view name = "cos"; static constexpr op_code code = op_code::cos; DIMSUM_HD auto operator()(auto a) const { using std::cos; return cos(a); } };

// 1 / sqrt(a), rounded as that division (not an approximate reciprocal square root).
struct rsqrt {
    static constexpr std::string_view name = "rsqrt";
    static constexpr op_code code = op_code::rsqrt;
    DIMSUM_HD auto operator()(auto a) const {
        using std::sqrt;
        return decltype(a)(1) / sqrt(a);
    }
};

// The nearest bf16 to a (ties to even), as a value of a's own type: what cast<bf16> does to a
// float or double inside a formula, which goes on computing in float.
struct round_bf16 {
    static constexpr std::string_view name = "cast<bf16>";
    static constexpr op_code code = op_code::round_bf16;
    template <class V>
    DIMSUM_HD V operator()(V a) const {
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
    DIMSUM_HD auto operator()(auto a) const {
        using std::exp;
        const decltype(a) one(1);
        return one / (one + exp(-a));
    }
};
struct silu {
    static constexpr std::string_view name = "silu";
    static constexpr op_code code = op_code::silu;
    DIMSUM_HD auto operator()(auto a) const {
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

// Phi(a) = (1 + erf(a / sqrt 2)) / 2, the standard normal distribution function: gelu's and
// its derivative's.
template <class V>
DIMSUM_HD V normal_cdf(V a) {
    using std::erf;
    using scalar = typename scalar_of<V>::type;
    const V inverse_sqrt2(static_cast<scalar>(1.0 / std::numbers::sqrt2)), one(scalar(1)), half(scalar(0.5));
    return (erf(a * inverse_sqrt2) + one) * half;
}

// GELU, exactly: a Phi(a) (Hendrycks and Gimpel 2016), as torch.nn.GELU() and BERT compute
// it. One function, not a formula of erf, so that gelu(x W + b) reads its argument once and
// computes it once.
struct gelu {
    static constexpr std::string_view name = "gelu";
    static constexpr op_code code = op_code::gelu;
    template <class V>
    DIMSUM_HD auto operator()(V a) const { return a * normal_cdf(a); }
};

// GELU's derivative, Phi(a) + a phi(a), phi(a) = e^(-a^2 / 2) / sqrt(2 pi): gelu's gradient
// rule writes it (differentiate.hpp), one function rather than a formula of a dozen steps,
// which a gemm's epilogue computed node by node over each block (the BERT layer's
// feed-forward backward).
struct gelu_derivative {
    static constexpr std::string_view name = "gelu_derivative";
    static constexpr op_code code = op_code::gelu_derivative;
    template <class V>
    DIMSUM_HD auto operator()(V a) const {
        using std::exp;
        using scalar = typename scalar_of<V>::type;
        const V minus_half(scalar(-0.5)), inverse_sqrt_2pi(static_cast<scalar>(std::numbers::inv_sqrtpi / std::numbers::sqrt2));
        return normal_cdf(a) + a * exp(a * a * minus_half) * inverse_sqrt_2pi;
    }
};

// max and min propagate NaN from either side, as torch.maximum does.
struct maximum {
    static constexpr std::string_view name = "max";
    static constexpr op_code code = op_code::maximum;
    DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
};
struct minimum {
    static constexpr std::string_view name = "min";
    static constexpr op_code code = op_code::minimum;
    DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
};

// a to the power b, as std::pow: pow(a, 0) is 1 and pow(1, b) is 1 even for NaN, as in
// C and PyTorch.
struct pow {
    static constexpr std::string_view name = "pow";
    static constexpr op_code code = op_code::pow;
    DIMSUM_HD auto operator()(auto a, auto b) const {
        using std::pow;
        return pow(a, b);
    }
};

// Comparisons give masks (bool), as in C++: false whenever an operand is NaN, but for
// not_equal, which is then true.
struct less { static constexpr std::string_view name = "less"; static constexpr op_code code = op_code::less; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a < b; } };
struct less_equal { static constexpr std::string_view name = "less_equal"; static constexpr op_code code = op_code::less_equal; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a <= b; } };
struct greater { static constexpr std::string_view name = "greater"; static constexpr op_code code = op_code::greater; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a > b; } };
struct greater_equal { static constexpr std::string_view name = "greater_equal"; static constexpr op_code code = op_code::greater_equal; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a >= b; } };
struct equal { static constexpr std::string_view name = "equal"; static constexpr op_code code = op_code::equal; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a == b; } };
struct not_equal { static constexpr std::string_view name = "not_equal"; static constexpr op_code code = op_code::not_equal; DIMSUM_HD constexpr auto operator()(auto a, auto b) const { return a != b; } };

// Logic of masks. A mask reaches a backend as 1 or 0 in the formula's element type; any value
// but 0 counts as true, as in where.
struct logical_and { static constexpr std::string_view name = "logical_and"; static constexpr op_code code = op_code::logical_and; DIMSUM_HD constexpr bool operator()(auto a, auto b) const { return bool(a) && bool(b); } };
struct logical_or { static constexpr std::string_view name = "logical_or"; static constexpr op_code code = op_code::logical_or; DIMSUM_HD constexpr bool operator()(auto a, auto b) const { return bool(a) || bool(b); } };
struct logical_not { static constexpr std::string_view name = "logical_not"; static constexpr op_code code = op_code::logical_not; DIMSUM_HD constexpr bool operator()(auto a) const { return !bool(a); } };

// where(condition, a, b)
struct where {
    static constexpr std::string_view name = "where";
    static constexpr op_code code = op_code::where;
    DIMSUM_HD constexpr auto operator()(bool condition, auto a, auto b) const { return condition ? a : b; }
};


// Every elementwise function, in the order of its op code: the one list that the rest of
// dimsum reads (the scalar dispatch below, names, the CPU backend's block functions, the
// CUDA backend's device code). A new function is a functor above, its place here, its code
// in op_code.hpp and its operation in ops/elementwise.hpp.
template <class... F>
struct function_list {};
using elementwise_functions =
    function_list<add, subtract, multiply, divide, negate, exp, log, sqrt, tanh, abs, erf, sigmoid, silu, gelu,
                  gelu_derivative, sin, cos, rsqrt, round_bf16, maximum, minimum, pow, less, less_equal, greater, greater_equal, equal, not_equal,
                  logical_and, logical_or, logical_not, where>;

// How many arguments F takes.
template <class F>
inline constexpr std::size_t arity = std::is_invocable_v<F, double> ? 1 : std::is_invocable_v<F, double, double> ? 2 : 3;

namespace detail {

template <class... F>
constexpr bool in_code_order(function_list<F...>) {
    std::size_t position = 0;
    return ((std::size_t(F::code) == position++) && ...) && sizeof...(F) + 1 == op_code_count;
}
static_assert(in_code_order(elementwise_functions{}),
              "dimsum: elementwise_functions lists every op code but map, each once, in the order of op_code");

// F on the scalar arguments a, as a value of T (a mask as 1 or 0; where's condition is any
// value but 0).
template <class F, class T>
DIMSUM_HD T apply_function(const T* a) {
    if constexpr (std::is_same_v<F, where>) return F{}(a[0] != T(0), a[1], a[2]);
    else if constexpr (arity<F> == 1) return static_cast<T>(F{}(a[0]));
    else return static_cast<T>(F{}(a[0], a[1]));
}

template <class T, class... F>
DIMSUM_HD T apply_listed(op_code op, const T* a, function_list<F...>) {
    T result = T(0) / T(0);  // map's: its program's host_function computes it, not its code
    (void)((op == F::code && (result = apply_function<F>(a), true)) || ...);
    return result;
}

template <class... F>
constexpr std::string_view name_listed(op_code op, function_list<F...>) {
    std::string_view name = "map";
    (void)((op == F::code && (name = F::name, true)) || ...);
    return name;
}

}  // namespace detail

// The function `op` on scalar arguments a[0], a[1], ...: what each code means. The reference
// backend computes with it, and the CUDA backend on the device (map aside: NaN).
template <class T>
DIMSUM_HD T apply(op_code op, const T* a) {
    return detail::apply_listed(op, a, elementwise_functions{});
}

// What error messages and ds::explain call the function of op.
constexpr std::string_view name_of(op_code op) { return detail::name_listed(op, elementwise_functions{}); }

// Reductions along an axis.
struct sum { static constexpr std::string_view name = "sum"; };
struct max { static constexpr std::string_view name = "max"; };
struct mean { static constexpr std::string_view name = "mean"; };

}  // namespace dimsum::fn
