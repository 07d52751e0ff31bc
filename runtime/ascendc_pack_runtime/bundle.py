"""The ``.ascpack`` container (docs/FORMAT.md): verify a bundle and extract it into the cache.

A bundle is a zstd-compressed tar whose first member is ``manifest.json``; the manifest lists
every other member with its size and sha256. :func:`open_bundle` streams the archive once:
it reads and validates the manifest, checks that this host can run the bundle, then writes each
member into a temporary directory while hashing it, refusing anything the manifest does not
promise. Only a fully verified tree is renamed to its content-addressed place
``<cache>/<sha256 of the bundle file>/``, so a directory there is always complete, and many
processes can open the same bundle at once (the first rename wins, the others reuse it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import (BundleError, BundleFormatError, BundleIntegrityError, BundleNotFoundError,
                     IncompatibleBundleError, UnsafeMemberError)

FORMAT_NAME = "ascpack"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
GRAPH_LIBRARY = "graph.so"
GRAPH_SOURCE = "graph.cpp"
WEIGHTS_FILE = "weights.bin"
TUNING_FILE = "tuning.json"
WEIGHT_ALIGNMENT = 64

CACHE_ENV = "ASCENDC_PACK_RUNTIME_CACHE"
MAX_BYTES_ENV = "ASCENDC_PACK_RUNTIME_MAX_BYTES"
DEFAULT_MAX_BYTES = 64 << 30
"""Cap on the decompressed size of a bundle (override with ASCENDC_PACK_RUNTIME_MAX_BYTES)."""
MAX_MANIFEST_BYTES = 16 << 20
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


# ----------------------------------------------------------------------------- names and paths


def check_member_name(name: object) -> str:
    """Return ``name`` if it is a safe relative member path, else raise UnsafeMemberError.

    Safe: ``/``-separated components of ``[A-Za-z0-9_.+-]`` not starting with ``.`` or ``-``
    (so no absolute paths, no ``..``, no hidden files, no backslashes)."""
    if not isinstance(name, str) or not name:
        raise UnsafeMemberError(f"bundle member name {name!r} is empty or not text; the bundle is "
                                "corrupt or was not written by ascendc-pack")
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise UnsafeMemberError(f"bundle member {name!r} has an absolute or non-POSIX path; refusing "
                                "to extract it. Rebuild the bundle with ascendc-pack")
    for part in name.split("/"):
        if part in ("", ".", "..") or not _COMPONENT_RE.fullmatch(part):
            raise UnsafeMemberError(f"bundle member {name!r} has an unsafe path component {part!r} "
                                    "(empty, '.', '..' or unusual characters); refusing to extract "
                                    "it. Rebuild the bundle with ascendc-pack")
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
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        n = int(raw)
    except ValueError:
        raise BundleFormatError(f"{MAX_BYTES_ENV} must be a positive integer (bytes), got {raw!r}") from None
    if n <= 0:
        raise BundleFormatError(f"{MAX_BYTES_ENV} must be a positive integer (bytes), got {raw!r}")
    return n


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- manifest


def validate_manifest(m: object) -> dict:
    """Check the manifest's format name, version and the fields the runtime relies on."""
    if not isinstance(m, dict):
        raise BundleFormatError(f"{MANIFEST_NAME} is not a JSON object; the bundle is corrupt")
    if m.get("format") != FORMAT_NAME:
        raise BundleFormatError(f"{MANIFEST_NAME}: format is {m.get('format')!r}, expected "
                                f"{FORMAT_NAME!r}; this file is not an ascendc-pack bundle")
    version = m.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BundleFormatError(f"{MANIFEST_NAME}: format_version {version!r} is not an integer; the "
                                "bundle is corrupt")
    if version > FORMAT_VERSION:
        raise BundleFormatError(f"{MANIFEST_NAME}: bundle format version {version} is newer than this "
                                f"runtime supports ({FORMAT_VERSION}); upgrade ascendc-pack")
    if version < FORMAT_VERSION:
        raise BundleFormatError(f"{MANIFEST_NAME}: bundle format version {version} is older than this "
                                f"runtime supports ({FORMAT_VERSION}); rebuild the bundle with a "
                                "current ascendc-pack")
    required = {"backend": str, "target": dict, "torch": dict, "inputs": list, "outputs": list,
                "mutations": list, "out_spec": str, "weights": dict, "graph": dict, "kernels": list,
                "members": dict}
    for key, typ in required.items():
        if not isinstance(m.get(key), typ):
            raise BundleFormatError(f"{MANIFEST_NAME}: field {key!r} is missing or not a "
                                    f"{typ.__name__}; the bundle is corrupt or from another tool")
    members = m["members"]
    if MANIFEST_NAME in members:
        raise BundleFormatError(f"{MANIFEST_NAME}: lists itself under 'members'; the bundle is corrupt")
    for name, info in members.items():
        check_member_name(name)
        if not isinstance(info, dict) or not isinstance(info.get("size"), int) or info["size"] < 0 \
                or not isinstance(info.get("sha256"), str) or not _SHA256_RE.fullmatch(info["sha256"]):
            raise BundleFormatError(f"{MANIFEST_NAME}: members[{name!r}] needs a non-negative 'size' and "
                                    "a lowercase hex 'sha256'; the bundle is corrupt")
    for name in (GRAPH_LIBRARY, WEIGHTS_FILE):
        if name not in members:
            raise BundleFormatError(f"{MANIFEST_NAME}: member {name!r} is not listed; the bundle is "
                                    "incomplete, rebuild it")
    for where, name in (("weights.file", m["weights"].get("file")),
                        ("graph.library", m["graph"].get("library", GRAPH_LIBRARY))):
        if name not in members:
            raise BundleFormatError(f"{MANIFEST_NAME}: {where} {name!r} is not among the members; the "
                                    "bundle is corrupt, rebuild it")
    for k in m["kernels"]:
        if not isinstance(k, dict) or k.get("file") not in members:
            raise BundleFormatError(f"{MANIFEST_NAME}: kernel entry {k!r} has no 'file' among the "
                                    "members; the bundle is incomplete, rebuild it")
    return m


