#!/usr/bin/python3
"""Makes the reference data of a BERT-style encoder layer with PyTorch, into tests/reference/bert/.

The layer is torch.nn.TransformerEncoderLayer(d_model=128, nhead=2, dim_feedforward=512,
dropout=0.0, activation='gelu', batch_first=True, norm_first=False, layer_norm_eps=1e-12):
post-norm, exact (erf) GELU, in eval mode and float64. Its parameters are torch's seeded
default initialisation, except that every bias and both LayerNorms get random values too
(a zero bias or a unit LayerNorm weight would let a test miss them), and all are rounded to
float32. The outputs are computed in float64 from those float32 values, through the module's
ordinary (not the fused "fast path") forward, and checked against the layer written out by
hand below. Needs Debian's python3-torch and python3-numpy:

    /usr/bin/python3 tests/reference/generate_bert.py

Files: weights.safetensors, the layer's parameters under the names of its parameter struct in
examples/bert_layer.cpp (written by hand to the published layout: safetensors_by_hand.py),
in the x @ W orientation (torch's Linear weights transposed, shape (in, out)), float32:
    attention.w_qkv   (128, 384)   columns q | k | v, each 2 heads x 64
    attention.b_qkv   (384,)
    attention.w_o     (128, 128)   rows: head-major concatenation of the heads
    attention.b_o     (128,)
    ln1_weight, ln1_bias (128,)    LayerNorm after attention + residual
    w_ff1             (128, 512)
    b_ff1             (512,)
    w_ff2             (512, 128)
    b_ff2             (128,)
    ln2_weight, ln2_bias (128,)    LayerNorm after feed-forward + residual
and .npy files:
    x           (2, 16, 128)  float32   input, standard normal
    out         (2, 16, 128)  float64   the layer's output, no mask
    out_padded  (2, 16, 128)  float64   with a key padding mask: sequence b attends to its
                                        first lengths[b] keys only
    lengths     (2,)          float64   [16, 11]
"""
import math
import pathlib

import numpy as np
import torch

from safetensors_by_hand import write_safetensors

HERE = pathlib.Path(__file__).resolve().parent
OUT_DIR = HERE / "bert"
BATCH, SEQ, MODEL, HEADS, FF = 2, 16, 128, 2, 512
HEAD = MODEL // HEADS
EPS = 1e-12
LENGTHS = [16, 11]
SEED = 20240611


def make_layer():
    """The seeded layer, in float64, every parameter rounded to float32."""
    torch.manual_seed(SEED)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=MODEL, nhead=HEADS, dim_feedforward=FF, dropout=0.0, activation="gelu",
        batch_first=True, norm_first=False, layer_norm_eps=EPS, dtype=torch.float64)
    with torch.no_grad():
        for bias in (layer.self_attn.in_proj_bias, layer.self_attn.out_proj.bias,
                     layer.linear1.bias, layer.linear2.bias):
            bias.normal_(0.0, 0.02)
        for norm in (layer.norm1, layer.norm2):
            norm.weight.copy_(1.0 + 0.1 * torch.randn(MODEL, dtype=torch.float64))
            norm.bias.normal_(0.0, 0.1)
        for p in layer.parameters():
            p.copy_(p.float().double())
    return layer.eval()


def parameters(layer):
    """The parameters as float64 tensors in the x @ W orientation, by their file names."""
    attn = layer.self_attn
    p = {
        "w_qkv": attn.in_proj_weight.T, "b_qkv": attn.in_proj_bias,
        "w_o": attn.out_proj.weight.T, "b_o": attn.out_proj.bias,
        "ln1_weight": layer.norm1.weight, "ln1_bias": layer.norm1.bias,
        "w_ff1": layer.linear1.weight.T, "b_ff1": layer.linear1.bias,
        "w_ff2": layer.linear2.weight.T, "b_ff2": layer.linear2.bias,
        "ln2_weight": layer.norm2.weight, "ln2_bias": layer.norm2.bias,
    }
    return {name: t.detach().clone().contiguous() for name, t in p.items()}


