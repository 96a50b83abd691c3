#pragma once
// Rotary position embedding (RoPE, Su et al. 2021) as a formula over cached cos and sin tables.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <type_traits>

#include "dimsum/core/shape_error.hpp"
#include "dimsum/nn/layers.hpp"
#include "dimsum/ops/gather.hpp"
#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/join.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum::nn {

// Which elements of a head form the pairs that RoPE turns.
enum class rotary_pairs {
    half_split,   // i and i + head/2: GPT-NeoX, LLaMA, Hugging Face's rotate_half
    interleaved,  // 2i and 2i + 1: GPT-J and the paper
};

namespace detail {
template <class S, class Seq, class Head>
constexpr message rotary_shape_error() {
    message m;
    if constexpr (S::rank < 2 || S::axes[S::rank - 2].name != describe_axis<Seq>.name ||
                  S::axes[S::rank - 1].name != describe_axis<Head>.name) {
        m << "dimsum: rotary: x must end in (" << describe_axis<Seq>.name << ", " << describe_axis<Head>.name
          << "), not ";
        write_static_shape<S>(m);
    }
    return m;
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_rotary_positions(std::size_t first, std::size_t count,
                                                                          std::size_t positions) {
    message m;
    m << "dimsum: rotary: positions " << first << " to " << first + count << " (exclusive) lie past the table's "
      << positions;
    throw shape_error(m);
}
// e with Count axes of extent 1 inserted after its first.
template <std::size_t Count, class E>
auto with_ones_after_batch(E&& e) {
    if constexpr (Count == 0) return std::forward<E>(e);
    else return with_ones_after_batch<Count - 1>(unsqueeze<dim<1>, 1>(std::forward<E>(e)));
}
}  // namespace detail

// No rotary embedding: what an attention call over a KV cache (multi_head_attention) turns
// its rows by when given no rotary.
struct no_rotary_t {
    template <class X, class Positions>
    const X& operator()(const X& x, const Positions&) const {
        return x;
    }
};
inline constexpr no_rotary_t no_rotary{};

// rotary<T, Seq, Head, Pairs>(positions, base = 10000): position p turns pair i of a head by
// the angle p / base^(2i / head). The tables, (seq=positions, head/2), are computed once here,
// in double and rounded once to T; a call reads slices of them and allocates nothing. The
// formula a call returns reads the tables: the rotary object must outlive it.
template <class T, axis_type Seq, axis_type Head, rotary_pairs Pairs = rotary_pairs::half_split>
class rotary {
    static_assert(Head::is_static && Head::static_extent % 2 == 0, "dimsum: rotary: the head axis needs a static, even extent");

public:
    static constexpr std::size_t head = Head::static_extent;
    using Half = axis<Head::name, head / 2>;

    explicit rotary(std::size_t positions, double base = 10000.0) : cos_(Seq{positions}), sin_(Seq{positions}) {
        for (std::size_t p = 0; p < positions; ++p) {
            for (std::size_t i = 0; i < head / 2; ++i) {
                const double angle = static_cast<double>(p) * std::pow(base, -2.0 * static_cast<double>(i) / head);
                cos_(p, i) = static_cast<T>(std::cos(angle));
                sin_(p, i) = static_cast<T>(std::sin(angle));
            }
        }
    }

    std::size_t positions() const { return cos_.extent(0); }
    const tensor<T, Seq, Half>& cos() const { return cos_; }
    const tensor<T, Seq, Half>& sin() const { return sin_; }

    // x (..., seq, head), its rows at positions first, first + 1, ...: x rotated, a formula of
    // x's shape. x is read twice (computed once); a temporary tensor is refused, as in rms_norm.
    template <class X>
    auto operator()(X&& x, std::size_t first = 0, call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        return rotate(std::forward<X>(x), [&]<class S>(std::size_t count) {
            if (first > positions() || count > positions() - first) detail::throw_rotary_positions(first, count, positions());
            return [first, count](const tensor<T, Seq, Half>& table) { return slice<Seq>(table, first, first + count); };  // (seq, head/2)
        });
    }

    // x (batch, ..., seq, head) whose rows lie at their own positions (batch, seq) (a padded
    // batch, where each sequence's rows begin elsewhere: kv_cache::step_positions): x rotated,
    // a formula of x's shape, reading the table rows those positions pick (ds::gather; a
    // position past the table is an index_error when it is evaluated). The positions are read
    // where they lie: they must outlive the formula.
    template <class X, axis_type Batch, axis_type Rows>
    auto operator()(X&& x, const tensor<std::int64_t, Batch, Rows>& positions, call_site caller = call_site::current()) const {
        ::dimsum::detail::operation_site site(caller);
        return rotate(std::forward<X>(x), [&]<class S>(std::size_t) {
            static_assert(S::rank >= 3, "dimsum: rotary: x at per-row positions is (batch, ..., seq, head)");
            // (batch, 1, ..., 1, seq, head/2): the tables' rows, broadcast over x's middle axes
            return [rows = &positions](const tensor<T, Seq, Half>& table) {
                return detail::with_ones_after_batch<S::rank - 3>(gather<Seq>(table, *rows));
            };
        });
    }

private:
    // x turned by the table rows that rows_for<shape of x>(x's seq extent) picks: what both
    // calls share (x read twice, so no temporary tensor; x ending in (seq, head)).
    template <class X, class RowsFor>
    auto rotate(X&& x, RowsFor rows_for) const {
        static_assert(!detail::is_temporary_tensor<X>,
                      "dimsum: nn::rotary reads x twice: give it a named tensor or a formula, not a temporary tensor");
        using S = shape_of<X>;
        constexpr message error = detail::rotary_shape_error<S, Seq, Head>();
        if constexpr (error.length != 0) {
            return fail<error>();
        } else {
            auto rows_of = rows_for.template operator()<S>(x.shape().extent(S::rank - 2));
            return turn(x, rows_of(cos_), rows_of(sin_));
        }
    }

    // x's pairs turned by the angles whose cosines and sines c and s hold, (..., seq, head/2).
    template <class X, class C, class S>
    static auto turn(const X& x, const C& c, const S& s) {
        if constexpr (Pairs == rotary_pairs::half_split) {
            auto x1 = slice<Head, 0, head / 2>(x), x2 = slice<Head, head / 2, head>(x);
            return concat<Head>(x1 * c - x2 * s, x2 * c + x1 * s);
        } else {
            auto even = slice<Head, 0, head, 2>(x), odd = slice<Head, 1, head, 2>(x);
            using Pair = axis<"pair", 2>;
            return ::dimsum::detail::reshape_to<shape_of<X>>(stack<Pair, shape_of<X>::rank>(even * c - odd * s, odd * c + even * s));
        }
    }

    tensor<T, Seq, Half> cos_, sin_;
};

}  // namespace dimsum::nn
