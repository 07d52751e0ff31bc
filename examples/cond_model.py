"""A ``torch.cond`` whose branches both hold fusible work.

The calibration inputs take both branches (positive and negative mean), so PGO tunes the
kernels of each branch.
"""
import torch
from torch import nn


class CondModel(nn.Module):
    def __init__(self, d=1024):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        h = self.proj(x)

        def softmax_branch(h, x):
            return torch.softmax(h * 0.5, dim=-1) + x

        def norm_branch(h, x):
            return torch.sigmoid(self.norm(h)) * x

        return torch.cond(x.mean() > 0, softmax_branch, norm_branch, (h, x))


def get_model():
    torch.manual_seed(0)
    return CondModel()


def get_example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(256, 1024, generator=g) + 0.5,)


def get_calibration_inputs():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(256, 1024, generator=g) - 0.5,)]
