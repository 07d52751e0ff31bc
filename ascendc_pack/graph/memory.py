"""Memory plan of the C++ graph: buffer lifetimes and placements, as values.

Every tensor a step produces into memory the graph controls is a buffer with a static layout.
Its lifetime is ``[first, last]`` in a linear order of the steps (cond branches laid out one
after the other; a buffer is live until the last read of any value whose memory it may be).
Buffers reachable from a model output are allocated fresh on every call (the caller owns its
results); all others live in one arena allocated at load, placed greedily by size so buffers
whose lifetimes do not overlap share memory.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

ARENA_ALIGN = 64


class Storage(enum.Enum):
    """Where a buffer's memory comes from."""

    ARENA = "arena"   # a fixed range of the arena, reused by every call
    FRESH = "fresh"   # allocated on every call (results the caller keeps)


@dataclass(frozen=True)
class Lifetime:
    """First and last step index (inclusive) at which a buffer must hold its value."""

    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Placement:
    """Where one buffer lives: ``offset`` is its byte offset in the arena (ARENA only)."""

    storage: Storage
    offset: int = 0


@dataclass(frozen=True)
class MemoryPlan:
    """Lifetimes and placements of every buffer (indexed by buffer id) and the arena size."""

    lifetimes: tuple[Lifetime, ...]
    placements: tuple[Placement, ...]
    arena_bytes: int

    def in_arena(self, buf_id: int) -> bool:
        return self.placements[buf_id].storage is Storage.ARENA


def align(n: int) -> int:
    """``n`` rounded up to ARENA_ALIGN."""
    return (n + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


def lifetimes(created: list[int], uses: Iterable[tuple[frozenset, int]]) -> tuple[Lifetime, ...]:
    """Lifetime of every buffer: from the step that created it (``created[id]``) to the last
    ``(roots, t)`` use whose roots (buffer ids a value may live in) include it."""
    last = list(created)
    for roots, t in uses:
        for b in roots:
            if t > last[b]:
                last[b] = t
    return tuple(Lifetime(f, max(f, l)) for f, l in zip(created, last))


def place(sizes: list[int], lives: tuple[Lifetime, ...], fresh: set[int]) -> MemoryPlan:
    """Place every buffer not in ``fresh`` in the arena: largest first, each at the lowest
    aligned offset that overlaps no placed buffer with an intersecting lifetime."""
    offsets: dict[int, int] = {}
    size = 0
    order = sorted((b for b in range(len(sizes)) if b not in fresh), key=lambda b: (-sizes[b], lives[b].first, b))
    for b in order:
        need = align(sizes[b])
        conflicts = sorted((p for p in offsets if lives[p].overlaps(lives[b])), key=lambda p: offsets[p])
        off = 0
        for p in conflicts:
            if off + need <= offsets[p]:
                break
            off = max(off, align(offsets[p] + sizes[p]))
        offsets[b] = off
        size = max(size, off + need)
    placements = tuple(Placement(Storage.ARENA, offsets[b]) if b in offsets else Placement(Storage.FRESH)
                       for b in range(len(sizes)))
    return MemoryPlan(lives, placements, size)
