"""torchvision swin_t (Swin-T: shifted-window attention with a relative position bias), random
weights, batch 1, 3x224x224. Needs the `bench` extra (see bench/models/_bench_deps.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_deps as deps  # noqa: E402

get_model = deps.torchvision_classifier("swin_t")
get_example_inputs = deps.image_inputs
