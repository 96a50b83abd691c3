#pragma once
// cast<To>(x): a formula's values as another element type, a node that fuses like any other.
//   cast<bf16>(x)    x of float: each value rounded to the nearest bf16 (ties to even), the
//                    formula going on in float; stored into a bf16 tensor it loses nothing more.
//                    x a formula of bf16 (computed in float): rounded there in the same way, an
//                    intermediate value held in bf16, as PyTorch's bf16 holds each; a kernel
//                    that reads bf16 reads it so. x a bf16 tensor or view: x itself;
//   cast<float>(x)   x of bf16, int32 or int64 (also cast<double>): the same values, exactly
//                    (integers up to 2^24 in float, 2^53 in double);
//   cast<double>(x)  x of float: its tensors' values, exactly, and its arithmetic done in
//                    double (as a formula of bf16 computes in float);
//   cast<float>(x)   x a tensor or view of double: each value rounded to the nearest float.
//                    A formula of double is evaluated into a tensor first: a formula computes
//                    in one type, so a cast never narrows in the middle of one.
// Mixing element types without a cast is a compile error naming both.

#include <type_traits>
#include <utility>

#include "dimsum/ops/common.hpp"

namespace dimsum {

namespace detail {

// Whether e is memory, values to read with no computation: a tensor or a view, a temporary
// tensor included (the cast's node holds it).
template <class E>
inline constexpr bool is_memory = is_strided_leaf<E> || is_tensor<std::remove_cvref_t<E>>::value;

template <class To, class From, bool Memory>
constexpr message cast_error() {
    message m;
    constexpr bool to_bf16 = std::is_same_v<To, bf16> && std::is_same_v<From, float>;
    constexpr bool widening = floating_element<To> && (std::is_same_v<From, bf16> || integer_element<From>);
    constexpr bool to_double = std::is_same_v<To, double> && std::is_same_v<From, float>;
    constexpr bool to_float = std::is_same_v<To, float> && std::is_same_v<From, double>;
    if constexpr (to_float && !Memory) {
        m << "dimsum: cast: from a formula of double to float: evaluate it into a ds::tensor<double> first, then cast "
             "that tensor (a formula computes in one type; cast<float> rounds the values of a tensor or view of double)";
    } else if constexpr (!std::is_same_v<To, From> && !to_bf16 && !widening && !to_double && !to_float) {
        m << "dimsum: cast: from " << type_name<From>() << " to " << type_name<To>()
          << " is not supported: a cast goes to bf16 from float, to double from float, to float from a tensor of "
             "double, or to float or double from bf16, int32 or int64";
    }
    return m;
}

}  // namespace detail

template <class To, operand E>
auto cast(E&& e) {
    using From = std::remove_const_t<value_type_of<E>>;
    if constexpr (is_invalid<E>) {
        return invalid_expression{};
    } else if constexpr (constexpr message error = detail::cast_error<To, From, detail::is_memory<E>>(); error.length != 0) {
        return fail<error>();
    } else if constexpr (std::is_same_v<To, From> && !(std::is_same_v<To, bf16> && !detail::is_strided_leaf<E>)) {
        return expr::hold(std::forward<E>(e));
    } else {
        return expr::cast<To, expr::held_t<E>>{{expr::hold(std::forward<E>(e))}};
    }
}

}  // namespace dimsum
