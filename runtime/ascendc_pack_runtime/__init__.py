"""ascendc-pack's minimal runtime: load an ``.ascpack`` bundle and call it.

This package needs torch and zstandard only. It never imports ``ascendc_pack``, jinja2, click
or a compiler, so a bundle runs on a machine without g++.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__version__ = "0.1.0"
KERNEL_ABI_VERSION = 1


def include_dir() -> Path:
    """Directory holding the C/C++ headers shared with generated code (``ascendc_pack/*.h``)."""
    return Path(str(resources.files("ascendc_pack_runtime.include")))


# --- bundle loading (DESIGN 4.8) -------------------------------------------------------------
from .errors import (ArchMismatchError, BackendUnavailableError, BundleError,  # noqa: E402,F401
                     BundleFormatError, BundleIntegrityError, BundleLoadError, BundleNotFoundError,
                     CorruptArchiveError, CxxAbiMismatchError, DuplicateMemberError, ExtraMemberError,
                     FormatNameError, FormatVersionError, GraphLoadError, IncompatibleBundleError,
                     KernelMismatchError, ManifestFieldError, ManifestJSONError, MemberHashError,
                     MemberPathConflictError, MemberSizeError, MissingCpuFeaturesError, MissingMemberError,
                     NotABundleError, SizeLimitError, TorchVersionMismatchError, UnsafeMemberError,
                     UnsafeMemberNameError, UnsafeMemberTypeError)
from .errors import __all__ as _error_names  # noqa: E402
from .bundle import VerifyReport, read_manifest, verify_bundle  # noqa: E402
from .model import Model, TensorSpec, load  # noqa: E402

__all__ = [
    "__version__", "KERNEL_ABI_VERSION", "include_dir", "load", "Model", "TensorSpec",
    "verify_bundle", "VerifyReport", "read_manifest", *_error_names,
]
