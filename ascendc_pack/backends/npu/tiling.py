"""Candidate tilings of an npu kernel, ranked by the npu cost model.

A candidate is ``(mode, block_dim, tile, buffer_num)`` (see :mod:`ascendc_pack.backends.npu.codegen`):

* ``mode``       - ``row`` (cores take rows) or ``split`` (cores take a segment of every row,
                   partial reductions through the workspace, ``SyncAll`` between stages);
* ``block_dim``  - vector cores, at most the SoC's vector cores or the core limit (``--cores``,
                   or the device limit torch_npu reports);
* ``tile``       - elements per UB tile, a multiple of 64 (one 256-byte repeat of float32: the
                   32-byte alignment of every UB operand and whole repeats for ``Compare``);
                   a row-mode tile that holds a whole row makes it *resident*;
* ``buffer_num`` - 2 (double buffering: the queues let DMA of tile i+1 overlap compute of tile i)
                   or 1.

Hard constraints: the kernel's InitBuffer calls must fit the SoC's usable Unified Buffer
(:func:`ascendc_pack.backends.npu.codegen.ub_bytes`, the same sum the emulator checks); a split kernel
needs ``block_dim <=`` the vector cores (``SyncAll``). The estimate (microseconds, rank only) is

    launch + max over cores of (per row: row work + tiles x tile time + reductions) + stages x SyncAll
    tile time = max(DMA, Vector) with double buffering, DMA + Vector without
    DMA = latency per copy + bytes / min(per-core bandwidth, HBM bandwidth / active cores)
    Vector = per instruction (issue + repeats), a repeat being 256 bytes

with constants of :class:`SocProfile` (documented as approximations; PGO measures).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.fusion import KernelSpec
from ascendc_pack.kernels.fused.tiling import MAX_CANDIDATES, Tiling
from ascendc_pack.backends.npu.codegen import KernelPlan, plan_kernel, ub_bytes
from ascendc_pack.backends.npu.layout import NpuLayout, Unsupported, analyze

TILES = (16384, 8192, 4096, 2048, 1024, 512, 256)
VECTOR_APIS = ("Add(", "Sub(", "Mul(", "Div(", "Max(", "Min(", "Adds(", "Muls(", "Maxs(", "Mins(", "Exp(", "Ln(",
               "Abs(", "Sqrt(", "Rsqrt(", "Reciprocal(", "Relu(", "Cast(", "Compare(", "@CMPS@(", "Select(",
               "Duplicate(", "DataCopy(", "Round16<", "ReduceSum(", "ReduceMax(", "ReduceMin(", "NanGuard(")


@dataclass(frozen=True)
class SocProfile:
    """What the cost model and the emulation know about an Ascend SoC.

    ``vector_cores``: the default for the emulation; on a device the count comes from
    ``torch.npu.get_device_properties(dev).vector_core_num`` (:meth:`with_cores`). ``arch``: the
    ``--cce-aicore-arch`` of its Vector cores; ``ub_bytes``: Unified Buffer per vector core (192
    KiB on NPU architecture 2201, the programming guide's storage table); ``ub_usable``: what
    InitBuffer may take (UB minus the 256 B framework and 8 KiB API reserves). Bandwidths and clock
    are rough public figures for Atlas A2 parts, used to rank candidates only.
    """

    name: str
    vector_cores: int
    arch: str = "dav-c220-vec"
    family: str = "Atlas A2"
    ub_bytes: int = 192 * 1024
    ub_usable: int = 192 * 1024 - 256 - 8 * 1024
    hbm_gbps: float = 1600.0
    core_dma_gbps: float = 60.0
    vector_ghz: float = 1.8
    dma_latency_us: float = 0.4
    issue_cycles: int = 16
    launch_us: float = 4.0
    sync_all_us: float = 2.0
    scalar_sync_us: float = 0.05

    def with_cores(self, vector_cores: int) -> "SocProfile":
        """This SoC with the vector-core count a device reports."""
        return replace(self, vector_cores=int(vector_cores))


_A2 = [SocProfile("Ascend910B1", 48), SocProfile("Ascend910B2", 48), SocProfile("Ascend910B2C", 48),
       SocProfile("Ascend910B3", 40), SocProfile("Ascend910B4", 40, hbm_gbps=800.0),
       SocProfile("Ascend910B4_1", 40, hbm_gbps=800.0)]
_A3 = [SocProfile(f"Ascend910_{n}", cores, family="Atlas A3")
       for n, cores in (("9391", 48), ("9392", 48), ("9381", 48), ("9382", 48), ("9372", 40), ("9362", 40),
                        ("9363", 40))]
SOCS = {p.name: p for p in _A2 + _A3}
"""The SoCs the Vector generator serves: Atlas A2 (910B1-B4) and A3 (910_93xx), NPU architecture
2201. Names as torch_npu reports them (``c10_npu::SocVersion``, ``torch.npu.get_device_name``)."""
DEFAULT_SOC = "Ascend910B2"
UNSERVED = {
    "Ascend310P": "Atlas inference products (NPU architecture 2002, dav-m200): their AI Core has no separate "
                  "Vector cores, no hard SyncAll (the SyncAll page: not supported) and no bfloat16, which the "
                  "generated kernels use",
    "Ascend310B": "Atlas 200I/500 A2 inference products: SyncAll and GetUserWorkspace are not supported there "
                  "(API reference)",
    "Ascend910A": "Atlas training products (first generation, NPU architecture 1001): no DataCopyPad and no hard "
                  "SyncAll",
    "Ascend910ProA": "Atlas training products (first generation)", "Ascend910ProB": "Atlas training products "
                     "(first generation)", "Ascend910PremiumA": "Atlas training products (first generation)",
    "Ascend950": "Ascend 950 (NPU architecture 3510): a different Vector architecture, not generated for yet",
}


def soc_profile(name: str, source: str = "SoC") -> SocProfile:
    """The profile of ``name`` (``Ascend910B2``, ``Ascend910_9392``, ...); a ConfigError naming the
    SoC and why for one the Vector generator does not serve (310P, 310B, 910A, 950)."""
    from ascendc_pack.errors import ConfigError

    if name in SOCS:
        return SOCS[name]
    for prefix, why in UNSERVED.items():
        if name.startswith(prefix) and (prefix != "Ascend910A" or name == "Ascend910A"):
            raise ConfigError(f"{source}: {name} is not supported by the npu backend: {why}. Build with --backend cpu, "
                              f"or for an Atlas A2/A3 SoC ({', '.join(sorted(SOCS))})")
    raise ConfigError(f"{source}: unknown Ascend SoC {name!r}; the npu backend knows {', '.join(sorted(SOCS))}")


@dataclass(frozen=True)
class NpuTarget:
    """The SoC and the block_dim limit every candidate respects."""

    soc: SocProfile
    cores: int

    @property
    def name(self) -> str:
        return self.soc.name


def tiling_repr(params: dict) -> str:
    return f"mode={params['mode']};bd={params['bd']};tile={params['tile']};buf={params['buf']}"


@lru_cache(maxsize=256)
def _plan(spec: KernelSpec, mode: str, resident: bool) -> KernelPlan:
    return plan_kernel(analyze(spec), mode, resident)


def plan_for(spec: KernelSpec, params: dict) -> KernelPlan:
    """The kernel plan of a candidate (cached per spec and mode)."""
    return _plan(spec, params["mode"], bool(params.get("resident")))


def _count_vector(plan: KernelPlan, name: str) -> int:
    for f in plan.functions:
        if f.signature.startswith(f"void {name}"):
            return sum(line.count(api) for line in f.body for api in VECTOR_APIS)
    return 0


def _max_tile(plan: KernelPlan, soc: SocProfile, buf: int, bd: int) -> int:
    lo, hi = 0, 1 << 20
    while hi - lo > 64:  # ub_bytes grows with the tile; the largest multiple of 64 that fits
        mid = (lo + hi) // 2 // 64 * 64
        if mid > lo and ub_bytes(plan, mid, buf, bd) <= soc.ub_usable:
            lo = mid
        else:
            hi = mid if mid > lo else lo + 64
    return lo


def estimate_us(lay: NpuLayout, plan: KernelPlan, params: dict, soc: SocProfile) -> float:
    """Rank-only estimate of a candidate's device time (see the module docstring)."""
    bd, tile, buf, mode = params["bd"], params["tile"], params["buf"], params["mode"]
    cycles_us = soc.vector_ghz * 1e3
    bw = min(soc.core_dma_gbps, soc.hbm_gbps / bd) * 1e3  # bytes per us per core
    cols = lay.inner if mode == "row" else min(lay.inner, -(-lay.inner // bd))
    rows = -(-lay.rows // bd) if mode == "row" else lay.rows
    if mode == "col":  # items of one column tile; each stage runs its tile pass once per subrow
        rows = -(-lay.rows * -(-lay.cols // tile) // bd)
        cols = lay.subrows * min(tile, lay.cols)
    stage_names = ["R"] if plan.resident else [str(s) for s in range(lay.n_stages)]
    t_row = 0.0
    for name in stage_names:
        n_vec = _count_vector(plan, f"Compute{name}")
        copies = sum(1 for f in plan.functions if f.signature.startswith((f"void CopyIn{name}(", f"void CopyOut{name}("))
                     for line in f.body if "DataCopyPad(" in line)
        if not n_vec and not copies:
            continue
        tiles = max(1, -(-cols // min(tile, lay.cols)))
        n = min(tile, cols, lay.cols)
        esize = plan.in_esize + plan.out_esize
        dma = copies * soc.dma_latency_us + n * esize / bw
        vec = n_vec * (soc.issue_cycles + -(-n // 64)) / cycles_us
        # double buffering overlaps the copies of one tile (or row) with the compute of another
        t_row += tiles * (max(dma, vec) if buf == 2 else dma + vec)
    row_body = [f for f in plan.functions if f.signature.startswith(("void Row(", "void Stage", "void Col("))]
    row_vec = sum(line.count(api) for f in row_body for line in f.body for api in VECTOR_APIS)
    row_copies = sum(line.count("DataCopyPad(") for f in row_body for line in f.body)
    row_syncs = sum(line.count("WaitFlag") for f in row_body for line in f.body)
    t_row += row_vec * (soc.issue_cycles + 1) / cycles_us + row_copies * soc.dma_latency_us \
        + row_syncs * soc.scalar_sync_us
    total = soc.launch_us + 0.02 * bd + rows * t_row
    if mode == "split":
        total += (lay.n_stages - 1) * soc.sync_all_us
    return total


def _space(lay: NpuLayout, target: NpuTarget) -> list[dict]:
    cores = max(1, target.cores)
    bds = sorted({b for b in (cores, cores // 2, cores // 4, 8, 2, 1) if 1 <= b <= cores})
    out = []
    cols64 = -(-lay.cols // 64) * 64
    if lay.col:  # cores take (row, column tile) items
        for bd in bds:
            for t in (cols64, *TILES):
                if t <= cols64 and bd <= lay.rows * -(-lay.cols // t):
                    out.append({"mode": "col", "bd": bd, "tile": t, "resident": False})
        return out
    for bd in bds:
        if bd <= max(1, lay.rows):
            if lay.subrows == 1:
                out.append({"mode": "row", "bd": bd, "tile": cols64, "resident": True})
            out += [{"mode": "row", "bd": bd, "tile": t, "resident": False} for t in TILES
                    if t < cols64 or (lay.subrows > 1 and t < 2 * cols64)]
        seg = -(-(-(-lay.inner // bd)) // 64) * 64
        if bd >= 2 and bd <= target.soc.vector_cores and seg * (bd - 1) < lay.inner and \
                lay.rows * len(lay.reductions) <= 4096:
            top = min(seg, cols64)
            out += [{"mode": "split", "bd": bd, "tile": t, "resident": False} for t in (top, *TILES) if t <= top]
    return out


def propose(spec: KernelSpec, target: NpuTarget, topn: int) -> list[Tiling]:
    """Candidate tilings, best (lowest estimate) first, at most ``min(topn, 10)``. Raises
    :class:`~ascendc_pack.backends.npu.layout.Unsupported` when the kernel cannot be generated."""
    lay = analyze(spec)
    scored, seen = [], set()
    for p in _space(lay, target):
        plan = _plan(spec, p["mode"], p["resident"])
        for buf in (2, 1):
            params = {**p, "buf": buf}
            if p["tile"] > _max_tile(plan, target.soc, buf, p["bd"]):
                continue  # over the Unified Buffer
            ws = lay.rows * len(lay.reductions) * p["bd"] * 4 if p["mode"] == "split" else 0
            cand = Candidate(tiling_repr(params), ws, p["bd"])
            if cand.kernel_key in seen:
                continue
            seen.add(cand.kernel_key)
            scored.append(Tiling(params, cand, estimate_us(lay, plan, params, target.soc)))
    if not scored:  # even the smallest tile does not fit: say why
        need = min(ub_bytes(_plan(spec, "row", False), 64, 1, 1), ub_bytes(_plan(spec, "row", True), 64, 1, 1))
        raise Unsupported(f"the kernel needs {need} B of Unified Buffer even with a 64-element tile; "
                          f"{target.soc.name} has {target.soc.ub_usable} B usable")
    scored.sort(key=lambda t: (t.est_us, t.candidate.tiling_repr))
    # the best of each (mode, block_dim, resident) first, so a small topn still lets PGO compare
    firsts, rest, kinds = [], [], set()
    for t in scored:
        kind = (t.params["mode"], t.params["bd"], t.params["resident"])
        (rest if kind in kinds else firsts).append(t)
        kinds.add(kind)
    ranked = (firsts + rest)[:max(1, min(topn, MAX_CANDIDATES))]
    return sorted(ranked, key=lambda t: (t.est_us, t.candidate.tiling_repr))
