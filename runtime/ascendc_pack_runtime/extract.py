"""Extraction of a verified bundle into the runtime cache (content-addressed, atomic).

:func:`open_bundle` writes the members into a temporary directory of the cache while
:func:`~ascendc_pack_runtime.archive.scan` verifies them, and renames the verified tree to
``<cache>/<sha256 of the bundle file>/``. An exclusive lock on the cache makes many processes
opening the same bundle extract it once; leftovers of a killed extraction are never trusted
(only a renamed, complete directory carrying the verified marker is) and are removed by the
next extraction.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from . import manifest as contract
from .archive import Head, check_path, corrupt, scan, sha256_file
from .constants import CACHE_ENV, MANIFEST_NAME, MARKER_FORMAT, MARKER_VERSION, REBUILD, VERIFIED_MARKER
from .errors import BundleError, MemberPathConflictError
from .host import check_host
from .manifest import Manifest


@dataclass
class Extracted:
    """A verified bundle in the cache.

    ``manifest`` is the manifest's JSON object as verified (for tools that print or forward
    it); ``contract`` is the same manifest typed (what the runtime reads)."""

    path: Path               # the .ascpack file
    directory: Path          # <cache>/<bundle_sha256>
    manifest: dict
    bundle_sha256: str
    extracted: bool          # False when an earlier extraction was reused
    contract: Manifest | None = None


def default_cache_dir() -> Path:
    """``$ASCENDC_PACK_RUNTIME_CACHE``, else ``$XDG_CACHE_HOME/ascendc_pack_runtime``, else
    ``~/.cache/ascendc_pack_runtime``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(os.path.expanduser(env))
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ascendc_pack_runtime"


def mkdir_private(path: Path) -> None:
    """Create directory ``path`` readable and writable by this user only (0700), whatever the
    umask (``mkdir`` applies the umask; the ``chmod`` after it does not)."""
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)


class _DirectorySink:
    """Writes verified members under ``root`` (the temporary extraction directory)."""

    def __init__(self, root: Path, path: Path):
        self.root, self.path = root, path
        self.dirs: set[Path] = set()

    def begin(self, head: Head) -> None:
        pass

    def create(self, name: str) -> BinaryIO:
        try:
            parent = self.root
            for part in name.split("/")[:-1]:
                parent = parent / part
                if parent not in self.dirs:
                    mkdir_private(parent)
                    self.dirs.add(parent)
            fd = os.open(self.root / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.fchmod(fd, 0o600)
            return os.fdopen(fd, "wb")
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
                raise
            raise MemberPathConflictError(f"{self.path}: member {name!r} cannot be created next to the other "
                                          f"members ({e}); the bundle is corrupt: {REBUILD}",
                                          member=name, fix=REBUILD) from None

    def finish(self, name: str) -> None:
        os.chmod(self.root / name, 0o700 if name.endswith(".so") else 0o600, follow_symlinks=False)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


def _raise(err: BundleError) -> None:
    raise err


def _reusable(directory: Path, expect_sha: str, verify: str) -> Head | None:
    """The head of a complete, verified earlier extraction, or None."""
    try:
        marker = json.loads((directory / VERIFIED_MARKER).read_text())
        if not isinstance(marker, dict) or marker.get("bundle_sha256") != expect_sha:
            return None
        data = (directory / MANIFEST_NAME).read_bytes()
        raw = contract.loads(data)
        head = Head(data, raw, Manifest.from_json(raw))
    except (OSError, ValueError, BundleError):
        return None
    for name, info in head.manifest.members.items():
        p = directory / name
        try:
            if p.is_symlink() or not p.is_file() or p.stat().st_size != info.size:
                return None
        except OSError:
            return None
        if verify == "full" and sha256_file(p) != info.sha256:
            return None
    return head


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


def _extracted(path: Path, directory: Path, head: Head, bundle_sha: str, extracted: bool) -> Extracted:
    return Extracted(path, directory, head.manifest_json, bundle_sha, extracted, head.manifest)


def open_bundle(path: Path | str, cache_dir: Path | str | None = None, verify: str = "sizes") -> Extracted:
    """Verify ``path`` and extract it under ``<cache_dir>/<sha256 of the file>/`` (atomic).

    ``verify`` controls what an earlier extraction must pass to be reused: ``"sizes"`` (its
    verified marker, every member present with its size; hashes were checked when it was
    extracted) or ``"full"`` (rehash every member). Raises a
    :class:`~ascendc_pack_runtime.errors.BundleError` subclass.
    """
    if verify not in ("sizes", "full"):
        raise ValueError(f"verify must be 'sizes' or 'full', got {verify!r}")
    path = check_path(path)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bundle_sha = sha256_file(path)
    target = cache / bundle_sha
    if target.is_dir():
        head = _reusable(target, bundle_sha, verify)
        if head is not None:
            check_host(head.manifest)
            return _extracted(path, target, head, bundle_sha, False)
    try:
        if not cache.is_dir():
            cache.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                mkdir_private(cache)
    except OSError as e:
        raise BundleError(f"cannot create the runtime cache directory {cache}: {e}; set {CACHE_ENV} "
                          "to a writable directory", field=CACHE_ENV, fix=f"set {CACHE_ENV}") from None
    with _extraction_lock(cache) as held:
        if target.is_dir():
            # another process may have finished while we waited for the lock
            head = _reusable(target, bundle_sha, verify)
            if head is not None:
                check_host(head.manifest)
                return _extracted(path, target, head, bundle_sha, False)
            # incomplete, damaged or modified: move it out of the way
            trash = cache / f".trash-{bundle_sha[:16]}-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(OSError):
                os.rename(target, trash)
        _remove_leftovers(cache, bundle_sha, held)
        tmp = cache / f".tmp-{bundle_sha[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            mkdir_private(tmp)
        except OSError as e:
            raise BundleError(f"cannot write into the runtime cache directory {cache}: {e}; set {CACHE_ENV} "
                              "to a writable directory", field=CACHE_ENV, fix=f"set {CACHE_ENV}") from None
        try:
            try:
                result = scan(path, _DirectorySink(tmp, path), _raise)
            except OSError as e:   # disk full, quota, ...: the environment, not the bundle
                raise BundleError(f"cannot extract {path.name} into {cache}: {e}; free space there or set "
                                  f"{CACHE_ENV} to another directory", field=CACHE_ENV,
                                  fix=f"free space or set {CACHE_ENV}") from None
            if result.bundle_sha256 != bundle_sha:
                raise corrupt(path, "the file changed while it was being verified")
            head = result.head
            check_host(head.manifest)
            _write_private(tmp / MANIFEST_NAME, head.manifest_bytes)
            _write_private(tmp / VERIFIED_MARKER, (json.dumps(
                {"format": MARKER_FORMAT, "version": MARKER_VERSION, "bundle_sha256": bundle_sha,
                 "manifest_sha256": head.manifest_sha256, "bundle_name": path.name,
                 "verified_at": time.time()}) + "\n").encode())
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
    return _extracted(path, target, head, bundle_sha, extracted)


__all__ = ["Extracted", "open_bundle", "default_cache_dir"]
