#pragma once
// Weights packed once for the CPU's matrix products. `ds::prepack(w)` packs a matrix into the
// panels that the product packs from its right operand on every call (gemm.hpp), so that
// `matmul(x, packed)` in a loop never packs w again, and a bf16 w is never widened into a
// float temporary first: its panels hold float.
//
// In a formula the packed matrix stands for w. A product that takes it as its right operand
// reads the panels on the CPU backend; every other use, and the reference backend, reads w
// itself. So w must outlive the packing (as it must outlive a view of it), and the packing is
// a copy of w's values when it was made: after writing w, pack it again.
//
// Memory: the panels hold rows x cols rounded up to the micro-kernel's width (16 floats with
// AVX2, 32 with AVX-512), in the compute type: the size of w for float and double, twice its
// size for bf16. A bf16 w packed where the bf16 path in use is amx or avx512_bf16 also holds
// its pairs for those instructions (bf16_gemm.hpp; rows rounded up to 32, columns to 32):
// once more its size, three times in all, since products of a float A by w (a layer's
// intermediate values) still read the float panels. `bytes()` tells. The pairs are laid out
// for that path's kernel: after a change of path (set_bf16_path), products pack B at each call
// until w is packed again.

#include <cstddef>
#include <memory>
#include <type_traits>

#include "dimsum/backend/cpu/bf16_paths.hpp"
#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/core/bf16.hpp"
#include "dimsum/core/element_type.hpp"
#include "dimsum/core/static_error.hpp"
#include "dimsum/tensor/aligned_buffer.hpp"
#include "dimsum/tensor/tensor.hpp"

#ifndef DIMSUM_PRECOMPILED_KERNELS
#include "dimsum/backend/cpu/gemm.hpp"
#endif

namespace dimsum {

// The panels of one matrix, as the CPU's gemm reads them: what a packing owns.
template <class C>
struct matrix_panels {
    detail::aligned_buffer<C> memory;
    detail::aligned_buffer<bf16> pairs;  // a bf16 matrix's, for the bf16 instructions; else empty
    backend::cpu::packed_operand<C> operand;
    std::size_t bytes() const { return memory.size() * sizeof(C) + pairs.size() * sizeof(bf16); }
};

// The panels of w, in its compute type (float for bf16), shared by whoever reads them.
template <class T, class K, class N>
std::shared_ptr<const matrix_panels<compute_type_t<T>>> pack_panels(const tensor_view<const T, K, N>& w) {
    using C = compute_type_t<T>;
    const auto extents = w.shape().extents();
    const backend::cpu::matrix<const T> m{w.data(), extents[0], extents[1], w.strides()[0], w.strides()[1]};
    auto panels = std::make_shared<matrix_panels<C>>();
    panels->memory = detail::aligned_buffer<C>(backend::cpu::packed_elements<C>(m.rows, m.cols));
    panels->operand = backend::cpu::pack_operand<C, T>(m, panels->memory.data());
    if constexpr (std::is_same_v<T, bf16>) {
        if (const auto path = backend::cpu::current_bf16_path(); path != backend::cpu::bf16_path::widen) {
            panels->pairs = detail::aligned_buffer<bf16>(backend::cpu::pair_elements(m.rows, m.cols));
            panels->operand.pairs_kc = backend::cpu::pack_pairs(m, panels->pairs.data(), path);
            panels->operand.pairs = panels->pairs.data();
        }
    }
    return panels;
}

// A matrix (K, N) and, if given, its panels: a leaf of formulas (packed_leaf) that reads as the
// view everywhere but as a product's right operand on the CPU backend. Its panels belong to
// someone else (a layer's prepack()), who keeps them as long as formulas of it live.
template <class T, class K, class N>
class packed_view {
public:
    using shape_type = ::dimsum::shape<K, N>;
    using value_type = T;

    packed_view(const tensor_view<const T, K, N>& values, const matrix_panels<compute_type_t<T>>* panels)
        : values_(values), panels_(panels) {}
    const shape_type& shape() const { return values_.shape(); }
    const tensor_view<const T, K, N>& values() const { return values_; }
    const backend::cpu::packed_operand<compute_type_t<T>>* packed() const { return panels_ ? &panels_->operand : nullptr; }

private:
    tensor_view<const T, K, N> values_;
    const matrix_panels<compute_type_t<T>>* panels_;
};

// A matrix (K, N) packed once: what ds::prepack returns. The packed_view of its own panels,
// cheap to copy (the copies share the panels).
template <class T, class K, class N>
class prepacked : public packed_view<T, K, N> {
public:
    explicit prepacked(const tensor_view<const T, K, N>& w) : prepacked(w, pack_panels(w)) {}

    // The memory the panels hold.
    std::size_t bytes() const { return panels_->bytes(); }

private:
    using panels_type = std::shared_ptr<const matrix_panels<compute_type_t<T>>>;
    prepacked(const tensor_view<const T, K, N>& w, panels_type panels)
        : packed_view<T, K, N>(w, panels.get()), panels_(std::move(panels)) {}
    panels_type panels_;  // what the view points to, kept alive
};

// The panels of a layer's projections W_Q, W_K, W_V and W_O, as its prepack() keeps them
// (nn::multi_head_attention, dist::multi_head_attention).
template <class C>
struct projection_panels {
    std::shared_ptr<const matrix_panels<C>> w_q, w_k, w_v, w_o;

    std::size_t bytes() const { return w_q->bytes() + w_k->bytes() + w_v->bytes() + w_o->bytes(); }
    // One of them in `packing`, or none without a packing.
    static const matrix_panels<C>* of(const std::shared_ptr<const projection_panels>& packing,
                                      std::shared_ptr<const matrix_panels<C>> projection_panels::*which) {
        return packing ? ((*packing).*which).get() : nullptr;
    }
};

// The four projections packed: views of the weights, in the order W_Q, W_K, W_V, W_O.
template <class Q, class K, class V, class O>
auto pack_projections(const Q& w_q, const K& w_k, const V& w_v, const O& w_o) {
    using C = compute_type_t<typename Q::value_type>;
    return std::make_shared<const projection_panels<C>>(
        projection_panels<C>{pack_panels(w_q), pack_panels(w_k), pack_panels(w_v), pack_panels(w_o)});
}

namespace detail {
template <class>
inline constexpr fixed_string prepack_matrix{
    "dimsum: prepack: packs a matrix of two axes (the right operand of matmul), of float, double or bf16"};
template <class>
inline constexpr fixed_string prepack_temporary{
    "dimsum: prepack: every use of the packing but a product reads the matrix itself, so it takes a named "
    "tensor or a view, not a temporary"};
}  // namespace detail

// w packed once for `matmul(x, packed)`: w must outlive it and keep its values.
template <class T, class... A>
auto prepack(const tensor_view<T, A...>& w) {
    using V = std::remove_const_t<T>;
    if constexpr (sizeof...(A) != 2 || !evaluable_element<V>) {
        (void)sizeof(static_shape_error<detail::prepack_matrix<V>>);
    } else {
        return prepacked<V, A...>(tensor_view<const V, A...>(w));
    }
}
template <class T, class... A>
auto prepack(const tensor<T, A...>& w) {
    return prepack(w.view());
}
template <class T, class... A>
void prepack(tensor<T, A...>&&) {
    (void)sizeof(static_shape_error<detail::prepack_temporary<T>>);
}

}  // namespace dimsum
