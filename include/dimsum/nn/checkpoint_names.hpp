#pragma once
// Where the common checkpoint layouts keep a decoder layer's weights (nn::decoder_layer), for
// ds::load's load_options::names:
//
//   ds::nn::decoder_layer<float, Model, Heads, KvHeads, Head, Hidden> layer;
//   ds::load(layer, "model.safetensors", {.prefix = "model.layers.0.", .allow_unused = true,
//                                         .names = ds::nn::hugging_face_llama_names});
//
// Both layouts store each projection as torch.nn.Linear does, (out, in): it is read
// transposed into the layer's (in, out). Their query and key projections also differ in the
// order of each head's columns, which decides the rotary pairs: Hugging Face's conversion
// permutes them for rotate_half (rotary_pairs::half_split), while Meta's and Mistral's own
// files pair neighbouring columns (rotary_pairs::interleaved).
//
// Not part of <dimsum/dimsum.hpp>: include it with <dimsum/interop/parameters.hpp>.

#include <array>

#include "dimsum/interop/parameters.hpp"

namespace dimsum::nn {

// Llama, Mistral, Qwen2 and their kin as Hugging Face's transformers saves them, a layer
// under "model.layers.N.": input_layernorm, self_attn.{q,k,v,o}_proj (Qwen2's with biases on
// Q, K and V), post_attention_layernorm, mlp.{gate,up,down}_proj.
inline constexpr std::array<stored_as, 13> hugging_face_llama_names{{
    {"attention_norm", "input_layernorm.weight"},
    {"attention.w_q", "self_attn.q_proj.weight", true},
    {"attention.w_k", "self_attn.k_proj.weight", true},
    {"attention.w_v", "self_attn.v_proj.weight", true},
    {"attention.w_o", "self_attn.o_proj.weight", true},
    {"attention.b_q", "self_attn.q_proj.bias"},
    {"attention.b_k", "self_attn.k_proj.bias"},
    {"attention.b_v", "self_attn.v_proj.bias"},
    {"attention.b_o", "self_attn.o_proj.bias"},
    {"ffn_norm", "post_attention_layernorm.weight"},
    {"w_1", "mlp.gate_proj.weight", true},
    {"w_3", "mlp.up_proj.weight", true},
    {"w_2", "mlp.down_proj.weight", true},
}};

// Meta's Llama layout, which Mistral's consolidated.safetensors keeps, a layer under
// "layers.N.": attention_norm, attention.w{q,k,v,o}, ffn_norm, feed_forward.w{1,2,3}.
inline constexpr std::array<stored_as, 9> meta_llama_names{{
    {"attention_norm", "attention_norm.weight"},
    {"attention.w_q", "attention.wq.weight", true},
    {"attention.w_k", "attention.wk.weight", true},
    {"attention.w_v", "attention.wv.weight", true},
    {"attention.w_o", "attention.wo.weight", true},
    {"ffn_norm", "ffn_norm.weight"},
    {"w_1", "feed_forward.w1.weight", true},
    {"w_3", "feed_forward.w3.weight", true},
    {"w_2", "feed_forward.w2.weight", true},
}};

}  // namespace dimsum::nn
