"""A larger benchmark model: 4 pre-norm transformer layers, d=512, 8 heads, MLP 2048 (GELU tanh),
final LayerNorm; batch 8, sequence 128 (model.py contract: get_model / get_example_inputs)."""
import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

LAYERS, D, HEADS, HIDDEN, BATCH, SEQ = 4, 512, 8, 2048, 8, 128


def _example_block():
    """The TransformerBlock of examples/transformer_block.py (one definition of a layer)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "transformer_block.py"
    spec = importlib.util.spec_from_file_location("_ascendc_pack_example_transformer_block", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.export needs the defining module registered
    spec.loader.exec_module(module)
    return module.TransformerBlock


Layer = _example_block()


class Transformer(nn.Module):
    def __init__(self, layers=LAYERS):
        super().__init__()
        self.layers = nn.ModuleList(Layer(D, HEADS, HIDDEN) for _ in range(layers))
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
