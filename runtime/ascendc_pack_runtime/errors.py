"""Typed errors of the runtime: one class per broken invariant, all under :class:`BundleError`.

Every refusal names the problem (the member or manifest field) and the fix. The classes form
five families that callers can catch as a whole::

    BundleError
    +-- BundleNotFoundError            the path is missing or not a file
    +-- BundleFormatError              not a bundle this runtime reads
    |   +-- NotABundleError            not zstd / not tar / manifest.json not the first member
    |   +-- FormatNameError            manifest "format" is not "ascpack"
    |   +-- FormatVersionError         manifest "format_version" newer or older than supported
    |   +-- ManifestJSONError          manifest.json is not valid UTF-8 JSON (or too large)
    |   +-- ManifestFieldError         a required manifest field is missing, mistyped or inconsistent
    +-- BundleIntegrityError           the content does not match the manifest
    |   +-- CorruptArchiveError        truncated / corrupt zstd or tar stream, checksum, trailing data
    |   +-- SizeLimitError             decompressed size (or a header) beyond the cap
    |   +-- MissingMemberError         a listed member is not in the archive
    |   +-- ExtraMemberError           an archive member is not listed
    |   +-- DuplicateMemberError       a member appears twice
    |   +-- MemberSizeError            a member's size differs from the manifest
    |   +-- MemberHashError            a member's sha256 differs from the manifest
    |   +-- MemberPathConflictError    a member would be created inside another member's file
    |   +-- UnsafeMemberError          a member would escape the extraction directory
    |       +-- UnsafeMemberNameError  absolute path, "..", hidden or unusual characters
    |       +-- UnsafeMemberTypeError  symlink, hard link, device, FIFO, directory
    +-- IncompatibleBundleError        built for another host or software stack
    |   +-- BackendUnavailableError    the bundle's backend is not available here
    |   +-- ArchMismatchError          another CPU architecture
    |   +-- MissingCpuFeaturesError    the host lacks ISA features the code was compiled for
    |   +-- TorchVersionMismatchError  another torch release
    |   +-- CxxAbiMismatchError        another _GLIBCXX_USE_CXX11_ABI
    +-- BundleLoadError                the verified bundle failed to load
    |   +-- GraphLoadError             graph.so cannot be loaded / does not register its operators
    |   +-- KernelMismatchError        graph.so and the manifest disagree on the kernels / ABI
    +-- TrustError                     a trust policy is set and the bundle does not satisfy it
    |   +-- UnsignedBundleError        the bundle carries no signature
    |   +-- UntrustedSignerError       signed by a key the policy does not trust
    |   +-- SignatureInvalidError      the signature does not match the manifest (edited / re-signed)
    |   +-- TrustPolicyError           the policy itself is unusable (bad key, no `cryptography`)
    +-- CacheError                     the runtime cache cannot be used safely
        +-- InsecureCacheError         group/other can write it, a foreign owner, or a symlinked entry
        +-- CacheSpaceError            not enough free space for the extraction
        +-- CacheIOError               an OS error reading or writing the cache (e.g. deleted mid-load)
        +-- TamperedExtractionError    an extracted library changed after verification

Each instance carries ``member`` (archive member name or None), ``field`` (manifest field or
None) and ``fix`` (what to do) besides its message.
"""

from __future__ import annotations


class BundleError(Exception):
    """Base class of every error raised while opening, verifying or loading a bundle."""

    def __init__(self, message: str = "", *, member: str | None = None, field: str | None = None,
                 fix: str | None = None):
        super().__init__(message)
        self.member = member
        self.field = field
        self.fix = fix

    @property
    def kind(self) -> str:
        """The class name, e.g. ``MemberHashError`` (used by ``ascendc-pack verify``)."""
        return type(self).__name__


class BundleNotFoundError(BundleError, FileNotFoundError):
    """The bundle path does not exist or is not a file."""


# ----------------------------------------------------------------------------- format


class BundleFormatError(BundleError):
    """The file is not an ``.ascpack`` bundle this runtime understands (not zstd/tar, no or bad
    manifest, unknown format name or version)."""


class NotABundleError(BundleFormatError):
    """Not a zstd stream, not a tar archive, an empty archive, or ``manifest.json`` is not the
    first member."""


class FormatNameError(BundleFormatError):
    """The manifest's ``format`` is not ``"ascpack"``."""


class FormatVersionError(BundleFormatError):
    """The manifest's ``format_version`` is not one this runtime reads."""


class ManifestJSONError(BundleFormatError):
    """``manifest.json`` is not valid UTF-8 JSON, not an object, or larger than allowed."""


class ManifestFieldError(BundleFormatError):
    """A manifest field the runtime relies on is missing, has the wrong type, or contradicts
    another field."""


# ----------------------------------------------------------------------------- integrity


class BundleIntegrityError(BundleError):
    """The bundle's content does not match its manifest: a member is missing, extra,
    duplicated, of the wrong size or hash, or the file is truncated or corrupt."""


class CorruptArchiveError(BundleIntegrityError):
    """The zstd frame or the tar stream is truncated or corrupt (zstd checksum mismatch,
    trailing bytes after the frame, malformed tar header)."""


class SizeLimitError(BundleIntegrityError):
    """The bundle decompresses (or declares) more bytes than allowed: a decompression bomb or
    a bundle larger than ``ASCENDC_PACK_RUNTIME_MAX_BYTES``."""


