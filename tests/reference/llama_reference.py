"""The Llama decoder layer in PyTorch float64, shared by the reference scripts
(generate_decoder.py, generate_decoder_layer.py): RMSNorm, grouped-query attention with
rotary embeddings (half-split pairs) and a causal mask over the whole sequence, no cache, and
SwiGLU. Weights are (in, out), by the names of nn::decoder_layer under a prefix."""
import torch


def rms_norm(x, g, epsilon):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + epsilon) * g


def rotate(x, base):  # (..., seq, head) at positions 0 .. seq, half-split pairs (i, i + head/2)
    head = x.shape[-1]
    frequency = base ** (-torch.arange(0, head, 2, dtype=torch.float64) / head)
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * frequency[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., : head // 2], x[..., head // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def decoder_layer(x, w, prefix, heads, kv_heads, head, epsilon, base):
    """x (batch, seq, model) -> (batch, seq, model); w[prefix + name] the layer's weights."""
    batch, seq, _ = x.shape
    h = rms_norm(x, w[prefix + "attention_norm"], epsilon)
    q = (h @ w[prefix + "attention.w_q"]).view(batch, seq, heads, head).transpose(1, 2)
    k = (h @ w[prefix + "attention.w_k"]).view(batch, seq, kv_heads, head).transpose(1, 2)
    v = (h @ w[prefix + "attention.w_v"]).view(batch, seq, kv_heads, head).transpose(1, 2)
    q, k = rotate(q, base), rotate(k, base)
    k = k.repeat_interleave(heads // kv_heads, dim=1)  # query head h reads key/value head h // group
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / head ** 0.5
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    z = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, heads * head)
    x = x + z @ w[prefix + "attention.w_o"]
    h = rms_norm(x, w[prefix + "ffn_norm"], epsilon)
    return x + (torch.nn.functional.silu(h @ w[prefix + "w_1"]) * (h @ w[prefix + "w_3"])) @ w[prefix + "w_2"]
