#pragma once
// Tensors in GPU memory, whose location is part of their type: cuda::tensor<T, Axes...> owns
// device memory, cuda::view<T, Axes...> sees it through strides. Both are leaves of formulas
// (core/concepts.hpp: device_leaf) like host tensors, but only the CUDA backend reads them: a
// formula over one evaluated on the CPU or reference backend is one compile error,
//     dimsum: this formula reads GPU memory (a cuda::tensor or a view of one), which this
//     backend cannot: evaluate it with ds::backend::cuda::evaluator, ...
// The host never dereferences their memory; there is no element access. Copies are explicit:
// to_device(host tensor or view) and to_host(device tensor or view), on the calling thread's
// stream, synchronous. No managed memory.
//
//   auto w_gpu = cuda::to_device(w);                  // (model, hidden), once
//   auto y_gpu = cuda::eval(ds::gelu(ds::matmul(x_gpu, w_gpu) + b_gpu));
//   ds::tensor<float, Batch, Seq, Hidden> y = cuda::to_host(y_gpu);

#include <cstddef>
#include <utility>

#include "dimsum/backend/cuda/evaluator.hpp"
#include "dimsum/backend/cuda/kernels.hpp"
#include "dimsum/backend/cuda/view.hpp"
#include "dimsum/evaluation/convert.hpp"
#include "dimsum/evaluation/assign.hpp"
#include "dimsum/tensor/tensor.hpp"
#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum::backend::cuda {

// Owning device memory, row-major; moved, never copied implicitly (to_device, eval).
template <class T, class... Axes>
class tensor {
public:
    using shape_type = ::dimsum::shape<Axes...>;
    using value_type = T;
    static constexpr std::size_t rank = shape_type::rank;

    explicit tensor(const shape_type& s) : shape_(s), data_(static_cast<T*>(allocate_memory(s.size() * sizeof(T)))) {}
    template <class... Given>
        requires(sizeof...(Given) > 0 && (std::is_class_v<Given> && ...))
    explicit tensor(Given... given) : tensor(shape_type(given...)) {}
    tensor(tensor&& other) noexcept : shape_(other.shape_), data_(std::exchange(other.data_, nullptr)) {}
    tensor& operator=(tensor&& other) noexcept {
        std::swap(shape_, other.shape_);
        std::swap(data_, other.data_);
        return *this;
    }
    tensor(const tensor&) = delete;
    tensor& operator=(const tensor&) = delete;
    ~tensor() { free_memory(data_); }

    const shape_type& shape() const { return shape_; }
    std::size_t size() const { return shape_.size(); }
    T* data() { return data_; }
    const T* data() const { return data_; }
    view<T, Axes...> view_of() { return {data_, shape_}; }
    view<const T, Axes...> view_of() const { return {data_, shape_}; }
    // In formulas: read-only, like a host tensor read by name.
    tensor_view<const T, Axes...> device_memory() const { return {data_, shape_}; }

private:
    shape_type shape_;
    T* data_;
};

template <class T, class S>
struct device_tensor_of_shape;
template <class T, class... A>
struct device_tensor_of_shape<T, ::dimsum::shape<A...>> {
    using type = tensor<T, A...>;
};

// Views: `cuda::view_of(t)`.
template <class T, class... A>
view<T, A...> view_of(tensor<T, A...>& t) { return t.view_of(); }
template <class T, class... A>
view<const T, A...> view_of(const tensor<T, A...>& t) { return t.view_of(); }

// A host tensor or view copied to the device (row-major).
template <class T, class... A>
tensor<std::remove_const_t<T>, A...> to_device(const tensor_view<T, A...>& host) {
    using V = std::remove_const_t<T>;
    tensor<V, A...> device(host.shape());
    context& c = this_thread_context();
    const auto from = evaluation::to_strided(tensor_view<const V, A...>(host));
    if (evaluation::is_row_major(from)) {
        upload(c, device.data(), host.data(), device.size() * sizeof(V));
    } else {  // strided: gathered row-major on the host first
        ::dimsum::tensor<V, A...> contiguous(host.shape());
        evaluation::convert_each(from, evaluation::to_strided(contiguous.view()), [](V x) { return x; });
        upload(c, device.data(), contiguous.data(), device.size() * sizeof(V));
    }
    finish(c);
    return device;
}
template <class T, class... A>
tensor<T, A...> to_device(const ::dimsum::tensor<T, A...>& host) { return to_device(host.view()); }

// A device tensor or view copied to a new host tensor.
template <class T, class... A>
::dimsum::tensor<std::remove_const_t<T>, A...> to_host(const view<T, A...>& device) {
    using V = std::remove_const_t<T>;
    ::dimsum::tensor<V, A...> host(device.shape());
    evaluator gpu;
    gpu.run(view<const V, A...>(device), host.view());  // a copy entry, then the download
    return host;
}
template <class T, class... A>
::dimsum::tensor<T, A...> to_host(const tensor<T, A...>& device) { return to_host(device.view_of()); }

// The value of a formula as a new device tensor, and a formula stored into device memory.
template <operand E>
auto eval(const E& e, evaluator gpu = {}) {
    using V = value_type_of<E>;
    typename device_tensor_of_shape<V, shape_of<E>>::type result(e.shape());
    gpu.run(e, result.view_of());
    return result;
}
template <class T, class... A, operand E>
void assign(const view<T, A...>& dst, const E& e, evaluator gpu = {}) {
    evaluation::assign_with(gpu, dst, e);
}
template <class T, class... A, operand E>
void assign(tensor<T, A...>& dst, const E& e, evaluator gpu = {}) {
    evaluation::assign_with(gpu, dst.view_of(), e);
}

}  // namespace dimsum::backend::cuda
