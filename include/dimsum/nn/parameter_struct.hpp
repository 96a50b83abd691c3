#pragma once
// Parameter structs: a layer's tensors declared once with Boost.Hana,
//
//   struct block {
//       BOOST_HANA_DEFINE_STRUCT(block,
//           (ds::nn::multi_head_attention<float, Model, Heads, Head>, attention),
//           (ds::tensor<float, Model>, norm_weight));
//   };
//
// and walked member by member: by the parameter files (interop/parameters.hpp: load, save,
// list) and by gradients (nn/gradients.hpp), which treat parameters, gradients and optimizer
// state alike. A member is a tensor, a std::optional tensor (a parameter that may be absent)
// or another parameter struct, whose members are named `outer.inner` (`attention.w_qkv`).

#include <optional>
#include <string>
#include <type_traits>

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>

#include "dimsum/tensor/tensor.hpp"

namespace dimsum::detail::parameters {

template <class>
inline constexpr bool is_optional = false;
template <class U>
inline constexpr bool is_optional<std::optional<U>> = true;

template <class M>
constexpr bool is_parameter() {
    if constexpr (is_optional<M>) return is_tensor<typename M::value_type>::value;
    else return is_tensor<M>::value;
}

// Calls f(name, member) for each tensor and std::optional tensor of a parameter struct, those of
// nested structs under `outer.inner` names, in the order of declaration.
template <class Layer, class F>
void for_each(Layer& layer, const std::string& prefix, F& f) {
    using L = std::remove_const_t<Layer>;
    static_assert(boost::hana::Struct<L>::value,
                  "dimsum: a parameter struct declares its members with BOOST_HANA_DEFINE_STRUCT");
    boost::hana::for_each(boost::hana::accessors<L>(), [&](auto accessor) {
        const std::string name = prefix + boost::hana::to<const char*>(boost::hana::first(accessor));
        auto& member = boost::hana::second(accessor)(layer);
        using M = std::remove_cvref_t<decltype(member)>;
        if constexpr (is_parameter<M>()) {
            f(name, member);
        } else {
            static_assert(boost::hana::Struct<M>::value,
                          "dimsum: a member of a parameter struct is a tensor, a std::optional tensor or another "
                          "parameter struct (declared with BOOST_HANA_DEFINE_STRUCT)");
            for_each(member, name + ".", f);
        }
    });
}

// Calls f(name, tensor) for each tensor the layer holds: its plain tensors and its optional
// ones that are set, with the layer's own constness.
template <class Layer, class F>
void for_each_present(Layer& layer, const std::string& prefix, F&& f) {
    auto present = [&]<class M>(const std::string& name, M& member) {
        if constexpr (is_optional<std::remove_const_t<M>>) {
            if (member) f(name, *member);
        } else {
            f(name, member);
        }
    };
    for_each(layer, prefix, present);
}

}  // namespace dimsum::detail::parameters
