"""torchvision mobilenet_v3_small, random weights (BatchNorm statistics randomized), batch 1, 3x224x224.
Needs the `bench` extra (see bench/models/_bench_deps.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_deps as deps  # noqa: E402


def get_model():
    models = deps.import_torchvision().models
    return deps.randomize_batchnorm(models.mobilenet_v3_small(weights=None))


def get_example_inputs():
    return deps.image_inputs()
