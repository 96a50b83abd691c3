"""Reference data for gradients (tests/nn/test_gradients.cpp): a small transformer block and its
loss, differentiated by PyTorch autograd in float64, and three AdamW steps of torch.optim.AdamW
on those gradients. The block: x + attention(layer_norm(x)) with two causal heads, then
+ W2 gelu(W1 layer_norm(.) + b1), logits by W_out, and the cross-entropy against integer
targets, one of them ignored (-100), averaged over the others.

Writes tests/reference/gradients/:
  x.npy (seq, model), targets.npy int64 (seq,), w_q.npy, w_k.npy, w_v.npy, w_o.npy,
  w_1.npy, b_1.npy, w_2.npy, w_out.npy: the inputs, float64;
  loss.npy (): the loss; grad_NAME.npy: its gradient with respect to each of the above
  (x included);
  adamw_NAME.npy: each weight after three AdamW steps (lr 0.01, betas (0.9, 0.999),
  eps 1e-8, weight decay 0.1), each step on the gradient of the weights before it.

Run with /usr/bin/python3 tests/reference/generate_gradients.py (Debian's python3-torch)."""
import pathlib

import numpy as np
import torch

SEQ, MODEL, HEADS, HEAD, HIDDEN, VOCAB = 7, 8, 2, 4, 12, 5
out = pathlib.Path(__file__).parent / "gradients"
out.mkdir(exist_ok=True)
generator = torch.Generator().manual_seed(2026)


def uniform(*shape, scale=1.0):
    return ((torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale)


inputs = {
    "x": uniform(SEQ, MODEL),
    "w_q": uniform(MODEL, HEADS * HEAD, scale=0.5), "w_k": uniform(MODEL, HEADS * HEAD, scale=0.5),
    "w_v": uniform(MODEL, HEADS * HEAD, scale=0.5), "w_o": uniform(HEADS * HEAD, MODEL, scale=0.5),
    "w_1": uniform(MODEL, HIDDEN, scale=0.5), "b_1": uniform(HIDDEN, scale=0.1),
    "w_2": uniform(HIDDEN, MODEL, scale=0.5), "w_out": uniform(MODEL, VOCAB, scale=0.5),
}
targets = torch.randint(0, VOCAB, (SEQ,), generator=generator, dtype=torch.int64)
targets[3] = -100


def layer_norm(t):
    return torch.nn.functional.layer_norm(t, (t.shape[-1],), eps=1e-5)


def loss_of(p):
    h = layer_norm(p["x"])
    def heads(t):  # (seq, heads*head) -> (heads, seq, head)
        return t.view(SEQ, HEADS, HEAD).transpose(0, 1)
    q, k, v = heads(h @ p["w_q"]), heads(h @ p["w_k"]), heads(h @ p["w_v"])
    scores = q @ k.transpose(1, 2) / HEAD ** 0.5
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)
    attended = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v
    r = p["x"] + attended.transpose(0, 1).reshape(SEQ, HEADS * HEAD) @ p["w_o"]
    m = r + torch.nn.functional.gelu(layer_norm(r) @ p["w_1"] + p["b_1"]) @ p["w_2"]
    logits = m @ p["w_out"]
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)


params = {name: value.clone().requires_grad_(True) for name, value in inputs.items()}
loss = loss_of(params)
loss.backward()
for name, value in inputs.items():
    np.save(out / f"{name}.npy", value.numpy())
    np.save(out / f"grad_{name}.npy", params[name].grad.numpy())
np.save(out / "targets.npy", targets.numpy())
np.save(out / "loss.npy", loss.detach().numpy())

weights = {name: value.clone().requires_grad_(True) for name, value in inputs.items() if name != "x"}
optimizer = torch.optim.AdamW(weights.values(), lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
for _ in range(3):
    optimizer.zero_grad()
    loss_of({"x": inputs["x"], **weights}).backward()
    optimizer.step()
for name, value in weights.items():
    np.save(out / f"adamw_{name}.npy", value.detach().numpy())
