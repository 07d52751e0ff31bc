"""PGO candidate selection: time every candidate on the kernel's real arguments (docs/DESIGN.md §2.5).

The protocol (``Protocol``): warm every candidate up, then measure in interleaved rounds (each
round runs every live candidate once, starting at a rotating index so no candidate always runs
first); each sample times ``number`` back-to-back launches, calibrated so a sample lasts at
least ``min_sample_us``. After ``min_rounds`` the medians decide, unless the best two are
within ``noise`` of each other: then rounds go on up to ``max_rounds`` or ``time_cap_s``.
Ties keep the lower index. A candidate whose launch raises is recorded as failed and never
chosen; if all fail, :class:`AutotuneError` is raised. (Before timing, :mod:`ascendc_pack.autotune.verify`
checks every candidate's outputs; the tune stage passes only the ones that passed.)

Another process can take a core in the middle of a sample (a busy build host): a multi-thread
candidate then waits for its straggler and looks slower than it is. With a ``contention`` clock
(:data:`contention_clock`) a sample during which this process's threads were preempted and
waited for a core longer than ``max_wait_share`` of it is taken again, up to
``contended_retries`` times, and the least contended one is kept; ``Selection.wait_share`` says
how contended the kept samples still were (``MeasurementQuality`` flags the choice). Launches
shorter than ``contended_min_launch_us`` are not judged: a 2-thread launch of a few µs is
dominated by its own threads' wake-up and placement (a woken thread put on its caller's core
preempts it), which looks like contention on a quiet host; a neighbour's millisecond slices
matter for the long launches, where thread counts are decided.

``select`` takes a ``measure(index, number) -> seconds`` callable, so the logic is tested with
an injected fake timer; :func:`kernel_measure` builds the real one for a compiled kernel.
"""

from __future__ import annotations

import logging
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ascendc_pack.errors import PackError

log = logging.getLogger("ascendc_pack")


class AutotuneError(PackError):
    """Every candidate of a kernel failed, so nothing can be chosen."""


class CandidateFailed(Exception):
    """Raised by a measure function when a candidate crashes or returns a non-zero status."""


@dataclass(frozen=True)
class Protocol:
    """How candidates are timed (recorded in tuning.json)."""

    warmup: int = 2
    min_rounds: int = 7
    max_rounds: int = 41
    noise: float = 0.02            # relative gap under which the best two count as tied
    time_cap_s: float = 1.5
    min_sample_us: float = 1000.0  # a sample repeats the launch until it lasts this long
    verify_timeout_s: float = 10.0  # a candidate's verification run may take this long (or longer
                                    # for slow references, see verify.TIMEOUT_PER_REFERENCE)
    max_wait_share: float = 0.05   # a sample whose threads waited for a core longer than this share
    contended_retries: int = 2     # of it is contended: taken again up to this many times
    contended_min_launch_us: float = 50.0  # shorter launches are not judged: their own threads'
                                           # wake-ups and placement look like contention

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Selection:
    """Result of one selection: the winner, each candidate's samples (us) and errors."""

    best: int
    samples_us: list[list[float]]
    errors: list[str | None]
    rounds: int
    number: int = 1
    medians_us: list[float | None] = field(default_factory=list)
    wait_share: float = 0.0         # contended run-queue wait ÷ wall time of the kept samples
    retaken: int = 0                # contended samples taken again


Measure = Callable[[int, int], float]  # (candidate index, launches) -> seconds for all launches


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


class _ContentionClock:
    """``() -> (seconds, preemptions) | None``: how long this process's threads have waited on a
    run queue (the second field of Linux's ``/proc/self/task/*/schedstat``, sleeping threads do not
    count) and how often they were preempted (``getrusage``'s involuntary context switches); None
    where the kernel does not say. Each thread's file stays open: about 10 µs a reading for a few
    threads instead of 70 µs opening them (it runs around every PGO sample)."""

    def __init__(self):
        self.pid, self.fds = None, {}

    def __call__(self) -> tuple[float, int] | None:
        if self.pid != os.getpid():  # a forked child: the open files are the parent's threads
            self.pid, self.fds = os.getpid(), {}
        try:
            tids = set(os.listdir("/proc/self/task"))
        except OSError:
            return None
        for tid in set(self.fds) - tids:  # threads that exited
            os.close(self.fds.pop(tid))
        total, seen = 0, False
        for tid in tids:
            try:
                if tid not in self.fds:
                    self.fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                total += int(os.pread(self.fds[tid], 128, 0).split()[1])
                seen = True
            except (OSError, ValueError, IndexError):  # it exited meanwhile, or no schedstat here
                continue
        return (total / 1e9, resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw) if seen else None


contention_clock = _ContentionClock()


def contended_wait(before, after) -> float:
    """The run-queue wait between two :data:`contention_clock` readings that other work caused:
    the wait if a thread of this process was preempted in between, else 0 (also when a reading is
    None). A thread woken on an idle vCPU waits too - for the hypervisor to resume the vCPU, up to
    ~40 µs on a KVM guest, a third of a small OpenMP kernel's sample - but nothing preempts it."""
    if before is None or after is None or after[1] == before[1]:
        return 0.0
    return max(0.0, after[0] - before[0])


def least_contended(take: Callable[[], tuple], retries: int, max_share: float) -> tuple[tuple, int]:
    """``take() -> (contended share, ...)`` up to ``1 + retries`` times, stopping at the first
    sample whose share is at most ``max_share``: the least contended sample and the retakes."""
    best = take()
    for retake in range(1, retries + 1):
        if best[0] <= max_share:
            return best, retake - 1
        best = min(best, take())
    return best, retries


