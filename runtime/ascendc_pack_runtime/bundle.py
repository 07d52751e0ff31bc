"""The ``.ascpack`` container (docs/FORMAT.md): verify a bundle and extract it into the cache.

A bundle is one zstd frame holding a tar whose first member is ``manifest.json``; the manifest
lists every other member with its size and sha256. Verification happens before anything is
loaded, in this order:

1. the file is a complete zstd frame (block structure walked without decompressing: truncation
   and trailing bytes are caught here);
2. one streaming pass: ``manifest.json`` first, valid JSON, format name and version, every field
   the runtime relies on; the decompressed size capped by what the manifest declares; every
   member a safe name, a regular file, listed, not duplicated, of the declared size and sha256;
   nothing but zero padding after the tar; the zstd content checksum (written by
   ``ascendc-pack build``) at the end of the frame; no listed member missing;
3. the host: backend, CPU architecture, ISA features, torch release, C++ ABI (after the
   integrity checks, so a corrupt manifest is reported as corruption, not as a host mismatch).

:func:`open_bundle` writes the members into a temporary directory of the cache while hashing
them and renames the verified tree to ``<cache>/<sha256 of the bundle file>/`` (atomic). A per
bundle lock file makes many processes opening the same bundle extract it once; leftovers of a
killed extraction are never trusted (only a renamed, complete directory is) and are removed by
the next extraction. :func:`verify_bundle` runs the same checks without writing anything and
reports every problem it finds.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import platform
import re
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import (ArchMismatchError, BackendUnavailableError, BundleError, BundleNotFoundError,
                     CorruptArchiveError, CxxAbiMismatchError, DuplicateMemberError, ExtraMemberError,
                     FormatNameError, FormatVersionError, IncompatibleBundleError, ManifestFieldError,
                     ManifestJSONError, MemberHashError, MemberPathConflictError, MemberSizeError,
                     MissingCpuFeaturesError, MissingMemberError, NotABundleError, SizeLimitError,
                     TorchVersionMismatchError, UnsafeMemberNameError, UnsafeMemberTypeError)

FORMAT_NAME = "ascpack"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
GRAPH_LIBRARY = "graph.so"
GRAPH_SOURCE = "graph.cpp"
WEIGHTS_FILE = "weights.bin"
TUNING_FILE = "tuning.json"
WEIGHT_ALIGNMENT = 64
VERIFIED_MARKER = ".ascpack-verified"
"""Written last into an extracted directory (before it is renamed into place): JSON with the
bundle's sha256. The C++ API refuses a directory without it."""

CACHE_ENV = "ASCENDC_PACK_RUNTIME_CACHE"
MAX_BYTES_ENV = "ASCENDC_PACK_RUNTIME_MAX_BYTES"
DEFAULT_MAX_BYTES = 64 << 30
"""Cap on the decompressed size of a bundle (override with ASCENDC_PACK_RUNTIME_MAX_BYTES)."""
MAX_MANIFEST_BYTES = 16 << 20
MAX_MEMBERS = 100_000
MAX_TAR_HEADER_BYTES = 1 << 20
"""Cap on a pax / GNU long-name header (tarfile reads those into memory)."""
MAX_PROBLEMS = 100
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
DTYPE_NAMES = frozenset(DTYPE_SIZES)

# test hooks (never set in production): pretend the host has exactly these CPU flags; pause an
# extraction after a member ("<member>:<file to create>") so a test can kill it half-way.
TEST_CPU_FLAGS_ENV = "ASCENDC_PACK_RUNTIME_TEST_CPU_FLAGS"
TEST_PAUSE_ENV = "ASCENDC_PACK_RUNTIME_TEST_PAUSE"

_NAMESPACE_RE = re.compile(r"ascpack_[0-9a-f]{8,64}")
_COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
_REBUILD = "rebuild the bundle with `ascendc-pack build`"


# ----------------------------------------------------------------------------- names and paths


def check_member_name(name: object) -> str:
    """Return ``name`` if it is a safe relative member path, else raise UnsafeMemberNameError.

    Safe: ``/``-separated components of ``[A-Za-z0-9_.+-]`` not starting with ``.`` or ``-``
    (so no absolute paths, no ``..``, no hidden files, no backslashes)."""
    if not isinstance(name, str) or not name:
        raise UnsafeMemberNameError(f"bundle member name {name!r} is empty or not text; the bundle is "
                                    f"corrupt or was not written by ascendc-pack: {_REBUILD}",
                                    member=str(name), fix=_REBUILD)
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise UnsafeMemberNameError(f"bundle member {name!r} has an absolute or non-POSIX path; refusing "
                                    f"to extract it: {_REBUILD}", member=name, fix=_REBUILD)
    if len(name) > 4096:
        raise UnsafeMemberNameError(f"bundle member name {name[:64]!r}... is {len(name)} characters long; "
                                    f"refusing it: {_REBUILD}", member=name[:256], fix=_REBUILD)
    for part in name.split("/"):
        if part in ("", ".", "..") or not _COMPONENT_RE.fullmatch(part):
            raise UnsafeMemberNameError(f"bundle member {name!r} has an unsafe path component {part!r} "
                                        "(empty, '.', '..', hidden or unusual characters); refusing to "
                                        f"extract it: {_REBUILD}", member=name, fix=_REBUILD)
    return name


