"""Every constant of the bundle contract, in one place (docs/FORMAT.md).

The compiler (``ascendc_pack``), the runtime and ``pyproject.toml`` (the distribution's version)
read these. The C/C++ headers cannot import Python: ``runtime/include/ascendc_pack/rt/contract.hpp``
and ``kernel_abi.h`` repeat the few the C++ reader needs, and ``tests/test_contract.py`` compiles
them and proves they equal the values here.
"""

from __future__ import annotations

VERSION = "0.1.0"
"""``__version__`` of ``ascendc_pack`` and ``ascendc_pack_runtime`` and the distribution's version."""

FORMAT_NAME = "ascpack"
FORMAT_VERSION = 1
"""The version of a static bundle (one graph). Bumped only for a change a reader would misread."""
FORMAT_VERSION_DYNAMIC = 2
"""The version of a bundle with dynamic dims (``dynamic``: a graph per plan, docs/FORMAT.md): a
version-1 reader refuses it (newer than it supports); this runtime reads both."""
GRAPH_ABI_VERSION = 1
"""The operators graph.so registers (init/run/release/signature) and their arguments."""
KERNEL_ABI_VERSION = 1
"""``ap_kernel_info`` / ``ap_kernel_launch`` of a static kernel library (kernel_abi.h)."""

# ----------------------------------------------------------------------------- members
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
"""Optional second member: an ed25519 signature over the exact bytes of manifest.json."""
GRAPH_LIBRARY = "graph.so"
GRAPH_SOURCE = "graph.cpp"
WEIGHTS_FILE = "weights.bin"
TUNING_FILE = "tuning.json"
WEIGHT_ALIGNMENT = 64

# ----------------------------------------------------------------------------- bounds
MAX_DIM = 1 << 48
"""Exclusive bound on every dimension, stride, input index (a product of two stays < 2**96)."""
MAX_NDIM = 64
MAX_MEMBER_BYTES = 1 << 62
MAX_MANIFEST_BYTES = 16 << 20
MAX_MEMBERS = 100_000
MAX_NAME_CHARS = 4096
MAX_COMPONENT_CHARS = 255
MAX_EXTRACT_DEPTH = 64
"""An extraction refuses a member nested deeper (bundles of ascendc-pack nest 4 deep): every
per-name walk stays short, and a ~100 KB bundle cannot make millions of directories."""
MAX_INT_DIGITS = 20
"""A manifest integer literal longer than this is refused as a field error (Python would
otherwise refuse 4,300+ digits deep inside json.loads, and such a number fits no field)."""
DEFAULT_MAX_BYTES = 64 << 30
"""Cap on the decompressed size of a bundle (override with ``ASCENDC_PACK_RUNTIME_MAX_BYTES``)."""
DEFAULT_MAX_RATIO = 1000
"""Cap on declared content ÷ compressed file size (override with ``ASCENDC_PACK_RUNTIME_MAX_RATIO``):
real bundles stay under 10 (weights barely compress); a bomb of zeros reaches 30,000."""
FREE_SPACE_MARGIN = 64 << 20
"""Free space an extraction leaves on the cache's file system besides the bundle's content."""
MAX_KEY_FILE_BYTES = 1 << 20
"""Largest trusted-key file read (a key line is 72 bytes): a larger file, or one that is not a
regular file (a device, a FIFO), is a ``TrustPolicyError`` before anything is read from it."""

# ----------------------------------------------------------------------------- the cache
VERIFIED_MARKER = ".ascpack-verified"
"""Written last into an extraction (before it is renamed into place); binds it to the bundle."""
MARKER_FORMAT = "ascpack-extracted"
MARKER_VERSION = 2
"""2: the marker names the bundle's sha256 and the sha256 of its manifest as verified."""

# ----------------------------------------------------------------------------- environment
CACHE_ENV = "ASCENDC_PACK_RUNTIME_CACHE"
MAX_BYTES_ENV = "ASCENDC_PACK_RUNTIME_MAX_BYTES"
MAX_RATIO_ENV = "ASCENDC_PACK_RUNTIME_MAX_RATIO"
TRUSTED_KEYS_ENV = "ASCENDC_PACK_RUNTIME_TRUSTED_KEYS"
"""Trust policy of a deployment: comma-separated public keys (``ed25519:<hex>``) or files
holding them; when set, only bundles signed by one of them load."""

REBUILD = "rebuild the bundle with `ascendc-pack build`"
"""The fix of every refusal that only a new bundle can cure."""
