"""ViT-S/16 (timm ``vit_small_patch16_224``: 12 layers, width 384, 6 heads, fused SDPA attention),
random weights, batch 1, 3x224x224. Needs the `bench` extra (see bench/models/_bench_deps.py)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_deps as deps  # noqa: E402


def get_model():
    torch.manual_seed(0)
    return deps.import_timm().create_model("vit_small_patch16_224", pretrained=False)


def get_example_inputs():
    return deps.image_inputs()
