#!/usr/bin/python3
"""Draws the charts of docs/performance.md from the CSV that `dimsum_bench --csv` writes.

PNG: one panel per yardstick (openblas, onednn, fma_peak, copy_bandwidth, pytorch,
pytorch_memory); in each, a group of bars per case and a bar per thread count, its height
dimsum / yardstick. The dashed line at 1.0 is parity with the library, or for fma_peak and
copy_bandwidth the machine's limit. The attention memory rows (seq_x_seq_scores) go to a
second chart, memory against sequence length, beside the PNG as attention_memory.png.

usage: plot_performance.py [CSV [PNG]]   (defaults: docs/performance.csv, docs/performance.png)
Needs Debian's python3-matplotlib (scripts/setup.sh installs it with DIMSUM_WITH_BENCH=1).
"""
import csv
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")  # a file, no display
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TITLES = {
    "openblas": "GEMM: dimsum / OpenBLAS cblas_sgemm (GFLOP/s)",
    "onednn": "GEMM: dimsum / oneDNN dnnl_sgemm (GFLOP/s)",
    "fma_peak": "GEMM and attention: dimsum / the FMA peak measured in the same run (GFLOP/s)",
    "copy_bandwidth": "softmax and elementwise: dimsum / memcpy (GB/s, bytes read + written)",
    "pytorch": "attention layer: dimsum / PyTorch at its best (GFLOP/s; higher is better)",
    "pytorch_memory": "attention layer: dimsum's memory / PyTorch's, beyond inputs and weights (lower is better)",
    # the bf16 rows (dimsum_bench --filter=bf16_)
    "dimsum_float": "bf16: dimsum in bf16 / dimsum in float on the same values",
    "dimsum_bf16": "bf16 GEMM: weights prepacked / packed at each call",
    "onednn_bf16": "bf16 GEMM: dimsum / oneDNN's bf16 matmul primitive (GFLOP/s)",
    "pytorch_bf16": "bf16 GEMM: dimsum / torch.matmul in bf16 (GFLOP/s)",
    "vdpbf16ps_peak": "bf16 GEMM and attention: dimsum / the vdpbf16ps peak measured in the same run",
    "amx_peak": "bf16 GEMM and attention: dimsum / the AMX peak measured in the same run",
}
MEMORY_YARDSTICK = "seq_x_seq_scores"


def plot_memory(rows, png_path):
    """Memory beyond inputs, weights and output against seq, log-log, with seq x seq."""
    layer = [(r, float(r["dimsum"])) for r in rows if not r["name"].endswith("_core")]
    core = [(r, float(r["dimsum"])) for r in rows if r["name"].endswith("_core")]
    seq = lambda r: int(r["name"].split("seq")[-1].removesuffix("_core"))  # noqa: E731
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([seq(r) for r, _ in layer], [mb for _, mb in layer], "o-", label="multi-head layer (Q, K, V held)")
    ax.plot([seq(r) for r, _ in core], [max(mb, 0.01) for _, mb in core], "s-", label="attention of given Q, K, V")
    ax.plot([seq(r) for r, _ in layer], [float(r["baseline"]) for r, _ in layer], "k--", label="the seq x seq scores")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (causal, model 1024, 16 heads)")
    ax.set_ylabel("MB beyond inputs, weights, output")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    print(f"wrote {png_path}")


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["threads"] = int(row["threads"])
        row["ratio"] = float(row["ratio"])
    return rows


def main(csv_path, png_path):
    rows = read_rows(csv_path)
    if not rows:
        print(f"{csv_path}: no rows", file=sys.stderr)
        return 1
    memory = [row for row in rows if row["baseline_name"] == MEMORY_YARDSTICK]
    if memory:
        plot_memory(memory, pathlib.Path(png_path).with_name("attention_memory.png"))
    rows = [row for row in rows if row["baseline_name"] != MEMORY_YARDSTICK]
    yardsticks = list(dict.fromkeys(row["baseline_name"] for row in rows))  # in the CSV's order
    threads = sorted({row["threads"] for row in rows})
    width = 0.8 / len(threads)

    fig, axes = plt.subplots(len(yardsticks), 1, figsize=(11, 3.0 * len(yardsticks)), squeeze=False)
    for ax, yardstick in zip(axes[:, 0], yardsticks):
        mine = [row for row in rows if row["baseline_name"] == yardstick]
        cases = list(dict.fromkeys(row["name"] for row in mine))
        for i, count in enumerate(threads):
            ratio = {row["name"]: row["ratio"] for row in mine if row["threads"] == count}
            offset = (i - (len(threads) - 1) / 2) * width
            xs = [x + offset for x, case in enumerate(cases) if case in ratio]
            bars = ax.bar(xs, [ratio[case] for case in cases if case in ratio], width,
                          label=f"{count} thread{'s' if count > 1 else ''}")
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        crowded = len(cases) > 6  # long names would overlap
        ax.set_xticks(range(len(cases)), cases, fontsize=7 if crowded else 8, rotation=20 if crowded else 0,
                      ha="right" if crowded else "center")
        ax.set_ylabel(f"dimsum / {yardstick}", fontsize=9)
        ax.set_title(TITLES.get(yardstick, yardstick), fontsize=10)
        ax.margins(y=0.15)  # room for the labels above the bars
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    print(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    csv_path = args[0] if args else ROOT / "docs" / "performance.csv"
    png_path = args[1] if len(args) > 1 else ROOT / "docs" / "performance.png"
    sys.exit(main(csv_path, png_path))
