"""What the PyTorch baselines of dimsum_bench share: how
a call is timed, and how a missing torch is reported."""
import argparse
import math
import os
import subprocess
import sys
import time


def add_timing_options(ap):
    """The options every baseline takes: how long to time, on which thread counts; and the
    hidden --child of the process that measures one configuration."""
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=5, help="timed batches (the fastest reported)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timed batch")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 round, 0.05 s batches")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def parse_timing_options(ap):
    """ap's arguments, with --quick applied."""
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.min_time = 1, 0.05
    args.rounds = max(1, args.rounds)
    return args


def best_seconds(fn, rounds, min_time):
    """The time of one call of fn: after two calls to warm up, the mean over a batch of calls
    lasting about min_time seconds; the fastest of `rounds` batches (as dimsum_bench times
    dimsum)."""
    for _ in range(2):
        fn()
    t0 = time.perf_counter()
    fn()
    reps = max(1, math.ceil(min_time / max(time.perf_counter() - t0, 1e-9)))
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        per_call.append((time.perf_counter() - t0) / reps)
    return min(per_call)


def torch_missing():
    """None if torch imports, else why not, fit for a CSV field."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising something else
        return str(e).replace(",", ";").replace("\n", " ") or type(e).__name__
    return None


def measure_in_children(script, args, tag, env):
    """For each of args.case (dicts with "name" and "spec") and each thread count of
    args.threads, runs `script --child --case SPEC --threads T` in a fresh process and prints
    `TAG,NAME,T,FIELDS`, FIELDS the comma-separated numbers of the child's last line (the first
    a time in ms); then `TAG_best,NAME,T,FIELDS` for the fastest of each case. Returns 1 if a
    child failed, else 0."""
    failed = False
    for case in args.case:
        results = []
        for t in (int(v) for v in args.threads.split(",")):
            cmd = [sys.executable, os.path.abspath(script), "--child", "--case", case["spec"], "--threads", str(t),
                   "--rounds", str(args.rounds), "--min-time", str(args.min_time)]
            # OpenBLAS has its own thread pool, which torch.set_num_threads does not size
            p = subprocess.run(cmd, env=dict(env, OPENBLAS_NUM_THREADS=str(t)), stdout=subprocess.PIPE, text=True)
            try:
                fields = p.stdout.strip().splitlines()[-1]
                ms = float(fields.split(",")[0])
                assert p.returncode == 0
            except Exception:
                print(f"warning: {case['name']} threads={t} failed (rc {p.returncode})", file=sys.stderr)
                failed = True
                continue
            results.append((ms, t, fields))
            print(f"{tag},{case['name']},{t},{fields}", flush=True)
        if results:
            ms, t, fields = min(results)
            print(f"{tag}_best,{case['name']},{t},{fields}", flush=True)
    return 1 if failed else 0


def parse_or_answer(ap, tag, child):
    """ap's arguments (the timing options added), or None where this process has answered
    already: `TAG_unavailable,WHY` printed without torch, or child(args) run in a child
    process (--child)."""
    add_timing_options(ap)
    args = parse_timing_options(ap)
    missing = torch_missing()
    if missing:
        print(f"{tag}_unavailable,{missing}")
        return None
    if args.child:
        args.threads = int(args.threads)
        child(args)
        return None
    return args


def baseline_main(script, ap, tag, child, environment):
    """The main of a baseline measured in fresh processes: parse_or_answer, then
    measure_in_children with environment(). Returns the exit status."""
    args = parse_or_answer(ap, tag, child)
    return 0 if args is None else measure_in_children(script, args, tag, environment())
