"""Writes .safetensors files by hand, to the published layout, so that the reference scripts
need no safetensors package: an 8-byte little-endian header length, a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded with
spaces to a multiple of 8 bytes, then the tensors' bytes back to back."""
import json
import struct

import numpy as np

DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64"}


def write_safetensors(path, tensors, metadata=None, data_order=None):
    """tensors: name -> numpy array. data_order: the names in the order their bytes are laid
    out (by default sorted), which need not be the header's order."""
    header = {"__metadata__": metadata} if metadata else {}
    data, offset = b"", 0
    for name in data_order or sorted(tensors):
        t = np.ascontiguousarray(tensors[name], dtype=tensors[name].dtype.newbyteorder("<"))
        raw = t.tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(dict(sorted(header.items())), separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
