"""The cache rules: what the runtime cache and an extraction in it must be before anything in
them is reused or loaded (docs/FORMAT.md, "The cache rules"). The C++ API applies the same rules
to the directory it is given (``runtime/include/ascendc_pack/rt/extraction.hpp``).

*Private* below means: owned by this user or root, and not writable by group or other.

1. **The way to the cache.** The cache path is resolved one component at a time, as the kernel
   does: every directory looked up on the way is owned by this user or root and is not writable
   by group/other unless it is sticky (like ``/tmp``: others cannot rename what is not theirs);
   every symbolic link followed is owned by this user or root. A symlinked cache
   (``ASCENDC_PACK_RUNTIME_CACHE=/link``) is therefore accepted, by Python and C++ alike, when
   the link and every directory on both sides of it pass.
2. **The cache root** (where the walk ends) is a private directory.
3. **An extraction** ``<cache>/<sha256 of the bundle>`` is a private real directory (a symlink
   in its place is refused).
4. **Everything in it the runtime reads** (every member, ``manifest.json``, ``manifest.sig``,
   the marker) is a private regular file reached through private real directories, never a
   symlink. ``kernels/`` 0770, ``weights.bin`` 0666 or ``kernel.so`` 0777 are refused
   (:class:`~ascendc_pack_runtime.errors.InsecureCacheError`, naming the path and the fix).

A refusal names the path and the fix; nothing is changed in the cache to "repair" it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from .constants import CACHE_ENV
from .errors import InsecureCacheError

CACHE_FIX = f"set {CACHE_ENV} to a private directory of your own"
MAX_SYMLINKS = 40
"""Symbolic links followed while resolving the cache path (Linux's limit): ELOOP beyond."""


def insecure(path: Path | str, problem: str, fix: str = CACHE_FIX) -> InsecureCacheError:
    """The refusal of ``path`` for ``problem``."""
    return InsecureCacheError(f"the runtime cache is not safe: {path} {problem}; someone else could swap the code "
                              f"or weights that are about to be used: {fix}", field=CACHE_ENV, fix=fix)


def _owned(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def check_private(path: Path | str, st: os.stat_result, fix: str | None = None) -> None:
    """``path`` (its ``st``) is this user's or root's and not writable by group/other."""
    if not _owned(st):
        raise insecure(path, f"belongs to another user (uid {st.st_uid})", fix or CACHE_FIX)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise insecure(path, f"can be written by group or other users (mode {stat.S_IMODE(st.st_mode):o})",
                       f"run `chmod go-w {path}` or {fix or CACHE_FIX}")


def _check_above(path: str, st: os.stat_result) -> None:
    if not _owned(st):
        raise insecure(path, f"(a directory on the way to the cache) belongs to another user (uid {st.st_uid}), who "
                             "could rename the cache", f"put the cache under directories of your own or root's: "
                                                       f"{CACHE_FIX}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise insecure(path, "(a directory above the cache) can be written by group or other users and is not "
                             "sticky: they could rename the cache")


def check_cache_dir(cache: Path | str) -> str:
    """Apply rules 1 and 2 to ``cache`` (which exists); returns its real path. OSError when a
    component is missing or links loop."""
    path = os.fspath(cache)
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    todo = [c for c in reversed(path.split("/")) if c]
    cur, checked, links = "/", set(), 0
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            cur = os.path.dirname(cur)   # cur is a real directory: its parent was looked up on the way
            continue
        if cur not in checked:
            _check_above(cur, os.stat(cur))
            checked.add(cur)
        nxt = os.path.join(cur, part)
        st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            if not _owned(st):
                raise insecure(nxt, f"(a symbolic link on the way to the cache) belongs to another user "
                                    f"(uid {st.st_uid}), who could point it elsewhere")
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            target = os.readlink(nxt)
            todo.extend(c for c in reversed(target.split("/")) if c)
            if target.startswith("/"):
                cur = "/"
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), nxt)
        cur = nxt
    st = os.stat(cur)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), cur)
    check_private(cache, st)
    return cur


def _again(directory: Path) -> str:
    return f"delete {directory} (the runtime extracts the bundle again)"


def check_entry(directory: Path) -> bool:
    """Rule 3: whether the extraction ``directory`` exists (a private real directory); refuses a
    symlink, a non-directory or a foreign/writable directory in its place."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise insecure(directory, "is a symbolic link (extractions are real directories)", _again(directory))
    if not stat.S_ISDIR(st.st_mode):
        raise insecure(directory, "is not a directory", _again(directory))
    check_private(directory, st, _again(directory))
    return True


def _inside_fix(directory: Path) -> str:
    return f"run `chmod -R go-w {directory}` if you changed it yourself, else {_again(directory)}"


def check_member(directory: Path, name: str, checked_dirs: set[str]) -> os.stat_result:
    """Rule 4 for ``name`` (``/``-separated) inside ``directory``: lstat of a private regular file
    reached through private real directories (each checked once per ``checked_dirs``).
    InsecureCacheError when it breaks the rule; FileNotFoundError when it is missing."""
    parts = name.split("/")
    for k in range(1, len(parts)):
        sub = "/".join(parts[:k])
        if sub in checked_dirs:
            continue
        st = os.lstat(directory / sub)
        if not stat.S_ISDIR(st.st_mode):
            raise insecure(directory / sub, "is a symbolic link or not a directory inside an extraction",
                           _again(directory))
        check_private(directory / sub, st, _inside_fix(directory))
        checked_dirs.add(sub)
    st = os.lstat(directory / name)
    if not stat.S_ISREG(st.st_mode):
        raise insecure(directory / name, "is a symbolic link or not a regular file inside an extraction",
                       _again(directory))
    check_private(directory / name, st, _inside_fix(directory))
    return st


def open_private(path: Path, directory: Path) -> int:
    """A descriptor of ``path`` (a file of the extraction ``directory``), opened without
    following a symlink and checked by rule 4 on the descriptor itself."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise insecure(path, "is not a regular file inside an extraction", _again(directory))
        check_private(path, st, _inside_fix(directory))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path, directory: Path, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path`` (see :func:`open_private`)."""
    with os.fdopen(open_private(path, directory), "rb") as f:
        return f.read(limit + 1)


def sha256_private(path: Path, directory: Path) -> str:
    """The sha256 of ``path`` (see :func:`open_private`)."""
    h = hashlib.sha256()
    with os.fdopen(open_private(path, directory), "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["CACHE_FIX", "insecure", "check_private", "check_cache_dir", "check_entry", "check_member",
           "open_private", "read_private", "sha256_private"]
