"""A larger benchmark model: 4 pre-norm transformer layers, d=512, 8 heads, MLP 2048 (GELU tanh),
final LayerNorm; batch 8, sequence 128 (model.py contract: get_model / get_example_inputs)."""
import torch
from torch import nn

LAYERS, D, HEADS, HIDDEN, BATCH, SEQ = 4, 512, 8, 2048, 8, 128


class Layer(nn.Module):
    def __init__(self, d=D, heads=HEADS, hidden=HIDDEN):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        h = nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh")
        return x + self.fc2(h)


class Transformer(nn.Module):
    def __init__(self, layers=LAYERS):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def get_model():
    torch.manual_seed(0)
    return Transformer()


def get_example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, SEQ, D, generator=g),)
