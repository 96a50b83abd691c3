#pragma once
// The optimizers' element updates (nn/optimizers.hpp; declared in kernels.hpp), on plain
// arrays: one vector of elements at a time, the last few through a vector-wide buffer, so that
// every element is computed by the same instructions wherever a thread's range begins (a
// resumed run continues bit for bit on any number of threads), and the square root and
// division vectorise (std::sqrt in a loop does not, for errno).

#include <algorithm>
#include <array>
#include <cstddef>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/simd.hpp"

DIMSUM_SIMD_CODE_BEGIN

namespace dimsum::backend::cpu {

// (kernels.hpp)
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, std::size_t first, std::size_t last, const adamw_step<T>& c) {
    using batch = simd<T>;
    constexpr std::size_t width = batch::size;
    const batch decay(c.decay), b1(c.beta1), b2(c.beta2), step_size(c.step_size), correction2(c.correction2), eps(c.epsilon);
    const batch r1(T(1) - c.beta1), r2(T(1) - c.beta2);
    auto update = [&](T* pi, const T* gi, T* mi, T* vi) {
        const batch gv = batch::load_unaligned(gi);
        const batch mv = b1 * batch::load_unaligned(mi) + r1 * gv;
        const batch vv = b2 * batch::load_unaligned(vi) + r2 * gv * gv;
        const batch pv = batch::load_unaligned(pi) * decay - step_size * mv / (xsimd::sqrt(vv) / correction2 + eps);
        mv.store_unaligned(mi);
        vv.store_unaligned(vi);
        pv.store_unaligned(pi);
    };
    std::size_t i = first;
    for (; i + width <= last; i += width) update(p + i, g + i, m + i, v + i);
    if (i == last) return;
    std::array<T, width> pt{}, gt{}, mt{}, vt{};  // the last few, through a vector
    const std::size_t rest = last - i;
    std::copy_n(p + i, rest, pt.data());
    std::copy_n(g + i, rest, gt.data());
    std::copy_n(m + i, rest, mt.data());
    std::copy_n(v + i, rest, vt.data());
    update(pt.data(), gt.data(), mt.data(), vt.data());
    std::copy_n(pt.data(), rest, p + i);
    std::copy_n(mt.data(), rest, m + i);
    std::copy_n(vt.data(), rest, v + i);
}

}  // namespace dimsum::backend::cpu

DIMSUM_SIMD_CODE_END
