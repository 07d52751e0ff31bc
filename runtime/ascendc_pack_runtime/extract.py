"""Extraction of a verified bundle into the runtime cache (content-addressed, atomic, bound).

:func:`open_bundle` writes the members into a private temporary directory of the cache while
:func:`~ascendc_pack_runtime.archive.scan` verifies them, and renames the verified tree to
``<cache>/<sha256 of the bundle file>/``. An exclusive lock on the cache makes many processes
opening the same bundle extract it once; leftovers of a killed extraction are never trusted and
are removed by the next extraction.

What the cache may be trusted with (docs/FORMAT.md, "The extraction"): the bundle file is the
authority, not the cache. A reuse reads the manifest again *from the bundle* (cheap: the first
member), requires the marker to name the bundle's sha256 and that manifest's sha256, requires the
cache's ``manifest.json`` to be those very bytes and its ``manifest.sig`` the bundle's (absent
when the bundle is unsigned), and checks every member against the bundle's manifest: sizes, the
sha256 of every library always, and the sha256 of *every* member (weights included) with
``verify="full"`` **or a trust policy** — under a policy nothing is used that was not hashed
against the signed manifest in this load. Anything else is re-extracted. The cache and
everything in it must pass the cache rules (:mod:`.cache_rules`: private, no symlinks, every
level up to ``/`` checked); directories are created 0700 whatever the umask. Every library is
hashed once more right before it is loaded (:func:`check_libraries`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

from .archive import Head, check_path, corrupt, read_head, scan, sha256_file
from .cache_rules import (CACHE_FIX, check_cache_dir, check_entry, check_member, read_private,
                          sha256_private)
from .constants import (CACHE_ENV, FREE_SPACE_MARGIN, MANIFEST_NAME, MARKER_FORMAT, MARKER_VERSION,
                        MAX_EXTRACT_DEPTH, REBUILD, SIGNATURE_NAME, VERIFIED_MARKER)
from .errors import (BundleError, BundleNotFoundError, CacheIOError, CacheSpaceError, MemberPathConflictError,
                     TamperedExtractionError, UnsafeMemberNameError)
from .host import check_host
from .manifest import Manifest
from .trust import TrustPolicy, check_signature


@dataclass
class Extracted:
    """A verified bundle in the cache.

    ``manifest`` is the manifest's JSON object as verified (for tools that print or forward
    it); ``contract`` is the same manifest typed (what the runtime reads); ``signer`` the key id
    of a signature the trust policy accepted (None without a policy)."""

    path: Path               # the .ascpack file
    directory: Path          # <cache>/<bundle_sha256>
    manifest: dict
    bundle_sha256: str
    extracted: bool          # False when an earlier extraction was reused
    contract: Manifest | None = None
    manifest_sha256: str | None = None
    signer: str | None = None


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


# ----------------------------------------------------------------------------- reuse


def _reusable(directory: Path, bundle_sha: str, head: Head, verify: str) -> bool:
    """Whether ``directory`` is a complete extraction of exactly this bundle (see the module doc).
    Damage (missing or resized members, other hashes, a missing or other ``manifest.sig``)
    answers False: the caller re-extracts. A breach of the cache rules raises InsecureCacheError."""
    try:
        marker = json.loads(read_private(directory / VERIFIED_MARKER, directory, 1 << 16))
        if not (isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT
                and marker.get("version") == MARKER_VERSION and marker.get("bundle_sha256") == bundle_sha
                and marker.get("manifest_sha256") == head.manifest_sha256):
            return False
        if read_private(directory / MANIFEST_NAME, directory, len(head.manifest_bytes)) != head.manifest_bytes:
            return False
        if head.signature is None:
            if os.path.lexists(directory / SIGNATURE_NAME):
                return False
        elif read_private(directory / SIGNATURE_NAME, directory, len(head.signature)) != head.signature:
            return False         # missing (deleted) or another signature: extracting again restores it
        m, checked_dirs = head.manifest, set()
        libraries = set(m.libraries())
        for name, info in m.members.items():
            if check_member(directory, name, checked_dirs).st_size != info.size:
                return False
            if (verify == "full" or name in libraries) and sha256_private(directory / name, directory) != info.sha256:
                return False
    except (OSError, ValueError):
        return False
    return True


def check_libraries(directory: Path, m: Manifest) -> None:
    """Right before loading: every library (graph.so, each kernel) in ``directory`` still has the
    sha256 of the verified manifest ``m`` (TamperedExtractionError otherwise; CacheIOError if
    unreadable)."""
    for name in m.libraries():
        try:
            ok = sha256_private(directory / name, directory) == m.members[name].sha256
        except OSError as e:
            raise _io_error(f"cannot read {directory / name} before loading it", e) from None
        if not ok:
            fix = "load the bundle again (its extraction is replaced), and find out who changed the cache"
            raise TamperedExtractionError(f"{directory / name} does not have the sha256 of the verified manifest "
                                          f"any more: the extraction was modified after it was verified; refusing "
                                          f"to load it: {fix}", member=name, fix=fix)


def _io_error(what: str, e: OSError) -> CacheIOError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheSpaceError(f"{what}: {e}; free space there or {CACHE_FIX}", field=CACHE_ENV,
                               fix=f"free space or {CACHE_FIX}")
    return CacheIOError(f"{what}: {e}; check the runtime cache (was it changed or deleted while loading?) or "
                        f"{CACHE_FIX}", field=CACHE_ENV, fix=f"load again or {CACHE_FIX}")


# ----------------------------------------------------------------------------- writing


class _DirectorySink:
    """Writes verified members under ``root`` (the private temporary extraction directory)."""

    def __init__(self, root: Path, path: Path):
        self.root, self.path = root, path
        self.dirs: set[Path] = set()

    def begin(self, head: Head) -> None:
        limit = os.pathconf(self.root, "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096
        base = len(os.fsencode(self.root)) + 1
        for name in head.manifest.members:
            if name.count("/") >= MAX_EXTRACT_DEPTH:
                raise UnsafeMemberNameError(f"{self.path}: member {name[:120]!r}... nests {name.count('/') + 1} "
                                            f"directories deep, more than an extraction allows ({MAX_EXTRACT_DEPTH}); "
                                            f"{REBUILD}", member=name[:256], fix=REBUILD)
            if base + len(name) >= limit:
                raise UnsafeMemberNameError(f"{self.path}: member {name[:120]!r}... cannot be extracted: its path "
                                            f"under {self.root.parent} would be {base + len(name)} bytes, this file "
                                            f"system allows {limit - 1}; {REBUILD}", member=name[:256], fix=REBUILD)
        need = head.manifest.declared_bytes + FREE_SPACE_MARGIN
        vfs = os.statvfs(self.root)
        free = vfs.f_bavail * vfs.f_frsize
        if free < need:
            raise CacheSpaceError(f"{self.path.name} needs {need} bytes in the runtime cache ({head.manifest.declared_bytes}"
                                  f" of content + {FREE_SPACE_MARGIN} spare), the file system of {self.root.parent} has "
                                  f"{free} free; nothing was written: free space there or {CACHE_FIX}",
                                  field=CACHE_ENV, fix=f"free space or {CACHE_FIX}")

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
            if e.errno == errno.ENAMETOOLONG:
                raise UnsafeMemberNameError(f"{self.path}: member {name[:120]!r}... cannot be extracted: its path "
                                            f"under {self.root.parent} is longer than this file system allows; "
                                            f"{REBUILD}", member=name[:256], fix=REBUILD) from None
            if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise MemberPathConflictError(f"{self.path}: member {name[:200]!r} cannot be created next to the "
                                              f"other members ({e.strerror}); the bundle is corrupt: {REBUILD}",
                                              member=name, fix=REBUILD) from None
            raise

    def finish(self, name: str) -> None:
        os.chmod(self.root / name, 0o700 if name.endswith(".so") else 0o600, follow_symlinks=False)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


def _raise(err: BundleError) -> None:
    raise err


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
    fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
            remove_tree(p)
    for p in cache.glob(f".trash-{prefix}-*"):
        remove_tree(p)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: Path) -> None:
    """Delete a directory tree of any depth, ignoring errors (shutil.rmtree recurses once per
    level and gives up past ~1,000; a hostile bundle can nest deeper within 4,096 characters).
    Walks with directory descriptors, so no path grows beyond PATH_MAX either."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    stack: list[tuple[int, str | None, set[str]]] = [(top, None, set())]   # (fd, name in parent, skipped)
    while stack:
        fd, _, skipped = stack[-1]
        child = None
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                if entry.name in skipped:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    child = entry.name
                    break
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
        if child is not None:
            try:
                stack.append((os.open(child, _DIR_FLAGS, dir_fd=fd), child, set()))
            except OSError:
                skipped.add(child)      # cannot enter it: leave it (never loop on it)
            continue
        _, name, _ = stack.pop()
        os.close(fd)
        if stack and name is not None:
            try:
                os.rmdir(name, dir_fd=stack[-1][0])
            except OSError:
                stack[-1][2].add(name)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(root: Path, dirs) -> None:
    for d in [root, *dirs]:
        _fsync_dir(d)


