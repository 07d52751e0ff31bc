"""The timing protocol: interleaved rounds, medians, spread, and when a row is noise.

Everything here is pure arithmetic on microsecond samples or takes its clock as a parameter, so
the protocol is tested with fake timers. The rules (also in docs/PERFORMANCE.md):

* A round times every contender once, in an order rotated by one each round, so a slow spell of
  the host hits every contender about equally.
* Latency is the median over all timed calls; the spread is the interquartile range of the
  per-round medians divided by their median (``rel_iqr``). Drift of the host's load between
  rounds shows up there, not in the median.
* A row is **unstable** when it has fewer than :data:`MIN_ROUNDS` rounds or its ``rel_iqr``
  exceeds :data:`UNSTABLE_REL_IQR`. Reports print unstable rows with a flag and never derive a
  bandwidth or a percentage from them.
* A ratio of two contenders is paired by round: the median over rounds of
  ``a's round median / b's round median``, with its own spread.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

#: a row whose per-round medians spread more than this (IQR / median) is flagged unstable
UNSTABLE_REL_IQR = 0.10
#: fewer rounds than this cannot show a spread: the row is flagged unstable
MIN_ROUNDS = 3


from ascendc_pack.autotune.protocol import lead_in  # noqa: E402,F401 (PGO measures with it too)

def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    """Median and interquartile range of a list of samples (per-round medians or ratios)."""

    median: float
    q1: float
    q3: float
    n: int

    @property
    def rel_iqr(self) -> float:
        """(q3 - q1) / median; infinite for a zero median."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else float("inf")

    @property
    def stable(self) -> bool:
        """Enough rounds and a spread within :data:`UNSTABLE_REL_IQR`."""
        return self.n >= MIN_ROUNDS and self.rel_iqr <= UNSTABLE_REL_IQR

    @staticmethod
    def of(samples: list[float]) -> Spread:
        if not samples:
            raise ValueError("no samples")
        return Spread(statistics.median(samples), percentile(samples, 25), percentile(samples, 75), len(samples))

    def to_json(self) -> dict:
        return {"median": self.median, "q1": self.q1, "q3": self.q3, "n": self.n,
                "rel_iqr": self.rel_iqr, "stable": self.stable}


def latency_stats(rounds_us: list[list[float]]) -> dict:
    """Statistics of one contender from its rounds (each a list of per-call microseconds).

    ``median_us``/``p90_us``/``min_us`` are over every call; ``spread`` is over the per-round
    medians (see the module docstring); ``stable`` is the spread's verdict."""
    calls = [us for r in rounds_us for us in r]
    per_round = [statistics.median(r) for r in rounds_us if r]
    spread = Spread.of(per_round)
    return {"median_us": statistics.median(calls), "p90_us": percentile(calls, 90), "min_us": min(calls),
            "calls": len(calls), "rounds": len(per_round), "round_medians_us": per_round,
            "spread": spread.to_json(), "stable": spread.stable}


def paired_ratio(a_rounds: list[float], b_rounds: list[float]) -> Spread | None:
    """Ratio a / b paired by round (per-round medians of two contenders timed in the same rounds).

    Rounds where either is missing (a contender dropped out) are skipped; None when none is left."""
    ratios = [a / b for a, b in zip(a_rounds, b_rounds) if a is not None and b]
    return Spread.of(ratios) if ratios else None


def rotated(names: list, r: int) -> list:
    """Round ``r``'s order: ``names`` rotated left by ``r``."""
    if not names:
        return []
    k = r % len(names)
    return names[k:] + names[:k]


def time_calls(fn: Callable[[], object], number: int, clock: Callable[[], int] = time.perf_counter_ns) -> list[float]:
    """Microseconds of each of ``number`` back-to-back calls of ``fn``, each timed on its own."""
    out = []
    for _ in range(number):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1e3)
    return out


def calls_per_sample(est_us: float, sample_us: float, cap: int = 100_000) -> int:
    """How many calls fill one sample of about ``sample_us`` (at least 1, at most ``cap``)."""
    return max(1, min(cap, round(sample_us / max(est_us, 0.01))))


def interleaved_stats(contenders: dict[str, Callable[[], object]], rounds: int = 15, target_us: float = 2000.0,
                      clock: Callable[[], int] = time.perf_counter_ns) -> dict[str, dict]:
    """Time in-process callables in interleaved rounds; :func:`latency_stats` per name.

    Each callable is called twice to warm up, then once more to size its samples (about
    ``target_us`` each, at most 2000 calls)."""
    numbers = {}
    for name, fn in contenders.items():
        fn()
        fn()
        numbers[name] = calls_per_sample(max(time_calls(fn, 1, clock)[0], 1.0), target_us, cap=2000)
    samples: dict[str, list[list[float]]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name in rotated(list(contenders), r):
            samples[name].append(time_calls(contenders[name], numbers[name], clock))
    return {name: latency_stats(s) for name, s in samples.items()}


def interleaved_medians(contenders: dict[str, Callable[[], object]], rounds: int = 15,
                        target_us: float = 2000.0) -> dict[str, float]:
    """Median microseconds per call of each contender, timed in interleaved rounds (no spread:
    prefer :func:`interleaved_stats`)."""
    return {name: s["median_us"] for name, s in interleaved_stats(contenders, rounds, target_us).items()}
