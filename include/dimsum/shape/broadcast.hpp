#pragma once
// Broadcasting for elementwise operations, aligned from the last axis as in NumPy.
//
// Two axes at the same position match when their names agree or one is unnamed; their
// extents must be equal, or one of them 1. A missing leading axis acts as an unnamed axis of
// extent 1. Names carry meaning: `head` and `model` never broadcast, whatever the extents.

#include <string_view>

#include "dimsum/shape/pick.hpp"

namespace dimsum::detail {

constexpr bool names_match(axis_desc a, axis_desc b) {
    return !a.is_named() || !b.is_named() || a.name == b.name;
}

constexpr std::size_t broadcast_extent(std::size_t a, std::size_t b) {
    if (a == 1) return b;
    if (b == 1 || a == b) return a;
    if (a == dynamic) return b;
    return a;  // b is dynamic; checked at run time
}

// Static part: whether two axes can ever broadcast.
constexpr bool can_broadcast(axis_desc a, axis_desc b) {
    if (!names_match(a, b)) return false;
    return !a.is_static() || !b.is_static() || a.extent == b.extent || a.extent == 1 || b.extent == 1;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_broadcast(std::string_view op, shape_ref a, shape_ref b,
                                                                   std::size_t ia, std::size_t ib) {
    message m;
    m << "dimsum: " << op << ": cannot broadcast ";
    write_axis(m, a.axes[ia], a.extents[ia]) << " with ";
    write_axis(m, b.axes[ib], b.extents[ib]) << " in " << a << " and " << b;
    throw shape_error(m);
}

// The run-time extents of a and b broadcast, right-aligned, into out (max rank entries).
inline void broadcast_extents(std::string_view op, shape_ref a, shape_ref b, std::size_t* out) {
    std::size_t rank = a.rank > b.rank ? a.rank : b.rank;
    for (std::size_t i = 0; i < rank; ++i) {
        std::size_t lead_a = rank - a.rank, lead_b = rank - b.rank;
        std::size_t ea = i < lead_a ? 1 : a.extents[i - lead_a];
        std::size_t eb = i < lead_b ? 1 : b.extents[i - lead_b];
        if (ea != eb && ea != 1 && eb != 1) throw_broadcast(op, a, b, i - lead_a, i - lead_b);
        out[i] = ea == 1 ? eb : ea;
    }
}

template <class A, class B>
using broadcast_axis_t = axis<std::conditional_t<A::name.empty(), B, A>::name,
                              broadcast_extent(A::static_extent, B::static_extent)>;

// The axis of S at position I once S is right-aligned to Rank axes; dim<1> where missing.
template <class S, std::size_t Rank, std::size_t I, bool Missing = (I < Rank - S::rank)>
struct aligned_axis {
    using type = dim<1>;
};
template <class S, std::size_t Rank, std::size_t I>
struct aligned_axis<S, Rank, I, false> {
    using type = typename S::template axis_at<I - (Rank - S::rank)>;
};
template <class S, std::size_t Rank, std::size_t I>
using aligned_axis_t = typename aligned_axis<S, Rank, I>::type;

template <class SA, class SB>
struct broadcast {
    static constexpr std::size_t rank = SA::rank > SB::rank ? SA::rank : SB::rank;

    template <std::size_t... I>
    static auto result(std::index_sequence<I...>)
        -> shape<broadcast_axis_t<aligned_axis_t<SA, rank, I>, aligned_axis_t<SB, rank, I>>...>;
    using type = decltype(result(std::make_index_sequence<rank>{}));

    static constexpr axis_desc a_at(std::size_t i) {
        std::size_t lead = rank - SA::rank;
        return i < lead ? axis_desc{"", 1} : SA::axes[i - lead];
    }
    static constexpr axis_desc b_at(std::size_t i) {
        std::size_t lead = rank - SB::rank;
        return i < lead ? axis_desc{"", 1} : SB::axes[i - lead];
    }

    // Empty when the shapes can broadcast, else the reason.
    static constexpr message error(std::string_view op) {
        message m;
        for (std::size_t i = 0; i < rank; ++i) {
            if (!can_broadcast(a_at(i), b_at(i))) {
                m << "dimsum: " << op << ": cannot broadcast " << a_at(i) << " with " << b_at(i);
                m << " in ";
                write_static_shape<SA>(m) << " and ";
                write_static_shape<SB>(m);
                return m;
            }
        }
        return m;
    }

    static type extents(const SA& a, const SB& b, std::string_view op) {
        auto ea = a.extents();
        auto eb = b.extents();
        std::array<std::size_t, rank> out{};
        broadcast_extents(op, {SA::axes.data(), ea.data(), SA::rank}, {SB::axes.data(), eb.data(), SB::rank}, out.data());
        return type::from_extents(out, op);
    }
};

}  // namespace dimsum::detail