def default_cache_dir() -> Path:
    """``$ASCENDC_PACK_RUNTIME_CACHE``, else ``$XDG_CACHE_HOME/ascendc_pack_runtime``, else
    ``~/.cache/ascendc_pack_runtime``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(os.path.expanduser(env))
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ascendc_pack_runtime"


def max_bytes() -> int:
    """The decompressed-size cap (``ASCENDC_PACK_RUNTIME_MAX_BYTES``, default 64 GiB)."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0:
        raise BundleError(f"{MAX_BYTES_ENV} must be a positive integer (bytes), got {raw!r}; fix the "
                          "environment variable", field=MAX_BYTES_ENV, fix=f"unset or correct {MAX_BYTES_ENV}")
    return n


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- manifest


def _field_error(field_name: str, problem: str, fix: str = _REBUILD) -> ManifestFieldError:
    return ManifestFieldError(f"{MANIFEST_NAME}: field {field_name!r} {problem}; the bundle is corrupt or "
                              f"from another tool: {fix}", field=field_name, fix=fix)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _need(cond: bool, field_name: str, problem: str) -> None:
    if not cond:
        raise _field_error(field_name, problem)


def _check_tensor_spec(d: object, where: str, *, stride_required: bool = False) -> None:
    _need(isinstance(d, dict), where, "is not an object")
    _need(isinstance(d.get("name"), str), f"{where}.name", "is missing or not a string")
    _need(isinstance(d.get("dtype"), str) and d["dtype"] in DTYPE_NAMES, f"{where}.dtype",
          f"is {d.get('dtype')!r}, not a dtype this runtime knows ({', '.join(sorted(DTYPE_NAMES))})")
    shape = d.get("shape")
    _need(isinstance(shape, list) and len(shape) <= 64 and all(_is_int(s) and 0 <= s < 1 << 48 for s in shape),
          f"{where}.shape", "is missing or not a list of non-negative integers")
    stride = d.get("stride")
    if stride is not None or stride_required:
        _need(isinstance(stride, list) and len(stride) == len(shape)
              and all(_is_int(s) and 0 <= s < 1 << 48 for s in stride),
              f"{where}.stride", "is missing or not a list of non-negative integers, one per dimension")


