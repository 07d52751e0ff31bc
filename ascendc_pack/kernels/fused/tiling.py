"""Tile: propose candidate tilings of a fused kernel, best first, by a simple cost model.

The parameter space per kernel (see :mod:`ascendc_pack.kernels.fused.codegen` for the schedules):

* ``row``   - block_dim, rows per task (``rpt``), OpenMP schedule, vector lanes;
* ``split`` - block_dim, lanes, store tile (split one row's inner range across threads; the
              reductions combine partials through a workspace of ``64 B x block_dim`` each);
* ``col``   - block_dim, tile of rows vectorized together (``tx``), for outer-axis reductions.

The cost model estimates microseconds from bytes moved (with a cache-fit bandwidth), the
arithmetic per element, per-task and per-barrier overheads and load imbalance. It only ranks;
PGO measures. At most 10 distinct candidates are kept, then trimmed to ``topn``.

Threads are not free. The ``row`` and ``col`` schedules of a static kernel run on the graph's
task pool (``ap_kernel_launch_pool``, kernel_pool.h; ``Target.pool_overhead_us``); the ``split``
schedule and jit kernels run OpenMP with ``OMP_WAIT_POLICY=PASSIVE`` (spinning
teams collapse on a busy host: docs/TACTICS.md), so every such region pays a futex
wake-up of the sleeping team and every barrier inside it a futex round trip
(``Target.parallel_overhead_us`` / ``barrier_us``, measured with ``bench/omp_wakeup.py``). A
kernel whose single-thread estimate is small therefore ranks its ``block_dim 1`` candidates
first, and a multi-thread candidate is proposed only where it can pay off: its estimate, wake-up
included, is within :data:`PAYOFF_MARGIN` of the best single-thread one (PGO then times it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.kernels.fused.codegen import Layout
from ascendc_pack.ir.fusion import KernelSpec, NodeKind
from ascendc_pack.ir.ops import STORAGE_BYTES, STORAGE_TYPE

MAX_CANDIDATES = 10
PAYOFF_MARGIN = 1.25
"""A multi-thread candidate is proposed while its estimate is at most this times the best
single-thread estimate: the model only ranks, so near break-even PGO decides."""


@dataclass(frozen=True)
class Target:
    """What the cost model knows about the machine.

    ``parallel_overhead_us`` (waking a sleeping team for one parallel region) and ``barrier_us``
    (one barrier inside a region) are libgomp's costs under ``OMP_WAIT_POLICY=PASSIVE``, the
    runtime's policy: 6-8 µs and 3-5 µs for 2 threads on the 2-core AMD build host, idle or with a
    core busy (``bench/omp_wakeup.py``; spinning makes them 0.4 µs on a quiet core and
    milliseconds on a busy one, so the passive numbers are the ones to plan with). The build
    measures the wake-up on its host (``HostProfile.omp_wake_us``: 50-80 µs on a KVM guest whose
    idle vCPUs halt); 8 µs is the fallback. A static kernel's ``row`` and ``col`` schedules run
    their tasks on the graph's task pool instead (kernel_pool.h: the caller starts at once, a late
    worker takes fewer tasks): ``pool_overhead_us``, as the generated GEMMs' fork/join."""

    cores: int
    l2_bytes: int = 1 << 20
    mem_gbps_per_core: float = 12.0    # the build's: kernels.target.HostProfile.mem_gbps
    cache_gbps_per_core: float = 60.0  # the build's: HostProfile.l2_gbps
    task_overhead_us: float = 0.05
    parallel_overhead_us: float = 8.0
    barrier_us: float = 3.0
    pool_overhead_us: float = 4.0


@dataclass(frozen=True)
class Tiling:
    """A candidate's parameters, its candidate triple, and its estimated cost."""

    params: dict
    candidate: Candidate
    est_us: float


def kernel_bytes(spec: KernelSpec) -> int:
    """Unique bytes a kernel reads (each load's distinct elements) and writes."""
    total = 0
    for n in spec.loads:
        elems = math.prod(s for s, st in zip(spec.axes, n.strides) if st != 0)
        total += elems * STORAGE_BYTES[STORAGE_TYPE[n.dtype]]
    for o in spec.outputs:
        total += math.prod(o.shape) * STORAGE_BYTES[STORAGE_TYPE[o.dtype]]
    return total