class MissingMemberError(BundleIntegrityError):
    """A member listed in the manifest is not in the archive."""


class ExtraMemberError(BundleIntegrityError):
    """The archive holds a member the manifest does not list."""


class DuplicateMemberError(BundleIntegrityError):
    """A member appears more than once in the archive."""


class MemberSizeError(BundleIntegrityError):
    """A member's size differs from the size the manifest declares."""


class MemberHashError(BundleIntegrityError):
    """A member's sha256 differs from the hash the manifest declares."""


class MemberPathConflictError(BundleIntegrityError):
    """A member's path runs through another member's file (``graph.so`` and ``graph.so/x``)."""


class UnsafeMemberError(BundleIntegrityError):
    """A member would escape the extraction directory or is not a regular file (absolute path,
    ``..``, link, device, FIFO, directory)."""


class UnsafeMemberNameError(UnsafeMemberError):
    """A member name is absolute, contains ``..``/``.``/empty components, starts with a dot or
    holds unusual characters."""


class UnsafeMemberTypeError(UnsafeMemberError):
    """A member is a symbolic link, hard link, device, FIFO or directory (bundles hold only
    regular files)."""


# ----------------------------------------------------------------------------- compatibility


class IncompatibleBundleError(BundleError):
    """The bundle was built for another host or software stack (architecture, ISA features,
    torch version, C++ ABI, backend)."""


class BackendUnavailableError(IncompatibleBundleError):
    """The bundle's backend (``manifest.backend``) cannot run in this process."""


class ArchMismatchError(IncompatibleBundleError):
    """The bundle was built for another CPU architecture."""


class MissingCpuFeaturesError(IncompatibleBundleError):
    """The host CPU lacks ISA features the bundle's code was compiled for (``target.isa``);
    loading it anyway would die with SIGILL."""


class TorchVersionMismatchError(IncompatibleBundleError):
    """graph.so was built against another torch release."""


class CxxAbiMismatchError(IncompatibleBundleError):
    """graph.so was built with another ``_GLIBCXX_USE_CXX11_ABI`` than this torch."""


# ----------------------------------------------------------------------------- loading


class BundleLoadError(BundleError):
    """The verified bundle could not be loaded: graph.so or a kernel library failed to load or
    is not the file the graph was built with (kernel_key mismatch)."""


class GraphLoadError(BundleLoadError):
    """graph.so cannot be loaded or does not register its operators, or its init failed."""


class KernelMismatchError(BundleLoadError):
    """graph.so was built for other kernels, another graph ABI or another number of inputs,
    outputs or weights than the manifest lists."""


# ----------------------------------------------------------------------------- trust


class TrustError(BundleError):
    """A trust policy is set (``trusted_keys`` / ``ASCENDC_PACK_RUNTIME_TRUSTED_KEYS``) and the
    bundle does not satisfy it; nothing was extracted or loaded."""


class UnsignedBundleError(TrustError):
    """The bundle carries no ``manifest.sig``."""


class UntrustedSignerError(TrustError):
    """The bundle is signed by a key the policy does not list (a foreign or re-signed bundle)."""


class SignatureInvalidError(TrustError):
    """``manifest.sig`` is malformed or its signature does not verify over ``manifest.json``
    (the manifest was edited after signing)."""


class TrustPolicyError(TrustError):
    """The trust policy cannot be applied: a key is malformed or unreadable, or the
    ``cryptography`` package (extra ``sign``) is missing."""


# ----------------------------------------------------------------------------- the cache


class CacheError(BundleError):
    """The runtime cache (``ASCENDC_PACK_RUNTIME_CACHE``) cannot be used safely or at all."""


class InsecureCacheError(CacheError):
    """The cache or an entry of it can be written by group/other or another user, or an entry
    is a symbolic link: someone else could swap the code that is about to run."""


class CacheSpaceError(CacheError):
    """The cache's file system has not enough free space for the extraction."""


class CacheIOError(CacheError):
    """An operating-system error while reading or writing the cache (deleted or changed while
    loading, permissions, I/O errors); the message carries the system's text."""


class TamperedExtractionError(CacheError):
    """A library of a verified extraction no longer has its manifest sha256 when it is about
    to be loaded (it was modified in the cache)."""


__all__ = [
    "BundleError", "BundleNotFoundError",
    "BundleFormatError", "NotABundleError", "FormatNameError", "FormatVersionError",
    "ManifestJSONError", "ManifestFieldError",
    "BundleIntegrityError", "CorruptArchiveError", "SizeLimitError", "MissingMemberError",
    "ExtraMemberError", "DuplicateMemberError", "MemberSizeError", "MemberHashError",
    "MemberPathConflictError", "UnsafeMemberError", "UnsafeMemberNameError", "UnsafeMemberTypeError",
    "IncompatibleBundleError", "BackendUnavailableError", "ArchMismatchError",
    "MissingCpuFeaturesError", "TorchVersionMismatchError", "CxxAbiMismatchError",
    "BundleLoadError", "GraphLoadError", "KernelMismatchError",
    "TrustError", "UnsignedBundleError", "UntrustedSignerError", "SignatureInvalidError", "TrustPolicyError",
    "CacheError", "InsecureCacheError", "CacheSpaceError", "CacheIOError", "TamperedExtractionError",
]