def validate_manifest(m: object) -> dict:
    """Check the manifest's format name, version and every field the runtime relies on.

    Raises ManifestJSONError (not an object), FormatNameError, FormatVersionError,
    ManifestFieldError, UnsafeMemberNameError (a listed name) or MemberPathConflictError."""
    if not isinstance(m, dict):
        raise ManifestJSONError(f"{MANIFEST_NAME} is not a JSON object; the bundle is corrupt: {_REBUILD}",
                                member=MANIFEST_NAME, fix=_REBUILD)
    if m.get("format") != FORMAT_NAME:
        raise FormatNameError(f"{MANIFEST_NAME}: field 'format' is {m.get('format')!r}, expected "
                              f"{FORMAT_NAME!r}; this file is not an ascendc-pack bundle (pass a file written "
                              "by `ascendc-pack build`)", field="format", fix="pass an .ascpack bundle")
    version = m.get("format_version")
    if not _is_int(version):
        raise FormatVersionError(f"{MANIFEST_NAME}: field 'format_version' is {version!r}, not an integer; "
                                 f"the bundle is corrupt: {_REBUILD}", field="format_version", fix=_REBUILD)
    if version > FORMAT_VERSION:
        raise FormatVersionError(f"{MANIFEST_NAME}: field 'format_version' is {version}, newer than this "
                                 f"runtime supports ({FORMAT_VERSION}); upgrade ascendc-pack (the runtime)",
                                 field="format_version", fix="upgrade ascendc-pack")
    if version < FORMAT_VERSION:
        raise FormatVersionError(f"{MANIFEST_NAME}: field 'format_version' is {version}, older than this "
                                 f"runtime supports ({FORMAT_VERSION}); rebuild the bundle with a current "
                                 "ascendc-pack", field="format_version", fix=_REBUILD)
    required = {"backend": str, "target": dict, "torch": dict, "inputs": list, "outputs": list,
                "mutations": list, "out_spec": str, "weights": dict, "graph": dict, "kernels": list,
                "members": dict}
    for key, typ in required.items():
        _need(isinstance(m.get(key), typ), key, f"is missing or not a {'JSON object' if typ is dict else typ.__name__}")

    members = m["members"]
    _need(len(members) <= MAX_MEMBERS, "members", f"lists {len(members)} members, more than {MAX_MEMBERS}")
    _need(MANIFEST_NAME not in members, "members", f"lists {MANIFEST_NAME} itself")
    for name, info in members.items():
        check_member_name(name)
        where = f"members[{name!r}]"
        _need(isinstance(info, dict), where, "is not an object")
        _need(_is_int(info.get("size")) and 0 <= info["size"] < 1 << 62, f"{where}.size",
              "is missing or not a non-negative integer")
        _need(isinstance(info.get("sha256"), str) and bool(_SHA256_RE.fullmatch(info["sha256"])),
              f"{where}.sha256", "is missing or not 64 lowercase hex digits")
    for name in members:
        parts = name.split("/")
        for k in range(1, len(parts)):
            prefix = "/".join(parts[:k])
            if prefix in members:
                raise MemberPathConflictError(
                    f"{MANIFEST_NAME}: member {name!r} cannot be created: {prefix!r} is itself a file "
                    f"member; the bundle is corrupt: {_REBUILD}", member=name, fix=_REBUILD)

    target, tv = m["target"], m["torch"]
    _need(isinstance(target.get("arch", ""), str), "target.arch", "is not a string")
    isa = target.get("isa", [])
    _need(isinstance(isa, list) and all(isinstance(f, str) for f in isa), "target.isa",
          "is not a list of CPU feature names")
    _need(isinstance(tv.get("version"), str) and bool(tv["version"]), "torch.version",
          "is missing or not a string")
    _need(tv.get("cxx11_abi") is None or isinstance(tv["cxx11_abi"], bool), "torch.cxx11_abi",
          "is not true, false or null")

    for i, d in enumerate(m["inputs"]):
        _check_tensor_spec(d, f"inputs[{i}]")
    n_in = len(m["inputs"])
    for i, d in enumerate(m["outputs"]):
        _check_tensor_spec(d, f"outputs[{i}]")
        idx = d.get("input_index")
        _need(idx is None or (_is_int(idx) and 0 <= idx < n_in), f"outputs[{i}].input_index",
              f"is not the index of one of the {n_in} inputs")
    input_names = {d["name"] for d in m["inputs"]}
    for i, mu in enumerate(m["mutations"]):
        _need(isinstance(mu, dict) and isinstance(mu.get("input"), str) and mu["input"] in input_names,
              f"mutations[{i}].input",
              "names no model input")

    w = m["weights"]
    _need(isinstance(w.get("file"), str) and w["file"] in members, "weights.file",
          f"is {w.get('file')!r}, not one of the members")
    tensors = w.get("tensors")
    _need(isinstance(tensors, list), "weights.tensors", "is missing or not a list")
    wsize = members[w["file"]]["size"]
    for i, t in enumerate(tensors):
        where = f"weights.tensors[{i}]"
        _check_tensor_spec(t, where, stride_required=True)
        for key in ("offset", "nbytes"):
            _need(_is_int(t.get(key)) and t[key] >= 0, f"{where}.{key}", "is missing or not a non-negative integer")
        itemsize = DTYPE_SIZES[t["dtype"]]
        shape, stride = t["shape"], t["stride"]
        span = 0 if any(n == 0 for n in shape) else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        _need(t["nbytes"] == span * itemsize and t["offset"] % itemsize == 0
              and t["offset"] + t["nbytes"] <= wsize, where,
              f"(offset {t['offset']}, {t['nbytes']} bytes) does not fit its shape and strides inside "
              f"{w['file']} ({wsize} bytes)")

    g = m["graph"]
    _need(isinstance(g.get("library", GRAPH_LIBRARY), str) and g.get("library", GRAPH_LIBRARY) in members,
          "graph.library", f"is {g.get('library', GRAPH_LIBRARY)!r}, not one of the members")
    _need(isinstance(g.get("namespace"), str) and bool(_NAMESPACE_RE.fullmatch(g["namespace"])),
          "graph.namespace", "is missing or not 'ascpack_' followed by hex digits")
    _need(_is_int(g.get("abi")), "graph.abi", "is missing or not an integer")
    for i, k in enumerate(m["kernels"]):
        where = f"kernels[{i}]"
        _need(isinstance(k, dict), where, "is not an object")
        for key in ("name", "kernel_key"):
            _need(isinstance(k.get(key), str), f"{where}.{key}", "is missing or not a string")
        _need(isinstance(k.get("file"), str) and k["file"] in members, f"{where}.file",
              f"is {k.get('file')!r}, not one of the members")
    return m


