"""Reading the ``.ascpack`` container: the zstd frame, the tar stream, the manifest first.

A bundle is one zstd frame holding a tar whose first member is ``manifest.json``. This module
reads it in one streaming pass (:func:`scan`), checking on the way everything the bytes can
get wrong: truncation, corruption, the zstd checksum, size caps (decompression bombs), member
names and types, duplicates, sizes and sha256s against the manifest. It writes nothing itself:
a :class:`MemberSink` (the extraction) receives the verified bytes. :func:`read_head` reads
only the manifest (cheap).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Protocol

from . import manifest as contract
from .constants import (DEFAULT_MAX_BYTES, DEFAULT_MAX_RATIO, MANIFEST_NAME, MAX_BYTES_ENV, MAX_MANIFEST_BYTES,
                        MAX_RATIO_ENV, REBUILD, SIGNATURE_NAME)
from .errors import (BundleError, BundleNotFoundError, CorruptArchiveError, DuplicateMemberError, ExtraMemberError,
                     ManifestJSONError, MemberHashError, MemberSizeError, MissingMemberError, NotABundleError,
                     SizeLimitError, UnsafeMemberNameError, UnsafeMemberTypeError)
from .manifest import Manifest, check_member_name

MAX_TAR_HEADER_BYTES = 1 << 20
"""Cap on a pax / GNU long-name header (tarfile reads those into memory)."""
MAX_SIGNATURE_BYTES = 1 << 16
_HEAD_CAP = MAX_MANIFEST_BYTES + MAX_SIGNATURE_BYTES + 2 * MAX_TAR_HEADER_BYTES + (1 << 20)
"""Decompressed bytes allowed before the manifest (and signature) are read and the caps known."""
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """The sha256 (hex) of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def max_bytes() -> int:
    """The decompressed-size cap (``ASCENDC_PACK_RUNTIME_MAX_BYTES``, default 64 GiB)."""
    return _env_positive_int(MAX_BYTES_ENV, DEFAULT_MAX_BYTES, "bytes")


def max_ratio() -> int:
    """The cap on declared content ÷ compressed size (``ASCENDC_PACK_RUNTIME_MAX_RATIO``)."""
    return _env_positive_int(MAX_RATIO_ENV, DEFAULT_MAX_RATIO, "a ratio")


def _env_positive_int(name: str, default: int, unit: str) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    n = int(raw) if raw.isdigit() and len(raw) <= 20 else 0
    if n <= 0:
        raise BundleError(f"{name} must be a positive integer ({unit}), got {raw[:40]!r}; fix the "
                          "environment variable", field=name, fix=f"unset or correct {name}")
    return n


def check_path(path: Path | str) -> Path:
    """``path`` as a Path if it is an existing file, else BundleNotFoundError."""
    path = Path(path)
    if not path.exists():
        raise BundleNotFoundError(f"{path}: no such bundle file; pass the path of a .ascpack file",
                                  fix="pass the path of an .ascpack file")
    if not path.is_file():
        raise BundleNotFoundError(f"{path} is not a file; pass the path of a .ascpack file",
                                  fix="pass the path of an .ascpack file")
    return path


def corrupt(path: Path, problem: str, member: str | None = None) -> CorruptArchiveError:
    """The error for a damaged file (the fix: copy it again or rebuild)."""
    fix = "copy the bundle again (the file is damaged) or rebuild it"
    return CorruptArchiveError(f"{path}: {problem}; {fix}", member=member, fix=fix)


# ----------------------------------------------------------------------------- zstd frame


