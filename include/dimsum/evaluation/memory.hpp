#pragma once
// The memory a plan's places name, bound for one evaluation: the one way every executor (the
// CPU's, the CUDA backend's, the reference interpreter) turns a place into an address. A place
// says which memory (a binding, a temporary, the destination), its layout there and its
// element type; the executor fills in where each binding, temporary and the destination
// start, then asks here. Addresses are integers, so that a GPU's memory, never dereferenced
// on the host, is bound the same way.

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "dimsum/evaluation/plan.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::evaluation {

struct bound_memory {
    std::vector<std::uintptr_t> bindings;     // where each binding's element 0 lies
    std::vector<std::uintptr_t> temporaries;  // where each of plan::temporaries starts
    // where each destination's element 0 lies: the root's, then those of program::other_roots
    std::vector<std::uintptr_t> destinations;

    // The destinations: the root's memory, then each other root's (program::other_roots).
    template <class T>
    void bind_destinations(std::uintptr_t root, std::span<const strided<T>> others) {
        destinations.assign(1, root);
        for (const strided<T>& other : others) destinations.push_back(reinterpret_cast<std::uintptr_t>(other.data));
    }

    // Each binding's own memory (host memory, or a GPU's where the binding is on the device).
    void bind(const std::vector<binding>& from) {
        bindings.clear();
        for (const binding& b : from) bindings.push_back(reinterpret_cast<std::uintptr_t>(b.data));
    }

    // The start of the memory place p names (its element at offset 0).
    std::uintptr_t start_of(const place& p) const {
        switch (p.memory) {
            case memory_kind::binding: return bindings[p.index];
            case memory_kind::temporary: return temporaries[p.index];
            case memory_kind::destination: break;
        }
        return destinations[p.index];
    }
    // The same, for memory an entry writes: never a binding.
    std::uintptr_t writable_start_of(const place& p) const {
        if (p.memory == memory_kind::binding) throw std::logic_error("dimsum: a plan writes to a tensor it reads");
        return start_of(p);
    }
};

// Host memory at place p, of T (the place's type must be T's): what a kernel writes, or reads.
template <class T>
strided<T> written_at(const bound_memory& m, const place& p) {
    if (p.type != element_type_of<T>()) throw std::logic_error("dimsum: a plan writes another type than its kernel's");
    return strided_at(reinterpret_cast<T*>(m.writable_start_of(p)), p.where);
}
template <class T>
strided<const T> read_at(const bound_memory& m, const place& p) {
    if (p.type != element_type_of<T>()) throw std::logic_error("dimsum: a plan reads another type as its own");
    return strided_at(reinterpret_cast<const T*>(m.start_of(p)), p.where);
}

}  // namespace dimsum::evaluation
