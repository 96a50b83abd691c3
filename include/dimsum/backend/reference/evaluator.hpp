#pragma once
// The reference backend: obviously correct, the oracle every fast backend is tested against.
// It stays in the tree.
//
// It walks a formula bottom-up. An operand is either read element by element through a
// "reader" (tensors, views, numbers, masks and elementwise nodes over them) or first
// materialised into a temporary by a kernel (matmul, softmax, reductions). transpose and view
// of a materialised value permute or reshape its strides without copying where the layout
// allows. The kernels (kernels.hpp) see only strided arrays.

#include <memory>
#include <tuple>
#include <type_traits>

#include "dimsum/backend/reference/kernels.hpp"
#include "dimsum/backend/reference/reshape_strides.hpp"
#include "dimsum/evaluation/assign.hpp"
#include "dimsum/expr/nodes.hpp"

namespace dimsum::backend::reference {

// Which kind of node a type is.
template <class T> inline constexpr bool is_matmul = false;
template <class S, class L, class R> inline constexpr bool is_matmul<expr::matmul<S, L, R>> = true;
template <class T> inline constexpr bool is_softmax = false;
template <std::size_t I, class O> inline constexpr bool is_softmax<expr::softmax<I, O>> = true;
template <class T> inline constexpr bool is_reduce = false;
template <class S, class F, std::size_t I, class O> inline constexpr bool is_reduce<expr::reduce<S, F, I, O>> = true;
template <class T> inline constexpr bool is_permute = false;
template <class S, auto O, class X> inline constexpr bool is_permute<expr::permute<S, O, X>> = true;
template <class T> inline constexpr bool is_reshape = false;
template <class S, class X> inline constexpr bool is_reshape<expr::reshape<S, X>> = true;
template <class T> inline constexpr bool is_select = false;
template <class S, std::size_t I, class X> inline constexpr bool is_select<expr::select<S, I, X>> = true;
template <class T> inline constexpr bool is_scalar = false;
template <class T> inline constexpr bool is_scalar<expr::scalar<T>> = true;
template <class T> inline constexpr bool is_mask = false;
template <class Q, class K> inline constexpr bool is_mask<expr::causal_mask<Q, K>> = true;
template <class T> inline constexpr bool is_elementwise = false;
template <class S, class F, class... O> inline constexpr bool is_elementwise<expr::elementwise<S, F, O...>> = true;

template <class T> struct function_of;  // the functor of an elementwise or reduce node
template <class S, class F, class... O> struct function_of<expr::elementwise<S, F, O...>> { using type = F; };
template <class S, class F, std::size_t I, class O> struct function_of<expr::reduce<S, F, I, O>> { using type = F; };

// Readers: read(index) takes an index of the output's rank; each reader reads its operand
// broadcast to that rank.
template <class T>
struct strided_reader {
    materialized<T> operand;  // already broadcast to the output's rank
    T read(const std::size_t* index) const { return operand.value.at(index); }
};

template <class T>
struct scalar_reader {
    T value;
    T read(const std::size_t*) const { return value; }
};

// True where key k lies in query q's future: k > q + (keys - queries).
struct causal_mask_reader {
    std::size_t queries, keys, query_axis;  // query_axis: position in the output index
    bool read(const std::size_t* index) const {
        long long q = queries == 1 ? 0 : static_cast<long long>(index[query_axis]);
        long long k = keys == 1 ? 0 : static_cast<long long>(index[query_axis + 1]);
        return k > q + static_cast<long long>(keys) - static_cast<long long>(queries);
    }
};

template <class F, class... Readers>
struct elementwise_reader {
    std::tuple<Readers...> operands;
    auto read(const std::size_t* index) const {
        return std::apply([&](const auto&... r) { return F{}(r.read(index)...); }, operands);
    }
};

class evaluator {
public:
    // Writes the value of e into dst, a view of e's shape that e does not read.
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        run_into(e, to_strided(dst));
    }

private:
    template <class E, class T>
    void run_into(const E& e, strided<T> dst) {
        if constexpr (is_matmul<E>) {
            auto a = materialize(std::get<0>(e.operands)), b = materialize(std::get<1>(e.operands));
            matmul<T>(broadcast_to_rank(a.value, dst.rank), broadcast_to_rank(b.value, dst.rank), dst);
        } else if constexpr (is_softmax<E>) {
            softmax<T>(materialize(std::get<0>(e.operands)).value, dst, E::axis);
        } else if constexpr (is_reduce<E>) {
            reduce<typename function_of<E>::type, T>(materialize(std::get<0>(e.operands)).value, dst, E::axis);
        } else {
            auto reader = make_reader(e, dst.rank);
            for_each_index(dst.extents, dst.rank, [&](const std::size_t* index) {
                dst.at(index) = static_cast<T>(reader.read(index));
            });
        }
    }

