"""PGO of a whole call's thread count: the ``call_threads`` record of the manifest.

Every parallel region of a call (a fused kernel, a oneDNN convolution, an MKL GEMM) wakes the
other threads of its team, which sleep between regions under the runtime's
``OMP_WAIT_POLICY=PASSIVE``. On a VM a sleeping vCPU halts, and waking it is a trip through the
hypervisor: 62 µs per 2-thread region on the 2-vCPU Intel host of 2026-12-02 (6-8 µs on the AMD
one; ``bench/omp_wakeup.py``). A model of many small steps then runs faster on one thread
(mobilenet_v3_small at batch 1: 3.1 ms on 2 threads, 1.4 ms on 1), and no per-kernel cost model
sees that for the ATen steps. So the build times the finished bundle with each candidate cap on
the model's real example inputs, in interleaved rounds with a lead-in (like every PGO
measurement), and records every median and the choice; a cap below every core is chosen only
when it beats no cap by more than :data:`MARGIN`. The record names this host (usable cores, CPU
model): the runtime applies the choice only on a host like it, and unless the caller passes
``threads``. The record is cached per graph source and host, so a warm rebuild does not time
again.

A ``--topn 1`` build (no PGO of kernels) times the caps too when the call has at least
:data:`MANY_STEPS` kernel, tactic and ATen steps (:func:`worth_timing`): that is where a wake-up per
step adds up (mobilenet_v3_small, efficientnet_b0), and the ~0.5 s it costs is small against such a
build; a small graph is left uncapped without timing.

Another process holding a core while the caps are timed favours the one-thread call (it has no
teammate to wait for), and a cap recorded then would halve the bundle's speed on a quiet host. So
each sample's contended run-queue wait is measured (``autotune.contended_wait``); a contended
sample is taken again (up to ``Protocol.contended_retries`` times, as in PGO), and if the kept
samples are still contended no cap is recorded and nothing is cached: the next build times again.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

import torch

from ascendc_pack_runtime.errors import BundleError
from ascendc_pack_runtime.host import host_cpu_model
from ascendc_pack_runtime.manifest_tactics import CallThreads

from ascendc_pack.autotune.protocol import Protocol, contended_wait, contention_clock, least_contended
from ascendc_pack.autotune.protocol import lead_in
from ascendc_pack.cache import atomic_write_text, stable_hash
from ascendc_pack.ir.choice import UNSTABLE_WAIT
from ascendc_pack.kernels.target import host_fingerprint

log = logging.getLogger("ascendc_pack")

CACHE_SUBDIR = "call_threads"
RECORD_VERSION = 2
MARGIN = 0.05
"""A cap below every core must be this much faster than no cap (noise must not cap a model)."""
ROUNDS = 5
SETTLED_ROUNDS = 3
"""Rounds after which timing stops early when they all agree by a wide margin (:func:`settled`)."""
LEAD_IN_S = 0.03
SAMPLE_S = 0.03
MANY_STEPS = 16
"""At ``--topn 1``, the caps are timed only for a call of at least this many parallel-capable steps."""


def worth_timing(topn: int, cores: int, steps: dict) -> bool:
    """Whether a build times the call caps: on 2+ cores, always with PGO (``topn`` > 1), and at
    ``--topn 1`` when ``steps`` (the graph's step counts by kind, ``GraphSource.stats["steps"]``)
    hold at least :data:`MANY_STEPS` fused, tactic and ATen-out steps."""
    if cores <= 1:
        return False
    return topn > 1 or sum(steps.get(k, 0) for k in ("fused", "tactic", "aten_out")) >= MANY_STEPS


def candidate_caps(cores: int) -> list[int]:
    """The thread counts timed: every core (the no-cap baseline) first, half of them from 4
    cores on, and 1."""
    caps = [cores] + ([cores // 2] if cores >= 4 else []) + [1]
    return list(dict.fromkeys(c for c in caps if c >= 1))


def choose(medians: dict[int, float], cores: int, margin: float = MARGIN) -> int | None:
    """The cap to record: the fastest candidate if it beats every core's median by more than
    ``margin``, else None (no cap)."""
    base = medians.get(cores)
    best = min(medians, key=lambda t: (medians[t], -t))
    if base is None or best == cores or medians[best] >= base * (1.0 - margin):
        return None
    return best


def settled(per_round: dict[int, list[float]], margin: float = MARGIN) -> bool:
    """True when every round so far (at least :data:`SETTLED_ROUNDS`) had the same fastest cap,
    ahead of every other by more than twice ``margin``: more rounds could not change the choice
    (a model whose calls take 100 ms then spends 3 rounds timing, not 5)."""
    rounds = min(len(v) for v in per_round.values())
    if rounds < SETTLED_ROUNDS or len(per_round) < 2:
        return False
    leaders = set()
    for r in range(rounds):
        times = sorted((v[r], c) for c, v in per_round.items())
        (best, cap), (second, _) = times[0], times[1]
        if best >= second * (1.0 - 2 * margin):
            return False
        leaders.add(cap)
    return len(leaders) == 1


def _time_round(model, args: list, restore: dict[int, torch.Tensor]) -> tuple[float, float]:
    """Median µs of the calls of one sample, after a lead-in of untimed calls, and the least
    contended of up to 1 + ``Protocol.contended_retries`` samples: the one whose threads waited for a core the
    smallest share of its wall time (that share is returned too)."""
    def take() -> tuple[float, float]:
        median_us, share = _sample(model, args, restore)
        return share, median_us

    (share, median_us), _ = least_contended(take, Protocol.contended_retries, UNSTABLE_WAIT)
    return median_us, share


def _sample(model, args: list, restore: dict[int, torch.Tensor]) -> tuple[float, float]:
    """Median µs of about :data:`SAMPLE_S` of calls after a lead-in, and the contended run-queue
    wait of this process's threads over that wall time (0 for calls shorter than
    ``Protocol.contended_min_launch_us``, as in PGO)."""

    def call() -> float:
        for i, t in restore.items():  # a model that mutates its inputs sees the same values every call
            args[i].copy_(t)
        t0 = time.perf_counter_ns()
        model(*args)
        return (time.perf_counter_ns() - t0) / 1e3

    lead_in(call, LEAD_IN_S * 1e6)
    times, before, start = [], contention_clock(), time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < SAMPLE_S:
        times.append(call())
    wall, median_us = time.perf_counter() - start, statistics.median(times)
    waited = contended_wait(before, contention_clock()) if median_us >= Protocol.contended_min_launch_us else 0.0
    return median_us, waited / wall


def measure(bundle: Path, inputs: tuple, cores: int, rounds: int = ROUNDS) -> tuple[CallThreads, float]:
    """Load ``bundle`` once per candidate cap and time the calls on ``inputs`` in up to ``rounds``
    interleaved rounds (order rotated; fewer once they are :func:`settled`); the record holds the
    median of the round medians. Also returns the largest run-queue wait share of a kept sample:
    above :data:`~ascendc_pack.ir.choice.UNSTABLE_WAIT` the record caps nothing."""
    import ascendc_pack_runtime as rt

    caps = candidate_caps(cores)
    models = {c: rt.load(bundle, threads=c) for c in caps}
    try:
        mutated = [mu.index for mu in next(iter(models.values())).contract.mutations]
        args = {c: [t.clone() for t in inputs] for c in caps}
        restore = {i: inputs[i].clone() for i in mutated}
        per_round: dict[int, list[float]] = {c: [] for c in caps}
        wait = 0.0
        with torch.no_grad():
            for r in range(rounds):
                for c in caps[r % len(caps):] + caps[:r % len(caps)]:
                    median_us, share = _time_round(models[c], args[c], restore)
                    per_round[c].append(median_us)
                    wait = max(wait, share)
                if settled(per_round):
                    break
    finally:
        for m in models.values():
            m.close()
    medians = {c: statistics.median(v) for c, v in per_round.items()}
    cap = choose(medians, cores) if wait <= UNSTABLE_WAIT else None
    return CallThreads(cap, tuple((c, round(medians[c], 2)) for c in caps), cores, host_cpu_model()), wait


def tune_call_threads(bundle: Path, inputs: tuple, cores: int, cache_dir: Path, graph_source: str) -> CallThreads:
    """The record for this graph on this host: the cached one (``<cache>/call_threads/<key>.json``),
    else a new :func:`measure`, then cached."""
    key = stable_hash(RECORD_VERSION, graph_source, cores, json.dumps(host_fingerprint(), sort_keys=True))
    path = Path(cache_dir) / CACHE_SUBDIR / f"{key}.json"
    try:
        return CallThreads.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, BundleError):  # absent or unreadable: measure again
        pass
    record, wait = measure(bundle, inputs, cores)
    if wait > UNSTABLE_WAIT:
        log.warning("call threads: another process held a core while the caps were timed (threads waited "
                    "for a core %.0f%% of a sample): no cap recorded, nothing cached; rebuild on a quiet "
                    "machine to tune it", wait * 100)
        return record
    atomic_write_text(path, json.dumps(record.to_json(), indent=1) + "\n")
    return record


__all__ = ["CACHE_SUBDIR", "MARGIN", "MANY_STEPS", "worth_timing", "candidate_caps", "choose", "settled", "measure", "tune_call_threads"]
