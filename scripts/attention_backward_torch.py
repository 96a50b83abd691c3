#!/usr/bin/env python3
"""PyTorch's side of dimsum_bench's attention_backward rows: causal attention of given Q, K and
V (batch, heads, seq, head), forward and backward (the gradients of Q, K and V for a given
cotangent of the output), as PyTorch 1.13 computes it: softmax(Q K^T / sqrt(head), causal
mask) V under autograd (1.13 has no scaled_dot_product_attention). Each thread count is
measured in a fresh process: the time of one forward and backward, and the peak memory beyond
Q, K, V, the cotangent and the gradients.

Prints, per case:
  torch_attention_backward,<name>,<threads>,<ms>,<extra_mb>
  torch_attention_backward_best,<name>,<threads>,<ms>,<extra_mb>
or torch_attention_backward_unavailable,<why> without torch.
"""
import argparse
import sys

from attention_torch import best_environment, peak_rss_bytes, reset_peak_rss, rss_bytes
from torch_timing import baseline_main, best_seconds


def parse_case(text):
    """NAME:batch,seq,heads,head"""
    name, spec = text.split(":", 1)
    batch, seq, heads, head = (int(v) for v in spec.split(","))
    return {"name": name, "spec": text, "batch": batch, "seq": seq, "heads": heads, "head": head}


def child(args):
    """Measure one case on args.threads threads; prints `ms,extra_mb`."""
    import torch
    torch.set_num_threads(args.threads)
    case = args.case[0]
    shape = (case["batch"], case["heads"], case["seq"], case["head"])
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    cotangent = torch.randn(shape, generator=gen)
    seq = case["seq"]
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    scale = 1.0 / case["head"] ** 0.5

    def forward_backward():
        for x in (q, k, v):
            x.grad = None
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        out = torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), v)
        out.backward(cotangent)

    forward_backward()  # the gradients exist: what is measured next is beyond them
    rss0 = rss_bytes()
    reset_peak_rss()
    seconds = best_seconds(forward_backward, args.rounds, args.min_time)
    peak = peak_rss_bytes()
    print(f"{seconds * 1e3:.4f},{(peak - rss0) / 1e6:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", type=parse_case, action="append", required=True, help="NAME:batch,seq,heads,head (repeatable)")
    return baseline_main(__file__, ap, "torch_attention_backward", child, best_environment)


if __name__ == "__main__":
    sys.exit(main())
