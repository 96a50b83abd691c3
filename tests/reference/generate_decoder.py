"""Reference data for examples/decoder.cpp: a small Llama-style decoder (token embedding,
RMSNorm, grouped-query attention with rotary embeddings, SwiGLU, a final RMSNorm and the
output projection) generating tokens greedily, computed by PyTorch in float64 from float32
weights. Each step recomputes the whole sequence with a causal mask, no cache: a path
independent of the cached one the example takes.

Writes tests/reference/decoder/: weights.safetensors (float32, the names the example's
parameter structs give), prompt.npy (int64, (batch, prompt)), tokens.npy (int64, (batch,
prompt + steps): the prompt and the tokens generated), logits.npy (float64, (steps, batch,
vocab): the last position's logits at each step).

Run with /usr/bin/python3 tests/reference/generate_decoder.py (Debian's python3-torch)."""
import pathlib

import numpy as np
import torch

from llama_reference import decoder_layer, rms_norm
from safetensors_by_hand import write_safetensors

VOCAB, MODEL, HEADS, KV_HEADS, HEAD, HIDDEN = 50, 32, 4, 2, 8, 48
BATCH, PROMPT, STEPS = 2, 5, 8
EPSILON, BASE = 1e-5, 10000.0

out = pathlib.Path(__file__).parent / "decoder"
out.mkdir(exist_ok=True)
generator = torch.Generator().manual_seed(2026)


def weight(*shape, scale):
    return ((torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale).float()


weights = {
    "embedding": weight(VOCAB, MODEL, scale=1.0),
    "block.attention_norm": 1 + weight(MODEL, scale=0.2),
    "block.attention.w_q": weight(MODEL, HEADS * HEAD, scale=MODEL ** -0.5),
    "block.attention.w_k": weight(MODEL, KV_HEADS * HEAD, scale=MODEL ** -0.5),
    "block.attention.w_v": weight(MODEL, KV_HEADS * HEAD, scale=MODEL ** -0.5),
    "block.attention.w_o": weight(HEADS * HEAD, MODEL, scale=(HEADS * HEAD) ** -0.5),
    "block.ffn_norm": 1 + weight(MODEL, scale=0.2),
    "block.w_1": weight(MODEL, HIDDEN, scale=MODEL ** -0.5),
    "block.w_3": weight(MODEL, HIDDEN, scale=MODEL ** -0.5),
    "block.w_2": weight(HIDDEN, MODEL, scale=HIDDEN ** -0.5),
    "norm": 1 + weight(MODEL, scale=0.2),
    "output": weight(MODEL, VOCAB, scale=MODEL ** -0.5),
}
w = {name: t.double() for name, t in weights.items()}


def forward(tokens):  # (batch, seq) -> logits of every position (batch, seq, vocab)
    x = decoder_layer(w["embedding"][tokens], w, "block.", HEADS, KV_HEADS, HEAD, EPSILON, BASE)
    return rms_norm(x, w["norm"], EPSILON) @ w["output"]


prompt = torch.randint(0, VOCAB, (BATCH, PROMPT), generator=generator)
tokens, logits = prompt.clone(), []
with torch.no_grad():
    for step in range(STEPS):
        last = forward(tokens)[:, -1, :]  # (batch, vocab)
        logits.append(last.numpy())
        tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=1)

write_safetensors(out / "weights.safetensors", {name: t.numpy() for name, t in weights.items()})
np.save(out / "prompt.npy", prompt.numpy().astype(np.int64))
np.save(out / "tokens.npy", tokens.numpy().astype(np.int64))
np.save(out / "logits.npy", np.stack(logits))
print("wrote", out, "tokens:", tokens.tolist())
