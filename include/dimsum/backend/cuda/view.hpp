#pragma once
// A view of GPU memory (cuda::view<T, Axes...>): extents and strides over device addresses, a
// leaf of formulas that only the CUDA backend reads (core/concepts.hpp: device_leaf). Owning
// device tensors and the copies between host and device are in tensor.hpp.

#include <cstddef>
#include <type_traits>

#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum::backend::cuda {

template <class T, class... Axes>
class view;

// The device view of a shape type's axes.
template <class T, class S>
struct device_view_of_shape;
template <class T, class... A>
struct device_view_of_shape<T, ::dimsum::shape<A...>> {
    using type = view<T, A...>;
};

// Device memory seen through extents and strides (in elements), like tensor_view.
template <class T, class... Axes>
class view {
public:
    using shape_type = ::dimsum::shape<Axes...>;
    using value_type = std::remove_const_t<T>;
    using element_type = T;
    static constexpr std::size_t rank = shape_type::rank;
    using strides_type = ::dimsum::strides_t<rank>;

    view(T* device_data, const shape_type& s, const strides_type& strides) : memory_(device_data, s, strides) {}
    view(T* device_data, const shape_type& s) : memory_(device_data, s) {}
    template <class U>
        requires std::is_same_v<const U, T>
    view(const view<U, Axes...>& other) : memory_(other.device_memory()) {}

    const shape_type& shape() const { return memory_.shape(); }
    const strides_type& strides() const { return memory_.strides(); }
    std::size_t extent(std::size_t i) const { return memory_.extent(i); }
    std::size_t size() const { return shape().size(); }
    T* data() const { return memory_.data(); }  // a device address
    // The same memory with another shape of the same axes (what assignment checks conform).
    template <class S>
    auto with_shape(const S& s) const {
        return typename device_view_of_shape<T, S>::type(memory_.data(), s, memory_.strides());
    }

    // A view of the same memory of shape S over `first` (ops/: transpose, slice, select).
    template <class S, class P>
    auto rewrap(P* first, const S& s, const ::dimsum::strides_t<S::rank>& strides) const {
        return typename device_view_of_shape<P, S>::type(first, s, strides);
    }

    // For lowering and aliasing checks only: a host view type over device addresses.
    const tensor_view<T, Axes...>& device_memory() const { return memory_; }

private:
    tensor_view<T, Axes...> memory_;
};

// A host view's device twin, the same shape and strides.
template <class T, class... A>
view<T, A...> as_device_view(const tensor_view<T, A...>& v) {
    return {v.data(), v.shape(), v.strides()};
}

}  // namespace dimsum::backend::cuda
