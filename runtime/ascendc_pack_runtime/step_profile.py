"""Where a bundle's call spends its time: per-step timings from torch's profiler.

The graph interpreter (graph.so) runs each ATen step through the dispatcher, which emits a
profiler event per operator, and emits one event per kernel launch named after the kernel
(fused kernels and generated GEMM / convolution kernels). :func:`profile_steps` profiles a few
calls and keeps the events directly below the graph's ``<namespace>::run``: the steps, in call
order. A step is keyed by its name and its occurrence in the call (``aten::addmm #3``), so a
``torch.cond`` branch that runs in some calls only is still one row. The profiler adds about a
microsecond per event: the call's total is measured under it too, and ``other`` (the call
minus its steps) is the interpreter's own work plus that overhead.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StepTime:
    """One step of a call: ``name`` (kernel name or ATen operator), ``occurrence`` (its index among
    the call's steps of that name), ``position`` (its first index in the call), ``median_us``
    over the calls that ran it, ``calls`` how many did."""

    name: str
    occurrence: int
    position: int
    median_us: float
    calls: int

    @property
    def label(self) -> str:
        return f"{self.name} #{self.occurrence}" if self.occurrence else self.name


@dataclass(frozen=True)
class StepProfile:
    """``calls`` profiled calls: their median total (``call_median_us``) and every step."""

    calls: int
    call_median_us: float
    steps: tuple[StepTime, ...]

    @property
    def steps_us(self) -> float:
        """Sum of the step medians."""
        return sum(s.median_us for s in self.steps)

    def by_name(self) -> list[tuple[str, int, float]]:
        """``(name, steps, total median µs)`` per step name, the largest total first."""
        totals: dict[str, list] = {}
        for s in self.steps:
            entry = totals.setdefault(s.name, [0, 0.0])
            entry[0] += 1
            entry[1] += s.median_us
        return sorted(((n, c, us) for n, (c, us) in totals.items()), key=lambda r: -r[2])

    def lines(self, top: int = 15) -> list[str]:
        """A report: the ``top`` slowest steps in call order of rank, then totals per name."""
        call = self.call_median_us
        share = (lambda us: f"{100 * us / call:5.1f} %") if call > 0 else (lambda us: "    -  ")
        out = [f"step profile over {self.calls} call(s) (torch.profiler): median call {call / 1e3:.3f} ms, "
               f"{len(self.steps)} steps {self.steps_us / 1e3:.3f} ms, other (interpreter + profiler) "
               f"{max(call - self.steps_us, 0.0) / 1e3:.3f} ms"]
        ranked = sorted(self.steps, key=lambda s: -s.median_us)[:top]
        out.append(f"  slowest {len(ranked)} step(s):   pos  median µs   share  step")
        out += [f"  {'':18}{s.position:5d} {s.median_us:10.1f} {share(s.median_us)}  {s.label}" for s in ranked]
        out.append("  per name:            steps   total µs   share  name")
        out += [f"  {'':18}{c:7d} {us:10.1f} {share(us)}  {n}" for n, c, us in self.by_name()[:top]]
        return out


def profile_steps(model, inputs: tuple, calls: int = 10, warmup: int = 3,
                  make_args: Callable[[], tuple] | None = None) -> StepProfile:
    """Profile ``calls`` calls of a loaded :class:`~.model.Model` on ``inputs`` (after ``warmup``
    unprofiled ones). ``make_args``: fresh arguments per call (a model that mutates its inputs);
    default: ``inputs`` every call. Raises ValueError when ``calls`` < 1."""
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"profile calls must be at least 1 (got {calls})")
    make_args = make_args or (lambda: inputs)
    for _ in range(warmup):
        model(*make_args())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            model(*make_args())
    run_name = f"{model.namespace_for(*make_args())}::run"
    roots = [e for e in prof.events() if e.name == run_name]  # also inside a caller's record_function
    if not roots:
        raise RuntimeError(f"the profiler recorded no {run_name} event; is another profiler active?")
    samples: dict[tuple[str, int], list[float]] = {}
    positions: dict[tuple[str, int], int] = {}
    for root in roots:
        seen: dict[str, int] = {}
        for pos, ev in enumerate(sorted(root.cpu_children, key=lambda e: e.time_range.start)):
            key = (ev.name, seen.get(ev.name, 0))
            seen[ev.name] = key[1] + 1
            samples.setdefault(key, []).append(ev.cpu_time_total)
            positions.setdefault(key, pos)
    steps = tuple(sorted((StepTime(n, k, positions[(n, k)], statistics.median(v), len(v))
                          for (n, k), v in samples.items()), key=lambda s: s.position))
    return StepProfile(len(roots), statistics.median(r.cpu_time_total for r in roots), steps)
