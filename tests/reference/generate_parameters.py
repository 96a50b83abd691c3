#!/usr/bin/python3
"""Writes the parameter files that tests/interop/test_parameters.cpp loads, into
tests/reference/parameters/: one small layer's weights in each format ds::load reads.

    /usr/bin/python3 tests/reference/generate_parameters.py

The layer (as the test declares it): attention.w_qkv (8, 24), attention.b_qkv (24,),
attention.w_o (8, 8), ff.w1 (8, 5), ff.b1 (5,), all float32, and norm (8,) float64; values
uniform in [-1, 1) from a fixed seed. Files:
    block/NAME.npy          numpy.save, one file per parameter (what the other files must equal)
    block.npz               numpy.savez (members stored)
    block_compressed.npz    numpy.savez_compressed (members deflated)
    block.safetensors       written by hand to the published layout (safetensors_by_hand.py,
                            no safetensors package needed), with a __metadata__ entry, as
                            torch's writer adds, and the data not in the header's order
"""
import pathlib

import numpy as np

from safetensors_by_hand import write_safetensors

OUT_DIR = pathlib.Path(__file__).resolve().parent / "parameters"


def parameters():
    rng = np.random.default_rng(20261130)
    shapes = {"attention.w_qkv": (8, 24), "attention.b_qkv": (24,), "attention.w_o": (8, 8),
              "ff.w1": (8, 5), "ff.b1": (5,)}
    p = {name: rng.uniform(-1, 1, shape).astype(np.float32) for name, shape in shapes.items()}
    p["norm"] = rng.uniform(-1, 1, (8,))
    return p


def main():
    p = parameters()
    (OUT_DIR / "block").mkdir(parents=True, exist_ok=True)
    for name, t in p.items():
        np.save(OUT_DIR / "block" / f"{name}.npy", t)
    np.savez(OUT_DIR / "block.npz", **p)
    np.savez_compressed(OUT_DIR / "block_compressed.npz", **p)
    write_safetensors(OUT_DIR / "block.safetensors", p, {"format": "pt", "note": "caf\u00e9"},
                      data_order=sorted(p, reverse=True))
    for f in ("block.npz", "block_compressed.npz"):
        with np.load(OUT_DIR / f) as loaded:
            assert all(np.array_equal(loaded[k], p[k]) for k in p)
    print("wrote", ", ".join(sorted(f.name for f in OUT_DIR.iterdir())))


if __name__ == "__main__":
    main()
