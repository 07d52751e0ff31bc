"""The seed's example: one fused add + full reduction, ``torch.add(x, y).sum()``."""
import torch


class AddSum(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(x, y).sum()


def get_model():
    return AddSum()


def get_example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(32, 1024, generator=g), torch.randn(1, 1024, generator=g))