def _normalize_arch(arch: str) -> str:
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch.lower())


def host_cpu_flags() -> set[str] | None:
    """This host's CPU feature flags from /proc/cpuinfo, None when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def check_host(m: dict) -> None:
    """Refuse a bundle this host cannot run: backend, architecture, ISA features, torch
    version and C++ ABI (graph.so is built against one torch's C++ API)."""
    import torch

    if m["backend"] != "cpu":
        raise IncompatibleBundleError(f"bundle backend is {m['backend']!r}; this runtime runs 'cpu' "
                                      "bundles. Rebuild it with --backend cpu")
    target = m["target"]
    want_arch = _normalize_arch(str(target.get("arch", "")))
    host_arch = _normalize_arch(platform.machine())
    if want_arch and want_arch != host_arch:
        raise IncompatibleBundleError(f"bundle was built for {want_arch}, this host is {host_arch}; "
                                      "rebuild the bundle on (or for) this architecture")
    flags = host_cpu_flags()
    need = [f for f in target.get("isa", []) if isinstance(f, str)]
    if flags is not None:
        missing = sorted(set(need) - flags)
        if missing:
            raise IncompatibleBundleError(
                f"bundle kernels need CPU features this host lacks: {', '.join(missing)} (built with "
                f"-march={target.get('march', '?')}); rebuild with a -march this host supports, e.g. "
                "--march x86-64-v2")
    tv = m["torch"]
    want, have = str(tv.get("version", "")), torch.__version__
    if want.split("+")[0] != have.split("+")[0]:
        raise IncompatibleBundleError(f"bundle graph was built against torch {want}, this process has "
                                      f"torch {have}; install torch=={want.split('+')[0]} or rebuild "
                                      "the bundle with this torch")
    abi = tv.get("cxx11_abi")
    if abi is not None and bool(abi) != bool(torch._C._GLIBCXX_USE_CXX11_ABI):
        raise IncompatibleBundleError(f"bundle graph was built with _GLIBCXX_USE_CXX11_ABI={int(bool(abi))}, "
                                      f"this torch uses {int(torch._C._GLIBCXX_USE_CXX11_ABI)}; rebuild "
                                      "the bundle with this torch")


# ----------------------------------------------------------------------------- streaming


class _CappedReader(io.RawIOBase):
    """Reads from the decompressor, refusing more than ``cap`` decompressed bytes."""

    def __init__(self, raw, cap: int):
        self.raw = raw
        self.cap = cap
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n is not None and n >= 0 else _CHUNK)
        self.count += len(data)
        if self.count > self.cap:
            raise BundleIntegrityError(
                f"bundle decompresses to more than {self.cap} bytes, more than its manifest declares "
                f"(or the {MAX_BYTES_ENV} cap); refusing to extract it (possible decompression bomb)")
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