# ----------------------------------------------------------------------------- host checks


def _normalize_arch(arch: str) -> str:
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch.lower())


def host_cpu_flags() -> set[str] | None:
    """This host's CPU feature flags from /proc/cpuinfo, None when unknown."""
    override = os.environ.get(TEST_CPU_FLAGS_ENV)
    if override is not None:
        return set(override.replace(",", " ").split())
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def host_problems(m: dict) -> list[IncompatibleBundleError]:
    """Every reason this host cannot run the (validated) manifest's bundle: backend,
    architecture, ISA features, torch release, C++ ABI (graph.so uses one torch's C++ API)."""
    import torch

    problems: list[IncompatibleBundleError] = []
    if m["backend"] != "cpu":
        fix = "rebuild it with the cpu backend or run it with a runtime for that backend"
        problems.append(BackendUnavailableError(
            f"{MANIFEST_NAME}: field 'backend' is {m['backend']!r}; this runtime runs 'cpu' bundles only: {fix}",
            field="backend", fix=fix))
    target = m["target"]
    want_arch = _normalize_arch(str(target.get("arch", "")))
    host_arch = _normalize_arch(platform.machine())
    if want_arch and want_arch != host_arch:
        fix = "rebuild the bundle on (or for) this architecture"
        problems.append(ArchMismatchError(
            f"{MANIFEST_NAME}: field 'target.arch': bundle was built for {want_arch}, this host is {host_arch}; "
            f"{fix}", field="target.arch", fix=fix))
    elif want_arch:
        flags = host_cpu_flags()
        need = [f for f in target.get("isa", [])]
        if flags is not None:
            missing = sorted(set(need) - flags)
            if missing:
                fix = ("rebuild with a portable target this host supports, e.g. `ascendc-pack build "
                       "--march x86-64-v2`" if host_arch == "x86_64" else
                       "rebuild with a -march this host supports (`ascendc-pack build --march ...`)")
                problems.append(MissingCpuFeaturesError(
                    f"{MANIFEST_NAME}: field 'target.isa': the bundle's code was compiled with "
                    f"-march={target.get('march', '?')} and needs CPU features this host lacks: "
                    f"{', '.join(missing)}; running it would crash with an illegal instruction: {fix}",
                    field="target.isa", fix=fix))
    tv = m["torch"]
    want, have = str(tv.get("version", "")), torch.__version__
    if want.split("+")[0] != have.split("+")[0]:
        fix = f"install torch=={want.split('+')[0]} or rebuild the bundle with this torch"
        problems.append(TorchVersionMismatchError(
            f"{MANIFEST_NAME}: field 'torch.version': graph.so was built against torch {want}, this process "
            f"has torch {have}; {fix}", field="torch.version", fix=fix))
    abi = tv.get("cxx11_abi")
    host_abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if abi is not None and bool(abi) != host_abi:
        fix = "use a torch build with the same C++ ABI or rebuild the bundle with this torch"
        problems.append(CxxAbiMismatchError(
            f"{MANIFEST_NAME}: field 'torch.cxx11_abi': graph.so was built with _GLIBCXX_USE_CXX11_ABI="
            f"{int(bool(abi))}, this torch uses {int(host_abi)}; {fix}", field="torch.cxx11_abi", fix=fix))
    return problems


def check_host(m: dict) -> None:
    """Raise the first :func:`host_problems` problem (an IncompatibleBundleError subclass)."""
    problems = host_problems(m)
    if problems:
        raise problems[0]


# ----------------------------------------------------------------------------- zstd frame


