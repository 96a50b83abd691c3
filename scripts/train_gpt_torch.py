"""The training step of examples/train_gpt.cpp in PyTorch, for a side-by-side figure: the same
model (two pre-norm layers of RMSNorm, rotary embedding in the rotate-half convention,
grouped-query attention with 4 query heads over 2 key/value heads of 16, SwiGLU of 128; model
64, vocabulary 11), the same task (reverse 8 digits; batch 32 sequences of 16 tokens, the loss
on the answer digits), cross-entropy, clipping at 1.0 and AdamW (lr 3e-3, no weight decay),
in float32. Prints the median tokens per second over the steps after the first 10, and the
step at which 99% of held-out answers (generated one token at a time) are right, if reached.

Usage: /usr/bin/python3 scripts/train_gpt_torch.py [--steps N] [--threads T]"""
import argparse
import statistics
import time

import torch

DIGITS, LENGTH, VOCAB, MODEL, KV_HEADS, GROUP, HEAD, HIDDEN, SEPARATOR = 8, 16, 11, 64, 2, 2, 16, 128, 10


def sequences(count, generator):
    digits = torch.randint(0, 10, (count, DIGITS), generator=generator)
    full = torch.cat([digits, torch.full((count, 1), SEPARATOR), digits.flip(1)], dim=1)
    tokens, targets = full[:, :LENGTH].clone(), full[:, 1:LENGTH + 1].clone()
    targets[:, :DIGITS] = -100
    return tokens, targets


def rms_norm(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        def p(*shape):
            return torch.nn.Parameter(torch.randn(*shape) * 0.02)
        self.embedding = p(VOCAB, MODEL)
        self.layers = torch.nn.ModuleList()
        for _ in range(2):
            layer = torch.nn.Module()
            layer.attention_norm = torch.nn.Parameter(torch.ones(MODEL))
            layer.feed_forward_norm = torch.nn.Parameter(torch.ones(MODEL))
            layer.w_q, layer.w_k, layer.w_v = p(MODEL, MODEL), p(MODEL, KV_HEADS * HEAD), p(MODEL, KV_HEADS * HEAD)
            layer.w_o, layer.w_1, layer.w_3, layer.w_2 = p(MODEL, MODEL), p(MODEL, HIDDEN), p(MODEL, HIDDEN), p(HIDDEN, MODEL)
            self.layers.append(layer)
        self.final_norm = torch.nn.Parameter(torch.ones(MODEL))
        self.w_out = p(MODEL, VOCAB)
        angles = torch.arange(LENGTH, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * torch.arange(HEAD // 2) / HEAD)
        self.register_buffer("cos", angles.cos().float())
        self.register_buffer("sin", angles.sin().float())

    def rotate(self, x):  # (..., seq, head)
        x1, x2 = x[..., :HEAD // 2], x[..., HEAD // 2:]
        return torch.cat([x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin], dim=-1)

    def forward(self, tokens):
        batch = tokens.shape[0]
        x = self.embedding[tokens]
        causal = torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), diagonal=1)
        for layer in self.layers:
            h = rms_norm(x, layer.attention_norm)
            q = self.rotate((h @ layer.w_q).view(batch, LENGTH, KV_HEADS, GROUP, HEAD).permute(0, 2, 3, 1, 4))
            k = self.rotate((h @ layer.w_k).view(batch, LENGTH, KV_HEADS, 1, HEAD).permute(0, 2, 3, 1, 4))
            v = (h @ layer.w_v).view(batch, LENGTH, KV_HEADS, 1, HEAD).permute(0, 2, 3, 1, 4)
            scores = (q @ k.transpose(-1, -2) / HEAD ** 0.5).masked_fill(causal, float("-inf"))
            z = torch.softmax(scores, dim=-1) @ v
            x = x + z.permute(0, 3, 1, 2, 4).reshape(batch, LENGTH, MODEL) @ layer.w_o
            h = rms_norm(x, layer.feed_forward_norm)
            x = x + (torch.nn.functional.silu(h @ layer.w_1) * (h @ layer.w_3)) @ layer.w_2
        return rms_norm(x, self.final_norm) @ self.w_out


def generated_accuracy(model, tokens, targets):
    tokens = tokens.clone()
    right = 0
    with torch.no_grad():
        for t in range(DIGITS, LENGTH):
            best = model(tokens)[:, t].argmax(-1)
            right += (best == targets[:, t]).sum().item()
            if t + 1 < LENGTH:
                tokens[:, t + 1] = best
    return right / (tokens.shape[0] * DIGITS)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(2026)
    held_out = sequences(128, torch.Generator().manual_seed(99))
    rates, reached = [], None
    for step in range(1, args.steps + 1):
        tokens, targets = sequences(32, generator)
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        rates.append(32 * LENGTH / (time.perf_counter() - start))
        if step % 50 == 0 and reached is None and generated_accuracy(model, *held_out) >= 0.99:
            reached = step
    print(f"pytorch {torch.__version__}, {args.threads} threads: median {statistics.median(rates[10:]):.0f} tokens/s "
          f"over steps 11 to {args.steps}; 99% of held-out answers right at step {reached}; "
          f"{100 * generated_accuracy(model, *held_out):.2f}% at the end")


if __name__ == "__main__":
    main()
