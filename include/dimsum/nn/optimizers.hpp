#pragma once
// Optimizers over parameter structs (nn/parameter_struct.hpp), as torch.optim computes them:
// SGD with momentum and AdamW, each one pass over each parameter tensor, in place; and the
// clipping of gradients by their global norm. An optimizer's state is a parameter struct too
// (the moments, of the parameters' type, and the number of steps taken), so ds::save and
// ds::load keep it beside the parameters, and a run resumed from saved parameters and state
// continues bit for bit: each element's update depends on that element alone, whatever the
// threads.
//
//   ds::nn::adamw opt(params, {.learning_rate = 1e-3});
//   ds::backward(loss, params, grads);
//   ds::nn::clip_grad_norm(grads, 1.0);
//   opt.step(params, grads);
//   ds::save(opt.state, "optimizer.npz");   // <dimsum/interop/parameters.hpp>
//
// Mixed precision: float parameters, a bf16 model computed with, float gradients:
//   ds::tape<ds::bf16> tape; ... tape.backward(loss, model, grads);
//   opt.step(params, grads, model);          // params updated, then rounded into model

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/front.hpp>
#include <boost/hana/second.hpp>

#include "dimsum/backend/cpu/kernels.hpp"
#include "dimsum/backend/cpu/threads.hpp"
#include "dimsum/nn/parameter_struct.hpp"
#include "dimsum/runtime/threads.hpp"
#include "dimsum/tensor/tensor.hpp"

// The updates' definitions, unless they come compiled from dimsum::kernels.
#ifndef DIMSUM_PRECOMPILED_KERNELS
#include "dimsum/backend/cpu/optimizer.hpp"
#endif

namespace dimsum::nn {

namespace detail {

// The memory of each tensor of a parameter struct, in member order (optional ones where set),
// every tensor dense: the pointers and element counts the update loops walk.
template <class T>
struct flat_tensors {
    std::vector<T*> data;
    std::vector<std::size_t> sizes;
};
template <class T, class Layer>
void collect(Layer& layer, flat_tensors<T>& out) {
    out.data.clear();
    out.sizes.clear();
    ::dimsum::detail::parameters::for_each_present(layer, "", [&]<class M>(const std::string&, M& member) {
        using V = std::remove_const_t<typename M::value_type>;
        static_assert(std::is_same_v<V, T>, "dimsum: an optimizer's parameters, gradients and state hold one element type");
        out.data.push_back(const_cast<T*>(member.data()));
        out.sizes.push_back(member.size());
    });
}

// f(first, last) for ranges that cover [0, n), on the team's threads where n is large.
template <class F>
void for_each_range(std::size_t n, F&& f) {
    backend::cpu::split_range(n >= backend::cpu::parallel_elements ? ::dimsum::num_threads() : 1, n, [] {}, f);
}
// f(i) for every i in [0, n), likewise.
template <class F>
void for_each_element(std::size_t n, F&& f) {
    for_each_range(n, [&](std::size_t first, std::size_t last) {
        for (std::size_t i = first; i < last; ++i) f(i);
    });
}

// Whether two structs' tensors match one for one in number and size.
template <class T, class U>
void check_alike(const flat_tensors<T>& a, const flat_tensors<U>& b, const char* op, const char* what) {
    if (a.sizes != b.sizes) throw std::invalid_argument(std::string("dimsum: ") + op + ": the " + what + " do not match the parameters");
}

// A mixed-precision model's working copy: the bf16 tensors of a struct like the parameters',
// each element rounded from its float parameter after the update, in the same pass.
struct no_working_copy {};
struct working_copy {
    flat_tensors<bf16> tensors;
    bool used = false;