def _corrupt(path: Path, problem: str, member: str | None = None) -> CorruptArchiveError:
    fix = "copy the bundle again (the file is damaged) or rebuild it"
    return CorruptArchiveError(f"{path}: {problem}; {fix}", member=member, fix=fix)


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
            raise _corrupt(path, f"the zstd frame is truncated ({size} bytes)")
        fhd = head[4]
        if fhd & 0x08:
            raise _corrupt(path, "the zstd frame header has its reserved bit set")
        fcs_flag, single, checksum, did_flag = fhd >> 6, bool(fhd & 0x20), bool(fhd & 0x04), fhd & 0x03
        pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag] + \
            ((1 if single else 0), 2, 4, 8)[fcs_flag]
        while True:
            if pos + 3 > size:
                raise _corrupt(path, f"the zstd frame is truncated (a block header at byte {pos} is cut off; "
                                     f"the file has {size} bytes)")
            f.seek(pos)
            b = f.read(3)
            header = b[0] | (b[1] << 8) | (b[2] << 16)
            last, btype, bsize = header & 1, (header >> 1) & 3, header >> 3
            if btype == 3:
                raise _corrupt(path, f"the zstd frame has a block of reserved type at byte {pos}")
            if bsize > 128 << 10:
                raise _corrupt(path, f"the zstd frame has an oversized block ({bsize} bytes) at byte {pos}")
            pos += 3 + (1 if btype == 1 else bsize)
            if last:
                break
        pos += 4 if checksum else 0
        if pos > size:
            raise _corrupt(path, f"the zstd frame is truncated: it needs {pos} bytes, the file has {size}")
        if pos < size:
            raise _corrupt(path, f"{size - pos} bytes follow the zstd frame (appended or concatenated data)")
    return checksum


# ----------------------------------------------------------------------------- streaming


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
        data = self.raw.read(n if n is not None and n >= 0 else _CHUNK)
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
        while chunk := self.f.read(_CHUNK):
            self.h.update(chunk)
        return self.h.hexdigest()


class _SafeTarInfo(tarfile.TarInfo):
    """Refuses oversized pax / GNU long-name headers before tarfile reads them into memory."""

    def _proc_member(self, tarfile_obj):
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                         tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) and self.size > MAX_TAR_HEADER_BYTES:
            fix = _REBUILD
            raise SizeLimitError(f"a tar extended header declares {self.size} bytes, more than the "
                                 f"{MAX_TAR_HEADER_BYTES} allowed; refusing the bundle: {fix}", fix=fix)
        return super()._proc_member(tarfile_obj)


def _stream_corrupt(path: Path, e: Exception) -> CorruptArchiveError:
    """The error for a decompression/tar failure while streaming the bundle."""
    return _corrupt(path, f"the bundle is truncated or corrupt ({type(e).__name__}: {str(e)[:300]})")


def _stream_errors():
    import zstandard

    return (tarfile.TarError, EOFError, zstandard.ZstdError, ValueError, UnicodeError, OverflowError,
            KeyError, IndexError)


@dataclass
class Extracted:
    """A verified bundle in the cache."""

    path: Path               # the .ascpack file
    directory: Path          # <cache>/<bundle_sha256>
    manifest: dict
    bundle_sha256: str
    extracted: bool          # False when an earlier extraction was reused


@dataclass
class VerifyReport:
    """What :func:`verify_bundle` found. ``problems`` holds one typed error per problem."""

    path: Path
    manifest: dict | None = None
    problems: list[BundleError] = field(default_factory=list)
    bundle_sha256: str | None = None
    members_checked: int = 0
    has_checksum: bool | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_path(path: Path | str) -> Path:
    path = Path(path)
    if not path.exists():
        raise BundleNotFoundError(f"{path}: no such bundle file; pass the path of a .ascpack file",
                                  fix="pass the path of an .ascpack file")
    if not path.is_file():
        raise BundleNotFoundError(f"{path} is not a file; pass the path of a .ascpack file",
                                  fix="pass the path of an .ascpack file")
    return path


def _open_tar(fileobj, path: Path) -> tarfile.TarFile:
    """A streaming tar reader (it reads the first header right away)."""
    try:
        return tarfile.open(fileobj=fileobj, mode="r|", tarinfo=_SafeTarInfo)
    except tarfile.ReadError as e:
        raise NotABundleError(f"{path}: the zstd content is not a tar archive ({e}); pass a bundle written by "
                              "`ascendc-pack build`", fix="pass an .ascpack bundle") from None


