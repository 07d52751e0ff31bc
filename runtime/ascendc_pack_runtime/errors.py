"""Typed errors of the runtime. Every refusal names the problem and the fix."""

from __future__ import annotations


class BundleError(Exception):
    """Base class of every error raised while opening, verifying or loading a bundle."""


class BundleNotFoundError(BundleError, FileNotFoundError):
    """The bundle path does not exist or is not a file."""


class BundleFormatError(BundleError):
    """The file is not an ``.ascpack`` bundle this runtime understands (not zstd/tar, no or bad
    manifest, unknown format name or version)."""


class BundleIntegrityError(BundleError):
    """The bundle's content does not match its manifest: a member is missing, extra,
    duplicated, of the wrong size or hash, or the file is truncated or corrupt."""


class UnsafeMemberError(BundleIntegrityError):
    """A member would escape the extraction directory or is not a regular file (absolute path,
    ``..``, link, device, FIFO, directory)."""


class IncompatibleBundleError(BundleError):
    """The bundle was built for another host or software stack (architecture, ISA features,
    torch version, C++ ABI, backend)."""


class BundleLoadError(BundleError):
    """The verified bundle could not be loaded: graph.so or a kernel library failed to load or
    is not the file the graph was built with (kernel_key mismatch)."""


__all__ = ["BundleError", "BundleNotFoundError", "BundleFormatError", "BundleIntegrityError",
           "UnsafeMemberError", "IncompatibleBundleError", "BundleLoadError"]
