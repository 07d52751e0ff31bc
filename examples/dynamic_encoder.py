"""A small transformer encoder layer with a dynamic batch (1..16) and sequence length (4..64).

``get_dynamic_shapes()`` declares the dims the torch.export way; the example and calibration
inputs come at three shapes, the buckets the build tunes a static plan for. Every other shape in
the ranges runs the generic plan (jit kernels, sizes computed per call).

    ascendc-pack build examples/dynamic_encoder.py --topn 2
"""
import torch
from torch import nn
from torch.export import Dim

D, HEADS, HIDDEN = 32, 2, 64


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln1 = nn.LayerNorm(D)
        self.ln2 = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, D)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2) for t in (q, k, v))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e4   # padding tokens: mask 0
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = self.ln1(x + self.proj(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))


def get_model():
    torch.manual_seed(0)
    return EncoderLayer()


def _inputs(batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[:, seq - seq // 4:] = 0
    return torch.randn(batch, seq, D, generator=g), mask


def get_example_inputs():
    return _inputs(2, 16, 1)


def get_calibration_inputs():
    return [_inputs(1, 8, 2), _inputs(4, 32, 3)]


def get_dynamic_shapes():
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=4, max=64)
    return {"x": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}
