"""One Llama-style decoder block written out (issue 42): batch 2, sequence 64, width 256, 4 heads,
RMSNorm, the causal mask as ``torch.where(mask, scores, -inf)`` over a [64, 64] boolean buffer,
SwiGLU MLP (hidden 688); random weights. A ~1 ms graph where per-step costs decide (model.py
contract: get_model / get_example_inputs; no extra packages)."""
import math
import torch
from torch import nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Block(nn.Module):
    def __init__(self, d=256, heads=4, hidden=688, seq=64):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, x):
        b, l, d = x.shape
        y = self.n1(x)
        q = self.q(y).view(b, l, self.h, self.dh).transpose(1, 2)
        k = self.k(y).view(b, l, self.h, self.dh).transpose(1, 2)
        v = self.v(y).view(b, l, self.h, self.dh).transpose(1, 2)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        s = torch.where(self.mask[:l, :l], s, float("-inf"))
        p = torch.softmax(s, dim=-1)
        a = (p @ v).transpose(1, 2).reshape(b, l, d)
        x = x + self.o(a)
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def get_model():
    torch.manual_seed(0)
    return Block().eval()


def get_example_inputs():
    return (torch.randn(2, 64, 256, generator=torch.Generator().manual_seed(0)),)
