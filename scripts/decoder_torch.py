#!/usr/bin/python3
"""PyTorch baseline for dimsum_bench's decoder rows (src/bench/decoder.cpp).

Times one decoding step of the Llama-style decoder of examples/decoder.hpp (float32,
inference): one new token at position `positions` of a KV cache of that many positions,
embedding to logits, for each case given as
  --case NAME:vocab,model,heads,kv_heads,head,hidden,positions
with 1 and 2 threads (--threads). The weights are random: the time does not depend on them.

PyTorch at its best for this step, by hand (torch 1.13 has no torch.compile and no
scaled_dot_product_attention), in the environment attention_torch.py gives it (OMP_WAIT_POLICY
PASSIVE, huge-page malloc, OpenBLAS's best kernels for this CPU and its thread pool sized like
torch's, one child process per thread count): no autograd, weights stored (in, out) so that every product
is x @ W, the caches preallocated and written in place, the rotary tables computed once,
and grouped-query attention without repeat_interleave: the group's queries stacked as rows
of one product per key/value head.

With --verify DIR (tests/reference/decoder), it first decodes the reference prompt with the
reference weights, step by step through its cache, and checks every step's logits against
PyTorch's float64 ones there: a wrong baseline would time the wrong work.

stdout, one line per measurement:
  torch_decoder,<case>,<threads>,<ms>
or `torch_decoder_unavailable,<reason>` if torch cannot be imported.
ms is the fastest of the timed calls after a warm-up (as dimsum_bench times dimsum).
"""
import argparse
import json
import os
import pathlib
import struct
import subprocess
import sys
import time


def parse_case(text):
    name, _, spec = text.partition(":")
    parts = [int(p) for p in spec.split(",")]
    if not name or len(parts) != 7:
        raise argparse.ArgumentTypeError(f"bad case {text!r}")
    keys = ("vocab", "model", "heads", "kv_heads", "head", "hidden", "positions")
    return dict(name=name, **dict(zip(keys, parts)))


class Decoder:
    def __init__(self, torch, c):
        self.torch, self.c = torch, c
        g = torch.Generator().manual_seed(1)

        def weight(*shape):
            return (torch.rand(*shape, generator=g) * 2 - 1) * shape[0] ** -0.5

        m, h, kv, d, f, vocab = c["model"], c["heads"], c["kv_heads"], c["head"], c["hidden"], c["vocab"]
        self.embedding = weight(vocab, m)
        self.g1, self.g2, self.g3 = (torch.ones(m) for _ in range(3))
        self.w_q, self.w_k, self.w_v, self.w_o = weight(m, h * d), weight(m, kv * d), weight(m, kv * d), weight(h * d, m)
        self.w_1, self.w_3, self.w_2 = weight(m, f), weight(m, f), weight(f, m)
        self.output = weight(m, vocab)
        capacity = c["positions"] + 1
        self.k_cache = torch.randn(1, kv, capacity, d)
        self.v_cache = torch.randn(1, kv, capacity, d)
        frequency = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angle = torch.arange(capacity, dtype=torch.float64)[:, None] * frequency[None, :]
        self.cos, self.sin = torch.cos(angle).float(), torch.sin(angle).float()

    def rms(self, x, g):
        return x * self.torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g

    def rotate(self, x, position):  # (..., head)
        half = self.c["head"] // 2
        c, s = self.cos[position], self.sin[position]
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def step(self, token, position):  # token (1, 1): the logits (1, vocab)
        torch, c = self.torch, self.c
        kv, d, group = c["kv_heads"], c["head"], c["heads"] // c["kv_heads"]
        x = self.embedding[token]  # (1, 1, model)
        h = self.rms(x, self.g1)
        q = self.rotate((h @ self.w_q).view(1, kv, group, d), position)  # (1, kv, group, head)
        self.k_cache[:, :, position] = self.rotate((h @ self.w_k).view(1, kv, d), position)
        self.v_cache[:, :, position] = (h @ self.w_v).view(1, kv, d)
        keys, values = self.k_cache[:, :, : position + 1], self.v_cache[:, :, : position + 1]
        scores = q @ keys.transpose(-1, -2) * d ** -0.5  # (1, kv, group, positions)
        z = torch.softmax(scores, dim=-1) @ values  # (1, kv, group, head)
        x = x + z.reshape(1, 1, -1) @ self.w_o
        h = self.rms(x, self.g2)
        x = x + (torch.nn.functional.silu(h @ self.w_1) * (h @ self.w_3)) @ self.w_2
        return self.rms(x[:, -1], self.g3) @ self.output


