#pragma once
// The gradients of a loss with respect to every parameter of a parameter struct
// (nn/parameter_struct.hpp), as a struct of the same type: one program computes the loss and
// every gradient, so what they share (the forward, and the adjoints of the steps above the
// parameters) is computed once, and the gradients are planned together.
//
//   ds::backward(loss, params, grads);          // grads := d loss / d params; returns the loss
//   block g = ds::gradients(loss, params);      // the same, into a new struct
//   ds::backward_from(layer(x), dy, std::tie(x, params), std::tie(dx, grads));  // one layer's
//
// A parameter the loss does not read gets a gradient of zeros. A bf16 model's gradients are
// computed in float and go into a float struct of the same layout (mixed precision).

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dimsum/backend/default.hpp"
#include "dimsum/evaluation/assign.hpp"
#include "dimsum/evaluation/differentiate.hpp"
#include "dimsum/evaluation/lower.hpp"
#include "dimsum/nn/parameter_struct.hpp"
#include "dimsum/shape/conform.hpp"

namespace dimsum {

namespace detail {

// A tensor differentiated with respect to, its type erased: how to lower its view into a
// program, and the memory it reads. backward lists a parameter struct's tensors so; a tape
// lists its own tensors too.
struct differentiated {
    const void* tensor;
    std::size_t (*lower)(const void* tensor, evaluation::program&, std::vector<evaluation::binding>&);
    evaluation::byte_range memory;
};

template <class T, class M>
differentiated differentiated_of(const M& leaf) {
    return {&leaf,
            [](const void* tensor, evaluation::program& p, std::vector<evaluation::binding>& bindings) {
                return evaluation::lower_step<T>(static_cast<const M*>(tensor)->view(), p, bindings);
            },
            evaluation::reach_of(leaf.view())};
}

// A program's memory and steps for the gradients of a struct, kept for their capacity.
template <class T>
struct struct_gradients {
    // the extents of each tensor differentiated, one after another (extent_ends[i]: where the
    // i-th's end): flat, so that a training step allocates nothing after its first
    std::vector<std::size_t> extents, extent_ends;
    std::vector<evaluation::strided<T>> destinations;  // each gradient's memory
    std::vector<differentiated> wrt;                   // the tensors differentiated, in the same order
    std::vector<std::size_t> leaf_steps, leaves, gradients;  // the parameters' steps and bindings, the gradients' steps
};

template <class T>
inline constexpr bool is_tuple = false;
template <class... T>
inline constexpr bool is_tuple<std::tuple<T...>> = true;

// Calls f(name, tensor) for each tensor of `leaves`, with their own constness: a tensor, a
// parameter struct (its tensors, optional ones where set), or a std::tuple of either
// (std::tie(x, params)), in order.
template <class Leaves, class F>
void for_each_tensor(Leaves& leaves, F&& f) {
    using L = std::remove_const_t<Leaves>;
    if constexpr (is_tensor<L>::value) {
        f(std::string("x"), leaves);
    } else if constexpr (is_tuple<L>) {
        std::apply([&](auto&... each) { (for_each_tensor(each, f), ...); }, leaves);
    } else {
        parameters::for_each_present(leaves, "", f);
    }
}

// Checks that `grads` holds a tensor for each of `leaves`' (for_each_tensor's order), of the
// same extents, none overlapping memory `output` reads; lists their memory in state.destinations.
template <class T, class Output, class Leaves, class Grads>
void match_gradients(const Output& output, const Leaves& leaves, Grads& grads, struct_gradients<T>& state, const char* op) {
    state.extents.clear();
    state.extent_ends.clear();
    state.destinations.clear();
    state.wrt.clear();
    for_each_tensor(leaves, [&]<class M>(const std::string&, const M& leaf) {
        static_assert(std::is_same_v<compute_type_t<std::remove_const_t<typename M::value_type>>, T>,
                      "dimsum: backward: every tensor differentiated holds the formula's element type (or bf16 in a formula that computes in float)");
        state.wrt.push_back(differentiated_of<T>(leaf));
        auto e = leaf.shape().extents();
        state.extents.insert(state.extents.end(), e.begin(), e.end());
        state.extent_ends.push_back(state.extents.size());
    });
    for_each_tensor(grads, [&]<class M>(const std::string& name, M& gradient) {
        static_assert(std::is_same_v<typename M::value_type, T>,
                      "dimsum: backward: gradients of the type the formula computes in (float for bf16 parameters)");
        const std::size_t i = state.destinations.size();
        auto e = gradient.shape().extents();
        const bool matches = i < state.extent_ends.size() && [&] {  // the i-th leaf's extents, from where the one before ends
            const auto kept = state.extents.begin();
            const std::size_t begin = i == 0 ? 0 : state.extent_ends[i - 1];
            return std::equal(e.begin(), e.end(), kept + std::ptrdiff_t(begin), kept + std::ptrdiff_t(state.extent_ends[i]));
        }();
        if (!matches) {
            throw std::invalid_argument(std::string("dimsum: ") + op + ": the gradients' " + name +
                                        " does not match its parameter (ds::gradients makes a matching struct)");
        }
        if (evaluation::reads(output, evaluation::reach_of(gradient.view()))) {
            throw std::invalid_argument(std::string("dimsum: ") + op + ": the gradients' " + name + " overlaps memory the formula reads");
        }
        state.destinations.push_back(evaluation::to_strided(gradient.view()));
    });
    if (state.destinations.size() != state.extent_ends.size()) {
        throw std::invalid_argument(std::string("dimsum: ") + op + ": the gradients' struct does not hold a tensor for every parameter");
    }
}

// Throws unless no binding but `leaf` overlaps leaf's memory: a tensor the formula reads that
// shares memory with a leaf, but that no views of the leaf express, would leave the leaf's
// gradient zeros where it is not.
inline void check_not_read_through_a_view(const std::vector<evaluation::binding>& bindings, std::size_t leaf) {
    auto reach = [](const evaluation::binding& b) {
        const std::size_t size = evaluation::size_of(b.type);
        const auto range = ::dimsum::detail::reach(b.where.extents.data(), b.where.strides.data(), b.where.rank);
        const auto base = reinterpret_cast<std::uintptr_t>(b.data) + static_cast<std::uintptr_t>(b.where.offset * std::ptrdiff_t(size));
        if (!range) return evaluation::byte_range{0, UINTPTR_MAX};
        return evaluation::byte_range{base + static_cast<std::uintptr_t>(range->first * std::ptrdiff_t(size)),
                                      base + static_cast<std::uintptr_t>(range->second * std::ptrdiff_t(size))};
    };
    const evaluation::byte_range of_leaf = reach(bindings[leaf]);
    for (std::size_t b = 0; b < bindings.size(); ++b) {
        if (b != leaf && reach(bindings[b]).overlaps(of_leaf)) {
            throw std::invalid_argument("dimsum: backward: the formula reads a view of a tensor it differentiates that no "
                                        "transpose, select, slice or view of it expresses: differentiate with respect to that view");
        }
    }
}

// Lowers `output` into p, the tensors of `wrt` first (a view of one lowers to views of its
// step), then `cotangent` and the reverse sweep: state.gradients, one step per tensor of wrt
// (zeros for one output does not read). Returns output's step.
template <class T, class Output, class Cotangent>
std::size_t lower_gradients(evaluation::program& p, std::vector<evaluation::binding>& bindings, const Output& output,
                            const Cotangent& cotangent, std::span<const differentiated> wrt, struct_gradients<T>& state,
                            gradient_options options) {
    p.clear();
    bindings.clear();
    state.leaf_steps.clear();
    state.leaves.clear();
    for (const differentiated& leaf : wrt) {
        const std::size_t id = leaf.lower(leaf.tensor, p, bindings);
        state.leaf_steps.push_back(id);
        state.leaves.push_back(p.steps[id].binding);
    }
    p.differentiated = state.leaf_steps;
    const std::size_t root = evaluation::lower_step<T>(output, p, bindings);
    p.differentiated.clear();
    const std::size_t seed = evaluation::lower_step<T>(cotangent, p, bindings);
    evaluation::differentiate(p, root, seed, state.leaves, state.gradients, options);
    evaluation::differentiation::builder steps(p, p.steps[root].computes_in);
    for (std::size_t i = 0; i < state.gradients.size(); ++i) {
        if (state.gradients[i] != evaluation::no_step) continue;
        check_not_read_through_a_view(bindings, state.leaves[i]);
        const std::size_t zero = steps.number(0);  // not read at all: zeros
        const evaluation::step leaf = p.steps[state.leaf_steps[i]];
        state.gradients[i] = steps.expand(zero, leaf);
    }
    p.binding_count = bindings.size();
    return root;
}

// One program on `backend`: the vector-Jacobian products of `output` for `cotangent` with
// respect to the tensors of `wrt`, into `gradients` (one each); with `value` (output then a
// loss, of no axes), output's value there too, as the program's root.
template <class T, class Backend, class Output, class Cotangent>
void run_gradients(Backend& backend, const Output& output, const Cotangent& cotangent, std::span<const differentiated> wrt,
                   std::span<const evaluation::strided<T>> gradients, struct_gradients<T>& state,
                   const evaluation::strided<T>* value = nullptr, gradient_options options = {}) {
    auto lower = [&](evaluation::program& p, std::vector<evaluation::binding>& bindings) {
        const std::size_t root = lower_gradients<T>(p, bindings, output, cotangent, wrt, state, options);
        if (value) {
            p.root = root;
            p.other_roots = state.gradients;
        } else {
            p.root = state.gradients[0];
            p.other_roots.assign(state.gradients.begin() + 1, state.gradients.end());
        }
    };
    if (value) backend.run_program(lower, *value, gradients);
    else backend.run_program(lower, gradients[0], gradients.subspan(1));
}

}  // namespace detail

// grads := the gradient of `loss` (a formula of no axes, of float, double or bf16) with
// respect to each tensor of `params`: a parameter struct, a tensor, or a std::tuple of them
// (std::tie(x, params)); `grads` holds tensors of the same extents in the same order, of the
// type the loss computes in (a struct of the same type: ds::gradients makes one; for bf16
// parameters, the float struct of the same layout), which do not overlap the formula's memory.
// Returns the loss's value. One evaluation on `backend` (the CPU backend, the reference
// backend, or the CUDA backend): the loss is the program's root, each gradient another root,
// planned together. `options` (gradient_options): with .bf16_products, a gradient's product
// beside a bf16 operand reads the cotangent rounded to bf16, as PyTorch's autocast does.
template <class Loss, class Params, class Grads, class Backend = default_backend>
auto backward(const Loss& loss, const Params& params, Grads&& grads, gradient_options options, Backend backend = {}) {
    using T = compute_type_t<value_type_of<Loss>>;
    static_assert(shape_of<Loss>::rank == 0, "dimsum: backward: the loss must be a formula of no axes (a scalar): sum it");
    static_assert(floating_element<T>, "dimsum: backward: a loss of float, double or bf16");
    thread_local detail::struct_gradients<T> state;  // kept for its capacity
    detail::match_gradients(loss, params, grads, state, "backward");
    T value{};
    const evaluation::strided<T> loss_value{&value, evaluation::row_major(0, {})};
    detail::run_gradients<T>(backend, loss, expr::scalar<T>{1, {}}, state.wrt, state.destinations, state, &loss_value, options);
    return value;
}
template <class Loss, class Params, class Grads, class Backend = default_backend>
    requires(!std::is_same_v<Backend, gradient_options>)
auto backward(const Loss& loss, const Params& params, Grads&& grads, Backend backend = {}) {
    return backward(loss, params, std::forward<Grads>(grads), gradient_options{}, backend);
}

// grads := the vector-Jacobian products of `output` (any formula of float, double or bf16) with
// respect to each tensor of `leaves` (as for backward), given `cotangent`, a formula of
// output's shape: one layer's backward, from the gradient of what the layer computed, in
// one program. E.g. backward_from(layer(x), dy, std::tie(x, params), std::tie(dx, grads)).
template <class Output, class Cotangent, class Leaves, class Grads, class Backend = default_backend>
void backward_from(const Output& output, const Cotangent& cotangent, const Leaves& leaves, Grads&& grads, gradient_options options,
                   Backend backend = {}) {
    using T = compute_type_t<value_type_of<Output>>;
    static_assert(floating_element<T>, "dimsum: backward_from: a formula of float, double or bf16");
    constexpr message shapes = ::dimsum::detail::conform_error<shape_of<Output>, shape_of<Cotangent>>("backward_from");
    static_assert(shapes.length == 0, "dimsum: backward_from: the cotangent has other axes than the formula");
    if (output.shape().extents() != cotangent.shape().extents()) {
        throw shape_error("dimsum: backward_from: the cotangent's extents are not the formula's");
    }
    thread_local detail::struct_gradients<T> state;
    detail::match_gradients(output, leaves, grads, state, "backward_from");
    if (state.destinations.empty()) return;
    detail::run_gradients<T>(backend, output, cotangent, state.wrt, state.destinations, state, nullptr, options);
}
template <class Output, class Cotangent, class Leaves, class Grads, class Backend = default_backend>
    requires(!std::is_same_v<Backend, gradient_options>)
void backward_from(const Output& output, const Cotangent& cotangent, const Leaves& leaves, Grads&& grads, Backend backend = {}) {
    backward_from(output, cotangent, leaves, std::forward<Grads>(grads), gradient_options{}, backend);
}

// The gradients of `loss` with respect to the tensors of `params` (of float or double), as a
// new struct of the same type (ds::backward into it).
template <class Loss, class Params, class Backend = default_backend>
Params gradients(const Loss& loss, const Params& params, Backend backend = {}) {
    Params grads = params;  // the same extents (and optional members set alike); overwritten
    backward(loss, params, grads, backend);
    return grads;
}

}  // namespace dimsum
