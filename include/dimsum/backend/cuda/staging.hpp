#pragma once
// What crosses between host and device around one evaluation of the CUDA backend, besides
// the value itself: each host tensor a formula reads, copied to device memory before the plan
// runs ("staging"), and the ids of device tensors that a gather (or a scatter, its gradient)
// reads, copied to the host so that the host checks them before anything runs
// (evaluation/integers.hpp). A copy moves the bytes a
// binding's layout reaches, from its lowest offset to its highest, and keeps the layout.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "dimsum/backend/cuda/kernels.hpp"
#include "dimsum/evaluation/plan.hpp"
#include "dimsum/tensor/tensor_view.hpp"  // detail::reach

namespace dimsum::backend::cuda::detail {

// The bytes a binding's layout reaches: from `first` (in bytes from its data), `bytes` of them.
// tensor_view's reach, overflow-checked.
struct byte_span {
    std::ptrdiff_t first = 0;
    std::size_t bytes = 0;
};
inline byte_span span_of(const evaluation::binding& b) {
    const auto range = dimsum::detail::reach(b.where.extents.data(), b.where.strides.data(), b.where.rank);
    if (!range) throw std::length_error("dimsum: cuda: a tensor whose strides reach past what an offset can hold");
    const auto element = static_cast<std::ptrdiff_t>(size_of(b.type));
    return {(b.where.offset + range->first) * element, static_cast<std::size_t>((range->second - range->first) * element)};
}

// device[i] := where binding i's element 0 lies in device memory: a host binding's elements
// copied into the arena, a device binding where it is (an empty one: 0).
inline void upload_bindings(context& c, const std::vector<evaluation::binding>& bindings, std::vector<std::uintptr_t>& device) {
    device.assign(bindings.size(), 0);
    for (std::size_t i = 0; i < bindings.size(); ++i) {
        const evaluation::binding& b = bindings[i];
        if (b.on_device) {
            device[i] = reinterpret_cast<std::uintptr_t>(b.data);
            continue;
        }
        if (b.where.size() == 0 || !b.data) continue;
        const byte_span span = span_of(b);
        void* copy = allocate(c, span.bytes);
        upload(c, copy, static_cast<const char*>(b.data) + span.first, span.bytes);  // host memory: in bounds
        device[i] = reinterpret_cast<std::uintptr_t>(copy) - static_cast<std::uintptr_t>(span.first);
    }
}

// The bindings as the host can check them: `bindings` itself, or, where a gather of the plan
// (or a scatter, a gather's gradient) reads ids on the device, a copy of it (`checked`) whose
// ids are copied into host memory (`host_ids`, kept for its capacity).
inline const std::vector<evaluation::binding>& host_checkable(context& c, const std::vector<evaluation::binding>& bindings,
                                                              const evaluation::plan& plan, std::vector<evaluation::binding>& checked,
                                                              std::vector<std::vector<std::byte>>& host_ids) {
    bool any = false;
    for (const evaluation::binding& b : bindings) any = any || b.on_device;
    if (!any) return bindings;
    checked = bindings;
    host_ids.resize(bindings.size());
    for (const evaluation::entry& e : plan.entries) {
        if (e.kind != evaluation::entry_kind::gather && e.kind != evaluation::entry_kind::scatter) continue;
        const std::size_t id = e.operands[1].index;  // the ids' binding
        evaluation::binding& b = checked[id];
        if (!b.on_device || b.where.size() == 0) continue;
        const byte_span span = span_of(b);
        std::vector<std::byte>& copy = host_ids[id];
        copy.resize(span.bytes);
        const auto first = reinterpret_cast<std::uintptr_t>(b.data) + static_cast<std::uintptr_t>(span.first);
        download(c, copy.data(), reinterpret_cast<const void*>(first), copy.size());
        // the same layout over the copy: the element at the lowest offset is the copy's first
        b.data = reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(copy.data()) - static_cast<std::uintptr_t>(span.first));
        b.on_device = false;
    }
    return checked;
}

}  // namespace dimsum::backend::cuda::detail