@dataclass
class Extracted:
    """A verified bundle in the cache."""

    path: Path               # the .ascpack file
    directory: Path          # <cache>/<bundle_sha256>
    manifest: dict
    bundle_sha256: str
    extracted: bool          # False when an earlier extraction was reused


def _open_stream(path: Path, cap: int):
    import zstandard

    f = open(path, "rb")
    try:
        magic = f.read(4)
        if magic != ZSTD_MAGIC:
            raise BundleFormatError(f"{path} is not a zstd-compressed .ascpack bundle (it starts with "
                                    f"{magic!r}); pass a file written by `ascendc-pack build`")
        f.seek(0)
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=_CHUNK, closefd=False)
        capped = _CappedReader(reader, cap)
        tar = tarfile.open(fileobj=capped, mode="r|")
    except BaseException:
        f.close()
        raise
    return f, capped, tar


def _stream_errors():
    import zstandard

    return (tarfile.TarError, EOFError, zstandard.ZstdError)


def _read_manifest_member(tar: tarfile.TarFile, path: Path) -> dict:
    first = tar.next()
    if first is None:
        raise BundleFormatError(f"{path} is an empty archive; pass a bundle written by ascendc-pack")
    if first.name != MANIFEST_NAME:
        raise BundleFormatError(f"{path}: the first member is {first.name!r}, expected {MANIFEST_NAME!r}; "
                                "the file is not an ascendc-pack bundle or was repacked")
    if not first.isreg():
        raise UnsafeMemberError(f"{path}: {MANIFEST_NAME} is not a regular file")
    if first.size > MAX_MANIFEST_BYTES:
        raise BundleFormatError(f"{path}: {MANIFEST_NAME} is {first.size} bytes, more than the "
                                f"{MAX_MANIFEST_BYTES} allowed; the bundle is corrupt")
    fobj = tar.extractfile(first)
    data = fobj.read() if fobj is not None else b""
    if len(data) != first.size:
        raise BundleIntegrityError(f"{path}: {MANIFEST_NAME} is truncated; the bundle file is incomplete")
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleFormatError(f"{path}: {MANIFEST_NAME} is not valid JSON ({e}); the bundle is corrupt") from None
    return validate_manifest(manifest)


def read_manifest(path: Path | str) -> dict:
    """Read and validate only the manifest of a bundle (cheap: the first member)."""
    path = _check_path(path)
    f, _, tar = _open_stream(path, MAX_MANIFEST_BYTES + (1 << 20))
    try:
        return _read_manifest_member(tar, path)
    except _stream_errors() as e:
        raise BundleIntegrityError(f"{path} is truncated or corrupt ({type(e).__name__}: {e}); "
                                   "copy the bundle again or rebuild it") from None
    finally:
        tar.close()
        f.close()


def _check_path(path: Path | str) -> Path:
    path = Path(path)
    if not path.exists():
        raise BundleNotFoundError(f"{path}: no such bundle file; pass the path of a .ascpack file")
    if not path.is_file():
        raise BundleNotFoundError(f"{path} is not a file; pass the path of a .ascpack file")
    return path


