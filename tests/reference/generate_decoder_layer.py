"""Reference data for nn::decoder_layer (tests/nn/test_attention_layer.cpp): one pre-norm
Llama layer (RMSNorm, grouped-query attention with rotary embeddings, SwiGLU) over a batch of
three sequences of different lengths, fed step by step as a padded batch, left- and
right-padded, and as an unpadded batch. PyTorch computes each sequence alone, all its tokens
at once with a causal mask and no cache, in float64 from float32 weights: a path independent
of the cached, padded one the test takes.

Writes tests/reference/decoder_layer/:
  weights.safetensors  float32, the layer's parameter names (attention.w_q, ...);
  real.npy             int64 (steps, batch): each step's real rows per sequence;
  steps.npy            int64 (steps,): each step's rows (the padded batch's width);
  x_left_S.npy, x_right_S.npy      float32 (batch, steps[S], model): step S's rows, padding
                                   rows (random values, which must not matter) on the left
                                   or the right;
  y_left_S.npy, y_right_S.npy      float64: the layer's output there, NaN on padding rows;
  x_even_S.npy, y_even_S.npy       an unpadded batch of two sequences, steps of 4, 3 and 1 rows.

Run with /usr/bin/python3 tests/reference/generate_decoder_layer.py (Debian's python3-torch)."""
import pathlib

import numpy as np
import torch

from llama_reference import decoder_layer
from safetensors_by_hand import write_safetensors

MODEL, HEADS, KV_HEADS, HEAD, HIDDEN = 32, 4, 2, 8, 48
EPSILON, BASE = 1e-5, 10000.0
# per step, the real rows of each of the three sequences; a step is as wide as its largest
REAL = [[5, 3, 1], [2, 2, 2], [1, 3, 2], [1, 1, 1]]
EVEN = [4, 3, 1]  # the unpadded batch's steps

out = pathlib.Path(__file__).parent / "decoder_layer"
out.mkdir(exist_ok=True)
generator = torch.Generator().manual_seed(2027)


def uniform(*shape, scale):
    return ((torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale).float()


weights = {
    "attention_norm": 1 + uniform(MODEL, scale=0.2),
    "attention.w_q": uniform(MODEL, HEADS * HEAD, scale=MODEL ** -0.5),
    "attention.w_k": uniform(MODEL, KV_HEADS * HEAD, scale=MODEL ** -0.5),
    "attention.w_v": uniform(MODEL, KV_HEADS * HEAD, scale=MODEL ** -0.5),
    "attention.w_o": uniform(HEADS * HEAD, MODEL, scale=(HEADS * HEAD) ** -0.5),
    "ffn_norm": 1 + uniform(MODEL, scale=0.2),
    "w_1": uniform(MODEL, HIDDEN, scale=MODEL ** -0.5),
    "w_3": uniform(MODEL, HIDDEN, scale=MODEL ** -0.5),
    "w_2": uniform(HIDDEN, MODEL, scale=HIDDEN ** -0.5),
}
w = {name: t.double() for name, t in weights.items()}


def layer(x):  # one sequence, all its rows: (seq, model) -> (seq, model)
    return decoder_layer(x[None], w, "", HEADS, KV_HEADS, HEAD, EPSILON, BASE)[0]


def rows(count):
    return uniform(count, MODEL, scale=1.0)


def padded(sequences, side):
    """sequences: per sequence, its tokens' rows (float32, (total, model)), fed as REAL says."""
    expected = [layer(s.double()) for s in sequences]
    done = [0] * len(sequences)
    for step, real in enumerate(REAL):
        n = max(real)
        x = rows(len(sequences) * n).view(len(sequences), n, MODEL)  # padding rows: noise
        y = torch.full((len(sequences), n, MODEL), float("nan"), dtype=torch.float64)
        for b, r in enumerate(real):
            at = slice(n - r, n) if side == "left" else slice(0, r)
            x[b, at] = sequences[b][done[b] : done[b] + r]
            y[b, at] = expected[b][done[b] : done[b] + r]
            done[b] += r
        np.save(out / f"x_{side}_{step}.npy", x.numpy())
        np.save(out / f"y_{side}_{step}.npy", y.numpy())


totals = [sum(step[b] for step in REAL) for b in range(3)]
sequences = [rows(t) for t in totals]
padded(sequences, "left")
padded(sequences, "right")

even = [rows(sum(EVEN)) for _ in range(2)]
expected = [layer(s.double()) for s in even]
done = 0
for step, n in enumerate(EVEN):
    np.save(out / f"x_even_{step}.npy", torch.stack([s[done : done + n] for s in even]).numpy())
    np.save(out / f"y_even_{step}.npy", torch.stack([e[done : done + n] for e in expected]).numpy())
    done += n

np.save(out / "real.npy", np.array(REAL, dtype=np.int64))
np.save(out / "steps.npy", np.array([max(r) for r in REAL], dtype=np.int64))
write_safetensors(out / "weights.safetensors", {name: t.numpy() for name, t in weights.items()})

# The same layer as the two common checkpoint layouts store it, matrices (out, in) as
# torch.nn.Linear holds them, beside other parameters of the model: Hugging Face's
# (model.layers.N.self_attn.q_proj.weight, ...) and Meta's, which Mistral's consolidated
# files keep (layers.N.attention.wq.weight, ...).
HUGGING_FACE = {
    "attention_norm": "input_layernorm.weight", "attention.w_q": "self_attn.q_proj.weight",
    "attention.w_k": "self_attn.k_proj.weight", "attention.w_v": "self_attn.v_proj.weight",
    "attention.w_o": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
    "w_1": "mlp.gate_proj.weight", "w_3": "mlp.up_proj.weight", "w_2": "mlp.down_proj.weight",
}
META = {
    "attention_norm": "attention_norm.weight", "attention.w_q": "attention.wq.weight",
    "attention.w_k": "attention.wk.weight", "attention.w_v": "attention.wv.weight",
    "attention.w_o": "attention.wo.weight", "ffn_norm": "ffn_norm.weight",
    "w_1": "feed_forward.w1.weight", "w_3": "feed_forward.w3.weight", "w_2": "feed_forward.w2.weight",
}


def stored(t):
    return t.t().contiguous().numpy() if t.dim() == 2 else t.numpy()


for file, prefix, names in [("hugging_face.safetensors", "model.layers.1.", HUGGING_FACE),
                            ("meta.safetensors", "layers.1.", META)]:
    tensors = {prefix + names[name]: stored(t) for name, t in weights.items()}
    tensors[prefix.replace("1", "0") + names["ffn_norm"]] = np.zeros(MODEL, dtype=np.float32)  # another layer
    write_safetensors(out / file, tensors)
print("wrote", out)
