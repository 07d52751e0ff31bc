"""Generated depthwise convolution kernels (NHWC, float32) with tiling candidates.

A :class:`DwConvSpec` (static shape, stride, padding, dilation, bias, fused pointwise epilogue)
describes ``y = epilogue(conv2d(x, weight, bias, groups=C))`` with one filter per channel
(channel multiplier 1). Memory layouts are fixed: ``x`` is NHWC (a channels_last
``[N, C, H, W]`` tensor), the weight ``[C, 1, kh, kw]`` is repacked once by Python into a dense
``[kh, kw, C]`` tensor (:func:`pack_weight`; fold an eval BatchNorm into it first with
:func:`fold_affine`), ``y`` is NHWC (a channels_last ``[N, C, OH, OW]`` tensor).

The cost model (:func:`propose`) ranks up to 10 tilings (:class:`DwConvTiling`): a channel block
``cb`` (a multiple of the host's vector width), an output-column block ``owb`` (pixels that share
the loaded weight vectors; ``owb x cb / lanes`` accumulators in registers), output rows per task
``rb`` and a thread count ``bd``. Each candidate renders to its own source
(``templates/kernel/dwconv.cpp.j2``, the static kernel ABI), so
:func:`ascendc_pack.toolchain.compiler.compile_kernels` caches and compiles them like any fused kernel;
:class:`~ascendc_pack.kernels.conv.depthwise_launch.DwConvKernel` launches one on tensors and
:func:`~ascendc_pack.kernels.conv.depthwise_launch.eager_reference` is what it must match. docs/DWCONV.md has
the details.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass

import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import PackError
from ascendc_pack.ir.epilogue import EPILOGUE, c_statement
from ascendc_pack.kernels import family
from ascendc_pack.kernels.conv.common import EPILOGUE_OPS, ConvGeometry, Pair, fold_affine, interior, out_size  # noqa: F401
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.fused.tiling import Target
from ascendc_pack.kernels.target import CpuTarget

MAX_CANDIDATES = 10
TEMPLATE_NAME = "kernel/dwconv.cpp.j2"



class DwConvSpecError(PackError, ValueError):
    """A depthwise-convolution spec or kernel call is inconsistent (the message names the field
    and the fix)."""


@dataclass(frozen=True)
class DwConvSpec(ConvGeometry):
    """One static depthwise convolution ``y = epilogue(conv2d(x, w, bias, stride, padding,
    dilation, groups=c))``: ``x`` NHWC ``[n, h, w, c]``, weight ``[c, 1, kh, kw]`` (read packed
    as ``[kh, kw, c]``), ``y`` NHWC ``[n, oh, ow, c]``; float32. ``epilogue`` steps run in order
    after the bias (see :data:`EPILOGUE_OPS`)."""

    error = DwConvSpecError
    kind = "depthwise conv"

    name: str
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    dilation: Pair = (1, 1)
    dtype: str = "float32"
    bias: bool = False
    epilogue: tuple[str, ...] = ()

    def __post_init__(self):
        self.check_fields(("n", "c", "h", "w", "kh", "kw"))
        if self.dtype != "float32":
            raise DwConvSpecError(f"depthwise conv {self.name}: dtype must be float32, got {self.dtype!r}; "
                                  f"other dtypes run as ATen")
        object.__setattr__(self, "epilogue", tuple(self.epilogue))
        bad = [op for op in self.epilogue if op not in EPILOGUE_OPS]
        if bad:
            raise DwConvSpecError(f"depthwise conv {self.name}: unsupported epilogue step(s) {bad}; fusable "
                                  f"steps are {', '.join(EPILOGUE_OPS)} (leave others to a separate kernel)")
        self.check_geometry()

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """The output as torch shapes it, ``[N, O, OH, OW]`` (stored channels_last)."""
        return (self.n, self.c, self.oh, self.ow)


    @property
    def flops(self) -> int:
        return 2 * self.n * self.c * self.oh * self.ow * self.kh * self.kw

    @staticmethod
    def from_conv(name: str, x_shape, kernel, stride=1, padding=0, dilation=1, *, bias: bool = False,
                  epilogue=()) -> DwConvSpec:
        """The spec of ``conv2d(x, weight[C, 1, kh, kw], groups=C)`` on ``x`` of ``x_shape``
        ``[N, C, H, W]`` (as torch shapes it; the kernel reads it channels_last)."""
        n, c, h, w = x_shape
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        return DwConvSpec(name, n, c, h, w, kh, kw, stride, padding, dilation, bias=bias, epilogue=tuple(epilogue))

    def to_json(self) -> dict:
        return {**asdict(self), "epilogue": list(self.epilogue)}

    @staticmethod
    def from_json(d: dict) -> DwConvSpec:
        return DwConvSpec(**{**d, **{k: tuple(d[k]) for k in ("stride", "padding", "dilation", "epilogue")}})

    def spec_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A depthwise weight ``[C, 1, kh, kw]`` as the dense ``[kh, kw, C]`` tensor the kernel reads."""
    if weight.dim() != 4 or weight.shape[1] != 1:
        raise DwConvSpecError(f"a depthwise weight is [C, 1, kh, kw], got {list(weight.shape)}")
    c, _, kh, kw = weight.shape
    return weight.reshape(c, kh * kw).t().contiguous().view(kh, kw, c)


