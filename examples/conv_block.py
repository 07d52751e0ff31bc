"""Conv2d + BatchNorm (eval) + ReLU + residual + pooling."""
import torch
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)) + x)
        return self.pool(y), y.mean(dim=(2, 3))


def get_model():
    torch.manual_seed(0)
    m = ConvBlock()
    with torch.no_grad():  # non-trivial running statistics, as after training
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.2, 0.2)
    return m


def get_example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(8, 32, 56, 56, generator=g),)
