#pragma once
// The owning tensor: row-major, contiguous, 64-byte aligned; float or double, or int32 or
// int64 for indices and lengths (core/element_type.hpp).

#include <algorithm>
#include <type_traits>

#include "dimsum/core/concepts.hpp"
#include "dimsum/core/element_type.hpp"
#include "dimsum/shape/conform.hpp"
#include "dimsum/tensor/aligned_buffer.hpp"
#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum {

template <class T, axis_type... Axes>
class tensor {
    static_assert(tensor_element<T>, "dimsum: tensor: the element type must be float, double, bf16, int32_t or int64_t");

public:
    using shape_type = ::dimsum::shape<Axes...>;
    using value_type = T;
    static constexpr std::size_t rank = shape_type::rank;

    // With every axis static, the full tensor; otherwise empty until given extents.
    tensor() : tensor(shape_type{}) {}

    // `tensor<float, Batch, Seq, Model> x(Batch{8}, Seq{128});` zero-filled.
    template <axis_type... Given>
        requires(sizeof...(Given) > 0)
    explicit tensor(Given... given) : tensor(shape_type(given...)) {}

    // Every value, in row-major order, for a tensor whose extents are all static:
    // `tensor<float, Seq, Model> x({1.0, 0.5, ...});` The count is checked at compile time.
    template <std::size_t N>
        requires(shape_type::dynamic_count == 0)
    explicit tensor(const T (&values)[N]) : tensor() {
        constexpr std::size_t expected = [] {
            std::size_t n = 1;
            for (axis_desc a : shape_type::axes) n *= a.extent;
            return n;
        }();
        if constexpr (N != expected) {
            constexpr message error = [] {
                message m;
                m << "dimsum: tensor: " << N << " values given for ";
                write_static_shape<shape_type>(m) << ", which holds " << expected;
                return m;
            }();
            fail<error>();
        } else {
            std::copy_n(values, N, buffer_.data());
        }
    }

    explicit tensor(const shape_type& s) : shape_(s), buffer_(s.size()) {
        (void)row_major_strides(s);  // a shape_error, now, if offsets would overflow ptrdiff_t
    }

    // `tensor<...> y = formula;` evaluates the formula.
    template <operand E>
        requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
    tensor(const E& e, call_site caller = call_site::current()) {
        detail::operation_site site(caller);
        if constexpr (!is_invalid<E>) {
            constexpr message error = detail::conform_error<shape_type, typename E::shape_type>("assign");
            if constexpr (error.length != 0) {
                fail<error>();
            } else {
                *this = tensor(detail::conform_extents<shape_type>(e.shape(), "assign"));
                assign(view(), e);
            }
        }
    }

    tensor(const tensor&) = default;
    tensor(tensor&&) noexcept = default;
    tensor& operator=(const tensor& other) = default;
    tensor& operator=(tensor&& other) noexcept = default;

    // `y = formula;` evaluates it, correctly even when the formula reads y; y takes the
    // formula's run-time extents.
    template <operand E>
        requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
    tensor& operator=(const E& e) {
        if constexpr (!is_invalid<E>) {
            // an operator cannot learn its caller's line: its errors name none
            if constexpr (E::shape_type::rank != rank) {
                tensor checked(e, call_site::unknown());  // reports the mismatch
            } else if (e.shape().extents() == shape_.extents()) {
                assign(view(), e, call_site::unknown());
            } else {
                tensor resized(e, call_site::unknown());
                *this = std::move(resized);
            }
        }
        return *this;
    }

    tensor_view<T, Axes...> view() { return {buffer_.data(), shape_}; }
    tensor_view<const T, Axes...> view() const { return {buffer_.data(), shape_}; }

    T* data() { return buffer_.data(); }
    const T* data() const { return buffer_.data(); }
    const shape_type& shape() const { return shape_; }
    std::size_t extent(std::size_t i) const { return shape_.extent(i); }
    std::size_t size() const { return buffer_.size(); }
    strides_t<rank> strides() const { return row_major_strides(shape_); }

    template <std::integral... I>
        requires(sizeof...(I) == rank)
    T& operator()(I... index) { return view()(index...); }
    template <std::integral... I>
        requires(sizeof...(I) == rank)
    const T& operator()(I... index) const { return view()(index...); }

    void fill(T value) { std::fill_n(buffer_.data(), buffer_.size(), value); }

private:
    shape_type shape_{};
    detail::aligned_buffer<T> buffer_;
};

template <class T>
struct is_tensor : std::false_type {};
template <class T, class... A>
struct is_tensor<tensor<T, A...>> : std::true_type {};

// The tensor type that holds a given shape type.
template <class T, class S>
struct tensor_of_shape;
template <class T, class... A>
struct tensor_of_shape<T, shape<A...>> {
    using type = tensor<T, A...>;
};
template <class T, class S>
using tensor_of_shape_t = typename tensor_of_shape<T, S>::type;

}  // namespace dimsum
