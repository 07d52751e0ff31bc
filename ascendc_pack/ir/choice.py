"""The outcome of tuning one fused kernel: what the render and bundle stages consume."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.fusion import KernelSpec


def rel_spread(samples_us, median_us) -> float | None:
    """Interquartile range of PGO samples over their median (None with < 4 samples or no median):
    the measurement quality of a kernel or tactic candidate."""
    s = sorted(samples_us)
    if len(s) < 4 or not median_us:
        return None
    return (s[(3 * len(s)) // 4] - s[len(s) // 4]) / median_us


@dataclass
class CandidateResult:
    """One candidate's measurement (``median_us`` None when not timed or failed).

    ``disqualified`` is set when PGO verification rejected the candidate
    (:meth:`ascendc_pack.autotune.verify.Disqualification.to_json`: reason, detail, output, max_error,
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

    @property
    def rel_spread(self) -> float | None:
        """Interquartile range of the samples over their median (None with < 4 samples)."""
        return rel_spread(self.samples_us, self.median_us)

    @staticmethod
    def from_json(d: dict) -> CandidateResult:
        return CandidateResult(Candidate.from_json(d), d.get("median_us"), list(d.get("samples_us", [])),
                               d.get("error"), d.get("disqualified"))


UNSTABLE_SPREAD = 0.10
"""A timed candidate whose samples spread more than this (IQR / median) is a noisy measurement."""

UNSTABLE_WAIT = 0.05
"""Timings whose threads waited for a core (another process held it) longer than this share of
the timed wall time are contended: a multi-thread candidate looks slower than it runs."""


@dataclass(frozen=True)
class MeasurementQuality:
    """How far one kernel's PGO timings can be trusted.

    ``load`` is the 1-minute load average when the kernel was tuned and ``cores`` the cores this
    process may use; ``spread`` the largest IQR / median of the winner and candidate 0;
    ``wait_share`` the run-queue wait of this process's threads over the wall time of the kept
    samples (``autotune.Selection.wait_share``: another process held a core while they were
    taken). The timings are ``stable`` when the machine was not oversubscribed (load <= cores),
    that spread is at most :data:`UNSTABLE_SPREAD` and the wait at most :data:`UNSTABLE_WAIT`;
    otherwise a reported speedup may be noise. The load average is a minute late and the spread
    misses a neighbour that holds a core the whole time; the wait sees both.
    """

    load: float
    cores: int
    spread: float
    stable: bool
    wait_share: float = 0.0

    @staticmethod
    def assess(results: list[CandidateResult], chosen: int, load: float, cores: int,
               wait_share: float = 0.0) -> MeasurementQuality:
        spreads = [r.rel_spread for r in (results[chosen], results[0]) if r.rel_spread is not None]
        spread = max(spreads, default=0.0)
        stable = load <= cores and spread <= UNSTABLE_SPREAD and wait_share <= UNSTABLE_WAIT
        return MeasurementQuality(round(load, 2), cores, round(spread, 4), stable, round(wait_share, 4))

    def describe(self) -> str:
        text = f"load {self.load:.1f} on {self.cores} cores, spread up to {self.spread:.0%}"
        if self.wait_share > UNSTABLE_WAIT:
            text += f", threads waited for a core {self.wait_share:.0%} of the time (another process held it)"
        return text

    def to_json(self) -> dict:
        return {"load": self.load, "cores": self.cores, "spread": self.spread, "stable": self.stable,
                "wait_share": self.wait_share}

    @staticmethod
    def from_json(d) -> MeasurementQuality | None:
        try:
            return MeasurementQuality(float(d["load"]), int(d["cores"]), float(d["spread"]), bool(d["stable"]),
                                      float(d.get("wait_share", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def unstable_footnote(qualities, what: str) -> str | None:
    """The footnote of a build summary whose speedups are marked ``?`` (``what``: "kernel",
    "tactic step"): how many rows had unstable timings and the worst case; None if none did."""
    bad = [q for q in qualities if q is not None and not q.stable]
    if not bad:
        return None
    worst = max(bad, key=lambda q: (q.load / q.cores, q.wait_share, q.spread))
    return (f"? timings of {len(bad)} {what}(s) were unstable ({worst.describe()}): these speedups may be "
            "noise, not measurements; rebuild on a quiet machine (check `uptime`) with a fresh --cache-dir "
            "to re-tune")


@dataclass
class KernelChoice:
    """The chosen candidate of one fused kernel.

    ``so_path`` is the winner's ``kernel.so`` in the compile cache; ``visited`` is False when
    no run reached the kernel (then the choice is candidate 0, docs/DESIGN.md §2.5); ``results`` lists
    every candidate in cost-model order with its timings.
    """

    name: str
    spec: KernelSpec
    chosen_index: int
    candidate: Candidate
    so_path: Path
    visited: bool
    results: list[CandidateResult]
    quality: MeasurementQuality | None = None   # None: not timed (one candidate, or unvisited)

    def to_json(self) -> dict:
        d = {"name": self.name, "chosen_index": self.chosen_index, "candidate": self.candidate.to_json(),
             "so_path": str(self.so_path), "visited": self.visited,
             "results": [r.to_json() for r in self.results]}
        if self.quality is not None:
            d["quality"] = self.quality.to_json()
        return d


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
def format_us(us: float) -> str:
    """A duration given in microseconds, in the unit that keeps it short: 23.4 us, 97.76 ms, 1.20 s."""
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