# ----------------------------------------------------------------------------- open_bundle


def open_bundle(path: Path | str, cache_dir: Path | str | None = None, verify: str = "sizes", *,
                trusted_keys: Iterable[str | os.PathLike] | None = None) -> Extracted:
    """Verify ``path`` and extract it under ``<cache_dir>/<sha256 of the file>/`` (atomic).

    ``verify`` controls what an earlier extraction must pass to be reused besides its marker,
    manifest, signature and the cache rules: ``"sizes"`` (every member's size, every library's
    sha256) or ``"full"`` (every member's sha256). ``trusted_keys`` (key texts or files; default
    ``$ASCENDC_PACK_RUNTIME_TRUSTED_KEYS``) sets a trust policy: the bundle must be signed by
    one of them, checked before anything is extracted or reused, and a reuse hashes every member
    (``"full"``, whatever ``verify`` says). Raises a
    :class:`~ascendc_pack_runtime.errors.BundleError` subclass.
    """
    if verify not in ("sizes", "full"):
        raise ValueError(f"verify must be 'sizes' or 'full', got {verify!r}")
    policy = TrustPolicy.resolve(trusted_keys)
    path = check_path(path)
    try:
        bundle_sha = sha256_file(path)
    except OSError as e:
        raise BundleNotFoundError(f"{path}: cannot read it ({e.strerror or e}); pass a readable .ascpack file",
                                  fix="pass a readable .ascpack file") from None
    head = read_head(path)
    signer = check_signature(head.manifest_bytes, head.signature, policy, str(path)) if policy else None
    if policy is not None:
        verify = "full"        # nothing unhashed is used under a policy: weights.bin included
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        return _open(path, cache, bundle_sha, head, verify, signer)
    except OSError as e:
        raise _io_error(f"cannot use the runtime cache {cache} for {path.name}", e) from None


