"""Small models shared by the tests and benchmarks: an MLP, a GPT-style decoder block and a ResNet
basic block (the digits CNN lives in train_digits.py)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """(N, d_in) -> (N, d_out): three Linear layers with GELU."""

    def __init__(self, d_in=64, hidden=128, d_out=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)


class TinyGPT(nn.Module):
    """Token embedding + learned positions, one pre-norm decoder block (causal attention, MLP with
    GELU), final LayerNorm and a head tied to the embedding. `attention(q, k, v)` on (batch, heads,
    time, head_dim) tensors: causal scaled_dot_product_attention by default (examples/kernels puts a
    Pallas kernel there)."""

    def __init__(self, vocab=64, dim=32, heads=4, ctx=16, attention=None):
        super().__init__()
        self.heads = heads
        self.attention = attention or (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(ctx, dim) * 0.02)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, idx):
        b, t = idx.shape
        x = self.emb(idx) + self.pos[:t]
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = self.attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.lnf(x) @ self.emb.weight.t()


class BasicBlock(nn.Module):
    """ResNet basic block with a strided 1x1 projection shortcut."""

    def __init__(self, cin=8, cout=16, stride=2):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.short(x))