def read_safetensors(path, torch):
    raw = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    data = raw[8 + length :]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32).reshape(entry["shape"])
    return out


def verify(torch, directory):
    """The decoder against tests/reference/decoder: the largest difference of the logits."""
    import numpy as np

    w = read_safetensors(f"{directory}/weights.safetensors", torch)
    prompt = np.load(f"{directory}/prompt.npy")
    want = np.load(f"{directory}/logits.npy")
    tokens = np.load(f"{directory}/tokens.npy")
    vocab, model = w["embedding"].shape
    c = dict(vocab=vocab, model=model, heads=w["block.attention.w_q"].shape[1] // 8, kv_heads=w["block.attention.w_k"].shape[1] // 8, head=8,
             hidden=w["block.w_1"].shape[1], positions=tokens.shape[1])
    worst = 0.0
    for b in range(prompt.shape[0]):
        d = Decoder(torch, c)
        d.embedding, d.g1, d.g2, d.g3, d.output = w["embedding"], w["block.attention_norm"], w["block.ffn_norm"], w["norm"], w["output"]
        d.w_q, d.w_k, d.w_v, d.w_o = w["block.attention.w_q"], w["block.attention.w_k"], w["block.attention.w_v"], w["block.attention.w_o"]
        d.w_1, d.w_3, d.w_2 = w["block.w_1"], w["block.w_3"], w["block.w_2"]
        for position in range(tokens.shape[1] - 1):
            logits = d.step(torch.tensor([[int(tokens[b, position])]]), position)
            step = position - (prompt.shape[1] - 1)
            if step >= 0:
                worst = max(worst, float((logits[0].double() - torch.from_numpy(want[step, b])).abs().max()))
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", type=parse_case, action="append", default=[])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--seconds", type=float, default=0.3, help="time spent on each measurement")
    parser.add_argument("--verify", help="tests/reference/decoder: check the decoder against PyTorch float64 first")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # the thread count of a child process
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_decoder_unavailable,{e}")
        return 0
    torch.set_grad_enabled(False)
    if args.child is None:  # the parent: one child per thread count, each in torch's best environment
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from attention_torch import best_environment

        env = best_environment()
        failed = False
        for threads in args.threads.split(","):
            command = [sys.executable, os.path.abspath(__file__), "--child", threads, "--seconds", str(args.seconds)]
            command += [f"--case={c['name']}:{c['vocab']},{c['model']},{c['heads']},{c['kv_heads']},{c['head']},"
                        f"{c['hidden']},{c['positions']}" for c in args.case]
            if args.verify:
                command += ["--verify", args.verify]
            failed |= subprocess.run(command, env=dict(env, OPENBLAS_NUM_THREADS=threads)).returncode != 0
        return 1 if failed else 0
    if args.verify:
        worst = verify(torch, args.verify)
        if not worst <= 1e-4:
            print(f"decoder_torch.py: the decoder's logits differ from the reference by {worst}", file=sys.stderr)
            return 1
        print(f"decoder_torch.py: verified, logits within {worst:.2e} of the reference", file=sys.stderr)
    threads = args.child
    torch.set_num_threads(threads)
    for c in args.case:
        model = Decoder(torch, c)
        token = torch.tensor([[7]])
        model.step(token, c["positions"])  # warm-up
        best, spent = float("inf"), 0.0
        while spent < args.seconds or best == float("inf"):
            start = time.perf_counter()
            model.step(token, c["positions"])
            seconds = time.perf_counter() - start
            best, spent = min(best, seconds), spent + seconds
        print(f"torch_decoder,{c['name']},{threads},{best * 1e3:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