def _flops_per_element(spec: KernelSpec) -> float:
    heavy = {"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "pow", "sin", "cos"}
    cost = 0.0
    for n in spec.nodes:
        if n.kind is NodeKind.OP:
            cost += 8.0 if n.op in heavy else 1.0
        elif n.kind is NodeKind.REDUCE:
            cost += 1.0
    return cost


def repr_of(params: dict) -> str:
    """Canonical tiling_repr: sorted ``key=value`` pairs joined by ``;``."""
    return ";".join(f"{k}={params[k]}" for k in sorted(params))


def _passes(spec: KernelSpec) -> int:
    """Passes over the inner axes: one per chained reduction stage, plus the storing pass."""
    stage = {}
    for n in spec.nodes:
        deps = [stage[a] for a in n.args]
        stage[n.id] = max(deps, default=0) + (1 if n.kind is NodeKind.REDUCE else 0)
    return max(stage.values(), default=0) + 1


def estimate_us(spec: KernelSpec, params: dict, target: Target) -> float:
    """Rank-only estimate of a candidate's time in microseconds."""
    layout = Layout.of(spec)
    rows = math.prod(spec.axes[a] for a in layout.outer)
    inner = math.prod(spec.axes[a] for a in layout.inner)
    n_red = len(spec.reductions)
    bd = params["bd"]
    nbytes = kernel_bytes(spec)
    passes = max(1, _passes(spec))
    working_set = nbytes / max(rows, 1) * (params.get("rpt", 1))
    # re-reads of a row across passes hit cache when a row fits in L2
    reread = nbytes * (passes - 1) / max(passes, 1)
    bw = target.mem_gbps_per_core * bd ** 0.8 * 1e3  # bytes per us
    cache_bw = target.cache_gbps_per_core * bd * 1e3
    t = nbytes / bw + (reread / cache_bw if working_set < target.l2_bytes else reread / bw)
    elems = rows * inner
    lanes = params.get("lanes", 16)
    sched = params["sched"]
    if sched == "col":
        vec_eff = min(1.0, params["tx"] / 16)
        t += elems * _flops_per_element(spec) / (2.0e3 * 16 * vec_eff * bd)
    else:
        tail = (inner % lanes) / max(inner, 1)
        vec_eff = max(0.15, min(1.0, inner / (4 * lanes)) * (1 - tail * 0.5))
        t += elems * _flops_per_element(spec) / (2.0e3 * lanes * vec_eff * bd)
    if bd > 1:  # split: an OpenMP team (its barriers); row / col: the task pool
        t += target.parallel_overhead_us if sched == "split" else target.pool_overhead_us
    if sched == "row":
        tasks = math.ceil(rows / params["rpt"])
        per_thread = math.ceil(tasks / bd)
        imbalance = per_thread * bd / max(tasks, 1)
        t = t * imbalance + per_thread * target.task_overhead_us
        if params["omp"] == "dynamic":
            t += tasks * target.task_overhead_us * 0.5
        if tasks < bd:
            t *= bd / max(tasks, 1)
    elif sched == "split":
        barrier = target.barrier_us if bd > 1 else 0.0  # a team of one does not wait
        t += rows * (n_red * passes * barrier + 0.05)
        if inner < 4096 * bd:
            t += rows * barrier
    elif sched == "col":
        tasks = math.ceil(rows / params["tx"])
        per_thread = math.ceil(tasks / bd)
        t = t * per_thread * bd / max(tasks, 1) + per_thread * target.task_overhead_us
        # strided access along the reduce axis: good only when rows are contiguous
        if not _rows_contiguous(spec, layout):
            t *= 4
    if sched != "col" and spec.reduce_axes and _rows_contiguous(spec, layout) \
            and not _inner_contiguous(spec, layout):
        # a row's reduction strides through memory (a channels_last mean over H, W) while the
        # col tile reads consecutive rows as vectors: measured 3.4-4.7x slower on conv_block's mean
        t *= 4
    return t


def _min_stride(spec: KernelSpec, axis: int) -> int | None:
    """The smallest stride of ``axis`` among the loads that walk it (None: no load does)."""
    return min((n.strides[axis] for n in spec.loads if n.strides[axis] != 0), default=None)


def _inner_contiguous(spec: KernelSpec, layout: Layout) -> bool:
    return _min_stride(spec, layout.inner[-1]) in (None, 1)


def _rows_contiguous(spec: KernelSpec, layout: Layout) -> bool:
    """Consecutive rows (the last outer axis) are adjacent in memory: a col tile vectorizes over
    them (e.g. a channels_last tensor's mean over H, W: channels are contiguous)."""
    return bool(layout.outer) and _min_stride(spec, layout.outer[-1]) == 1


def _space(spec: KernelSpec, cores: int) -> list[dict]:
    layout = Layout.of(spec)
    rows = math.prod(spec.axes[a] for a in layout.outer)
    inner = math.prod(spec.axes[a] for a in layout.inner)
    has_red = bool(spec.reduce_axes)
    bds = sorted({1, cores} | ({max(1, cores // 2)} if cores >= 4 else set()))
    out = []
    for bd in bds:
        for lanes in (8, 16):
            if rows >= 1:
                for rpt in (1, 4, 16, 64):
                    if (rpt > 1 and rpt * bd > rows) or (bd > 1 and rows == 1):
                        continue
                    for omp in ("static", "dynamic"):
                        out.append({"sched": "row", "bd": bd, "rpt": rpt, "omp": omp, "lanes": lanes})
            if rows < 8 * bd or inner >= 8192:
                for tile in ((4096, 32768) if not has_red else (4096,)):
                    out.append({"sched": "split", "bd": bd, "lanes": lanes, "tile": tile})
        if has_red and rows >= 16 and _rows_contiguous(spec, layout):  # outer-axis reductions
            last = spec.axes[layout.outer[-1]]
            for tx in (16, 64, 256):
                # several outer axes: a tile stays within one run of the last (TX divides it)
                if tx <= rows * 2 and (len(layout.outer) == 1 or last % tx == 0):
                    out.append({"sched": "col", "bd": bd, "tx": tx, "lanes": 16})
    return out


def propose(spec: KernelSpec, target: Target, topn: int) -> list[Tiling]:
    """Candidate tilings, best (lowest estimate) first, at most ``min(topn, 10)``.

    Multi-thread candidates are kept only where they can pay off (:func:`pays_off`), so a
    small kernel gets ``block_dim 1`` candidates only."""
    n_red = len(spec.reductions)
    scored, seen = [], set()
    for params in _space(spec, target.cores):
        workspace = 64 * params["bd"] * n_red if params["sched"] == "split" else 0
        cand = Candidate(repr_of(params), workspace, params["bd"])
        if cand.kernel_key in seen:
            continue
        seen.add(cand.kernel_key)
        scored.append(Tiling(params, cand, estimate_us(spec, params, target)))
    single = min((t.est_us for t in scored if t.params["bd"] == 1), default=None)
    scored = [t for t in scored if pays_off(t, single)]
    scored.sort(key=lambda t: (t.est_us, t.candidate.tiling_repr))
    # keep the choice diverse: the best of each (schedule, block_dim) comes before the
    # runners-up, so even a small topn lets PGO compare schedules and thread counts (the cost
    # model cannot know, e.g., that the other core is busy)
    firsts, rest, seen_kinds = [], [], set()
    for t in scored:
        kind = (t.params["sched"], t.params["bd"])
        (rest if kind in seen_kinds else firsts).append(t)
        seen_kinds.add(kind)
    ranked = (firsts + rest)[:max(1, min(topn, MAX_CANDIDATES))]
    return sorted(ranked, key=lambda t: (t.est_us, t.candidate.tiling_repr))


def pays_off(tiling: Tiling, single_us: float | None) -> bool:
    """Whether a candidate is worth proposing: every single-thread one is; a multi-thread one
    when its estimate (wake-up and barriers included) is within :data:`PAYOFF_MARGIN` of the
    best single-thread estimate ``single_us`` (``None``: there is no single-thread candidate)."""
    return tiling.params["bd"] == 1 or single_us is None or tiling.est_us <= PAYOFF_MARGIN * single_us
