"""The on-disk kernel cache (docs/DESIGN.md §3.3): layout, atomic writes, the per-kernel lock, hashing.

Layout of one fused kernel (``root`` is ``BuildConfig.kernel_cache_root``, i.e.
``<cache>/ascendc``)::

    <root>/<kernel_name>/<artifact_hash>/
        compile.lock                          filelock, shared by compile and autotune
        optimize_tiling                       "tiling_repr|workspace|block_dim" of the winner
        tuning.json                           every candidate's samples, protocol, host
        static_kernel/<kernel_key>/kernel.cpp the candidate's source
        static_kernel/<kernel_key>/kernel.so  the candidate's static kernel library
        static_kernel/<kernel_key>/compile_error.txt   only when the compile failed

Every file is written atomically (temp file in the same directory, then ``os.replace``) while
holding ``compile.lock``, so readers never see a partial file and concurrent builds of the same
model neither corrupt nor duplicate work.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import filelock

from ascendc_pack.errors import PackError

LOCK_TIMEOUT_S = 600.0
"""How long to wait for another process holding a kernel's ``compile.lock``."""

_SAFE_COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class LockTimeoutError(PackError):
    """Another process held a kernel's ``compile.lock`` for longer than the timeout."""


# ----------------------------------------------------------------------------- atomic writes


def atomic_write_bytes(path: Path | str, data: bytes, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically: a temp file in the same directory, then
    ``os.replace``. Creates the parent directory. ``fsync`` also flushes the data to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path | str, text: str, fsync: bool = False, encoding: str = "utf-8") -> Path:
    """Text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def temp_path_for(path: Path) -> Path:
    """A unique temporary name next to ``path`` (same directory, so ``os.replace`` is atomic)."""
    return path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"


# ----------------------------------------------------------------------------- hashing


def stable_hash(*parts: str | bytes | int | None) -> str:
    """sha256 hex of ``parts``. Each part is type-tagged and length-prefixed, so
    ``("ab", "c")`` and ``("a", "bc")`` differ (unlike torch_npu's separator-less join)."""
    h = hashlib.sha256()
    for part in parts:
        if part is None:
            tag, data = b"n", b""
        elif isinstance(part, bytes):
            tag, data = b"b", part
        elif isinstance(part, str):
            tag, data = b"s", part.encode("utf-8")
        elif isinstance(part, int) and not isinstance(part, bool):
            tag, data = b"i", str(part).encode()
        else:
            raise TypeError(f"stable_hash takes str, bytes, int or None parts, got {type(part).__name__}")
        h.update(tag + str(len(data)).encode() + b":" + data + b"\x00")
    return h.hexdigest()


# ----------------------------------------------------------------------------- lock


class KernelLock(filelock.FileLock):
    """A ``filelock.FileLock`` whose timeout raises :class:`LockTimeoutError` with a clear message."""

    def acquire(self, *args, **kwargs):
        try:
            return super().acquire(*args, **kwargs)
        except filelock.Timeout:
            raise LockTimeoutError(
                f"timed out after {self.timeout:g} s waiting for {self.lock_file}: another build "
                "of the same kernel holds it. Wait for that build to finish, or, if no other "
                "ascendc-pack process is running, delete the lock file and retry") from None


def kernel_lock(kernel_dir: Path | str, timeout: float = LOCK_TIMEOUT_S) -> KernelLock:
    """The per-kernel ``compile.lock`` in ``kernel_dir`` (created if missing), as a context
    manager. Waiting longer than ``timeout`` seconds raises :class:`LockTimeoutError`."""
    kernel_dir = Path(kernel_dir)
    try:
        kernel_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PackError(f"cannot create kernel cache directory {kernel_dir}: {e}. Set "
                        "TORCHINDUCTOR_CACHE_DIR or --cache-dir to a writable directory") from e
    return KernelLock(str(kernel_dir / "compile.lock"), timeout=timeout)


# ----------------------------------------------------------------------------- layout


def check_component(value: str, what: str) -> str:
    """Return ``value`` if it is safe as one path component (``[A-Za-z0-9_.-]``, no leading
    dot), else raise ValueError."""
    if not isinstance(value, str) or not _SAFE_COMPONENT_RE.fullmatch(value):
        raise ValueError(f"{what} must be 1-200 characters of [A-Za-z0-9_.-] not starting with "
                         f"'.' or '-', got {value!r}")
    return value


@dataclass(frozen=True)
class KernelDir:
    """The cache directory of one fused kernel: ``<root>/<kernel_name>/<artifact_hash>/``.

    ``root`` is the kernel cache root (``BuildConfig.kernel_cache_root``)."""

    root: Path
    kernel_name: str
    artifact_hash: str

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))
        check_component(self.kernel_name, "kernel_name")
        check_component(self.artifact_hash, "artifact_hash")

    @property
    def path(self) -> Path:
        """``<root>/<kernel_name>/<artifact_hash>``."""
        return self.root / self.kernel_name / self.artifact_hash

    @property
    def lock_path(self) -> Path:
        return self.path / "compile.lock"

    @property
    def optimize_tiling(self) -> Path:
        return self.path / "optimize_tiling"

    @property
    def tuning_json(self) -> Path:
        return self.path / "tuning.json"

    @property
    def static_kernel_dir(self) -> Path:
        return self.path / "static_kernel"

    def candidate_dir(self, kernel_key: str) -> Path:
        """``static_kernel/<kernel_key>``: everything about one candidate."""
        return self.static_kernel_dir / check_component(kernel_key, "kernel_key")

    def kernel_so(self, kernel_key: str) -> Path:
        return self.candidate_dir(kernel_key) / "kernel.so"

    def kernel_cpp(self, kernel_key: str) -> Path:
        return self.candidate_dir(kernel_key) / "kernel.cpp"

    def compile_error(self, kernel_key: str) -> Path:
        return self.candidate_dir(kernel_key) / "compile_error.txt"

    def lock(self, timeout: float = LOCK_TIMEOUT_S) -> KernelLock:
        """This kernel's ``compile.lock`` (see :func:`kernel_lock`)."""
        return kernel_lock(self.path, timeout=timeout)
