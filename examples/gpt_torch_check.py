#!/usr/bin/env python3
"""Loads a consolidated gpt checkpoint into a PyTorch module with nanoGPT's
names and computes the val loss the way `gpt eval` does (64 windows evenly
spaced through the last 10 % of the corpus). Needs python3-torch and
python3-h5py (Debian); the build and the tests never do.

    consolidate_ckpts --ckpt-prefix ckpt/ckpt-step-600 --save-path gpt.h5
    /usr/bin/python3 examples/gpt_torch_check.py gpt.h5 ~/.cache/cxla/kjv.txt

The state dict loads with strict=True apart from lm_head.weight, which is
tied to transformer.wte.weight and stored once under that name. The number
of heads, which no weight's shape tells, comes from the file's root
attribute program_meta, where gpt stores its model config ("vocab_size=256
block_size=128 n_layer=4 n_head=4 n_embd=256 precision=f32"); --n-head is for files
saved before it, and must agree with it otherwise.
"""
import argparse
import math

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c)
        self.attn.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, 4 * c)
        self.mlp.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        att = att.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, c):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, c)
        self.transformer.wpe = nn.Embedding(block, c)
        self.transformer.h = nn.ModuleList([Block(c, n_head) for _ in range(n_layer)])
        self.transformer.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("h5")
    ap.add_argument("corpus")
    ap.add_argument("--n-head", type=int, help="files without program_meta only (default 4)")
    ap.add_argument("--windows", type=int, default=64)
    a = ap.parse_args()
    with h5py.File(a.h5, "r") as f:
        sd = {k: torch.tensor(f["model"][k][()]) for k in f["model"].keys()}
        meta = f.attrs.get("program_meta", b"")
    meta = dict(kv.split("=", 1) for kv in (meta.decode() if isinstance(meta, bytes) else str(meta)).split())
    n_head = int(meta.get("n_head", a.n_head or 4))
    if a.n_head is not None and a.n_head != n_head:
        raise SystemExit("gpt_torch_check.py: --n-head %d disagrees with the checkpoint's %d" % (a.n_head, n_head))
    vocab, c = sd["transformer.wte.weight"].shape
    block = sd["transformer.wpe.weight"].shape[0]
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    m = GPT(vocab, block, n_layer, n_head, c)
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    data = open(a.corpus, "rb").read()
    val = data[int(len(data) * 0.9):]
    step = (len(val) - block - 1) // a.windows
    with torch.no_grad():
        x = torch.tensor([list(val[w * step:w * step + block]) for w in range(a.windows)])
        y = torch.tensor([list(val[w * step + 1:w * step + block + 1]) for w in range(a.windows)])
        loss = F.cross_entropy(m(x).reshape(-1, vocab), y.reshape(-1))
    print("torch %s: %d parameters loaded (lm_head.weight tied), val loss: %.4f"
          % (torch.__version__, sum(p.numel() for p in m.parameters()), loss.item()))


if __name__ == "__main__":
    main()