def _read_manifest_member(tar: tarfile.TarFile, path: Path) -> dict:
    try:
        first = tar.next()
    except tarfile.ReadError as e:
        raise NotABundleError(f"{path}: the zstd content is not a tar archive ({e}); pass a bundle written by "
                              "`ascendc-pack build`", fix="pass an .ascpack bundle") from None
    if first is None:
        raise NotABundleError(f"{path} is an empty archive; pass a bundle written by `ascendc-pack build`",
                              fix="pass an .ascpack bundle")
    if first.name != MANIFEST_NAME:
        raise NotABundleError(f"{path}: the first member is {first.name!r}, expected {MANIFEST_NAME!r}; the "
                              f"file is not an ascendc-pack bundle or was repacked: {_REBUILD}",
                              member=first.name, fix=_REBUILD)
    if first.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or first.issparse():
        raise UnsafeMemberTypeError(f"{path}: {MANIFEST_NAME} is not a regular file; {_REBUILD}",
                                    member=MANIFEST_NAME, fix=_REBUILD)
    if first.size > MAX_MANIFEST_BYTES:
        raise ManifestJSONError(f"{path}: {MANIFEST_NAME} is {first.size} bytes, more than the "
                                f"{MAX_MANIFEST_BYTES} allowed; the bundle is corrupt: {_REBUILD}",
                                member=MANIFEST_NAME, fix=_REBUILD)
    fobj = tar.extractfile(first)
    data = fobj.read() if fobj is not None else b""
    if len(data) != first.size:
        raise _corrupt(path, f"{MANIFEST_NAME} is truncated", member=MANIFEST_NAME)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ManifestJSONError(f"{path}: {MANIFEST_NAME} is not valid JSON ({str(e)[:200]}); the bundle is "
                                f"corrupt: {_REBUILD}", member=MANIFEST_NAME, fix=_REBUILD) from None
    return validate_manifest(manifest)


def _member_kind(member: tarfile.TarInfo) -> str:
    return ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
            "a device" if member.isdev() else "a directory" if member.isdir() else
            "a FIFO" if member.isfifo() else "a sparse file" if member.issparse() else "not a regular file")


def _pause_hook(name: str) -> None:
    spec = os.environ.get(TEST_PAUSE_ENV)
    if spec:
        member, _, flag = spec.partition(":")
        if member == name:
            Path(flag).write_text(str(os.getpid()))
            time.sleep(600)


def _scan(path: Path, dest: Path | None, report: Callable[[BundleError], None],
          on_manifest: Callable[[dict], None] | None = None) -> tuple[dict, str, bool, int]:
    """Verify ``path`` in one streaming pass, writing members into ``dest`` when given.

    Member-level problems go to ``report`` (which raises in load mode, collects in verify mode);
    problems that make reading on impossible are raised. Returns (manifest, sha256 of the file as
    read, whether the zstd frame has a checksum, members verified)."""
    import zstandard

    has_checksum = check_zstd_frame(path)
    cap = max_bytes()
    f = open(path, "rb")
    hashing = _HashingFile(f)
    tar = None
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(hashing, read_size=_CHUNK, closefd=False)
        capped = _CappedReader(reader, min(cap, MAX_MANIFEST_BYTES + (1 << 20)), path)
        tar = _open_tar(capped, path)
        manifest = _read_manifest_member(tar, path)
        if on_manifest is not None:
            on_manifest(manifest)
        members = manifest["members"]
        declared = sum(info["size"] for info in members.values())
        if declared > cap:
            fix = f"raise {MAX_BYTES_ENV} if the bundle is trusted"
            raise SizeLimitError(f"{path}: field 'members' declares {declared} bytes of content, more than the "
                                 f"{cap}-byte cap ({MAX_BYTES_ENV}); {fix}", field="members", fix=fix)
        # content + tar headers and padding (pax headers included) + the end-of-archive records
        capped.cap = capped.count + declared + 4096 * (len(members) + 2) + (1 << 20)
        seen: set[str] = set()
        checked = 0
        while (member := tar.next()) is not None:
            name = member.name
            try:
                check_member_name(name)
            except UnsafeMemberNameError as e:
                report(UnsafeMemberNameError(f"{path}: {e}", member=name, fix=e.fix))
                continue
            if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.issparse():
                report(UnsafeMemberTypeError(
                    f"{path}: member {name!r} is {_member_kind(member)}; bundles hold only regular files. "
                    f"Refusing to extract it: {_REBUILD}", member=name, fix=_REBUILD))
                continue
            if name == MANIFEST_NAME or name in seen:
                report(DuplicateMemberError(f"{path}: member {name!r} appears twice; the bundle was tampered "
                                            f"with or repacked: {_REBUILD}", member=name, fix=_REBUILD))
                continue
            info = members.get(name)
            if info is None:
                report(ExtraMemberError(f"{path}: member {name!r} is not listed in {MANIFEST_NAME}; the bundle "
                                        f"was tampered with or repacked: {_REBUILD}", member=name, fix=_REBUILD))
                continue
            seen.add(name)
            if member.size != info["size"]:
                report(MemberSizeError(f"{path}: member {name!r} is {member.size} bytes, the manifest says "
                                       f"{info['size']}; the bundle is corrupt: {_REBUILD}",
                                       member=name, fix=_REBUILD))
                continue
            src = tar.extractfile(member)
            out = None
            if dest is not None:
                target = dest / name
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    out = open(target, "xb")
                except OSError as e:
                    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
                        raise
                    raise MemberPathConflictError(f"{path}: member {name!r} cannot be created next to the other "
                                                  f"members ({e}); the bundle is corrupt: {_REBUILD}",
                                                  member=name, fix=_REBUILD) from None
            h = hashlib.sha256()
            written = 0
            try:
                while written < member.size:
                    chunk = src.read(min(_CHUNK, member.size - written))
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
                raise _corrupt(path, f"member {name!r} is truncated ({written} of {member.size} bytes)", name)
            if h.hexdigest() != info["sha256"]:
                report(MemberHashError(f"{path}: member {name!r} has sha256 {h.hexdigest()}, the manifest says "
                                       f"{info['sha256']}; the bundle is corrupt or was modified: copy it again "
                                       "or rebuild it", member=name, fix="copy the bundle again or rebuild it"))
                continue
            checked += 1
            if dest is not None:
                os.chmod(dest / name, 0o755 if name.endswith(".so") else 0o644)
                _pause_hook(name)
        # after the end-of-archive block only zero padding may follow, up to the end of the frame
        # (reading to the end of the frame also checks the zstd content checksum)
        leftover = getattr(tar.fileobj, "buf", b"")
        if isinstance(leftover, bytes) and leftover.strip(b"\0"):
            raise _corrupt(path, "data follows the end of the tar archive (a corrupt tar header ends the "
                                 "archive early, or data was appended)")
        while chunk := capped.read(_CHUNK):
            if chunk.strip(b"\0"):
                raise _corrupt(path, "data follows the end of the tar archive (a corrupt tar header ends the "
                                     "archive early, or data was appended)")
        digest = hashing.finish()
        for name in members:
            if name not in seen:
                report(MissingMemberError(f"{path}: member {name!r} listed in {MANIFEST_NAME} is missing from "
                                          "the archive; the bundle file is truncated or incomplete: copy it "
                                          "again or rebuild it", member=name,
                                          fix="copy the bundle again or rebuild it"))
        return manifest, digest, has_checksum, checked
    except BundleError:
        raise
    except _stream_errors() as e:
        raise _stream_corrupt(path, e) from None
    finally:
        if tar is not None:
            with contextlib.suppress(Exception):
                tar.close()
        f.close()


