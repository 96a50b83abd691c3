#pragma once
// The other pieces of a transformer layer, as formulas over ops/: GELU and layer normalisation
// with its learned scale and shift.

#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/softmax.hpp"

namespace dimsum::nn {

// GELU, exactly (fn::gelu): x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (Hendrycks and Gimpel
// 2016), as torch.nn.GELU() and BERT compute it; the same as ds::gelu.
template <class X>
auto gelu(X&& x) {
    return ::dimsum::gelu(std::forward<X>(x));
}

// layer_norm(x) gamma + beta along the last axis (Ba et al. 2016): gamma and beta have that
// axis only.
template <class X, class Gamma, class Beta>
auto layer_norm(X&& x, Gamma&& gamma, Beta&& beta, double epsilon = 1e-5) {
    return ::dimsum::layer_norm(std::forward<X>(x), epsilon) * std::forward<Gamma>(gamma) + std::forward<Beta>(beta);
}

}  // namespace dimsum::nn
