#!/usr/bin/env python3
"""PyTorch on the GPU beside dimsum_gpu_bench (src/gpu_bench.cpp), for scripts/gpu_check.sh.

Speed: the bench's cases at the same sizes on device tensors, each the median of 5 batches of
at least 50 ms after 3 warm-ups, wall time with the device synchronised after each call, as
dimsum's bench times its synchronous evaluations. Float cases as dimsum runs them (TF32 off
unless the row says tf32), SDPA in float (PyTorch's choice of kernel) and in bf16 (flash), for
scale. With --dimsum FILE (the bench's output), the two side by side last, with their ratio,
also written as CSV to --csv FILE.

Parity (--parity DIR): the cases `dimsum_gpu_bench --parity DIR` wrote, recomputed in float64
on the device and compared by ||dimsum - reference|| / ||reference|| (at most 1e-5: exact float
arithmetic); a NaN that the reference does not have fails. Exit status 1 if any case fails.

    python3 scripts/gpu_torch.py [--smoke] [--device cuda|cpu] [--dimsum FILE] [--csv FILE]
    python3 scripts/gpu_torch.py --parity DIR [--device cuda|cpu]
"""
import argparse
import csv
import math
import pathlib
import sys
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


results = {}  # case name -> (value, unit), for the table


def row(name, value, unit):
    results[name] = (value, unit)
    print(f"torch_{name:<34} {value:12.4g} {unit}", flush=True)


def sdpa(q, k, v, is_causal):
    """PyTorch's fused attention; its definition where PyTorch predates it (Debian's 1.13)."""
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def reference(kind, options, inputs, dev):
    """The case recomputed in float64 from dimsum's own inputs."""
    x = {name: torch.from_numpy(a).to(dev, torch.float64) for name, a in inputs.items()}
    if kind == "attention":
        scale, causal = float(options["scale"]), options["causal"] == "1"
        q, k, v = x["q"], x["k"], x["v"]  # (batch, heads, seq, d)
        out = torch.empty_like(q[..., : v.shape[-1]])
        for h in range(q.shape[1]):  # a head at a time: the (query, key) matrix of one head
            scores = q[:, h] @ k[:, h].transpose(-1, -2) * scale
            if causal:  # keys and queries aligned at their ends, as dimsum's causal_mask
                nq, nk = scores.shape[-2:]
                future = torch.ones(nq, nk, dtype=torch.bool, device=dev).triu(nk - nq + 1)
                scores = scores.masked_fill(future, -math.inf)
            out[:, h] = torch.softmax(scores, dim=-1) @ v[:, h]
        return out
    if kind == "gemm_bias_gelu":
        return torch.nn.functional.gelu(x["a"] @ x["b"] + x["bias"])
    if kind == "softmax":
        out = torch.softmax(x["x"], dim=-1)
        masked = torch.isinf(x["x"]).all(dim=-1) & (x["x"] < 0).all(dim=-1)
        out[masked] = 0  # a row of -infinity only gives 0 in dimsum (NaN in PyTorch)
        return out
    raise ValueError(f"unknown parity case kind {kind}")


def parity(folder, dev):
    import numpy
    folder = pathlib.Path(folder)
    failed = 0
    lines = (folder / "cases.txt").read_text().splitlines()
    for line in lines:
        name, kind, *rest = line.split()
        options = dict(item.split("=", 1) for item in rest)
        inputs = {f.name[len(name) + 1 : -len(".npy")]: numpy.load(f) for f in folder.glob(f"{name}.*.npy")}
        got = torch.from_numpy(inputs.pop("o")).to(dev, torch.float64)
        want = reference(kind, options, inputs, dev)
        new_nan = (torch.isnan(got) & ~torch.isnan(want)).sum().item()
        error = (torch.linalg.norm((got - want).nan_to_num()) / torch.linalg.norm(want.nan_to_num())).item()
        ok = new_nan == 0 and error <= 1e-5
        failed += not ok
        print(f"parity {name:<40} relative error {error:.2e} (at most 1e-5), {new_nan} NaN: {'ok' if ok else 'FAILED'}",
              flush=True)
    print(f"gpu_torch parity: {len(lines) - failed} of {len(lines)} cases agree with float64", flush=True)
    return 1 if failed or not lines else 0