def _open(path: Path, cache: Path, bundle_sha: str, head: Head, verify: str, signer: str | None) -> Extracted:
    target = cache / bundle_sha

    def done(extracted: bool) -> Extracted:
        return Extracted(path, target, head.manifest_json, bundle_sha, extracted, head.manifest,
                         head.manifest_sha256, signer)

    if cache.is_dir():
        check_cache_dir(cache)
        if check_entry(target) and _reusable(target, bundle_sha, head, verify):
            check_host(head.manifest)
            return done(False)
    else:
        for d in [*reversed(cache.parents), cache]:   # every missing directory private, the cache too
            if not d.is_dir():
                with contextlib.suppress(FileExistsError):
                    mkdir_private(d)
        check_cache_dir(cache)
    with _extraction_lock(cache) as held:
        if check_entry(target):
            # another process may have finished while we waited for the lock
            if _reusable(target, bundle_sha, head, verify):
                check_host(head.manifest)
                return done(False)
            # incomplete, damaged or modified: move it out of the way
            os.rename(target, cache / f".trash-{bundle_sha[:16]}-{uuid.uuid4().hex[:8]}")
        _remove_leftovers(cache, bundle_sha, held)
        tmp = cache / f".tmp-{bundle_sha[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        mkdir_private(tmp)
        try:
            extracted = _extract_into(tmp, target, path, bundle_sha, head, verify)
            _fsync_dir(cache)
        except BaseException:
            remove_tree(tmp)
            raise
    return done(extracted)


def _extract_into(tmp: Path, target: Path, path: Path, bundle_sha: str, head: Head, verify: str) -> bool:
    """Scan the bundle into ``tmp``, complete it and rename it to ``target``; whether this call
    made ``target`` (False: another process, without a working lock, finished first)."""
    def same_head(scanned: Head) -> None:
        if scanned.manifest_bytes != head.manifest_bytes or scanned.signature != head.signature:
            raise corrupt(path, "the file changed while it was being verified")

    sink = _DirectorySink(tmp, path)
    result = scan(path, sink, _raise, same_head)
    if result.bundle_sha256 != bundle_sha:
        raise corrupt(path, "the file changed while it was being verified")
    check_host(head.manifest)
    _write_private(tmp / MANIFEST_NAME, head.manifest_bytes)
    if head.signature is not None:
        _write_private(tmp / SIGNATURE_NAME, head.signature)
    _write_private(tmp / VERIFIED_MARKER, (json.dumps(
        {"format": MARKER_FORMAT, "version": MARKER_VERSION, "bundle_sha256": bundle_sha,
         "manifest_sha256": head.manifest_sha256, "bundle_name": path.name, "verified_at": time.time()}) + "\n").encode())
    _fsync_tree(tmp, sink.dirs)
    try:
        os.rename(tmp, target)
        return True
    except OSError:
        if not check_entry(target) or not _reusable(target, bundle_sha, head, verify):
            raise
        remove_tree(tmp)
        return False


__all__ = ["Extracted", "open_bundle", "default_cache_dir", "check_cache_dir", "check_libraries", "mkdir_private"]
