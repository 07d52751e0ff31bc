"""Linear + LayerNorm + GELU + residual, twice: the fused kernels sit between two matmuls."""
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d=1024, hidden=2048):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x):
        h = nn.functional.gelu(self.norm1(self.fc1(x)))
        return self.norm2(self.fc2(h) + x)


def get_model():
    torch.manual_seed(0)
    return MLP()


def get_example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(256, 1024, generator=g),)


def get_calibration_inputs():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(256, 1024, generator=g),)]