def check_zstd_frame(path: Path) -> bool:
    """Walk the block headers of the single zstd frame of ``path`` without decompressing.

    Returns whether the frame carries a content checksum. Raises NotABundleError (no zstd
    magic) or CorruptArchiveError (truncated frame, reserved block type, bytes after the frame).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(18)
        if head[:4] != ZSTD_MAGIC:
            raise NotABundleError(f"{path} is not a zstd-compressed .ascpack bundle (it starts with "
                                  f"{head[:4]!r}); pass a file written by `ascendc-pack build`",
                                  fix="pass an .ascpack bundle")
        if len(head) < 6:
            raise corrupt(path, f"the zstd frame is truncated ({size} bytes)")
        fhd = head[4]
        if fhd & 0x08:
            raise corrupt(path, "the zstd frame header has its reserved bit set")
        fcs_flag, single, checksum, did_flag = fhd >> 6, bool(fhd & 0x20), bool(fhd & 0x04), fhd & 0x03
        pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag] + \
            ((1 if single else 0), 2, 4, 8)[fcs_flag]
        while True:
            if pos + 3 > size:
                raise corrupt(path, f"the zstd frame is truncated (a block header at byte {pos} is cut off; "
                                    f"the file has {size} bytes)")
            f.seek(pos)
            b = f.read(3)
            header = b[0] | (b[1] << 8) | (b[2] << 16)
            last, btype, bsize = header & 1, (header >> 1) & 3, header >> 3
            if btype == 3:
                raise corrupt(path, f"the zstd frame has a block of reserved type at byte {pos}")
            if bsize > 128 << 10:
                raise corrupt(path, f"the zstd frame has an oversized block ({bsize} bytes) at byte {pos}")
            pos += 3 + (1 if btype == 1 else bsize)
            if last:
                break
        pos += 4 if checksum else 0
        if pos > size:
            raise corrupt(path, f"the zstd frame is truncated: it needs {pos} bytes, the file has {size}")
        if pos < size:
            raise corrupt(path, f"{size - pos} bytes follow the zstd frame (appended or concatenated data)")
    return checksum


# ----------------------------------------------------------------------------- stream plumbing


class _CappedReader(io.RawIOBase):
    """Reads from the decompressor, refusing more than ``cap`` decompressed bytes."""

    def __init__(self, raw, cap: int, path: Path):
        self.raw = raw
        self.cap = cap
        self.count = 0
        self.path = path

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n is not None and n >= 0 else CHUNK)
        self.count += len(data)
        if self.count > self.cap:
            fix = f"raise {MAX_BYTES_ENV} only if the bundle is trusted; otherwise rebuild it"
            raise SizeLimitError(
                f"{self.path}: the bundle decompresses to more than {self.cap} bytes, more than its manifest "
                f"declares (plus tar headers) or the {MAX_BYTES_ENV} cap; refusing it (possible "
                f"decompression bomb): {fix}", fix=fix)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class _HashingFile:
    """The compressed file, hashed as the decompressor reads it (detects a file that changes
    while it is being verified)."""

    def __init__(self, f):
        self.f = f
        self.h = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data

    def finish(self) -> str:
        while chunk := self.f.read(CHUNK):
            self.h.update(chunk)
        return self.h.hexdigest()


class _SafeTarInfo(tarfile.TarInfo):
    """Refuses oversized pax / GNU long-name headers before tarfile reads them into memory."""

    def _proc_member(self, tarfile_obj):
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                         tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) and self.size > MAX_TAR_HEADER_BYTES:
            raise SizeLimitError(f"a tar extended header declares {self.size} bytes, more than the "
                                 f"{MAX_TAR_HEADER_BYTES} allowed; refusing the bundle: {REBUILD}", fix=REBUILD)
        return super()._proc_member(tarfile_obj)


def _stream_errors():
    import zstandard

    return (tarfile.TarError, EOFError, zstandard.ZstdError, ValueError, UnicodeError, OverflowError,
            KeyError, IndexError)


def _stream_corrupt(path: Path, e: Exception) -> CorruptArchiveError:
    return corrupt(path, f"the bundle is truncated or corrupt ({type(e).__name__}: {str(e)[:300]})")


def _not_tar(path: Path, e: Exception) -> NotABundleError:
    return NotABundleError(f"{path}: the zstd content is not a tar archive ({e}); pass a bundle written by "
                           "`ascendc-pack build`", fix="pass an .ascpack bundle")


def _is_regular(member: tarfile.TarInfo) -> bool:
    return member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse()


def _member_kind(member: tarfile.TarInfo) -> str:
    return ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
            "a device" if member.isdev() else "a directory" if member.isdir() else
            "a FIFO" if member.isfifo() else "a sparse file" if member.issparse() else "not a regular file")


# ----------------------------------------------------------------------------- the head


@dataclass(frozen=True)
class Head:
    """The manifest of a bundle as read from the archive: its exact bytes, the JSON object,
    the typed, validated :class:`~ascendc_pack_runtime.manifest.Manifest`, and the bytes of
    ``manifest.sig`` when the bundle is signed."""

    manifest_bytes: bytes
    manifest_json: dict
    manifest: Manifest
    signature: bytes | None = None

    @property
    def manifest_sha256(self) -> str:
        return hashlib.sha256(self.manifest_bytes).hexdigest()


def _read_small_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, cap: int) -> bytes:
    if not _is_regular(member):
        raise UnsafeMemberTypeError(f"{path}: {member.name} is {_member_kind(member)}; {REBUILD}",
                                    member=member.name, fix=REBUILD)
    if member.size > cap:
        raise ManifestJSONError(f"{path}: {member.name} is {member.size} bytes, more than the {cap} allowed; the "
                                f"bundle is corrupt: {REBUILD}", member=member.name, fix=REBUILD)
    fobj = tar.extractfile(member)
    data = fobj.read() if fobj is not None else b""
    if len(data) != member.size:
        raise corrupt(path, f"{member.name} is truncated", member=member.name)
    return data


def _read_head(tar: tarfile.TarFile, path: Path) -> tuple[Head, tarfile.TarInfo | None]:
    """The head and the header of the member after it (None at the end of the archive)."""
    try:
        first = tar.next()
    except tarfile.ReadError as e:
        raise _not_tar(path, e) from None
    if first is None:
        raise NotABundleError(f"{path} is an empty archive; pass a bundle written by `ascendc-pack build`",
                              fix="pass an .ascpack bundle")
    if first.name != MANIFEST_NAME:
        raise NotABundleError(f"{path}: the first member is {first.name[:200]!r}, expected {MANIFEST_NAME!r}; the "
                              f"file is not an ascendc-pack bundle or was repacked: {REBUILD}",
                              member=first.name[:256], fix=REBUILD)
    data = _read_small_member(tar, first, path, MAX_MANIFEST_BYTES)
    raw = contract.loads(data, f"{path}: {MANIFEST_NAME}")
    manifest = Manifest.from_json(raw)
    following, signature = tar.next(), None
    if following is not None and following.name == SIGNATURE_NAME:
        signature = _read_small_member(tar, following, path, MAX_SIGNATURE_BYTES)
        following = tar.next()
    return Head(data, raw, manifest, signature), following


@contextlib.contextmanager
def _tar_stream(path: Path, fileobj, cap: int):
    """(tar reader, capped reader) over the zstd stream of ``fileobj``; stream errors become
    CorruptArchiveError."""
    import zstandard

    tar = None
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(fileobj, read_size=CHUNK, closefd=False)
        capped = _CappedReader(reader, cap, path)
        try:
            tar = tarfile.open(fileobj=capped, mode="r|", tarinfo=_SafeTarInfo)
        except tarfile.ReadError as e:
            raise _not_tar(path, e) from None
        yield tar, capped
    except BundleError:
        raise
    except _stream_errors() as e:
        raise _stream_corrupt(path, e) from None
    finally:
        if tar is not None:
            with contextlib.suppress(Exception):
                tar.close()


def read_head(path: Path | str) -> Head:
    """Read and validate only the manifest of a bundle (the frame's block headers and the first
    member). Does not check the other members or the host."""
    path = check_path(path)
    check_zstd_frame(path)
    with open(path, "rb") as f, _tar_stream(path, f, _HEAD_CAP) as (tar, _):
        return _read_head(tar, path)[0]


# ----------------------------------------------------------------------------- the full pass


class MemberSink(Protocol):
    """Where :func:`scan` writes verified member bytes (the extraction)."""

    def begin(self, head: Head) -> None:
        """Called once the manifest is read and before any member: may refuse the bundle."""

    def create(self, name: str) -> BinaryIO:
        """A new, empty, writable file for member ``name``."""

    def finish(self, name: str) -> None:
        """Member ``name`` was written completely and its sha256 matched."""


@dataclass(frozen=True)
class ScanResult:
    head: Head
    bundle_sha256: str           # of the file as read
    has_checksum: bool           # the zstd frame carries a content checksum
    members_checked: int


def scan(path: Path, sink: MemberSink | None, report: Callable[[BundleError], None],
         on_head: Callable[[Head], None] | None = None) -> ScanResult:
    """Verify ``path`` in one streaming pass, writing members through ``sink`` when given.

    Member-level problems go to ``report`` (which raises in load mode, collects in verify mode);
    problems that make reading on impossible are raised. ``on_head`` sees the manifest first."""
    has_checksum = check_zstd_frame(path)
    cap = max_bytes()
    with open(path, "rb") as f:
        hashing = _HashingFile(f)
        with _tar_stream(path, hashing, min(cap, _HEAD_CAP)) as (tar, capped):
            head, member = _read_head(tar, path)
            if on_head is not None:
                on_head(head)
            members = head.manifest.members
            _check_declared(path, head.manifest.declared_bytes, cap)
            if sink is not None:
                sink.begin(head)
            # content + per member its tar header, a pax header carrying its name and the padding of
            # its data (at most 3 KiB + the name) + the end-of-archive records
            overhead = sum(max(4096, 3072 + len(name)) for name in members) + 2 * 4096 + (1 << 20)
            capped.cap = capped.count + head.manifest.declared_bytes + overhead
            seen: set[str] = set()
            checked = 0
            while member is not None:
                if _check_member(member, members, seen, path, report):
                    if _copy_member(tar, member, members[member.name].sha256, sink, path, report):
                        checked += 1
                member = tar.next()
            _check_end(tar, capped, path)
            digest = hashing.finish()
    for name in members:
        if name not in seen:
            report(MissingMemberError(f"{path}: member {name!r} listed in {MANIFEST_NAME} is missing from "
                                      "the archive; the bundle file is truncated or incomplete: copy it "
                                      "again or rebuild it", member=name, fix="copy the bundle again or rebuild it"))
    return ScanResult(head, digest, has_checksum, checked)


def _check_declared(path: Path, declared: int, cap: int) -> None:
    """Refuse a manifest that declares more content than the caps allow, before reading any:
    the absolute cap and the ratio to the compressed file (an honest-looking 60 GiB declared in
    a 2 MB file would otherwise be decompressed and hashed in full before a hash mismatch)."""
    if declared > cap:
        fix = f"raise {MAX_BYTES_ENV} if the bundle is trusted"
        raise SizeLimitError(f"{path}: field 'members' declares {declared} bytes of content, more than the "
                             f"{cap}-byte cap ({MAX_BYTES_ENV}); {fix}", field="members", fix=fix)
    compressed = max(path.stat().st_size, 1)
    ratio = max_ratio()
    if declared > ratio * compressed:
        fix = f"raise {MAX_RATIO_ENV} if the bundle is trusted (e.g. large all-zero weights)"
        raise SizeLimitError(f"{path}: field 'members' declares {declared} bytes of content in a {compressed}-byte "
                             f"file, a ratio over {ratio} ({MAX_RATIO_ENV}); refusing it (possible decompression "
                             f"bomb): {fix}", field="members", fix=fix)


def _check_member(member: tarfile.TarInfo, members, seen: set[str], path: Path,
                  report: Callable[[BundleError], None]) -> bool:
    """Whether ``member`` is a safe, regular, listed, new member of its declared size (a listed
    member joins ``seen`` even when its size is wrong: it is not also reported missing)."""
    name = member.name
    try:
        check_member_name(name)
    except UnsafeMemberNameError as e:
        report(UnsafeMemberNameError(f"{path}: {e}", member=e.member, fix=e.fix))
        return False
    if not _is_regular(member):
        report(UnsafeMemberTypeError(f"{path}: member {name!r} is {_member_kind(member)}; bundles hold only regular "
                                     f"files. Refusing to extract it: {REBUILD}", member=name, fix=REBUILD))
        return False
    if name == MANIFEST_NAME or name in seen:
        report(DuplicateMemberError(f"{path}: member {name!r} appears twice; the bundle was tampered "
                                    f"with or repacked: {REBUILD}", member=name, fix=REBUILD))
        return False
    info = members.get(name)
    if info is None:
        report(ExtraMemberError(f"{path}: member {name!r} is not listed in {MANIFEST_NAME}; the bundle "
                                f"was tampered with or repacked: {REBUILD}", member=name, fix=REBUILD))
        return False
    seen.add(name)
    if member.size != info.size:
        report(MemberSizeError(f"{path}: member {name!r} is {member.size} bytes, the manifest says "
                               f"{info.size}; the bundle is corrupt: {REBUILD}", member=name, fix=REBUILD))
        return False
    return True


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, sha256: str, sink: MemberSink | None,
                 path: Path, report: Callable[[BundleError], None]) -> bool:
    """Hash (and write through ``sink``) one member; whether its sha256 matched."""
    name = member.name
    src = tar.extractfile(member)
    out = sink.create(name) if sink is not None else None
    h = hashlib.sha256()
    written = 0
    try:
        while written < member.size:
            chunk = src.read(min(CHUNK, member.size - written))
            if not chunk:
                break
            h.update(chunk)
            if out is not None:
                out.write(chunk)
            written += len(chunk)
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
    finally:
        if out is not None:
            out.close()
    if written != member.size:
        raise corrupt(path, f"member {name!r} is truncated ({written} of {member.size} bytes)", name)
    if h.hexdigest() != sha256:
        report(MemberHashError(f"{path}: member {name!r} has sha256 {h.hexdigest()}, the manifest says "
                               f"{sha256}; the bundle is corrupt or was modified: copy it again "
                               "or rebuild it", member=name, fix="copy the bundle again or rebuild it"))
        return False
    if sink is not None:
        sink.finish(name)
    return True


def _check_end(tar: tarfile.TarFile, capped: _CappedReader, path: Path) -> None:
    """After the end-of-archive block only zero padding may follow, up to the end of the frame
    (reading to the end of the frame also checks the zstd content checksum)."""
    trailing = "data follows the end of the tar archive (a corrupt tar header ends the archive early, or " \
               "data was appended)"
    leftover = getattr(tar.fileobj, "buf", b"")
    if isinstance(leftover, bytes) and leftover.strip(b"\0"):
        raise corrupt(path, trailing)
    while chunk := capped.read(CHUNK):
        if chunk.strip(b"\0"):
            raise corrupt(path, trailing)


__all__ = ["Head", "ScanResult", "MemberSink", "scan", "read_head", "check_zstd_frame", "check_path", "corrupt",
           "sha256_file", "max_bytes", "max_ratio", "ZSTD_MAGIC", "MAX_TAR_HEADER_BYTES", "MAX_SIGNATURE_BYTES"]
