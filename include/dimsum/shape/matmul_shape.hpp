#pragma once
// The shape of matmul(a, b): a is (..., m, k), b is (..., k, n), the result (..., m, n).
// The leading (batch) axes broadcast as for elementwise operations; the contracted axes k
// must match exactly: same name (or one unnamed) and same extent.

#include "dimsum/shape/broadcast.hpp"

namespace dimsum::detail {

template <class SA, class SB>
constexpr message matmul_error() {
    message m;
    if (SA::rank < 2 || SB::rank < 2) {
        m << "dimsum: matmul: both operands need two or more axes: ";
        write_static_shape<SA>(m) << " x ";
        return write_static_shape<SB>(m);
    }
    axis_desc k_a = SA::axes[SA::rank - 1], k_b = SB::axes[SB::rank - 2];
    if (!names_match(k_a, k_b) || (k_a.is_static() && k_b.is_static() && k_a.extent != k_b.extent)) {
        return m << "dimsum: matmul: contracted axes differ: " << k_a << " vs " << k_b;
    }
    return broadcast<slice_t<SA, 0, SA::rank - 2>, slice_t<SB, 0, SB::rank - 2>>::error("matmul batch axes");
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
        std::size_t k_a = a.extent(SA::rank - 1), k_b = b.extent(SB::rank - 2);
        if (k_a != k_b) {
            message m;
            m << "dimsum: matmul: contracted axes differ: ";
            write_axis(m, SA::axes[SA::rank - 1], k_a) << " vs ";
            write_axis(m, SB::axes[SB::rank - 2], k_b) << " in " << a << " x " << b;
            throw shape_error(m);
        }
        std::array<std::size_t, SA::rank - 2> batch_positions_a{};
        std::array<std::size_t, SB::rank - 2> batch_positions_b{};
        for (std::size_t i = 0; i < SA::rank - 2; ++i) batch_positions_a[i] = i;
        for (std::size_t i = 0; i < SB::rank - 2; ++i) batch_positions_b[i] = i;
        auto batch_extents = batch::extents(gather_extents<batch_a>(a, batch_positions_a, "matmul"),
                                            gather_extents<batch_b>(b, batch_positions_b, "matmul"),
                                            "matmul batch axes");
        std::array<std::size_t, type::rank> out{};
        for (std::size_t i = 0; i + 2 < type::rank; ++i) out[i] = batch_extents.extent(i);
        out[type::rank - 2] = a.extent(SA::rank - 2);
        out[type::rank - 1] = b.extent(SB::rank - 1);
        return type::from_extents(out, "matmul");
    }
};

}  // namespace dimsum::detail
