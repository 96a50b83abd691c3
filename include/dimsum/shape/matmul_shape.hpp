#pragma once
// The shape of matmul(a, b): a is (..., m, k), b is (..., k, n), the result (..., m, n).
// The leading (batch) axes broadcast as for elementwise operations; the contracted axes k
// must match exactly: same name (or one unnamed) and same extent.

#include "dimsum/shape/broadcast.hpp"

namespace dimsum::detail {

template <class SA, class SB>
constexpr message matmul_error() {
    message m;
    if constexpr (SA::rank < 2 || SB::rank < 2) {
        m << "dimsum: matmul: both operands need two or more axes: ";
        write_static_shape<SA>(m) << " x ";
        return write_static_shape<SB>(m);
    } else {
        axis_desc k_a = SA::axes[SA::rank - 1], k_b = SB::axes[SB::rank - 2];
        if (!names_match(k_a, k_b) || (k_a.is_static() && k_b.is_static() && k_a.extent != k_b.extent)) {
            return m << "dimsum: matmul: contracted axes differ: " << k_a << " vs " << k_b;
        }
        return broadcast<slice_t<SA, 0, SA::rank - 2>, slice_t<SB, 0, SB::rank - 2>>::error("matmul batch axes");
    }
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_contracted(shape_ref a, shape_ref b) {
    message m;
    m << "dimsum: matmul: contracted axes differ: ";
    write_axis(m, a.axes[a.rank - 1], a.extents[a.rank - 1]) << " vs ";
    write_axis(m, b.axes[b.rank - 2], b.extents[b.rank - 2]) << " in " << a << " x " << b;
    throw shape_error(m);
}

// The run-time extents of matmul(a, b) into out (batch..., m, n).
inline void matmul_extents(shape_ref a, shape_ref b, std::size_t* out) {
    if (a.extents[a.rank - 1] != b.extents[b.rank - 2]) throw_contracted(a, b);
    shape_ref batch_a{a.axes, a.extents, a.rank - 2}, batch_b{b.axes, b.extents, b.rank - 2};
    broadcast_extents("matmul batch axes", batch_a, batch_b, out);
    std::size_t batch_rank = a.rank > b.rank ? a.rank - 2 : b.rank - 2;
    out[batch_rank] = a.extents[a.rank - 2];
    out[batch_rank + 1] = b.extents[b.rank - 1];
}

// Only to be used once matmul_error<SA, SB>() is empty.
template <class SA, class SB>
struct matmul_shape {
    using batch_a = slice_t<SA, 0, SA::rank - 2>;
    using batch_b = slice_t<SB, 0, SB::rank - 2>;
    using batch = broadcast<batch_a, batch_b>;
    using type = concat_t<typename batch::type,
                          shape<typename SA::template axis_at<SA::rank - 2>,
                                typename SB::template axis_at<SB::rank - 1>>>;

    static type extents(const SA& a, const SB& b) {
        auto ea = a.extents();
        auto eb = b.extents();
        std::array<std::size_t, type::rank> out{};
        matmul_extents({SA::axes.data(), ea.data(), SA::rank}, {SB::axes.data(), eb.data(), SB::rank}, out.data());
        return type::from_extents(out, "matmul");
    }
};

}  // namespace dimsum::detail