def read_manifest(path: Path | str) -> dict:
    """Read and validate only the manifest of a bundle (cheap: the frame's block headers and
    the first member). Does not check members or the host."""
    import zstandard

    path = _check_path(path)
    check_zstd_frame(path)
    with open(path, "rb") as f:
        tar = None
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=1 << 16, closefd=False)
            capped = _CappedReader(reader, MAX_MANIFEST_BYTES + (1 << 20), path)
            tar = _open_tar(capped, path)
            return _read_manifest_member(tar, path)
        except BundleError:
            raise
        except _stream_errors() as e:
            raise _stream_corrupt(path, e) from None
        finally:
            if tar is not None:
                with contextlib.suppress(Exception):
                    tar.close()


def verify_bundle(path: Path | str, *, check_host_compat: bool = True) -> VerifyReport:
    """Run every check :func:`open_bundle` runs, writing nothing, and collect every problem
    (one typed error each; a problem that stops the stream, e.g. corruption, ends the list)."""
    path = Path(path)
    rep = VerifyReport(path)

    def collect(err: BundleError) -> None:
        rep.problems.append(err)
        if len(rep.problems) >= MAX_PROBLEMS:
            raise BundleError(f"{path}: more than {MAX_PROBLEMS} problems; stopping")

    def keep(manifest: dict) -> None:
        rep.manifest = manifest

    try:
        _check_path(path)
        _, rep.bundle_sha256, rep.has_checksum, rep.members_checked = _scan(path, None, collect, keep)
    except BundleError as e:
        if not rep.problems or rep.problems[-1] is not e:
            rep.problems.append(e)
    if check_host_compat and rep.manifest is not None:
        rep.problems.extend(host_problems(rep.manifest))
    return rep


# ----------------------------------------------------------------------------- the cache


def _raise(err: BundleError) -> None:
    raise err


def _reusable(directory: Path, expect_sha: str, verify: str) -> dict | None:
    """The manifest of a complete, verified earlier extraction, or None."""
    try:
        marker = json.loads((directory / VERIFIED_MARKER).read_text())
        if not isinstance(marker, dict) or marker.get("bundle_sha256") != expect_sha:
            return None
        manifest = validate_manifest(json.loads((directory / MANIFEST_NAME).read_text()))
    except (OSError, ValueError, BundleError):
        return None
    for name, info in manifest["members"].items():
        p = directory / name
        try:
            if p.is_symlink() or not p.is_file() or p.stat().st_size != info["size"]:
                return None
        except OSError:
            return None
        if verify == "full" and sha256_file(p) != info["sha256"]:
            return None
    return manifest