def layer_norm(h, weight, bias):
    mean = h.mean(dim=-1, keepdim=True)
    var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)  # biased, as LayerNorm
    return (h - mean) / torch.sqrt(var + EPS) * weight + bias


def gelu(u):
    return 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))


def by_hand(x, p, lengths=None):
    """The same layer written out: x @ W + b, attention, post-norm residuals, exact GELU."""
    def split(t):  # (batch, seq, model) -> (batch, heads, seq, head)
        return t.view(BATCH, SEQ, HEADS, HEAD).transpose(1, 2)
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    q, k, v = (split(t) for t in qkv.split(MODEL, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD)
    if lengths is not None:
        padded = torch.arange(SEQ)[None, :] >= torch.tensor(lengths)[:, None]  # (batch, key)
        scores = scores.masked_fill(padded[:, None, None, :], float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v
    attended = z.transpose(1, 2).reshape(BATCH, SEQ, MODEL) @ p["w_o"] + p["b_o"]
    h = layer_norm(x + attended, p["ln1_weight"], p["ln1_bias"])
    f = gelu(h @ p["w_ff1"] + p["b_ff1"]) @ p["w_ff2"] + p["b_ff2"]
    return layer_norm(h + f, p["ln2_weight"], p["ln2_bias"])


def with_module(layer, x, mask=None):
    """The module's ordinary forward: autograd on (parameters require grad) rules out the
    fused fast path, torch._transformer_encoder_layer_fwd."""
    assert torch.is_grad_enabled() and all(p.requires_grad for p in layer.parameters())
    return layer(x, src_key_padding_mask=mask).detach()


def main():
    layer = make_layer()
    p = parameters(layer)
    torch.manual_seed(SEED + 1)
    x = torch.randn(BATCH, SEQ, MODEL, dtype=torch.float32).double()
    mask = torch.arange(SEQ)[None, :] >= torch.tensor(LENGTHS)[:, None]  # True: a key to ignore

    out = with_module(layer, x)
    out_padded = with_module(layer, x, mask)
    for got, want in ((by_hand(x, p), out), (by_hand(x, p, LENGTHS), out_padded)):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (got - want).abs().max()
    assert torch.isfinite(out_padded).all()
    # The fast path agrees (to float64 rounding): padded rows are not zeroed or NaN either.
    with torch.no_grad():
        assert torch.allclose(layer(x, src_key_padding_mask=mask), out_padded, rtol=1e-10, atol=1e-12)
    # Valid rows do not see the padded positions' input.
    changed = x.clone()
    changed[1, LENGTHS[1]:] = torch.randn(SEQ - LENGTHS[1], MODEL, dtype=torch.float64)
    assert torch.allclose(with_module(layer, changed, mask)[1, :LENGTHS[1]], out_padded[1, :LENGTHS[1]],
                          rtol=1e-12, atol=1e-12)
    # The mask matters: sequence 1 differs from the unmasked output, sequence 0 does not.
    assert torch.allclose(out_padded[0], out[0], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out_padded[1], out[1], rtol=1e-3, atol=1e-3)

    OUT_DIR.mkdir(exist_ok=True)
    in_struct = {"w_qkv": "attention.w_qkv", "b_qkv": "attention.b_qkv", "w_o": "attention.w_o", "b_o": "attention.b_o"}
    write_safetensors(OUT_DIR / "weights.safetensors",
                      {in_struct.get(name, name): t.numpy().astype(np.float32) for name, t in p.items()})
    np.save(OUT_DIR / "x.npy", x.numpy().astype(np.float32))
    np.save(OUT_DIR / "out.npy", out.numpy())
    np.save(OUT_DIR / "out_padded.npy", out_padded.numpy())
    np.save(OUT_DIR / "lengths.npy", np.array(LENGTHS, dtype=np.float64))
    files = sorted([*OUT_DIR.glob("*.npy"), OUT_DIR / "weights.safetensors"])
    print("wrote", ", ".join(f.name for f in files),
          f"({sum(f.stat().st_size for f in files)} bytes)")


if __name__ == "__main__":
    main()
