"""Typed reading of manifest JSON: the parser and the field reader behind every ``from_json``.

:func:`loads` parses manifest bytes (duplicate keys, oversized integers and non-finite numbers
become typed refusals naming the field); :class:`Fields` reads one JSON object's fields with
their types and bounds, raising a :class:`~ascendc_pack_runtime.errors.ManifestFieldError` that
names the field path (``kernels[0].candidates[1].median_us``) and the fix.
"""

from __future__ import annotations

import json
import math
import re
from typing import Callable

from .constants import MANIFEST_NAME, MAX_DIM, MAX_INT_DIGITS, MAX_NDIM, REBUILD
from .errors import ManifestFieldError, ManifestJSONError
from .tensor_meta import DTYPES

MAX_COUNT = 1 << 31
"""Bound on counts and indices (cores, topn, candidate indices, graph ABI)."""


def field_error(field_name: str, problem: str, fix: str = REBUILD) -> ManifestFieldError:
    """The error for one bad manifest field (``field_name`` is its path, e.g. ``inputs[0].dtype``)."""
    return ManifestFieldError(f"{MANIFEST_NAME}: field {field_name!r} {problem}; the bundle is corrupt or "
                              f"from another tool: {fix}", field=field_name, fix=fix)


# ----------------------------------------------------------------------------- JSON in


class _BigInt:
    """An integer literal too long for any field (stands in for it so the field is named)."""

    def __init__(self, digits: str):
        self.digits = len(digits)

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


class _NonFinite:
    """``NaN`` / ``Infinity`` / ``-Infinity`` (not JSON; refused wherever a field is read)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _parse_int(text: str):
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else _BigInt(text)


def unique_keys(pairs: list) -> dict:
    """``object_pairs_hook`` of ``json.loads`` that refuses a duplicate key (ValueError), as the
    C++ reader does: both always read the same value."""
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k[:60]!r} in an object")
        d[k] = v
    return d


def loads(data: bytes, where: str = MANIFEST_NAME) -> dict:
    """Parse manifest bytes (UTF-8 JSON object); ManifestJSONError names what is wrong.

    Oversized integers and non-finite numbers are parsed as placeholders that the field checks
    refuse with the field's name (a 5,000-digit number is a field error, not corruption). A
    duplicate key is refused (the C++ reader refuses it too: both always read the same value)."""
    try:
        value = json.loads(data.decode("utf-8"), parse_int=_parse_int, parse_constant=_NonFinite,
                           object_pairs_hook=unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ManifestJSONError(f"{where} is not valid JSON ({str(e)[:200]}); the bundle is corrupt: {REBUILD}",
                                member=MANIFEST_NAME, fix=REBUILD) from None
    if not isinstance(value, dict):
        raise ManifestJSONError(f"{where} is not a JSON object; the bundle is corrupt: {REBUILD}",
                                member=MANIFEST_NAME, fix=REBUILD)
    return value


# ----------------------------------------------------------------------------- field reading


def show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(v: object) -> bool:
    return type(v) is int


class Fields:
    """Typed reads of the JSON object at field path ``where`` (each raises a field error)."""

    __slots__ = ("d", "where")

    def __init__(self, d: object, where: str):
        if not isinstance(d, dict):
            raise field_error(where, f"is {show(d)}, not a JSON object")
        self.d, self.where = d, where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, ok: Callable[[object], bool], what: str, *, optional: bool = False):
        if key not in self.d or (optional and self.d[key] is None):
            if optional:
                return None
            raise field_error(self.path(key), "is missing")
        v = self.d[key]
        if not ok(v):
            raise field_error(self.path(key), f"is {show(v)}, not {what}")
        return v

    def str(self, key: str, *, pattern: re.Pattern | None = None, nonempty: bool = False,
            what: str = "a string") -> str:
        return self.get(key, lambda v: isinstance(v, str) and (not nonempty or bool(v))
                        and (pattern is None or bool(pattern.fullmatch(v))), what)

    def int(self, key: str, lo: int = 0, hi: int = MAX_COUNT, *, optional: bool = False,
            nullable: bool = False) -> int | None:
        """An integer in [lo, hi); ``nullable``: or null (the key must be there); ``optional``: the
        key may also be absent."""
        return self.get(key, lambda v: (nullable and v is None) or (is_int(v) and lo <= v < hi),
                        f"an integer in [{lo}, {hi})" + (" or null" if nullable else ""), optional=optional)

    def bool(self, key: str, *, nullable: bool = False) -> bool | None:
        return self.get(key, lambda v: isinstance(v, bool) or (nullable and v is None),
                        "true, false or null" if nullable else "true or false")

    def number(self, key: str) -> float | None:
        """A finite non-negative number or null."""
        return self.get(key, lambda v: v is None or (type(v) in (int, float) and math.isfinite(v) and v >= 0),
                        "a finite non-negative number or null")

    def list(self, key: str) -> list[tuple[object, str]]:
        """(item, its field path) per element of a list field."""
        items = self.get(key, lambda v: isinstance(v, list), "a list")
        return [(v, f"{self.path(key)}[{i}]") for i, v in enumerate(items)]

    def strs(self, key: str) -> tuple[str, ...]:
        items = self.list(key)
        for v, where in items:
            if not isinstance(v, str):
                raise field_error(where, f"is {show(v)}, not a string")
        return tuple(v for v, _ in items)

    def dims(self, key: str, *, length: int | None = None, optional: bool = False) -> tuple[int, ...] | None:
        """A shape or stride: at most MAX_NDIM integers in [0, MAX_DIM), ``length`` of them."""
        if optional and self.d.get(key) is None:
            return None
        items = self.list(key)
        if len(items) > MAX_NDIM:
            raise field_error(self.path(key), f"has {len(items)} dimensions, more than {MAX_NDIM}")
        if length is not None and len(items) != length:
            raise field_error(self.path(key), f"has {len(items)} entries, not one per dimension ({length})")
        for v, where in items:
            if not (is_int(v) and 0 <= v < MAX_DIM):
                raise field_error(where, f"is {show(v)}, not an integer in [0, 2**48)")
        return tuple(v for v, _ in items)

    def dtype(self, key: str) -> str:
        return self.get(key, lambda v: isinstance(v, str) and v in DTYPES,
                        f"a dtype this runtime knows ({', '.join(sorted(DTYPES))})")

    def obj(self, key: str) -> Fields:
        if key not in self.d:
            raise field_error(self.path(key), "is missing")
        return Fields(self.d[key], self.path(key))



__all__ = ["loads", "unique_keys", "field_error", "Fields", "is_int", "show", "MAX_COUNT"]
