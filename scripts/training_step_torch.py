#!/usr/bin/env python3
"""PyTorch's side of dimsum_bench's training_step rows: one training step of a layer on a batch
of sequences: the forward, the mean squared error against a target, the backward (the
gradients of every weight and of the input) and one torch.optim.AdamW step, in float32, or
with the forward under torch.autocast("cpu", dtype=torch.bfloat16) (a case ending ",bf16":
mixed precision, the parameters and gradients float32, the products in bf16). The layers:
  bert_layer     torch.nn.TransformerEncoderLayer (model 768, 12 heads, feed-forward 3072,
                 GELU, post-norm, layer-norm epsilon 1e-12, no dropout);
  decoder_layer  a Llama-style layer as src/bench/training.cpp writes it (model 512; RMSNorm;
                 rotary embedding, half split; 8 query heads over 2 key/value heads of 64,
                 causal; SwiGLU of 1408), in PyTorch operations (1.13 has no
                 scaled_dot_product_attention: matmul, masked_fill, softmax, matmul).
Each thread count is measured in a fresh process, in the environment that gives PyTorch its
best (attention_torch.py).

Prints, per case:
  torch_training_step,<name>,<threads>,<ms>
  torch_training_step_best,<name>,<threads>,<ms>
or torch_training_step_unavailable,<why> without torch.
"""
import argparse
import sys

from attention_torch import best_environment
from torch_timing import baseline_main, best_seconds


def parse_case(text):
    """NAME:layer,batch,seq[,bf16]"""
    name, spec = text.split(":", 1)
    fields = spec.split(",")
    layer, batch, seq = fields[:3]
    if layer not in ("bert_layer", "decoder_layer"):
        raise argparse.ArgumentTypeError(f"unknown layer {layer}")
    if fields[3:] not in ([], ["bf16"]):
        raise argparse.ArgumentTypeError(f"unknown type {fields[3:]}")
    return {"name": name, "spec": text, "layer": layer, "batch": int(batch), "seq": int(seq), "bf16": fields[3:] == ["bf16"]}


def decoder_layer(torch, seq):
    """The decoder layer of the module's docstring, its weights drawn as torch.nn.Linear's."""
    model, heads, kv_heads, head, hidden = 512, 8, 2, 64, 1408

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            bound = model ** -0.5
            def p(*shape):
                return torch.nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))
            self.attention_norm = torch.nn.Parameter(torch.ones(model))
            self.ffn_norm = torch.nn.Parameter(torch.ones(model))
            self.w_q, self.w_k, self.w_v = p(model, heads * head), p(model, kv_heads * head), p(model, kv_heads * head)
            self.w_o, self.w_1, self.w_3, self.w_2 = p(heads * head, model), p(model, hidden), p(model, hidden), p(hidden, model)
            angles = torch.arange(seq, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * torch.arange(head // 2) / head)
            self.register_buffer("cos", angles.cos().float())
            self.register_buffer("sin", angles.sin().float())
            self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1))

        def rotate(self, x):  # (..., seq, head)
            x1, x2 = x[..., :head // 2], x[..., head // 2:]
            return torch.cat([x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin], dim=-1)

        @staticmethod
        def rms_norm(x, g):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

        def forward(self, x):
            batch = x.shape[0]
            h = self.rms_norm(x, self.attention_norm)
            q = self.rotate((h @ self.w_q).view(batch, seq, heads, head).transpose(1, 2))
            k = self.rotate((h @ self.w_k).view(batch, seq, kv_heads, head).transpose(1, 2))
            v = (h @ self.w_v).view(batch, seq, kv_heads, head).transpose(1, 2)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            scores = (q @ k.transpose(-1, -2)) * head ** -0.5
            z = torch.softmax(scores.masked_fill(self.future, float("-inf")), dim=-1) @ v
            r = x + z.transpose(1, 2).reshape(batch, seq, heads * head) @ self.w_o
            n = self.rms_norm(r, self.ffn_norm)
            return r + (torch.nn.functional.silu(n @ self.w_1) * (n @ self.w_3)) @ self.w_2

    return Layer(), model


def child(args):
    """Measure one case on args.threads threads; prints `ms`."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    case = args.case[0]
    if case["layer"] == "bert_layer":
        layer, model = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True,
                                                        layer_norm_eps=1e-12), 768
    else:
        layer, model = decoder_layer(torch, case["seq"])
    x = torch.randn(case["batch"], case["seq"], model, requires_grad=True)
    target = torch.randn(case["batch"], case["seq"], model)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case["bf16"]):
            y = layer(x)
        torch.nn.functional.mse_loss(y.float(), target).backward()
        optimizer.step()

    seconds = best_seconds(step, args.rounds, args.min_time)
    print(f"{seconds * 1e3:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", type=parse_case, action="append", required=True, help="NAME:LAYER,batch,seq; LAYER: bert_layer or decoder_layer (repeatable)")
    return baseline_main(__file__, ap, "torch_training_step", child, best_environment)


if __name__ == "__main__":
    sys.exit(main())