# ----------------------------------------------------------------------------- tiling + cost


@dataclass(frozen=True)
class DwConvTiling(Tiling):
    """A candidate's parameters: ``cb`` channels per block (``cb / lanes`` vectors), ``owb``
    output columns per register block, ``rb`` output rows per task (a task runs every channel
    block over its rows, so a block's input rows stay in L1 from one row to the next), ``bd``
    threads (OpenMP over batch x row blocks)."""

    cb: int
    owb: int
    rb: int
    bd: int
    lanes: int

    error = DwConvSpecError
    kind = "depthwise-convolution"


@dataclass(frozen=True)
class ChannelPart:
    """``blocks`` consecutive channel blocks of ``vectors`` vectors of ``lanes`` floats from
    channel ``c0``: the main blocks, the whole vectors left, then power-of-two tail chunks, so
    every channel is computed exactly once and no access crosses the channel end."""

    c0: int
    lanes: int
    vectors: int
    blocks: int


def channel_parts(c: int, cb: int, lanes: int) -> list[ChannelPart]:
    """How ``c`` channels split into blocks of ``cb`` (see :class:`ChannelPart`)."""
    parts, c0 = [], 0
    if c // cb:
        parts.append(ChannelPart(0, lanes, cb // lanes, c // cb))
        c0 = c // cb * cb
    if (c - c0) // lanes:
        parts.append(ChannelPart(c0, lanes, (c - c0) // lanes, 1))
        c0 += (c - c0) // lanes * lanes
    chunk = lanes // 2
    while c0 < c:
        if c - c0 >= chunk:
            parts.append(ChannelPart(c0, chunk, 1, 1))
            c0 += chunk
        chunk //= 2
    return parts


# Machine constants of the estimate (cycles unless named otherwise). Rank only: fitted to the
# measured times of every single-thread candidate of 15 mobilenet / efficientnet shapes on the
# build host (AVX2, Zen 3), see docs/DWCONV.md
FMA_PORTS = 2.0
LOAD_PORTS = 2.0
FMA_LATENCY = 2.0  # an accumulator's chain of taps, per tap (out-of-order blocks overlap)
BLOCK_CYCLES = 30.0  # a register block's call, setup, loop exits and epilogue loads
EDGE_FACTOR = 1.6  # edge blocks test every tap's column
OVERLAP = 0.25  # of the other terms, beside the limiting one


def _axis_taps(out: int, size: int, k: int, s: int, p: int, d: int) -> list[int]:
    """Valid (non-padding) taps of each output position along one axis."""
    return [sum(0 <= o * s - p + i * d < size for i in range(k)) for o in range(out)]


def _block_cycles(p: int, nv: int, col_taps: float, kw: int, edge: bool) -> float:
    """One kernel row of a p-pixel x nv-vector register block whose pixels have ``col_taps``
    valid taps each: its FMAs (each loading an input vector) and kw x nv weight loads on the FMA
    and load ports, and no faster than an accumulator's chain of dependent FMAs."""
    fmas = p * nv * col_taps
    cyc = max(fmas / FMA_PORTS, (fmas + nv * kw) / LOAD_PORTS, col_taps * FMA_LATENCY)
    return cyc * (EDGE_FACTOR if edge else 1.0)


def estimate_us(spec: DwConvSpec, t: DwConvTiling, target: CpuTarget) -> float:
    """Rank-only estimate of one call (microseconds): the busiest thread's register blocks (tails,
    edges and padded rows included), its input rows moving from L2 to L1, and the tensors moving
    from memory, the largest plus :data:`OVERLAP` of the others; plus the wake-up and closing
    barrier of a parallel region."""
    (_, *rows), (_, *cols) = spec._axes()
    row_taps = sum(_axis_taps(spec.oh, *rows)) / spec.oh
    col_taps = _axis_taps(spec.ow, *cols)
    lo, hi = spec.interior_cols
    vector, _ = _epilogue(spec)
    steps = sum(EPILOGUE[op].pass_cycles for op in spec.epilogue)
    epi = 1 + int(spec.bias) + (steps if vector else 0)  # per vector, in the register blocks
    row_cycles = 0.0  # one output row, every channel
    for part in channel_parts(spec.c, t.cb, t.lanes):
        for a, b, edge in ((0, lo, True), (lo, hi, False), (hi, spec.ow, True)):
            # (pixels, first column, how many such blocks): interior blocks all have kw taps
            blocks = [(t.owb, a, (b - a) // t.owb)] if not edge else \
                [(t.owb, ow0, 1) for ow0 in range(a, b - t.owb + 1, t.owb)]
            if (b - a) % t.owb:
                blocks.append(((b - a) % t.owb, b - (b - a) % t.owb, 1))
            for p, ow0, count in blocks:
                taps = sum(col_taps[ow0:ow0 + p]) / p if count else 0
                row_cycles += count * part.blocks * (row_taps * _block_cycles(p, part.vectors, taps, spec.kw, edge)
                                                     + BLOCK_CYCLES + p * part.vectors * epi)
    if not vector:  # the row pass of the lane steps: every vector of the row, loaded and stored
        row_cycles += spec.ow * -(-spec.c // t.lanes) * (steps + 2)
    tasks = spec.n * -(-spec.oh // t.rb)
    rows = -(-tasks // t.bd) * min(t.rb, spec.oh)  # output rows of the busiest thread
    compute = rows * row_cycles / (target.ghz * 1e3)
    # a channel block's window of input rows stays in L1 from one output row of a task to the
    # next when it fits; else every output row reads its kh input rows from L2
    kh_ext = (spec.kh - 1) * spec.dilation[0] + 1
    reuse = (t.rb > 1 and kh_ext * spec.w * t.cb * 4 <= target.l1d * 0.5) or \
        kh_ext * spec.w * spec.c * 4 <= target.l1d * 0.5
    rows_read = min(spec.stride[0], kh_ext) if reuse else spec.kh
    l2 = rows * rows_read * spec.w * spec.c * 4 / (target.l2_gbps * 1e3)
    # the tensors from memory: once, unless a task's rows do not stay in L2 across its channel
    # blocks; then every block streams its slice, and a slice narrower than a cache line
    # (64 B) fetches each line once per block sharing it
    task_rows = min(t.rb, spec.oh)

    def passes(footprint: int) -> float:
        return 1.0 if footprint <= target.l2 * 0.5 else max(1.0, 64 / (t.cb * 4))

    x_rows = (task_rows - 1) * spec.stride[0] + kh_ext
    y_passes = passes(task_rows * spec.ow * spec.c * 4)
    y_passes += 0 if vector or y_passes == 1 else 2  # the row pass reads and writes it again
    nbytes = 4 * spec.c * spec.n * (spec.h * spec.w * passes(x_rows * spec.w * spec.c * 4)
                                    + spec.oh * spec.ow * (int(spec.residual) + y_passes))
    whole = 4 * spec.c * spec.n * (spec.h * spec.w + spec.oh * spec.ow)
    gbps = target.l2_gbps if whole <= target.l2 * 0.5 * t.bd else target.mem_gbps
    mem = nbytes / (gbps * 1e3 * min(t.bd, tasks) ** 0.8)
    terms = (compute, l2, mem)
    us = max(terms) + OVERLAP * (sum(terms) - max(terms))
    if t.bd > 1:
        us += Target.parallel_overhead_us + Target.barrier_us
    return us


def _space(spec: DwConvSpec, target: CpuTarget) -> list[DwConvTiling]:
    vec, cores = target.lanes, target.cores
    bds = sorted({1, cores} | ({cores // 2} if cores >= 4 else set()))
    cvec = -(-spec.c // vec)
    # rows per task: one (channel blocks innermost), all (outermost: most L1 reuse), the most
    # whose input rows stay in L2; with threads, about 1, 2 or 4 tasks per thread and image
    kh_ext = (spec.kh - 1) * spec.dilation[0] + 1
    row_bytes = spec.stride[0] * spec.w * spec.c * 4
    fit = max(1, int((target.l2 * 0.5 - kh_ext * spec.w * spec.c * 4) // row_bytes) + 1)
    single = {1, spec.oh, min(fit, spec.oh)}
    split = {1} | {-(-spec.oh // (bd * k)) for bd in bds if bd > 1 for k in (1, 2, 4)}
    lo, hi = spec.interior_cols
    widest = max(lo, hi - lo, spec.ow - hi)  # a longer column block runs as this one
    out = []
    for nv in (1, 2, 3, 4, 6, 8):
        if nv > 1 and nv > cvec:
            continue  # a block wider than the channels would only ever run as a tail
        owbs = [o for o in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14) if o * nv + nv <= target.registers]
        for owb in sorted({min(o, widest) for o in owbs}):
            for bd in bds:
                for rb in sorted(single if bd == 1 else split):
                    tasks = spec.n * -(-spec.oh // rb)
                    if bd > 1 and tasks < bd:
                        continue
                    out.append(DwConvTiling(nv * vec, owb, rb, bd, vec))
    return out


def propose(spec: DwConvSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 10)`` distinct candidates, best (lowest estimate) first, never more
    threads than ``target.cores``. Multi-thread candidates appear only where the best
    single-thread estimate is at least :data:`PARALLEL_MIN_US` and they are within
    ``PAYOFF_MARGIN`` of it. The list keeps variety for PGO: every thread count gets an equal
    share (the cost model cannot know whether the other cores are busy), and within one the best
    few channel and column blocks come before the runners-up."""
    scored = family.scored(spec, target, _space(spec, target), lambda s, t: 0, estimate_us)
    groups = [family.varied([c for c in scored if c.tiling.bd == bd], (lambda t: t.cb, lambda t: t.owb))
              for bd in sorted({c.tiling.bd for c in scored})]
    groups.sort(key=lambda g: g[0].est_us)
    picked = [c for row in itertools.zip_longest(*groups) for c in row if c is not None]
    return sorted(picked[:max(1, min(topn, MAX_CANDIDATES))], key=lambda c: (c.est_us, c.candidate.tiling_repr))


# ----------------------------------------------------------------------------- render + build


def _epilogue(spec: DwConvSpec) -> tuple[bool, list[str]]:
    """(whether the steps run in the register blocks, their C statements on ``v``). Steps of
    plain arithmetic (``EpilogueOp.vector``) run on the accumulator vectors before the store and
    read the residual as ``ld<L>(rp)``; with any step of kernel_math.h (exp, erf, tanh) every
    step runs in one ``#pragma omp simd`` pass over each finished output row (all channels,
    contiguous; in L1/L2 by then) reading ``rp[j]``: measured 10-25 % faster than a lane loop
    per register block, whose short loops do not overlap the next block's FMAs."""
    vector = all(EPILOGUE[op].vector for op in spec.epilogue)
    res = "v += ld<L>(rp);" if vector else "v += rp[j];"
    return vector, [res if op == "add" else c_statement(op) for op in spec.epilogue]


def render(spec: DwConvSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (a static kernel: shapes and tiling compiled in)."""
    t, c = cand.tiling, cand.candidate
    vector, steps = _epilogue(spec)
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, s=spec, t=t, oh=spec.oh, ow=spec.ow, rows=spec.interior_rows,
        cols=spec.interior_cols, parts=channel_parts(spec.c, t.cb, t.lanes), n_inputs=spec.n_inputs,
        vector_epilogue=vector, steps=steps)


GENERATOR = Generator("dwconv", __name__, TEMPLATE_NAME, propose, render, DwConvTiling)


def plan(spec: DwConvSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources."""
    return family.plan(GENERATOR, spec, config, target)


def compile_dwconvs(specs: list[DwConvSpec], config: BuildConfig, target: CpuTarget | None = None,
                    **compile_kwargs) -> list[FamilyBuild]:
    """Plan every spec and compile all their candidates in one ``compile_kernels`` call."""
    return family.compile_all(GENERATOR, specs, config, target, **compile_kwargs)


__all__ = ["DwConvSpec", "DwConvSpecError", "DwConvTiling", "GENERATOR", "EPILOGUE_OPS",
           "MAX_CANDIDATES", "channel_parts", "compile_dwconvs", "estimate_us", "fold_affine", "interior",
           "pack_weight", "plan", "propose", "render"]
