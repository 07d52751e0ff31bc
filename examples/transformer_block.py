"""A pre-norm transformer block: MultiheadAttention + LayerNorm + MLP (GELU tanh), residuals."""
import torch
from torch import nn


class TransformerBlock(nn.Module):
    def __init__(self, d=256, heads=4, hidden=1024):
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


def get_model():
    torch.manual_seed(0)
    return TransformerBlock()


def get_example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(8, 128, 256, generator=g),)
