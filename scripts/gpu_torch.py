#!/usr/bin/env python3
"""PyTorch on the GPU on dimsum_gpu_bench's cases (src/gpu_bench.cpp), for scripts/gpu_check.sh:
the same sizes, device tensors, each case timed with CUDA events as the median of 5 batches of
at least 50 ms after 3 warm-ups. Float cases as dimsum runs them (TF32 off unless the row says
tf32), SDPA in float (PyTorch's choice of kernel) and in bf16 (flash), for scale.

    python3 scripts/gpu_torch.py [--smoke] [--device cuda|cpu]
"""
import argparse
import math
import time

import torch


def seconds_per_call(f, device, smoke):
    for _ in range(1 if smoke else 3):
        f()
    batches = []
    for _ in range(1 if smoke else 5):
        calls = 0
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        while True:
            f()
            calls += 1
            if device == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if smoke or elapsed >= 0.05:
                break
        batches.append(elapsed / calls)
    batches.sort()
    return batches[len(batches) // 2]


def row(name, value, unit):
    print(f"torch_{name:<34} {value:12.1f} {unit}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--device", default="cuda")
    a = parser.parse_args()
    dev, smoke = a.device, a.smoke
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}", flush=True)
    with torch.no_grad():
        count = 4096 if smoke else 1 << 27
        x = torch.rand(count, device=dev)
        y = torch.empty_like(x)
        t = seconds_per_call(lambda: y.copy_(x), dev, smoke)
        row(f"copy_{count}", 2 * count * 4 / t / 1e9, "GB/s")

        cols = 64 if smoke else 4096
        rows = count // cols
        xm, rm, bias = torch.rand(rows, cols, device=dev), torch.rand(rows, cols, device=dev), torch.rand(cols, device=dev)
        t = seconds_per_call(lambda: torch.maximum(xm * 0.5 + bias, torch.zeros((), device=dev)) + rm, dev, smoke)
        row(f"eltwise_{rows}x{cols}", 3 * rows * cols * 4 / t / 1e9, "GB/s")
        for width in (128, 512, 4096):
            w = 16 if smoke else width
            n = count // w
            s = torch.rand(n, w, device=dev)
            t = seconds_per_call(lambda: torch.softmax(s, dim=-1), dev, smoke)
            row(f"softmax_{n}x{w}", 2 * n * w * 4 / t / 1e9, "GB/s")

        for size in (1024, 4096, 8192):
            n = 8 if smoke else size
            a_, b_ = torch.rand(n, n, device=dev), torch.rand(n, n, device=dev)
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                t = seconds_per_call(lambda: a_ @ b_, dev, smoke)
                row(f"gemm_{'tf32' if tf32 else 'fp32'}_{n}^3", 2 * n ** 3 / t / 1e12, "TFLOP/s")
            torch.backends.cuda.matmul.allow_tf32 = False

        for d in (64, 128):
            for seq in (512, 2048, 8192):
                s = 16 if smoke else seq
                batch, heads, dd = (1, 2, 8) if smoke else (16384 // seq, 2048 // d, d)
                q, k, v = (torch.rand(batch, heads, s, dd, device=dev) for _ in range(3))
                for causal in (False, True):
                    pairs = batch * heads * s * s * (0.5 if causal else 1.0)
                    flops = 4 * pairs * dd
                    name = f"attention_{'causal_' if causal else ''}{batch}x{heads}x{s}x{dd}"
                    f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    row(name, flops / seconds_per_call(f, dev, smoke) / 1e12, "TFLOP/s")
                    if dev == "cuda":
                        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
                        g = lambda: torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
                        row(name + "_bf16", flops / seconds_per_call(g, dev, smoke) / 1e12, "TFLOP/s")
    print("gpu_torch: done", flush=True)


if __name__ == "__main__":
    main()