def select(n: int, measure: Measure, protocol: Protocol = Protocol(),
           clock: Callable[[], float] = time.perf_counter,
           contention: Callable[[], tuple[float, int] | None] | None = None) -> Selection:
    """Choose the fastest of ``n`` candidates by the protocol above; ``contention`` (e.g.
    :data:`contention_clock`) turns on the re-taking of contended samples."""
    errors: list[str | None] = [None] * n
    samples: list[list[float]] = [[] for _ in range(n)]
    live = list(range(n))
    kept_s = waited_s = 0.0  # wall and run-queue wait seconds of the kept samples
    retaken = 0

    def take(i: int, number: int) -> tuple[float, float, float]:
        c0 = contention()
        t = measure(i, number)
        judged = t >= protocol.contended_min_launch_us * 1e-6 * number
        waited = contended_wait(c0, contention()) if judged else 0.0
        return waited / max(t, 1e-12), t, waited

    def uncontended(i: int, number: int) -> float:
        """One sample of candidate ``i``: the least contended of up to 1 + contended_retries."""
        nonlocal kept_s, waited_s, retaken
        (_, t, waited), retakes = least_contended(lambda: take(i, number), protocol.contended_retries,
                                                  protocol.max_wait_share)
        kept_s, waited_s, retaken = kept_s + t, waited_s + waited, retaken + retakes
        return t

    def run(i: int, number: int, timed: bool = False) -> float | None:
        try:
            return uncontended(i, number) if timed and contention is not None else measure(i, number)
        except CandidateFailed as exc:
            errors[i] = str(exc)
        except Exception as exc:  # a crash in one candidate must not stop the build
            errors[i] = f"{type(exc).__name__}: {exc}"
        live.remove(i)
        return None

    for i in list(live):  # warm-up, and calibration of launches per sample
        for _ in range(protocol.warmup):
            if run(i, 1) is None:
                break
    if not live:
        raise AutotuneError("every candidate failed: " + "; ".join(f"#{i}: {e}" for i, e in enumerate(errors)))
    probe = [run(i, 1) for i in list(live)]
    per_call = max((p for p in probe if p is not None), default=0.0)
    number = max(1, min(1000, int(protocol.min_sample_us * 1e-6 / max(per_call, 1e-9)) + 1))
    start = clock()
    rounds = 0
    while live:
        rounds += 1
        order = live[rounds % len(live):] + live[:rounds % len(live)]
        for i in order:
            t = run(i, number, timed=True)
            if t is not None:
                samples[i].append(t / number * 1e6)
        if not live:
            break
        if rounds < protocol.min_rounds:
            continue
        ranked = sorted(live, key=lambda i: (_median(samples[i]), i))
        if len(ranked) < 2 or rounds >= protocol.max_rounds or clock() - start > protocol.time_cap_s:
            break
        a, b = _median(samples[ranked[0]]), _median(samples[ranked[1]])
        if b - a > protocol.noise * a:
            break  # a clear winner
    if not live:
        raise AutotuneError("every candidate failed: " + "; ".join(f"#{i}: {e}" for i, e in enumerate(errors)))
    medians = [(_median(s) if s and errors[i] is None else None) for i, s in enumerate(samples)]
    best = min(live, key=lambda i: (medians[i], i))
    return Selection(best=best, samples_us=samples, errors=errors, rounds=rounds, number=number,
                     medians_us=medians, wait_share=round(waited_s / kept_s, 4) if kept_s > 0 else 0.0,
                     retaken=retaken)


def kernel_measure(kernels: list, args: list[torch.Tensor], pool: int | None = None) -> Measure:
    """A measure function for compiled candidates (``FusedKernel`` objects, None = failed),
    launched on ``pool`` (an ``ap_pool`` address: the graph's task pool, which graph.so runs a
    library exporting ``ap_kernel_launch_pool`` on) when given.

    The kernels read their inputs and write only into their own output buffers, never into the
    caller's tensors; inputs are still snapshotted and restored around every timed call so a
    kernel that misbehaved could not leak a change into the user's data.
    """
    inputs = [k.prepare_inputs(list(args)) if k is not None else None for k in kernels]
    snapshots = [a.clone() for a in args]
    outputs = [k.allocate_outputs() if k is not None else None for k in kernels]
    launches = [k.lib.bind(inputs[i], outputs[i], k._workspace, pool=pool) if k is not None else None
                for i, k in enumerate(kernels)]

    def measure(i: int, number: int) -> float:
        launch = launches[i]
        if launch is None:
            raise CandidateFailed("did not compile")
        t0 = time.perf_counter()
        for _ in range(number):
            rc = launch()
            if rc != 0:
                raise CandidateFailed(f"returned status {rc}")
        elapsed = time.perf_counter() - t0
        for a, s in zip(args, snapshots):
            if not torch.equal(a, s):
                a.copy_(s)
                raise CandidateFailed("wrote into its input tensor")
        return elapsed

    return measure
def lead_in(fn: Callable[[], object], us: float, clock: Callable[[], int] = time.perf_counter_ns) -> int:
    """Untimed calls of ``fn`` until ``us`` microseconds have passed (none for ``us <= 0``, else at
    least one); returns how many. Brings a contender that sat idle back to its steady state
    before a sample is timed (docs/DESIGN.md §8)."""
    if us <= 0:
        return 0
    t0, n = clock(), 0
    while True:
        fn()
        n += 1
        if (clock() - t0) / 1e3 >= us:
            return n



