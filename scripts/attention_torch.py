#!/usr/bin/python3
"""PyTorch baseline for the dimsum attention benchmark (run by src/bench/attention.cpp).

Times one multi-head attention forward (float32, inference, batch_first),
input projections and output projection included, for each case given as
  --case NAME:batch,seq,model,heads[,causal|decode][,bf16]
"decode" means one query token against `seq` cached, already projected keys
and values. "bf16": the module, its input and the caches in torch.bfloat16
(`module.to(torch.bfloat16)`), as a researcher runs bf16. Each (case, impl, threads) runs in a fresh child process so that
peak memory is per configuration.

stdout, one line per measurement and one best line per case:
  torch_attention,<case>,<impl>,<threads>,<ms>,<extra_mb>
  torch_attention_best,<case>,<impl>,<threads>,<ms>,<extra_mb>
or `torch_attention_unavailable,<reason>` if torch cannot be imported.
ms is the per-call time of the fastest timed batch (as dimsum_bench times dimsum); extra_mb is peak RSS (VmHWM) after the timed
calls minus RSS just before the first forward call, in MB (1e6 bytes).
Progress and warnings go to stderr. Exit code 1 if any measurement failed.

PyTorch runs at its best: OMP_WAIT_POLICY=PASSIVE, huge-page malloc, OpenBLAS (torch's BLAS
here) with its own thread pool sized like torch's, and with its best kernels for this CPU
(see openblas_core), whatever OPENBLAS_CORETYPE the caller had set.
"""
import argparse
import math
import os
import resource
import subprocess
import sys

from torch_timing import best_seconds, parse_or_answer

IMPLS = ("module", "manual")


def parse_case(text):
    name, _, spec = text.partition(":")
    parts = spec.split(",")
    bf16 = parts[-1] == "bf16"
    if bf16:
        parts = parts[:-1]
    if not name or len(parts) not in (4, 5) or "," in name:
        raise argparse.ArgumentTypeError(f"bad case {text!r}")
    b, s, m, h = (int(p) for p in parts[:4])
    mode = parts[4] if len(parts) == 5 else "full"
    if mode not in ("full", "causal", "decode") or m % h or min(b, s, m, h) < 1:
        raise argparse.ArgumentTypeError(f"bad case {text!r}")
    return dict(name=name, spec=text, batch=b, seq=s, model=m, heads=h, mode=mode, bf16=bf16)


class Manual:
    """Hand-written attention with the module's weights, tuned for torch 1.13 CPU."""

    def __init__(self, mha, case, torch):
        m, h = case["model"], case["heads"]
        self.torch, self.h, self.d = torch, h, m // h
        scale = 1.0 / math.sqrt(self.d)
        # Fold the 1/sqrt(head) scale into the Q projection: saves a pass over
        # the (seq x seq) scores. Weights are stored (in, out) so addmm needs no
        # transposes.
        w = mha.in_proj_weight.detach().t().contiguous()
        b = mha.in_proj_bias.detach().clone()
        w[:, :m] *= scale
        b[:m] *= scale
        self.w_qkv, self.b_qkv = w, b
        self.w_q, self.b_q = w[:, :m].contiguous(), b[:m].contiguous()
        self.w_o = mha.out_proj.weight.detach().t().contiguous()
        self.b_o = mha.out_proj.bias.detach().clone()
        self.mask = None
        if case["mode"] == "causal":
            s = case["seq"]
            # Additive mask: baddbmm fuses it into the scores GEMM (beta * C),
            # equivalent to masked_fill_(triu(1), -inf) without an extra pass.
            self.mask = torch.zeros(s, s, dtype=w.dtype).masked_fill_(
                torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))

    def _attend(self, q, k_t, v):
        t = self.torch
        if self.mask is None:
            scores = t.bmm(q, k_t)
        else:
            scores = t.baddbmm(self.mask, q, k_t)
        # In-place softmax (out= aliasing input): avoids a second (seq x seq) buffer.
        t._softmax(scores, -1, False, out=scores)
        return t.bmm(scores, v)

    def forward(self, x):
        t = self.torch
        bsz, s, m = x.shape
        h, d = self.h, self.d
        qkv = t.addmm(self.b_qkv, x.reshape(bsz * s, m), self.w_qkv)
        qkv = qkv.view(bsz, s, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, H, S, D)
        q, k, v = (qkv[i].reshape(bsz * h, s, d) for i in range(3))
        o = self._attend(q, k.transpose(1, 2), v)  # (B*H, S, D)
        o = o.view(bsz, h, s, d).transpose(1, 2).reshape(bsz * s, m)
        return t.addmm(self.b_o, o, self.w_o).view(bsz, s, m)

    def decode(self, x, k_cache, v_cache):
        # x: (B, 1, M); caches: (B, H, S, D), contiguous, so every view is free.
        t = self.torch
        bsz, _, m = x.shape
        h, d = self.h, self.d
        q = t.addmm(self.b_q, x.view(bsz, m), self.w_q).view(bsz * h, 1, d)
        k = k_cache.view(bsz * h, -1, d)
        o = self._attend(q, k.transpose(1, 2), v_cache.view(bsz * h, -1, d))
        return t.addmm(self.b_o, o.view(bsz, m), self.w_o).view(bsz, 1, m)