    template <class T>
    void collect_from(no_working_copy*, const flat_tensors<T>&, const char*) { used = false; }
    template <class Working, class T>
    void collect_from(Working* working, const flat_tensors<T>& params, const char* op) {
        static_assert(std::is_same_v<T, float>, "dimsum: an optimizer's bf16 working copy rounds float parameters");
        collect(*working, tensors);
        check_alike(params, tensors, op, "working copy's tensors");
        used = true;
    }
    // elements [first, last) of parameter tensor k, rounded into the copy
    void round(std::size_t k, const float* p, std::size_t first, std::size_t last) const {
        if (!used) return;
        bf16* out = tensors.data[k];
        for (std::size_t i = first; i < last; ++i) out[i] = bf16(p[i]);
    }
};

// A struct like `like` (the same extents, optional members set alike), every element 0.
template <class Params>
Params zeros_like(const Params& like) {
    Params zeros = like;
    ::dimsum::detail::parameters::for_each_present(zeros, "", [](const std::string&, auto& member) { member.fill(0); });
    return zeros;
}

}  // namespace detail

namespace detail {

// The element type of a parameter struct's tensors (its first tensor's).
template <class Layer>
constexpr auto first_element() {
    auto accessors = boost::hana::accessors<Layer>();
    using First = std::remove_cvref_t<decltype(boost::hana::second(boost::hana::front(accessors))(std::declval<Layer&>()))>;
    if constexpr (::dimsum::detail::parameters::is_optional<First>) return typename First::value_type::value_type{};
    else if constexpr (is_tensor<First>::value) return typename First::value_type{};
    else return first_element<First>();
}
template <class Layer>
using element_of = decltype(first_element<Layer>());

}  // namespace detail

// The global norm of a struct of gradients, sqrt of the sum of every element's square (summed
// in double, tensor by tensor, in order); where it exceeds max_norm, every gradient is scaled
// by max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_ does. Returns the norm
// before clipping.
template <class Params>
double clip_grad_norm(Params& grads, double max_norm) {
    using T = detail::element_of<Params>;
    thread_local detail::flat_tensors<T> g;  // kept for its capacity: a training step allocates nothing
    detail::collect(grads, g);
    double squares = 0;
    for (std::size_t t = 0; t < g.data.size(); ++t) {
        for (std::size_t i = 0; i < g.sizes[t]; ++i) squares += static_cast<double>(g.data[t][i]) * static_cast<double>(g.data[t][i]);
    }
    const double norm = std::sqrt(squares);
    const double scale = max_norm / (norm + 1e-6);
    if (scale < 1) {
        const T by = static_cast<T>(scale);
        for (std::size_t t = 0; t < g.data.size(); ++t) {
            T* d = g.data[t];
            detail::for_each_element(g.sizes[t], [&](std::size_t i) { d[i] *= by; });
        }
    }
    return norm;
}

struct sgd_options {
    double learning_rate = 1e-2;
    double momentum = 0;      // 0: plain gradient descent
    double weight_decay = 0;  // added to the gradient as weight_decay * parameter (L2)
};

// What SGD keeps: each parameter's momentum buffer, and the steps taken.
template <class Params>
struct sgd_state {
    BOOST_HANA_DEFINE_STRUCT(sgd_state, (Params, momentum), (tensor<double>, steps));
};

// torch.optim.SGD: d = g + weight_decay p; with momentum, b = momentum b + d (b = d on the
// first step), d = b; then p -= learning_rate d.
template <class Params>
class sgd {
public:
    sgd_options options;
    sgd_state<Params> state;

    explicit sgd(const Params& params, sgd_options o = {}) : options(o), state{detail::zeros_like(params), tensor<double>()} {}

    void step(Params& params, const Params& grads) { update(params, grads, static_cast<detail::no_working_copy*>(nullptr)); }

    // The same, and then `working` (a struct of the same tensors in bf16: a mixed-precision
    // model computes with it, ds::tape<ds::bf16>) := the new parameters rounded, in the same pass.
    template <class Working>
    void step(Params& params, const Params& grads, Working& working) { update(params, grads, &working); }

private:
    template <class Working>
    void update(Params& params, const Params& grads, Working* working) {
        using T = detail::element_of<Params>;
        detail::collect(params, p_);
        detail::collect(grads, g_);
        detail::collect(state.momentum, b_);
        detail::check_alike(p_, g_, "sgd", "gradients");
        detail::check_alike(p_, b_, "sgd", "momentum buffers");
        w_.collect_from(working, p_, "sgd");
        const bool first = state.steps.data()[0] == 0;
        const T lr = static_cast<T>(options.learning_rate), mu = static_cast<T>(options.momentum),
                decay = static_cast<T>(options.weight_decay);
        const bool momentum = options.momentum != 0;
        for (std::size_t t = 0; t < p_.data.size(); ++t) {
            T* p = p_.data[t];
            const T* g = g_.data[t];
            T* b = b_.data[t];
            detail::for_each_range(p_.sizes[t], [&](std::size_t from, std::size_t to) {
                for (std::size_t i = from; i < to; ++i) {
                    T d = decay != 0 ? g[i] + decay * p[i] : g[i];
                    if (momentum) {
                        b[i] = first ? d : mu * b[i] + d;
                        d = b[i];
                    }
                    p[i] -= lr * d;
                }
                if constexpr (std::is_same_v<T, float>) w_.round(t, p, from, to);
            });
        }
        state.steps.data()[0] += 1;
    }

