"""ascendc-pack's minimal runtime: load an ``.ascpack`` bundle and call it.

This package needs torch and zstandard only. It never imports ``ascendc_pack``, jinja2, click
or a compiler, so a bundle runs on a machine without g++.
"""

from __future__ import annotations

# First, before anything imports torch: libgomp reads its wait policy once, when torch loads it.
from .threads import WaitPolicy, apply_wait_policy as _apply_wait_policy

WAIT_POLICY: WaitPolicy = _apply_wait_policy()
"""What the runtime's OpenMP wait policy is and where it came from (:mod:`.threads`)."""

from importlib import resources  # noqa: E402
from pathlib import Path  # noqa: E402

from .constants import FORMAT_VERSION, GRAPH_ABI_VERSION, KERNEL_ABI_VERSION  # noqa: E402
from .constants import VERSION as __version__  # noqa: E402


def include_dir() -> Path:
    """Directory holding the C/C++ headers shared with generated code (``ascendc_pack/*.h``)."""
    return Path(str(resources.files("ascendc_pack_runtime.include")))


# --- bundle loading (docs/DESIGN.md §4.1) ---------------------------------------------------
from .errors import *  # noqa: E402,F401,F403  (every error class: errors.__all__)
from .errors import __all__ as _error_names  # noqa: E402
from . import bundle  # noqa: E402,F401  (``ascendc_pack_runtime.bundle`` keeps its public names)
from .manifest import Manifest  # noqa: E402
from .model import Model, TensorSpec, load  # noqa: E402
from .step_profile import StepProfile, profile_steps  # noqa: E402
from .verify import VerifyReport, read_manifest, verify_bundle  # noqa: E402

__all__ = [
    "__version__", "FORMAT_VERSION", "GRAPH_ABI_VERSION", "KERNEL_ABI_VERSION", "include_dir", "load", "Model",
    "TensorSpec", "Manifest", "profile_steps", "StepProfile", "verify_bundle", "VerifyReport", "read_manifest", "WAIT_POLICY", "WaitPolicy",
    *_error_names,
]
