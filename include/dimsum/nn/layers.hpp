#pragma once
// The other pieces of a transformer layer, as formulas over ops/: GELU, layer normalisation
// with its learned scale and shift, RMSNorm, and the GELU and SwiGLU feed-forwards.

#include <type_traits>

#include "dimsum/ops/cast.hpp"
#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/matmul.hpp"
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
auto layer_norm(X&& x, Gamma&& gamma, Beta&& beta, double epsilon = 1e-5, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    return ::dimsum::layer_norm(std::forward<X>(x), epsilon) * std::forward<Gamma>(gamma) + std::forward<Beta>(beta);
}

namespace detail {
// A tensor passed as a temporary, which a formula reading it twice could not hold.
template <class X>
inline constexpr bool is_temporary_tensor = is_tensor<std::remove_cvref_t<X>>::value && !std::is_lvalue_reference_v<X>;

// v as a tensor of its value type would hold it: a formula of bf16 values (which computes in
// float until a cast rounds it) rounded to bf16, as a bf16 model (PyTorch's too) holds each
// activation a product reads. The product then multiplies two bf16 operands (on the bf16
// kernels where the CPU has them) and its weight's gradient finds a bf16 operand. A bf16
// tensor or view is itself; anything else is v.
template <class V>
decltype(auto) as_stored(V&& v) {
    if constexpr (is_invalid<V>) return invalid_expression{};  // the error already given, once
    else if constexpr (std::is_same_v<std::remove_const_t<value_type_of<V>>, bf16>) return cast<bf16>(std::forward<V>(v));
    else return std::forward<V>(v);
}
}  // namespace detail

// x / sqrt(mean(x^2) + epsilon) g along the last axis (Zhang and Sennrich 2019), as
// torch.nn.RMSNorm and LLaMA compute it; g has that axis only. x is read twice (one step,
// computed once); a temporary tensor is refused at compile time: name it first. epsilon
// enters the formula in its compute type: float in a bf16 formula, never rounded to bf16.
template <class X, class G>
auto rms_norm(X&& x, G&& g, double epsilon = 1e-6, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    static_assert(!detail::is_temporary_tensor<X>,
                  "dimsum: nn::rms_norm reads x twice: give it a named tensor or a formula, not a temporary tensor");
    using S = shape_of<X>;
    using Last = typename S::template axis_at<S::rank - 1>;
    const auto& rows = x;
    auto mean_square = mean<Last>(rows * rows, keep_axis);  // (..., last=1)
    return rows * rsqrt(mean_square + static_cast<compute_type_t<value_type_of<X>>>(epsilon)) * std::forward<G>(g);
}

// The feed-forward of BERT and GPT-2: gelu(x W_1 + b_1) W_2 + b_2, x (..., model), W_1
// (model, hidden), W_2 (hidden, model). Where x's values are bf16, x and the GELU's output
// are rounded to bf16 before the products that read them (detail::as_stored).
template <class X, class W1, class B1, class W2, class B2>
auto gelu_feed_forward(X&& x, W1&& w_1, B1&& b_1, W2&& w_2, B2&& b_2, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    auto inner = gelu(matmul(detail::as_stored(std::forward<X>(x)), std::forward<W1>(w_1)) + std::forward<B1>(b_1));
    return matmul(detail::as_stored(std::move(inner)), std::forward<W2>(w_2)) + std::forward<B2>(b_2);
}

// The SwiGLU feed-forward (Shazeer 2020), as in LLaMA: (silu(x W_1) * x W_3) W_2, x (..., model),
// W_1 and W_3 (model, hidden), W_2 (hidden, model). x is read twice, as in rms_norm. Where
// x's values are bf16, x and silu(x W_1) * x W_3 are rounded to bf16 before the products that
// read them (detail::as_stored).
template <class X, class W1, class W3, class W2>
auto swiglu(X&& x, W1&& w_1, W3&& w_3, W2&& w_2, call_site caller = call_site::current()) {
    ::dimsum::detail::operation_site site(caller);
    static_assert(!detail::is_temporary_tensor<X>,
                  "dimsum: nn::swiglu reads x twice: give it a named tensor or a formula, not a temporary tensor");
    auto&& rows = detail::as_stored(x);
    return matmul(detail::as_stored(silu(matmul(rows, std::forward<W1>(w_1))) * matmul(rows, std::forward<W3>(w_3))),
                  std::forward<W2>(w_2));
}

}  // namespace dimsum::nn