    detail::flat_tensors<detail::element_of<Params>> p_, g_, b_;
    detail::working_copy w_;
};

struct adamw_options {
    double learning_rate = 1e-3;
    double beta1 = 0.9, beta2 = 0.999;
    double epsilon = 1e-8;
    double weight_decay = 1e-2;  // decoupled: p *= 1 - learning_rate weight_decay
};

// What AdamW keeps: the first and second moments of each parameter, and the steps taken.
template <class Params>
struct adamw_state {
    BOOST_HANA_DEFINE_STRUCT(adamw_state, (Params, m), (Params, v), (tensor<double>, steps));
};

// torch.optim.AdamW (Loshchilov and Hutter 2019), step t from 1: p *= 1 - lr wd;
// m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// p -= (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon). One pass over each
// parameter, its gradient and its moments, in the parameters' type.
template <class Params>
class adamw {
public:
    adamw_options options;
    adamw_state<Params> state;

    explicit adamw(const Params& params, adamw_options o = {})
        : options(o), state{detail::zeros_like(params), detail::zeros_like(params), tensor<double>()} {}

    void step(Params& params, const Params& grads) { update(params, grads, static_cast<detail::no_working_copy*>(nullptr)); }

    // The same, and then `working` (a struct of the same tensors in bf16: a mixed-precision
    // model computes with it, ds::tape<ds::bf16>) := the new parameters rounded, in the same pass.
    template <class Working>
    void step(Params& params, const Params& grads, Working& working) { update(params, grads, &working); }

private:
    template <class Working>
    void update(Params& params, const Params& grads, Working* working) {
        using T = detail::element_of<Params>;
        detail::collect(params, p_);
        detail::collect(grads, g_);
        detail::collect(state.m, m_);
        detail::collect(state.v, v_);
        detail::check_alike(p_, g_, "adamw", "gradients");
        detail::check_alike(p_, m_, "adamw", "first moments");
        detail::check_alike(p_, v_, "adamw", "second moments");
        w_.collect_from(working, p_, "adamw");
        const double t = state.steps.data()[0] + 1;
        const T b1 = static_cast<T>(options.beta1), b2 = static_cast<T>(options.beta2), eps = static_cast<T>(options.epsilon);
        const T decay = static_cast<T>(1 - options.learning_rate * options.weight_decay);
        const T step_size = static_cast<T>(options.learning_rate / (1 - std::pow(options.beta1, t)));
        const T correction2 = static_cast<T>(std::sqrt(1 - std::pow(options.beta2, t)));
        const backend::cpu::adamw_step<T> constants{decay, b1, b2, step_size, correction2, eps};
        for (std::size_t k = 0; k < p_.data.size(); ++k) {
            T* p = p_.data[k];
            const T* g = g_.data[k];
            T* m = m_.data[k];
            T* v = v_.data[k];
            detail::for_each_range(p_.sizes[k], [&](std::size_t first, std::size_t last) {
                backend::cpu::adamw_update(p, g, m, v, first, last, constants);
                if constexpr (std::is_same_v<T, float>) w_.round(k, p, first, last);  // while the range is in cache
            });
        }
        state.steps.data()[0] = t;
    }

    detail::flat_tensors<detail::element_of<Params>> p_, g_, m_, v_;
    detail::working_copy w_;
};

}  // namespace dimsum::nn
