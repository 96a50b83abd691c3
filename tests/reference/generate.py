#!/usr/bin/python3
"""Makes the reference data of tests/nn/test_multi_head.cpp with PyTorch.

The inputs are dimsum's seeded ones (ds::fill_uniform: SplitMix64 of the seed and the
element's row-major index), reproduced here bit for bit; the outputs are computed in float64
by torch.nn.functional.multi_head_attention_forward, and checked against the formula written
out by hand. Needs Debian's python3-torch and python3-numpy:

    /usr/bin/python3 tests/reference/generate.py
"""
import pathlib

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
BATCH, SEQ, MODEL, HEADS = 2, 10, 768, 12
WEIGHT_BOUND = 1.0 / MODEL ** 0.5  # mha::weight_bound


def splitmix64(seed, index):
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (index.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def fill_uniform(shape, seed, low=-1.0, high=1.0):
    """ds::fill_uniform of a float tensor: drawn in double, rounded to float."""
    n = int(np.prod(shape))
    unit = (splitmix64(seed, np.arange(n)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return (low + (high - low) * unit).astype(np.float32).reshape(shape)


def by_hand(x, w_q, w_k, w_v, w_o, causal):
    """The formula of examples/multi_head_attention.hpp, in torch."""
    def split(t):  # (batch, seq, model) -> (batch, heads, seq, head)
        return t.view(BATCH, SEQ, HEADS, MODEL // HEADS).transpose(1, 2)
    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    scores = q @ k.transpose(-1, -2) / (MODEL // HEADS) ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v
    return z.transpose(1, 2).reshape(BATCH, SEQ, MODEL) @ w_o


def with_torch_module(x, w_q, w_k, w_v, w_o, causal):
    """The same through torch.nn.functional.multi_head_attention_forward (x W, not x W^T)."""
    seq_first = x.transpose(0, 1)
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1) if causal else None
    out, _ = torch.nn.functional.multi_head_attention_forward(
        seq_first, seq_first, seq_first, MODEL, HEADS,
        in_proj_weight=torch.cat([w_q.T, w_k.T, w_v.T]), in_proj_bias=None,
        bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
        out_proj_weight=w_o.T, out_proj_bias=None, training=False,
        need_weights=False, attn_mask=mask)
    return out.transpose(0, 1)


def main():
    x = fill_uniform((BATCH, SEQ, MODEL), 1)
    w = {name: fill_uniform((MODEL, MODEL), seed, -WEIGHT_BOUND, WEIGHT_BOUND)
         for name, seed in (("q", 2), ("k", 3), ("v", 4), ("o", 5))}
    args = [torch.from_numpy(a.astype(np.float64)) for a in (x, w["q"], w["k"], w["v"], w["o"])]
    outputs = {}
    for causal in (False, True):
        reference = with_torch_module(*args, causal)
        assert torch.allclose(reference, by_hand(*args, causal), rtol=1e-12, atol=1e-14)
        outputs[causal] = reference.numpy()
    np.save(HERE / "multi_head_x.npy", x.astype(np.float64))
    np.save(HERE / "multi_head_w_o_rows.npy", w["o"][:4].astype(np.float64))  # a sample: the whole is 4.7 MB
    np.save(HERE / "multi_head_out.npy", outputs[False])
    np.save(HERE / "multi_head_causal_out.npy", outputs[True])
    print("wrote", ", ".join(sorted(p.name for p in HERE.glob("multi_head_*.npy"))))


if __name__ == "__main__":
    main()