def setup(torch, case, project_cache=False):
    """Module, manual impl and the call arguments; nothing here is timed."""
    torch.manual_seed(0)
    b, s, m, h = case["batch"], case["seq"], case["model"], case["heads"]
    mha = torch.nn.MultiheadAttention(m, h, batch_first=True, bias=True).eval()
    with torch.no_grad():  # default init zeroes the biases; make them matter
        mha.in_proj_bias.uniform_(-0.1, 0.1)
        mha.out_proj.bias.uniform_(-0.1, 0.1)
    dtype = torch.bfloat16 if case["bf16"] else torch.float32
    mha = mha.to(dtype)
    manual = Manual(mha, case, torch)
    if case["mode"] == "decode":
        x = torch.randn(b, 1, m, dtype=dtype)
        if project_cache:  # real projections, so the module can serve as reference
            ctx = torch.randn(b, s, m, dtype=dtype)
            w, bias = mha.in_proj_weight, mha.in_proj_bias
            k, v = (torch.nn.functional.linear(ctx, w[i * m:(i + 1) * m], bias[i * m:(i + 1) * m])
                    .view(b, s, h, m // h).transpose(1, 2).contiguous() for i in (1, 2))
        else:
            ctx = None
            k, v = (torch.randn(b, h, s, m // h, dtype=dtype) for _ in range(2))
        return mha, manual, x, (k, v, ctx)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1) if case["mode"] == "causal" else None
    return mha, manual, torch.randn(b, s, m, dtype=dtype), mask


def verify(torch, case):
    """Module vs manual once per case; warn (stderr) beyond 1e-4 relative (3e-2 in bf16, whose
    two versions round their intermediates differently)."""
    with torch.inference_mode():
        mha, manual, x, extra = setup(torch, case, project_cache=True)
        if case["mode"] == "decode":
            k, v, ctx = extra
            ref = mha(x, ctx, ctx, need_weights=False)[0]
            out = manual.decode(x, k, v)
        else:
            ref = mha(x, x, x, need_weights=False, attn_mask=extra)[0]
            out = manual.forward(x)
        err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).float().item()
    if not err <= (3e-2 if case["bf16"] else 1e-4):
        print(f"warning: {case['name']}: module and manual differ, rel err {err:.3g}",
              file=sys.stderr)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss():
    # ru_maxrss survives fork+exec (the child starts at the parent's peak, several
    # hundred MB after verify()), so track VmHWM of this address space instead and
    # reset it to the current RSS (Linux >= 4.0; harmless if refused).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# OpenBLAS core types of 0.3.21 with AVX-512 kernels, and those without even AVX2 (its own
# detection falls back to these on CPUs newer than it knows).
AVX512_CORES = {"SkylakeX", "Cooperlake", "SapphireRapids"}
PRE_AVX2_CORES = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Atom",
                  "Katmai", "Coppermine", "Northwood", "Banias", "Bobcat", "Barcelona", "Bulldozer"}


def openblas_core():
    """The core type that gives torch's OpenBLAS its best kernels here, or None to keep its own
    detection: OpenBLAS 0.3.21 detects this kind of CPU (Emerald Rapids) as Prescott, SSE3 at a
    fifth of the speed, so "at its best" means SkylakeX (AVX-512) or Haswell (AVX2), as
    dimsum_bench does for its own OpenBLAS baseline."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    probe = ("import ctypes; lib = ctypes.CDLL('libopenblas.so.0'); "
             "lib.openblas_get_corename.restype = ctypes.c_char_p; print(lib.openblas_get_corename().decode())")
    try:  # in a fresh process: OpenBLAS reads the variable once, when it loads
        detected = subprocess.run([sys.executable, "-c", probe], env=env, stdout=subprocess.PIPE,
                                  text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, OSError):
        return None
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    core = None
    if "avx512f" in flags and "avx512bw" in flags and detected not in AVX512_CORES:
        core = "SkylakeX"
    elif "avx2" in flags and detected in PRE_AVX2_CORES:
        core = "Haswell"
    print(f"[attention_torch] OpenBLAS detects {detected}" +
          (f"; the children use {core}" if core else ""), file=sys.stderr)
    return core


def best_environment():
    """The environment a child process gets to run PyTorch at its best: OMP_WAIT_POLICY=PASSIVE,
    huge-page malloc, and OpenBLAS's best kernels (openblas_core), whatever OPENBLAS_CORETYPE
    the caller had set (a core type forced for another purpose can halve it)."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    env.pop("OPENBLAS_CORETYPE", None)
    core = openblas_core()
    if core:
        env["OPENBLAS_CORETYPE"] = core
    return env


def child(args):
    """Measure one (case, impl, threads); prints `ms,extra_mb` on stdout."""
    import torch
    torch.set_num_threads(args.threads)
    case = args.case[0]
    with torch.inference_mode():
        mha, manual, x, extra = setup(torch, case)
        if args.impl == "module":
            fn = lambda: mha(x, x, x, need_weights=False, attn_mask=extra)
        elif case["mode"] == "decode":
            fn = lambda: manual.decode(x, extra[0], extra[1])
        else:
            fn = lambda: manual.forward(x)
        rss0 = rss_bytes()
        reset_peak_rss()
        seconds = best_seconds(fn, args.rounds, args.min_time)
        peak = peak_rss_bytes()
    print(f"{seconds * 1e3:.4f},{(peak - rss0) / 1e6:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Case modes: full (default), causal, decode.")
    ap.add_argument("--case", type=parse_case, action="append", required=True,
                    help="NAME:batch,seq,model,heads[,causal|decode] (repeatable)")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip checking module against manual (a caller's later turns)")
    ap.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    args = parse_or_answer(ap, "torch_attention", child)
    if args is None:
        return 0
    import torch

    env = best_environment()
    threads = [int(t) for t in args.threads.split(",")]
    failed = False
    for case in args.case:
        if not args.no_verify:
            print(f"[attention_torch] {case['spec']}: verifying", file=sys.stderr, flush=True)
            verify(torch, case)
        results = []
        for impl in IMPLS:
            if impl == "module" and case["mode"] == "decode":
                continue  # nn.MultiheadAttention has no KV-cache path
            for t in threads:
                cmd = [sys.executable, os.path.abspath(__file__), "--child",
                       "--case", case["spec"], "--impl", impl, "--threads", str(t),
                       "--rounds", str(args.rounds), "--min-time", str(args.min_time)]
                # OpenBLAS has its own thread pool, which torch.set_num_threads does not size
                child_env = dict(env, OPENBLAS_NUM_THREADS=str(t))
                p = subprocess.run(cmd, env=child_env, stdout=subprocess.PIPE, text=True)
                try:
                    ms, mb = (float(v) for v in p.stdout.strip().splitlines()[-1].split(","))
                    assert p.returncode == 0
                except Exception:
                    print(f"warning: {case['name']} {impl} threads={t} failed (rc {p.returncode})",
                          file=sys.stderr)
                    failed = True
                    continue
                results.append((ms, impl, t, mb))
                print(f"torch_attention,{case['name']},{impl},{t},{ms:.4f},{mb:.2f}", flush=True)
        if results:
            ms, impl, t, mb = min(results)
            print(f"torch_attention_best,{case['name']},{impl},{t},{ms:.4f},{mb:.2f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
