"""The runtime's threading policy: how OpenMP threads wait, and per-model thread caps.

**Wait policy.** On a busy host (serving hosts are busy by design) libgomp's default - spin up
to ~300k iterations at every barrier before sleeping - collapses: a spinning thread waits for a
teammate the scheduler put off the core and takes that core from everyone else meanwhile. With
the 2 cores shared by other jobs, eager resnet18 went from 79 ms to 1417 ms, and a 2-thread
parallel region 500 µs after the last one took 11.5 ms instead of 9 µs (docs/TACTICS.md,
``bench/threading_study.py``, ``bench/omp_wakeup.py``). ``OMP_WAIT_POLICY=PASSIVE`` (threads
sleep at once) costs a futex wake-up per parallel region instead, 6-8 µs here, which the cost
model plans for (:mod:`ascendc_pack.kernels.fused.tiling`).

libgomp reads its environment once, when it is loaded - when ``torch`` is imported. So
importing ``ascendc_pack_runtime`` (or ``ascendc_pack``, which imports it first) *before* torch
sets ``OMP_WAIT_POLICY=PASSIVE`` in ``os.environ`` (:func:`apply_wait_policy`), unless:

* the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``: their choice stands (a dedicated,
  quiet host may prefer to spin: ``OMP_WAIT_POLICY=ACTIVE``);
* an OpenMP runtime is already loaded (torch was imported first): setting the variable could no
  longer change this process, so nothing is set and ``ascendc_pack_runtime.WAIT_POLICY`` says so; export
  ``OMP_WAIT_POLICY=PASSIVE`` before starting Python, or import ``ascendc_pack_runtime`` first.

The command-line entry points (``ascendc-pack ...``, ``python -m ascendc_pack_runtime ...``)
import this package before anything imports torch, so they always run under the policy.

**The graph's task pool** (``task_pool.h``, where generated GEMM, convolution and attention
kernels run) keeps its workers awake for a short poll after each job, 200 µs unless
``ASCENDC_PACK_POOL_SPIN_US`` says otherwise (0: they sleep at once), yielding the core on every
poll (:func:`pool_wait`; docs/DESIGN.md §4.8 has the measurements: faster on an idle host, 13-23 %
slower with a core busy).

**Thread caps.** ``load(path, threads=N)`` caps a model's calls at N threads: the fused kernels'
``max_threads`` (the graph's ``set_threads``) and torch's intra-op threads on the calling thread
for the duration of each call (:func:`intra_op_threads`; OpenMP's thread count is a per-thread
setting, so other threads are not affected; it is restored after the call).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, MutableMapping

POLICY: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
"""What the runtime puts in the environment when the user chose nothing."""
USER_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""Any of these in the environment means the user chose the wait policy."""
_OPENMP_LIBRARIES = ("libgomp", "libiomp", "libomp.so")


@dataclass(frozen=True)
class WaitPolicy:
    """What :func:`apply_wait_policy` found and did."""

    source: str
    """``"runtime"`` (it set :data:`POLICY`), ``"user"`` (the environment already chose) or
    ``"too late"`` (an OpenMP runtime was loaded before; nothing was set)."""
    settings: tuple[tuple[str, str], ...]
    """The wait-policy variables in the environment afterwards."""

    def describe(self) -> str:
        """One line for ``run`` / ``serve`` output (the task pool's wait included)."""
        env = " ".join(f"{k}={v}" for k, v in self.settings) or "libgomp default (spins ~300k iterations)"
        if self.source == "runtime":
            line = f"OpenMP wait policy: {env} (set by ascendc_pack_runtime; set OMP_WAIT_POLICY to override)"
        elif self.source == "user":
            line = f"OpenMP wait policy: {env} (from the environment)"
        else:
            line = (f"OpenMP wait policy: {env}: torch was imported before ascendc_pack_runtime, too late to set "
                    "OMP_WAIT_POLICY=PASSIVE (export it, or import ascendc_pack_runtime first)")
        return f"{line}; {pool_wait()}"


POOL_SPIN_VARIABLE = "ASCENDC_PACK_POOL_SPIN_US"
POOL_SPIN_DEFAULT_US = 200


def pool_spin_us(environ: MutableMapping[str, str] | None = None) -> int:
    """How long the task pool's workers stay awake after a job, as ``task_pool.h`` reads
    :data:`POOL_SPIN_VARIABLE` (a non-negative integer; anything else: the default)."""
    raw = (os.environ if environ is None else environ).get(POOL_SPIN_VARIABLE, "")
    return int(raw) if raw.isdigit() else POOL_SPIN_DEFAULT_US


def pool_wait(environ: MutableMapping[str, str] | None = None) -> str:
    """The task pool's wait between jobs, in words."""
    us = pool_spin_us(environ)
    if us == 0:
        return f"task pool: workers sleep between jobs ({POOL_SPIN_VARIABLE}=0)"
    return f"task pool: workers stay awake {us} µs between jobs ({POOL_SPIN_VARIABLE}=0 to sleep at once)"


def openmp_loaded() -> bool:
    """Whether an OpenMP runtime is mapped into this process (read from /proc/self/maps; where
    that is unreadable: whether torch has been imported)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any(lib in line for line in f for lib in _OPENMP_LIBRARIES)
    except OSError:
        return "torch" in sys.modules


def apply_wait_policy(environ: MutableMapping[str, str] | None = None,
                      loaded: bool | None = None) -> WaitPolicy:
    """Put :data:`POLICY` into ``environ`` (default ``os.environ``) unless the user chose a wait
    policy or an OpenMP runtime is already loaded (``loaded``: default :func:`openmp_loaded`)."""
    env = os.environ if environ is None else environ
    if any(k in env for k in USER_VARIABLES):
        source = "user"
    elif openmp_loaded() if loaded is None else loaded:
        source = "too late"
    else:
        env.update(POLICY)
        source = "runtime"
    return WaitPolicy(source, tuple((k, env[k]) for k in USER_VARIABLES if k in env))


def check_threads(threads, what: str = "threads") -> int | None:
    """``threads`` as a positive int, or None (no cap); a ValueError that names the fix otherwise."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{what} must be a positive integer (or None for no cap), got {threads!r}")
    return threads


def per_instance_threads(workers: int, threads: int | None = None) -> int | None:
    """A serving instance's thread cap: ``threads`` if given; else, with several ``workers``
    instances calling in parallel, torch's intra-op thread count shared out among them (at least
    1) so that they do not oversubscribe the cores; else None (one instance: no cap)."""
    if check_threads(threads) is not None:
        return threads
    if workers <= 1:
        return None
    import torch

    return max(1, torch.get_num_threads() // workers)


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count at ``threads`` on this thread, restored
    after (None: unchanged). Changing it costs well under a microsecond."""
    import torch

    before = torch.get_num_threads()
    if threads is None or before == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["POLICY", "USER_VARIABLES", "WaitPolicy", "apply_wait_policy", "openmp_loaded", "check_threads",
           "per_instance_threads", "intra_op_threads"]
