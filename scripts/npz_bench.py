#!/usr/bin/python3
"""NumPy's side of dimsum_npz_bench (src/npz_bench.cpp), which runs it with /usr/bin/python3:

  npz_bench.py write PATH SCALE   writes PATH with numpy.savez_compressed: the weights of a
                                  BERT-base encoder (12 layers of 768, a 30522-word embedding;
                                  110 M float32 values, 440 MB) times SCALE in every extent
                                  but the layers' count, drawn from N(0, 0.02) and rounded to
                                  bfloat16's 8 bits of mantissa (the low two bytes zero), as
                                  weights trained in bf16 and saved as float32 are
  npz_bench.py load PATH ROUNDS   loads every member with numpy.load, ROUNDS times

stdout of `load`, one line per member, then the timing:
  crc,<name>,<CRC-32 of the array's bytes, in hex>
  numpy,<bytes of array data>,<seconds of the fastest round>
or `numpy_unavailable,<reason>` if numpy cannot be imported.
"""
import sys
import time
import zlib


def bert_base(scale, rng, np):
    model, hidden, words = (max(1, int(n * scale)) for n in (768, 3072, 30522))

    def weights(*shape):
        a = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
        return ((a + 0x8000) & 0xffff0000).view(np.float32)  # to the nearest bf16 (ties up)

    arrays = {"embeddings.word": weights(words, model), "embeddings.position": weights(512, model),
              "embeddings.norm.weight": np.ones(model, np.float32), "embeddings.norm.bias": np.zeros(model, np.float32)}
    for layer in range(12):
        p = f"encoder.layer.{layer}."
        for name in ("q", "k", "v", "o"):
            arrays[p + f"attention.w_{name}"] = weights(model, model)
            arrays[p + f"attention.b_{name}"] = weights(model)
        arrays[p + "w_ff1"], arrays[p + "b_ff1"] = weights(model, hidden), weights(hidden)
        arrays[p + "w_ff2"], arrays[p + "b_ff2"] = weights(hidden, model), weights(model)
        for norm in ("ln1", "ln2"):
            arrays[p + norm + ".weight"] = np.ones(model, np.float32)
            arrays[p + norm + ".bias"] = np.zeros(model, np.float32)
    return arrays


def main():
    try:
        import numpy as np
    except ImportError as e:
        print(f"numpy_unavailable,{e}")
        return 0
    command, path = sys.argv[1], sys.argv[2]
    if command == "write":
        np.savez_compressed(path, **bert_base(float(sys.argv[3]), np.random.default_rng(46), np))
        return 0
    best = float("inf")
    for _ in range(int(sys.argv[3])):
        start = time.perf_counter()
        with np.load(path) as z:
            total = sum(z[name].nbytes for name in z.files)
        best = min(best, time.perf_counter() - start)
    with np.load(path) as z:
        for name in z.files:
            print(f"crc,{name},{zlib.crc32(z[name].tobytes()):08x}")
    print(f"numpy,{total},{best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
