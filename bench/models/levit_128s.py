"""timm levit_128s (LeViT-128S: convolution stem, attention stages with BatchNorm'd linears and
a learned attention bias), random weights, eval mode, batch 1, 3x224x224. Needs the `bench`
extra (see bench/models/_bench_deps.py)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_deps as deps  # noqa: E402


def get_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return deps.randomize_batchnorm(deps.import_timm().create_model("levit_128s", pretrained=False)).eval()


get_example_inputs = deps.image_inputs