def _extract_into(path: Path, tmp: Path) -> dict:
    """Stream the bundle into ``tmp``, verifying everything; returns the manifest."""
    cap = max_bytes()
    f, capped, tar = _open_stream(path, min(cap, MAX_MANIFEST_BYTES + (1 << 20)))
    try:
        manifest = _read_manifest_member(tar, path)
        members = manifest["members"]
        declared = sum(info["size"] for info in members.values())
        if declared > cap:
            raise BundleIntegrityError(f"{path}: the manifest declares {declared} bytes of content, more "
                                       f"than the {cap}-byte cap ({MAX_BYTES_ENV}); raise the cap if "
                                       "the bundle is trusted")
        # content + tar headers and padding (pax headers included) + the end-of-archive records
        capped.cap = capped.count + declared + 4096 * (len(members) + 2) + (1 << 20)
        check_host(manifest)
        seen: set[str] = set()
        while (member := tar.next()) is not None:
            name = member.name
            check_member_name(name)
            if not member.isreg():
                kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
                        "a device" if member.isdev() else "a directory" if member.isdir() else
                        "a FIFO" if member.isfifo() else "not a regular file")
                raise UnsafeMemberError(f"{path}: member {name!r} is {kind}; bundles hold only regular "
                                        "files. Refusing to extract it; rebuild the bundle")
            if name == MANIFEST_NAME or name in seen:
                raise BundleIntegrityError(f"{path}: member {name!r} appears twice; the bundle was "
                                           "tampered with or repacked, rebuild it")
            info = members.get(name)
            if info is None:
                raise BundleIntegrityError(f"{path}: member {name!r} is not listed in {MANIFEST_NAME}; "
                                           "the bundle was tampered with or repacked, rebuild it")
            if member.size != info["size"]:
                raise BundleIntegrityError(f"{path}: member {name!r} is {member.size} bytes, the manifest "
                                           f"says {info['size']}; the bundle is corrupt, rebuild it")
            seen.add(name)
            dest = tmp / name
            h = hashlib.sha256()
            src = tar.extractfile(member)
            written = 0
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                out = open(dest, "xb")
            except OSError as e:
                raise BundleIntegrityError(f"{path}: member {name!r} cannot be created next to the other "
                                           f"members ({e}); the bundle is corrupt, rebuild it") from None
            with out:
                while True:
                    chunk = src.read(min(_CHUNK, member.size - written)) if written < member.size else b""
                    if not chunk:
                        break
                    h.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
            if written != member.size:
                raise BundleIntegrityError(f"{path}: member {name!r} is truncated ({written} of "
                                           f"{member.size} bytes); the bundle file is incomplete")
            if h.hexdigest() != info["sha256"]:
                raise BundleIntegrityError(f"{path}: member {name!r} has sha256 {h.hexdigest()}, the "
                                           f"manifest says {info['sha256']}; the bundle is corrupt or was "
                                           "modified, copy it again or rebuild it")
            os.chmod(dest, 0o755 if name.endswith(".so") else 0o644)
        missing = sorted(set(members) - seen)
        if missing:
            raise BundleIntegrityError(f"{path}: member(s) {', '.join(missing)} listed in {MANIFEST_NAME} "
                                       "are missing; the bundle file is truncated or incomplete")
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        return manifest
    except _stream_errors() as e:
        raise BundleIntegrityError(f"{path} is truncated or corrupt ({type(e).__name__}: {e}); copy the "
                                   "bundle again or rebuild it") from None
    finally:
        tar.close()
        f.close()


def _reusable(directory: Path, expect_sha: str, verify: str) -> dict | None:
    """The manifest of a complete earlier extraction, or None."""
    try:
        manifest = validate_manifest(json.loads((directory / MANIFEST_NAME).read_text()))
    except (OSError, ValueError, BundleFormatError, UnsafeMemberError):
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


def open_bundle(path: Path | str, cache_dir: Path | str | None = None, verify: str = "sizes") -> Extracted:
    """Verify ``path`` and extract it under ``<cache_dir>/<sha256 of the file>/`` (atomic).

    ``verify`` controls what an earlier extraction must pass to be reused: ``"sizes"`` (every
    member present with its size; hashes were checked when it was extracted) or ``"full"``
    (rehash every member). Raises a :class:`~ascendc_pack_runtime.errors.BundleError` subclass.
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
        # incomplete or modified: move it out of the way (another process may be doing the same)
        trash = cache / f".trash-{bundle_sha[:16]}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            pass
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"cannot create the runtime cache directory {cache}: {e}. Set {CACHE_ENV} "
                          "to a writable directory") from None
    tmp = cache / f".tmp-{bundle_sha[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        manifest = _extract_into(path, tmp)
        try:
            os.rename(tmp, target)
            extracted = True
        except OSError:
            # another process finished first: use its (identical) tree
            if _reusable(target, bundle_sha, "sizes") is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            extracted = False
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Extracted(path, target, manifest, bundle_sha, extracted)


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_NAME", "GRAPH_LIBRARY", "GRAPH_SOURCE",
           "WEIGHTS_FILE", "TUNING_FILE", "WEIGHT_ALIGNMENT", "check_member_name", "validate_manifest",
           "check_host", "read_manifest", "open_bundle", "Extracted", "default_cache_dir", "sha256_file"]
