"""The outcome of tuning one fused kernel: what the render and bundle stages consume."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .candidate import Candidate


@dataclass
class CandidateResult:
    """One candidate's measurement (``median_us`` None when not timed or failed).

    ``disqualified`` is set when PGO verification rejected the candidate
    (:meth:`ascendc_pack.verify.Disqualification.to_json`: reason, detail, output, max_error,
    allowed); ``error`` then holds its message.
    """

    candidate: Candidate
    median_us: float | None = None
    samples_us: list[float] = field(default_factory=list)
    error: str | None = None
    disqualified: dict | None = None

    def to_json(self) -> dict:
        d = self.candidate.to_json()
        d.update({"median_us": self.median_us, "samples_us": list(self.samples_us), "error": self.error})
        if self.disqualified is not None:  # only then: records of verified winners are unchanged
            d["disqualified"] = dict(self.disqualified)
        return d

    @staticmethod
    def from_json(d: dict) -> CandidateResult:
        return CandidateResult(Candidate.from_json(d), d.get("median_us"), list(d.get("samples_us", [])),
                               d.get("error"), d.get("disqualified"))


@dataclass
class KernelChoice:
    """The chosen candidate of one fused kernel.

    ``so_path`` is the winner's ``kernel.so`` in the compile cache; ``visited`` is False when
    no run reached the kernel (then the choice is candidate 0, DESIGN 2); ``results`` lists
    every candidate in cost-model order with its timings.
    """

    name: str
    spec: dict
    chosen_index: int
    candidate: Candidate
    so_path: Path
    visited: bool
    results: list[CandidateResult]

    def to_json(self) -> dict:
        return {"name": self.name, "chosen_index": self.chosen_index, "candidate": self.candidate.to_json(),
                "so_path": str(self.so_path), "visited": self.visited,
                "results": [r.to_json() for r in self.results]}


@dataclass
class KernelFallback:
    """A fused kernel that runs as its ATen steps because no candidate can be used (every one
    failed to compile, was disqualified by verification or crashed); ``results`` says why for
    each candidate. The bundle replaces the kernel by those steps (never a wrong answer)."""

    name: str
    reason: str
    results: list[CandidateResult]
    visited: bool

    def to_json(self) -> dict:
        return {"name": self.name, "reason": self.reason, "visited": self.visited,
                "results": [r.to_json() for r in self.results]}
