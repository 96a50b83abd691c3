#pragma once
// Losses, as formulas of no axes: differentiated like any formula (ds::grad, ds::backward).
//   cross_entropy<Vocab>(logits, targets): the mean over the targets that are not
//       ignore_index of -log softmax(logits)[target], as torch.nn.functional.cross_entropy;
//   mean_squared_error(a, b): the mean over every position of (a - b)^2.

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "dimsum/core/next_index.hpp"
#include "dimsum/ops/common.hpp"

#include "dimsum/core/element_type.hpp"
#include "dimsum/ops/cast.hpp"
#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/mask.hpp"
#include "dimsum/ops/softmax.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/shape/find_axis.hpp"

namespace dimsum::nn {

namespace detail {

using every_position = axis<"every_position">;

// The sum of a formula over all its axes: seen as one axis, then summed.
template <class E>
auto sum_all(E&& e) {
    if constexpr (shape_of<E>::rank == 0) return std::forward<E>(e);
    else return sum<every_position>(view<every_position>(std::forward<E>(e)));
}

}  // namespace detail

// The cross-entropy of logits (..., vocab) against targets (...), a tensor or view of int32 or
// int64 class indices along Vocab, the logits' last axis: the mean, over the positions whose target is not
// ignore_index, of log(sum(exp(logits))) - logits[target], computed as logits shifted by
// their maximum (so that exp cannot overflow). A formula of no axes; every target ignored
// gives NaN (0 / 0), as PyTorch does. A target outside [0, vocab) that is not ignore_index
// counts as a zero-probability class: its row adds log(sum(exp(logits))) alone (PyTorch
// raises an error there; the targets are the caller's to check).
template <axis_type Vocab, operand Logits, class Targets>
auto cross_entropy(Logits&& logits, const Targets& targets, std::int64_t ignore_index = -100) {
    using T = value_type_of<Logits>;
    static_assert(floating_element<T>, "dimsum: cross_entropy: logits of float or double");
    static_assert(integer_element<std::remove_const_t<value_type_of<Targets>>>,
                  "dimsum: cross_entropy: the targets are a tensor or view of int32_t or int64_t");
    using S = shape_of<Logits>;
    static_assert(S::rank >= 1 && S::template axis_at<S::rank - 1>::name == Vocab::name,
                  "dimsum: cross_entropy: the logits' last axis is the one named like Vocab");
    const std::size_t classes = logits.shape().extent(S::rank - 1);
    std::size_t counted = 0;  // the targets not ignored
    const auto ids = ::dimsum::detail::leaf_view(targets);
    constexpr std::size_t rank = decltype(ids)::rank;
    std::array<std::size_t, rank> index{}, extents{};
    for (std::size_t i = 0; i < rank; ++i) extents[i] = ids.extent(i);
    if (ids.size() != 0) {
        do {
            counted += ids.data()[ids.offset(index)] != ignore_index;
        } while (::dimsum::detail::next_index(index.data(), extents.data(), rank));
    }
    auto shifted = logits - max<Vocab>(logits, keep_axis);
    auto log_probabilities = shifted - log(sum<Vocab>(exp(shifted), keep_axis));
    auto target_values = unsqueeze<axis<Vocab::name, 1>, rank>(cast<T>(targets));
    auto picked = sum<Vocab>(where(arange<T>(Vocab{classes}) == target_values, log_probabilities, T(0)));
    return -detail::sum_all(std::move(picked)) / static_cast<T>(counted);
}

// The mean over every position of (a - b)^2: a and b of one shape (or broadcast to one).
template <operand A, operand B>
auto mean_squared_error(A&& a, B&& b) {
    auto difference = std::forward<A>(a) - std::forward<B>(b);
    using T = value_type_of<decltype(difference)>;
    const std::size_t count = difference.shape().size();
    return detail::sum_all(difference * difference) / static_cast<T>(count);
}

}  // namespace dimsum::nn
