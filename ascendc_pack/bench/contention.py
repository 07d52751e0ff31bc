"""The contention run: another process keeps one core busy while the contenders are timed.

The busy process is a plain Python ``while True: pass`` loop (one thread, never sleeps), started
once per model and switched on and off with SIGCONT / SIGSTOP, so that quiet and busy phases
alternate round by round and a drift of the host's own load hits both phases alike. By default
it is not pinned (the OS scheduler places it, as another tenant's job would be); ``pin`` keeps
it on one core (``sched_setaffinity``). A contender's slowdown is paired by round: the median
over rounds of (busy round median ÷ quiet round median).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ascendc_pack.errors import ConfigError
from ascendc_pack.bench.machine import host_cores
from ascendc_pack.bench.stats import paired_ratio

SPIN = "while True:\n    pass\n"
#: seconds after switching the busy process on or off before timing resumes
SETTLE_S = 0.1


class Spinner:
    """Another process spinning on one core; :meth:`set` switches it on or off."""

    def __init__(self, pin: int | None = None):
        if pin is not None:
            try:
                allowed = os.sched_getaffinity(0)
            except AttributeError:
                raise ConfigError("--busy-core needs an OS with CPU affinity (Linux); leave it unset") from None
            if pin not in allowed:
                raise ConfigError(f"--busy-core {pin} is not a core this process may use "
                                  f"({sorted(allowed)}); pick one of them or leave it unset")
        self.pin = pin
        self.proc: subprocess.Popen | None = None
        self.on = False

    def describe(self) -> str:
        where = f"pinned to core {self.pin}" if self.pin is not None else "not pinned"
        return (f"one Python process spinning in `while True: pass` ({where}) on a host with "
                f"{host_cores()} usable cores, switched on for the busy phase of every round")

    def __enter__(self) -> Spinner:
        self.proc = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.kill(self.proc.pid, signal.SIGSTOP)
        if self.pin is not None:
            os.sched_setaffinity(self.proc.pid, {self.pin})
        return self

    def set(self, on: bool) -> None:
        """Busy (SIGCONT) or quiet (SIGSTOP), then wait :data:`SETTLE_S`."""
        if on != self.on and self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT if on else signal.SIGSTOP)
            self.on = on
        time.sleep(SETTLE_S)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def slowdowns(quiet: dict[str, list[float]], busy: dict[str, list[float]], bundles, reference: str = "ort") -> dict:
    """Per contender the busy ÷ quiet slowdown (paired by round); per bundle its slowdown ÷ the
    ``reference`` contender's (``vs_<reference>``, paired by round too; < 1: the bundle degrades
    less) and its busy latency ÷ the reference's busy latency (``busy_vs_<reference>``; < 1: the
    bundle is faster with the core taken).

    The slowdown ratio alone favours a contender that scales badly: one that gains little from
    the second core loses little when it is taken (README "Threading"), so both are reported.

    ``quiet`` / ``busy``: per contender id, its per-round medians (same rounds in both)."""
    out: dict = {"slowdown": {}, "vs_" + reference: {}, "busy_vs_" + reference: {}}
    for cid in quiet:
        s = paired_ratio(busy.get(cid, []), quiet[cid])
        if s is not None:
            out["slowdown"][cid] = s.to_json()
    if reference in quiet and reference in busy:
        ref = [b / q for b, q in zip(busy[reference], quiet[reference])]
        for cid in bundles:
            if cid in quiet and cid in busy:
                mine = [b / q for b, q in zip(busy[cid], quiet[cid])]
                for key, s in (("vs_", paired_ratio(mine, ref)),
                               ("busy_vs_", paired_ratio(busy[cid], busy[reference]))):
                    if s is not None:
                        out[key + reference][cid] = s.to_json()
    return out