@contextlib.contextmanager
def _extraction_lock(cache: Path):
    """An exclusive ``flock`` on the cache directory itself (no lock file; the kernel releases
    it if the holder dies). Extractions into one cache run one at a time; reusing an extracted
    bundle takes no lock. Yields True when held, False where file locks are unsupported."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield False
        return
    fd = os.open(cache, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = True
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                raise
            held = False
        yield held
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_leftovers(cache: Path, bundle_sha: str, lock_held: bool) -> None:
    """Delete temporary and trash directories of this bundle left by killed extractions."""
    prefix = bundle_sha[:16]
    for p in cache.glob(f".tmp-{prefix}-*"):
        try:
            pid = int(p.name.split("-")[2])
        except (IndexError, ValueError):
            pid = -1
        if lock_held or pid <= 0 or not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)
    for p in cache.glob(f".trash-{prefix}-*"):
        shutil.rmtree(p, ignore_errors=True)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(root: Path) -> None:
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        _fsync_dir(d)


def open_bundle(path: Path | str, cache_dir: Path | str | None = None, verify: str = "sizes") -> Extracted:
    """Verify ``path`` and extract it under ``<cache_dir>/<sha256 of the file>/`` (atomic).

    ``verify`` controls what an earlier extraction must pass to be reused: ``"sizes"`` (its
    verified marker, every member present with its size; hashes were checked when it was
    extracted) or ``"full"`` (rehash every member). Raises a
    :class:`~ascendc_pack_runtime.errors.BundleError` subclass.
    """
    if verify not in ("sizes", "full"):
        raise ValueError(f"verify must be 'sizes' or 'full', got {verify!r}")
    path = _check_path(path)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bundle_sha = sha256_file(path)
    target = cache / bundle_sha
    if target.is_dir():
        manifest = _reusable(target, bundle_sha, verify)
        if manifest is not None:
            check_host(manifest)
            return Extracted(path, target, manifest, bundle_sha, extracted=False)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"cannot create the runtime cache directory {cache}: {e}; set {CACHE_ENV} "
                          "to a writable directory", field=CACHE_ENV, fix=f"set {CACHE_ENV}") from None
    with _extraction_lock(cache) as held:
        if target.is_dir():
            # another process may have finished while we waited for the lock
            manifest = _reusable(target, bundle_sha, verify)
            if manifest is not None:
                check_host(manifest)
                return Extracted(path, target, manifest, bundle_sha, extracted=False)
            # incomplete, damaged or modified: move it out of the way
            trash = cache / f".trash-{bundle_sha[:16]}-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(OSError):
                os.rename(target, trash)
        _remove_leftovers(cache, bundle_sha, held)
        tmp = cache / f".tmp-{bundle_sha[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
        except OSError as e:
            raise BundleError(f"cannot write into the runtime cache directory {cache}: {e}; set {CACHE_ENV} "
                              "to a writable directory", field=CACHE_ENV, fix=f"set {CACHE_ENV}") from None
        try:
            try:
                manifest, digest, _, _ = _scan(path, tmp, _raise)
            except OSError as e:   # disk full, quota, ...: the environment, not the bundle
                raise BundleError(f"cannot extract {path.name} into {cache}: {e}; free space there or set "
                                  f"{CACHE_ENV} to another directory", field=CACHE_ENV,
                                  fix=f"free space or set {CACHE_ENV}") from None
            if digest != bundle_sha:
                raise _corrupt(path, "the file changed while it was being verified")
            check_host(manifest)
            (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            (tmp / VERIFIED_MARKER).write_text(json.dumps(
                {"format": "ascpack-extracted", "version": 1, "bundle_sha256": bundle_sha,
                 "bundle_name": path.name, "verified_at": time.time()}) + "\n")
            _fsync_tree(tmp)
            try:
                os.rename(tmp, target)
                extracted = True
            except OSError:
                # without a working lock another process may have finished first: use its tree
                if _reusable(target, bundle_sha, "sizes") is None:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                extracted = False
            _fsync_dir(cache)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Extracted(path, target, manifest, bundle_sha, extracted)


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_NAME", "GRAPH_LIBRARY", "GRAPH_SOURCE",
           "WEIGHTS_FILE", "TUNING_FILE", "WEIGHT_ALIGNMENT", "VERIFIED_MARKER", "check_member_name",
           "validate_manifest", "check_host", "host_problems", "host_cpu_flags", "read_manifest",
           "check_zstd_frame", "verify_bundle", "VerifyReport", "open_bundle", "Extracted",
           "default_cache_dir", "sha256_file", "max_bytes"]
