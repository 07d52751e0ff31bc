"""The fused kernels of ``manifest.json`` (docs/FORMAT.md): each kernel's chosen candidate, its
library member and every candidate with its PGO median. Part of :mod:`ascendc_pack_runtime.manifest`
(same conventions: ``from_json`` checks types, bounds and that ``kernel_key`` is the md5 of its
tiling, raising field errors naming the field path)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from types import MappingProxyType

from .constants import MAX_MEMBER_BYTES
from .schema import MAX_COUNT, Fields, field_error

_MD5_RE = re.compile(r"[0-9a-f]{32}")


def kernel_key_of(tiling_repr: str, workspace: int, block_dim: int) -> str:
    """``md5("<tiling_repr>|<workspace>|<block_dim>")`` hex: the torch_npu recipe (docs/DESIGN.md §3.2)."""
    return hashlib.md5(f"{tiling_repr}|{workspace}|{block_dim}".encode()).hexdigest()


def _tiling(f: Fields) -> tuple[str, str, int, int]:
    key = f.str("kernel_key", pattern=_MD5_RE, what="32 lowercase hex digits")
    tiling = f.get("tiling_repr", lambda v: isinstance(v, str) and bool(v) and "|" not in v and "\n" not in v,
                   "a non-empty string without '|' or newlines")
    workspace, block_dim = f.int("workspace", 0, MAX_MEMBER_BYTES), f.int("block_dim", 1, MAX_COUNT)
    if key != kernel_key_of(tiling, workspace, block_dim):
        raise field_error(f.path("kernel_key"), f"is {key}, not md5(tiling_repr|workspace|block_dim) = "
                                                f"{kernel_key_of(tiling, workspace, block_dim)}")
    return key, tiling, workspace, block_dim


@dataclass(frozen=True)
class Candidate:
    """One tiling candidate of a fused kernel and its PGO median (None: not timed)."""

    index: int
    kernel_key: str
    tiling_repr: str
    workspace: int
    block_dim: int
    median_us: float | None
    failed: bool

    @staticmethod
    def from_json(d: object, where: str) -> Candidate:
        f = Fields(d, where)
        index = f.int("index")
        return Candidate(index, *_tiling(f), f.number("median_us"), f.bool("failed"))

    def to_json(self) -> dict:
        return {"index": self.index, "kernel_key": self.kernel_key, "tiling_repr": self.tiling_repr,
                "workspace": self.workspace, "block_dim": self.block_dim, "median_us": self.median_us,
                "failed": self.failed}


@dataclass(frozen=True)
class Kernel:
    """A fused kernel's chosen candidate, its library member, whether PGO reached it, and every
    candidate in cost-model order."""

    name: str
    kernel_key: str
    tiling_repr: str
    workspace: int
    block_dim: int
    file: str
    visited: bool
    chosen_index: int
    candidates: tuple[Candidate, ...]
    uses: tuple | None = None    # [{"inputs", "outputs"}] per step running this kernel (optional)

    @staticmethod
    def from_json(d: object, where: str) -> Kernel:
        f = Fields(d, where)
        name = f.str("name", nonempty=True)
        key, tiling, workspace, block_dim = _tiling(f)
        file, visited, chosen = f.str("file"), f.bool("visited"), f.int("chosen_index")
        candidates = tuple(Candidate.from_json(v, w) for v, w in f.list("candidates"))
        for i, c in enumerate(candidates):
            if c.index != i:
                raise field_error(f"{where}.candidates[{i}].index", f"is {c.index}, not its position {i}")
        if chosen >= len(candidates) or candidates[chosen].kernel_key != key:
            raise field_error(f"{where}.chosen_index", f"is {chosen}, not the index of the candidate with "
                                                       f"kernel_key {key}")
        return Kernel(name, key, tiling, workspace, block_dim, file, visited, chosen, candidates, _uses(f, where))

    def to_json(self) -> dict:
        return {"name": self.name, "kernel_key": self.kernel_key, "tiling_repr": self.tiling_repr,
                "workspace": self.workspace, "block_dim": self.block_dim, "file": self.file,
                "visited": self.visited, "chosen_index": self.chosen_index,
                "candidates": [c.to_json() for c in self.candidates],
                **({"uses": [dict(u) for u in self.uses]} if self.uses is not None else {})}


def _uses(f: Fields, where: str) -> tuple | None:
    """``kernels[i].uses``: the value names each step running the kernel reads and writes."""
    if "uses" not in f.d:
        return None
    uses = []
    for u, w in f.list("uses"):
        g = Fields(u, w)
        uses.append(MappingProxyType({"inputs": list(g.strs("inputs")), "outputs": list(g.strs("outputs"))}))
    return tuple(uses)


__all__ = ["Candidate", "Kernel", "kernel_key_of"]
