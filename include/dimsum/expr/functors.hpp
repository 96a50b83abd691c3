#pragma once
// The elementwise functions, one small type each. They are generic in their argument type so
// that a backend can call them on scalars or on SIMD batches alike; `name` is what error
// messages call the operation.

#include <cmath>
#include <string_view>

namespace dimsum::fn {


struct add { static constexpr std::string_view name = "add"; constexpr auto operator()(auto a, auto b) const { return a + b; } };
struct subtract { static constexpr std::string_view name = "subtract"; constexpr auto operator()(auto a, auto b) const { return a - b; } };
struct multiply { static constexpr std::string_view name = "multiply"; constexpr auto operator()(auto a, auto b) const { return a * b; } };
struct divide { static constexpr std::string_view name = "divide"; constexpr auto operator()(auto a, auto b) const { return a / b; } };
struct negate { static constexpr std::string_view name = "negate"; constexpr auto operator()(auto a) const { return -a; } };

struct exp { static constexpr std::string_view name = "exp"; auto operator()(auto a) const { using std::exp; return exp(a); } };
struct log { static constexpr std::string_view name = "log"; auto operator()(auto a) const { using std::log; return log(a); } };
struct sqrt { static constexpr std::string_view name = "sqrt"; auto operator()(auto a) const { using std::sqrt; return sqrt(a); } };
struct tanh { static constexpr std::string_view name = "tanh"; auto operator()(auto a) const { using std::tanh; return tanh(a); } };
struct abs { static constexpr std::string_view name = "abs"; auto operator()(auto a) const { using std::abs; return abs(a); } };
struct erf { static constexpr std::string_view name = "erf"; auto operator()(auto a) const { using std::erf; return erf(a); } };

// max and min propagate NaN from either side, as torch.maximum does.
struct maximum {
    static constexpr std::string_view name = "max";
    constexpr auto operator()(auto a, auto b) const { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
};
struct minimum {
    static constexpr std::string_view name = "min";
    constexpr auto operator()(auto a, auto b) const { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
};

// where(condition, a, b)
struct select {
    static constexpr std::string_view name = "where";
    constexpr auto operator()(bool condition, auto a, auto b) const { return condition ? a : b; }
};


// Reductions along an axis.
struct sum { static constexpr std::string_view name = "sum"; };
struct max { static constexpr std::string_view name = "max"; };
struct mean { static constexpr std::string_view name = "mean"; };

}  // namespace dimsum::fn
