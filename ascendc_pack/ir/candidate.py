"""A tiling candidate and its ``kernel_key`` (docs/DESIGN.md §3.2, the torch_npu recipe)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One tiling of a fused kernel: ``tiling_repr`` (canonical, no ``|``), workspace bytes and
    the number of parallel blocks (threads on CPU)."""

    tiling_repr: str
    workspace: int
    block_dim: int

    def __post_init__(self):
        if "|" in self.tiling_repr or "\n" in self.tiling_repr:
            raise ValueError(f"tiling_repr must not contain '|' or newlines: {self.tiling_repr!r}")

    @property
    def optimize_tiling_text(self) -> str:
        """The exact text of an ``optimize_tiling`` file choosing this candidate."""
        return f"{self.tiling_repr}|{self.workspace}|{self.block_dim}"

    @property
    def kernel_key(self) -> str:
        """``md5("<tiling_repr>|<workspace>|<block_dim>")`` as hex."""
        return hashlib.md5(self.optimize_tiling_text.encode()).hexdigest()

    @staticmethod
    def parse(text: str) -> Candidate:
        """Parse ``optimize_tiling`` text; raises ValueError if it is not ``repr|ws|bd``."""
        parts = text.split("|")
        if len(parts) != 3 or not parts[0]:
            raise ValueError(f"expected 'tiling_repr|workspace|block_dim', got {text!r}")
        try:
            ws, bd = int(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"workspace and block_dim must be integers, got {text!r}") from None
        if ws < 0 or bd < 1:
            raise ValueError(f"workspace must be >= 0 and block_dim >= 1, got {text!r}")
        return Candidate(parts[0], ws, bd)

    def to_json(self) -> dict:
        return {"tiling_repr": self.tiling_repr, "workspace": self.workspace,
                "block_dim": self.block_dim, "kernel_key": self.kernel_key}

    @staticmethod
    def from_json(d: dict) -> Candidate:
        return Candidate(d["tiling_repr"], int(d["workspace"]), int(d["block_dim"]))
