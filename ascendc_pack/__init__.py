"""ascendc-pack: tune a PyTorch model's fused kernels on real inputs and ship them as one file.

The pipeline (docs/DESIGN.md §2): load model.py -> capture (torch.export) -> fuse -> tile -> compile ->
tune (PGO) -> render C++ graph -> bundle. This package is the compiler side; the runtime that
loads bundles is the separate package ``ascendc_pack_runtime``.
"""

from __future__ import annotations

import warnings

# torch warns "Failed to initialize NumPy" when it first touches its numpy bridge (while it is
# imported, or during torch.export) in an install without numpy; the compiler never uses it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

from ascendc_pack_runtime.constants import VERSION as __version__  # noqa: E402 (one version for both packages)

from ascendc_pack.frontend.capture import Captured, capture  # noqa: E402
from ascendc_pack.errors import CaptureError, CompileError, ConfigError, ModelFileError, PackError  # noqa: E402
from ascendc_pack.frontend.loader import LoadedModel, load_model_file  # noqa: E402
from ascendc_pack.pipeline import BuildResult, build, build_file, compile  # noqa: E402
from ascendc_pack.dynamic import build_dynamic  # noqa: E402
from ascendc_pack.ir.program import ModelProgram, Program  # noqa: E402

__all__ = [
    "__version__", "build", "build_dynamic", "build_file", "compile", "BuildResult", "capture", "Captured", "load_model_file", "LoadedModel", "ModelProgram",
    "Program", "PackError", "ModelFileError", "ConfigError", "CaptureError", "CompileError",
]