    // The value of a node as a strided array, computed into a temporary only when it is not
    // already one (tensors, views, and transposes or views of them).
    template <class E>
    auto materialize(const E& e) -> materialized<value_type_of<E>> {
        using T = value_type_of<E>;
        if constexpr (is_tensor_view<E>::value) {
            return {to_strided(e), nullptr};
        } else if constexpr (is_tensor<E>::value) {
            return {to_strided(e.view()), nullptr};
        } else if constexpr (is_permute<E>) {
            auto m = materialize(std::get<0>(e.operands));
            auto permuted = m.value;
            for (std::size_t i = 0; i < E::order.size(); ++i) {
                permuted.extents[i] = m.value.extents[E::order[i]];
                permuted.strides[i] = m.value.strides[E::order[i]];
            }
            return {permuted, m.owner};
        } else if constexpr (is_select<E>) {
            auto m = materialize(std::get<0>(e.operands));
            auto sliced = m.value;
            sliced.data += static_cast<std::ptrdiff_t>(e.index) * m.value.strides[E::axis];
            sliced.rank -= 1;
            for (std::size_t i = E::axis; i < sliced.rank; ++i) {
                sliced.extents[i] = m.value.extents[i + 1];
                sliced.strides[i] = m.value.strides[i + 1];
            }
            return {sliced, m.owner};
        } else if constexpr (is_reshape<E>) {
            auto m = materialize(std::get<0>(e.operands));
            if (!reshape_in_place(m.value, e.shape().extents())) {
                m = copy_contiguous(m.value);
                reshape_in_place(m.value, e.shape().extents());
            }
            return m;
        } else {
            auto result = std::make_shared<tensor_of_shape_t<T, shape_of<E>>>(e.shape());
            run(e, result->view());
            return {to_strided(std::as_const(*result).view()), result};
        }
    }

    template <class T, std::size_t R>
    static bool reshape_in_place(strided<const T>& s, const std::array<std::size_t, R>& extents) {
        if (s.size() == 0) {
            s.rank = R;
            for (std::size_t i = 0; i < R; ++i) s.extents[i] = extents[i];
            return true;  // nothing to read
        }
        auto strides = reshape_strides(s.extents, s.strides, s.rank, extents);
        if (!strides) return false;
        s.rank = R;
        for (std::size_t i = 0; i < R; ++i) {
            s.extents[i] = extents[i];
            s.strides[i] = (*strides)[i];
        }
        return true;
    }

    template <class T>
    static materialized<T> copy_contiguous(const strided<const T>& s) {
        auto storage = std::shared_ptr<T[]>(new T[s.size()]);
        strided<T> out{storage.get(), s.rank, s.extents, {}};
        std::ptrdiff_t step = 1;
        for (std::size_t i = s.rank; i-- > 0;) {
            out.strides[i] = step;
            step *= static_cast<std::ptrdiff_t>(s.extents[i]);
        }
        for_each_index(s.extents, s.rank, [&](const std::size_t* index) { out.at(index) = s.at(index); });
        strided<const T> value{out.data, out.rank, out.extents, out.strides};
        return {value, storage};
    }

    // A reader for operand e of an output of the given rank.
    template <class E>
    auto make_reader(const E& e, std::size_t rank) {
        if constexpr (is_scalar<E>) {
            return scalar_reader<typename E::value_type>{e.value};
        } else if constexpr (is_mask<E>) {
            return causal_mask_reader{e.shape().extent(0), e.shape().extent(1), rank - 2};
        } else if constexpr (is_elementwise<E>) {
            return std::apply(
                [&](const auto&... operand) {
                    using reader = elementwise_reader<typename function_of<E>::type, decltype(make_reader(operand, rank))...>;
                    return reader{{make_reader(operand, rank)...}};
                },
                e.operands);
        } else {
            auto m = materialize(e);
            m.value = broadcast_to_rank(m.value, rank);
            return strided_reader<value_type_of<E>>{m};
        }
    }
};

}  // namespace dimsum::backend::reference
