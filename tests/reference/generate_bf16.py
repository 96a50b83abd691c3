"""Reference conversions to bfloat16 for tests/core/test_bf16.cpp.

float32 -> bf16 comes from PyTorch (torch.Tensor.to(torch.bfloat16), round to nearest even);
double -> bf16 from exact rational arithmetic (PyTorch rounds a double to float first, which
rounds some values twice). Run with /usr/bin/python3 from tests/reference/.
"""
from fractions import Fraction
import math
import struct

import numpy as np
import torch

rng = np.random.default_rng(11)

# float32 inputs: ordinary values of every magnitude, exact ties (odd and even kept part),
# the edges of the range, subnormals, zeros, infinities. NaN is checked apart (PyTorch gives
# one canonical NaN; dimsum keeps the sign and payload, as the hardware conversion does).
bits = []
bits += [int(b) for b in rng.integers(0, 2**32, 4000, dtype=np.uint64)]
for kept in list(rng.integers(0, 2**16, 300)) + [0x3f80, 0x3f81, 0x7f7e, 0x7f7f, 0x0000, 0x0001, 0x007f, 0x0080]:
    for low in (0x8000, 0x7fff, 0x8001, 0x0000, 0xffff):
        bits.append((int(kept) << 16) | low)
bits = np.array([b for b in bits if (b & 0x7fffffff) <= 0x7f800000], dtype=np.uint32)
floats = bits.view(np.float32)
want = torch.from_numpy(floats.copy()).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
np.save("bf16/float_in.npy", floats)
np.save("bf16/float_bits.npy", want.astype(np.int32))


def nearest_bf16(d):
    """The bf16 bits nearest to double d (ties to even), by exact arithmetic."""
    if math.isinf(d):
        return 0x7f80 | (0x8000 if d < 0 else 0)
    sign = 0x8000 if math.copysign(1.0, d) < 0 else 0
    x = Fraction(abs(d))
    if x == 0:
        return sign
    # candidates: every finite bf16 is m * 2^(e - 7) with 8-bit m; find the bracketing pair
    best = None
    e = max(math.frexp(abs(d))[1] - 1, -126)  # unbiased exponent, clamped to the subnormal range
    ulp = Fraction(2) ** (e - 7)
    low = (x // ulp) * ulp
    high = low + ulp
    q_low = low / ulp
    if x - low < high - x or (x - low == high - x and q_low % 2 == 0):
        best = low
    else:
        best = high
    largest = Fraction(2 - Fraction(1, 128)) * Fraction(2) ** 127
    if best > largest:
        return sign | 0x7f80
    f = float(best)  # exact: best is a bf16, so a float
    return sign | (struct.unpack("<I", struct.pack("<f", f))[0] >> 16)


doubles = list(rng.normal(0, 1, 1000) * np.exp2(rng.integers(-140, 130, 1000)))
# double-rounding traps: just above a bf16 tie by less than half a float ulp
for kept in rng.integers(0, 2**15, 300):
    tie = struct.unpack("<f", struct.pack("<I", (int(kept) << 16) | 0x8000))[0]
    if not math.isfinite(tie) or tie == 0:
        continue
    doubles += [tie, tie * (1 + 2.0**-40), tie * (1 - 2.0**-40), -tie * (1 + 2.0**-30)]
doubles += [0.0, -0.0, math.inf, -math.inf, 3.3895313892515355e38, 3.3961775292304e38, 1e39, -1e39, 1e-45, 5e-324]
doubles = np.array(doubles, dtype=np.float64)
np.save("bf16/double_in.npy", doubles)
np.save("bf16/double_bits.npy", np.array([nearest_bf16(float(d)) for d in doubles], dtype=np.int32))
print(len(floats), "floats,", len(doubles), "doubles")