def table(dimsum_output, csv_path):
    """dimsum's rows beside PyTorch's, with their ratio: dimsum / torch (above 1: dimsum faster)."""
    rows = []
    for line in pathlib.Path(dimsum_output).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] in ("GB/s", "TFLOP/s"):
            name, value, unit = parts[0], float(parts[1]), parts[2]
            torch_value = results.get(name, (math.nan, unit))[0]
            bf16 = results.get(name + "_bf16", (math.nan, unit))[0]
            rows.append((name, unit, value, torch_value, value / torch_value if torch_value else math.nan, bf16))
    print(f"\n{'case':<36} {'unit':<8} {'dimsum':>9} {'torch':>9} {'ratio':>6} {'torch bf16':>10}")
    for name, unit, value, torch_value, ratio, bf16 in rows:
        print(f"{name:<36} {unit:<8} {value:9.4g} {torch_value:9.4g} {ratio:6.2f} {bf16:10.4g}")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["case", "unit", "dimsum", "torch", "dimsum_over_torch", "torch_bf16"])
            out.writerows(rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parity", metavar="DIR")
    parser.add_argument("--dimsum", metavar="FILE")
    parser.add_argument("--csv", metavar="FILE")
    a = parser.parse_args()
    dev, smoke = a.device, a.smoke
    if a.parity:
        with torch.no_grad():
            return parity(a.parity, dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}", flush=True)
    with torch.no_grad():
        count = 4096 if smoke else 1 << 27
        x = torch.rand(count, device=dev)
        y = torch.empty_like(x)
        t = seconds_per_call(lambda: y.copy_(x), dev, smoke)
        row(f"copy_{count}", 2 * count * 4 / t / 1e9, "GB/s")
        row(f"copy_pass_{count}", 2 * count * 4 / t / 1e9, "GB/s")  # the yardstick of dimsum's copy as a formula

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

        squares = [(n, n, n) for n in (1024, 4096, 8192)]
        bert = [(1024, 768, 2304), (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768)]  # the BERT-base layer's
        for m, k, n in squares + bert:
            square = m == k == n
            if smoke:
                m, k, n = (8, 8, 8) if square else (4, k // 256, n // 256)
            shape = f"{n}^3" if square else f"{m}x{k}x{n}"
            a_, b_ = torch.rand(m, k, device=dev), torch.rand(k, n, device=dev)
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                t = seconds_per_call(lambda: a_ @ b_, dev, smoke)
                row(f"gemm_{'tf32' if tf32 else 'fp32'}_{shape}", 2 * m * k * n / t / 1e12, "TFLOP/s")
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
                    f = lambda: sdpa(q, k, v, causal)
                    row(name, flops / seconds_per_call(f, dev, smoke) / 1e12, "TFLOP/s")
                    if dev == "cuda":
                        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
                        g = lambda: sdpa(qb, kb, vb, causal)
                        row(name + "_bf16", flops / seconds_per_call(g, dev, smoke) / 1e12, "TFLOP/s")
        batch, seq = (1, 4) if smoke else (8, 128)
        layer = torch.nn.MultiheadAttention(768, 12, batch_first=True).to(dev).eval()
        x = torch.rand(batch, seq, 768, device=dev)
        t = seconds_per_call(lambda: layer(x, x, x, need_weights=False), dev, smoke)
        tokens = batch * seq
        row(f"mha_bert_{batch}x{seq}", (8 * tokens * 768 * 768 + 4 * tokens * seq * 768) / t / 1e12, "TFLOP/s")

        for keys in (4096, 16384):
            batch, heads, s, dd = (1, 2, 40, 8) if smoke else (8, 32, keys, 128)
            q = torch.rand(batch, heads, 1, dd, device=dev)
            k, v = (torch.rand(batch, heads, s, dd, device=dev) for _ in range(2))
            name = f"attention_decode_{batch}x{heads}x1x{s}x{dd}"
            t = seconds_per_call(lambda: sdpa(q, k, v, False), dev, smoke)
            row(name, 2 * batch * heads * s * dd * 4 / t / 1e9, "GB/s")
    print("gpu_torch: done", flush=True)
    if a.dimsum:
        table(a.dimsum, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
