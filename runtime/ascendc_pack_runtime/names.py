"""Member names of a bundle: what is safe to extract, and which names collide as paths."""

from __future__ import annotations

import bisect
import re

from .constants import MAX_COMPONENT_CHARS, MAX_NAME_CHARS, REBUILD
from .errors import UnsafeMemberNameError

_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,%d}" % (MAX_COMPONENT_CHARS - 1)
_COMPONENT_RE = re.compile(_COMPONENT)
_NAME_RE = re.compile(f"{_COMPONENT}(?:/{_COMPONENT})*")
"""A whole safe name in one linear regex pass (no per-component Python loop)."""


def check_member_name(name: object) -> str:
    """Return ``name`` if it is a safe relative member path, else raise UnsafeMemberNameError.

    Safe: ``/``-separated components of ``[A-Za-z0-9_.+-]`` not starting with ``.`` or ``-``
    (so no absolute paths, no ``..``, no hidden files, no backslashes), at most 4096 characters."""
    if not isinstance(name, str) or not name:
        raise UnsafeMemberNameError(f"bundle member name {name!r} is empty or not text; the bundle is "
                                    f"corrupt or was not written by ascendc-pack: {REBUILD}",
                                    member=str(name), fix=REBUILD)
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise UnsafeMemberNameError(f"bundle member {name[:200]!r} has an absolute or non-POSIX path; refusing "
                                    f"to extract it: {REBUILD}", member=name[:256], fix=REBUILD)
    if len(name) > MAX_NAME_CHARS:
        raise UnsafeMemberNameError(f"bundle member name {name[:64]!r}... is {len(name)} characters long; "
                                    f"refusing it: {REBUILD}", member=name[:256], fix=REBUILD)
    if _NAME_RE.fullmatch(name):
        return name
    for part in name.split("/"):
        if not _COMPONENT_RE.fullmatch(part):
            raise UnsafeMemberNameError(f"bundle member {name[:200]!r} has an unsafe path component {part[:64]!r} "
                                        "(empty, '.', '..', hidden or unusual characters); refusing to "
                                        f"extract it: {REBUILD}", member=name[:256], fix=REBUILD)
    return name


def path_conflicts(names) -> tuple[str, str] | None:
    """A pair (file, member inside it) when one name is a directory prefix of another, else None.

    Sorted names put every name starting with ``f + "/"`` in one run beginning at the first name
    >= ``f + "/"``, so one binary search per name suffices: O(n log n) comparisons (a quadratic
    walk over prefixes took minutes on 3,900 names of 2,048 components)."""
    ordered = sorted(names)
    for f in ordered:
        probe = f + "/"
        i = bisect.bisect_left(ordered, probe)
        if i < len(ordered) and ordered[i].startswith(probe):
            return f, ordered[i]
    return None


__all__ = ["check_member_name", "path_conflicts"]
