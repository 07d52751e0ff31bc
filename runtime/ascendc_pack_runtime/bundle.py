"""The ``.ascpack`` container (docs/FORMAT.md): one import for its readers.

The work is done by modules of one concern each; this module gathers their public names
(``ascendc_pack_runtime.bundle.open_bundle`` and friends keep working):

* :mod:`~ascendc_pack_runtime.constants` - format name and version, member names, caps, env vars;
* :mod:`~ascendc_pack_runtime.manifest` - the typed manifest (the contract) and member-name rules;
* :mod:`~ascendc_pack_runtime.archive` - reading and verifying the zstd/tar stream;
* :mod:`~ascendc_pack_runtime.verify` - :func:`verify_bundle` (every problem, nothing written);
* :mod:`~ascendc_pack_runtime.extract` - :func:`open_bundle` (extraction into the cache);
* :mod:`~ascendc_pack_runtime.host` - this host against the bundle's target.

Verification happens before anything is loaded, in this order: the zstd frame (without
decompressing), then one streaming pass (manifest first and validated, size caps, every
member's name, type, size and sha256, trailing data, the zstd checksum), then the host.
"""

from __future__ import annotations

from .archive import ZSTD_MAGIC, Head, check_zstd_frame, max_bytes, read_head, sha256_file
from .constants import (CACHE_ENV, DEFAULT_MAX_BYTES, FORMAT_NAME, FORMAT_VERSION, GRAPH_LIBRARY, GRAPH_SOURCE,
                        MANIFEST_NAME, MAX_BYTES_ENV, MAX_MANIFEST_BYTES, MAX_MEMBERS, TUNING_FILE,
                        VERIFIED_MARKER, WEIGHT_ALIGNMENT, WEIGHTS_FILE)
from .extract import Extracted, default_cache_dir, open_bundle
from .host import check_host, host_cpu_flags, host_problems
from .manifest import Manifest, check_member_name
from .verify import VerifyReport, read_manifest, verify_bundle

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_NAME", "GRAPH_LIBRARY", "GRAPH_SOURCE",
           "WEIGHTS_FILE", "TUNING_FILE", "WEIGHT_ALIGNMENT", "VERIFIED_MARKER", "CACHE_ENV", "MAX_BYTES_ENV",
           "DEFAULT_MAX_BYTES", "MAX_MANIFEST_BYTES", "MAX_MEMBERS", "ZSTD_MAGIC", "Manifest", "Head",
           "check_member_name", "check_host", "host_problems", "host_cpu_flags", "read_manifest", "read_head",
           "check_zstd_frame", "verify_bundle", "VerifyReport", "open_bundle", "Extracted", "default_cache_dir",
           "sha256_file", "max_bytes"]
