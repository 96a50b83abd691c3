#pragma once
// The other pieces of a transformer layer, as formulas over ops/: GELU and layer normalisation
// with its learned scale and shift.

#include <cmath>
#include <numbers>

#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/softmax.hpp"

namespace dimsum::nn {

// GELU, exactly: x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (Hendrycks and Gimpel 2016), as
// torch.nn.GELU() and BERT compute it.
template <class X>
auto gelu(X&& x) {
    using T = value_type_of<X>;
    const T inverse_sqrt2 = static_cast<T>(1.0 / std::numbers::sqrt2);
    return x * (erf(x * inverse_sqrt2) + T(1)) * T(0.5);
}

// layer_norm(x) gamma + beta along the last axis (Ba et al. 2016): gamma and beta have that
// axis only.
template <class X, class Gamma, class Beta>
auto layer_norm(X&& x, Gamma&& gamma, Beta&& beta, double epsilon = 1e-5) {
    return ::dimsum::layer_norm(std::forward<X>(x), epsilon) * std::forward<Gamma>(gamma) + std::forward<Beta>(beta);
}

}  // namespace dimsum::nn
