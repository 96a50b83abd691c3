#!/usr/bin/python3
"""PyTorch baseline for dimsum_bench's bf16 GEMM rows (run by src/bench/gemm.cpp).

Times torch.matmul(a, b, out=c) with a (m, k), b (k, n) and c in torch.bfloat16, as a
researcher running bf16 calls it, on each thread count given, each in a fresh child process:
  matmul_torch.py --shape m,k,n [--threads 1,2] [--rounds 5] [--min-time 0.2] [--quick]

stdout, one line per thread count:
  torch_matmul,<threads>,<seconds per call>,<error>
or `torch_matmul_unavailable,<reason>` if torch cannot be imported. The time is that of the
fastest timed batch (as dimsum_bench times dimsum). The error is the product's largest
distance from float64 on the same bf16 values, in units of what float sums and one bf16
rounding of the result allow (k 2^-24 sum |a b| + 2^-8 |c|): at most 1 for a product summed
in float. PyTorch 1.13 on a CPU without AVX512-BF16 exceeds it many times over (its sums
are not float's), which is reported, not hidden. Exit code 1 if any child failed.

PyTorch runs as attention_torch.py runs it: OMP_WAIT_POLICY=PASSIVE and huge-page malloc.
"""
import argparse
import os
import subprocess
import sys

from torch_timing import best_seconds, parse_or_answer


def child(args):
    import torch
    torch.set_num_threads(args.threads)
    m, k, n = args.shape
    generator = torch.Generator().manual_seed(1)
    a = (torch.rand(m, k, generator=generator, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
    b = (torch.rand(k, n, generator=generator, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
    c = torch.empty(m, n, dtype=torch.bfloat16)
    with torch.inference_mode():
        torch.matmul(a, b, out=c)
        exact = torch.matmul(a.double(), b.double())
        bound = k * 2.0 ** -24 * torch.matmul(a.double().abs(), b.double().abs()) + 2.0 ** -8 * exact.abs() + 1e-30
        error = float(((c.double() - exact).abs() / bound).max())
        seconds = best_seconds(lambda: torch.matmul(a, b, out=c), args.rounds, args.min_time)
    print(f"{seconds:.9f},{error:.3g}")
    return 0


def shape(text):
    try:
        m, k, n = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected m,k,n")
    if min(m, k, n) < 1:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}")
    return m, k, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=shape, required=True, help="m,k,n")
    args = parse_or_answer(ap, "torch_matmul", child)
    if args is None:
        return 0

    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    failed = False
    for t in (int(x) for x in args.threads.split(",")):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--shape", ",".join(map(str, args.shape)),
               "--threads", str(t), "--rounds", str(args.rounds), "--min-time", str(args.min_time)]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        try:
            seconds, error = (float(x) for x in p.stdout.strip().splitlines()[-1].split(","))
            assert p.returncode == 0
        except Exception:
            print(f"warning: matmul {args.shape} threads={t} failed (rc {p.returncode})", file=sys.stderr)
            failed = True
            continue
        print(f"torch_matmul,{t},{seconds:.9g},{error:.3g}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
