"""Generated AMX bfloat16 convolutions: a dense float32 :class:`~ascendc_pack.kernels.conv.direct.ConvSpec`
(NHWC ``x`` and residual, groups 1) computed as an implicit GEMM on the AMX tile unit
(``TDPBF16PS``: bfloat16 operands, float32 accumulation).

The GEMM is ``M = n*oh*ow`` output pixels by ``N = c_out`` channels over ``K = kh*kw*c_in`` taps.
Each task gathers its pixels' taps from ``x`` and rounds them to bfloat16 in its workspace (the
im2col of the block, zero at padding taps), then runs the AMX GEMM's tile blocks
(``templates/kernel/gemm_amx.cpp.j2`` with ``conv``: one template for both) on the weight, rounded
and packed at build by :func:`pack_weight`; the bias, a residual ``add`` and an activation run in
float32 on the tile results. The kernel ABI is the direct convolution's (``x``, packed weight,
bias, residual; channels_last ``y``), so the graph launches it like one.

**Direct** (:data:`DIRECT`, ``c_in`` a multiple of 32): the im2col copies every input value
``kh·kw`` times (as much work as the tile products for resnet18's 3x3 convolutions), so this
variant instead rounds the rows of ``x`` a task reads, with their zero padding, into the thread's
workspace as its strips reach them (no pass of its own: the rounding runs beside the tile products
of the rows before), and reads every A tile from there in place: 16 consecutive output pixels of
one row (a strip; the pixels past the row's end are computed and dropped) at one tap and 32
channels, rows ``stride·C`` apart. Its tasks are output rows of an image times column blocks
(:class:`AmxDirectTiling`). Rounding per task instead of in a pool job of its own before the
tasks: resnet18's 64@56 3x3 convolution 81 → 64 µs, 128@28 74 → 65, the 7x7 stem (kernel rows,
below) 168 → 135, 256@14 63 → 68 (its tasks round 9 of 16 rows each).

**NCHW input**: an entry convolution's ``x`` may be NCHW, read in place by the im2col gather; its
taps are then ordered (i, c, j), so a channel's kernel row is one run of x (``pack_weight(w,
"nchw")``): a ViT's patch embedding needs no relayout of the image.

**Kernel rows** (:data:`ROWS`, an NCHW ``x`` of at most 4 channels: a CNN's stem): the direct
variant once more, but x is rounded per call into ``CP`` (2 or 4) channels a pixel, the ones past
``C`` zero, so a kernel row's taps (``KW * CP`` values, at most 32) are one run of it, and an A
tile of that depth (16 rows of 28 values for a 7x7 RGB stem) is read in place: ``KH`` tile
products a strip per column tile where the im2col gathers ``KH * KW * C`` values per output pixel
(``pack_weight(w, "rows")``). The zero channels make every tile row exactly its pixel's taps.

Why: on this host oneDNN's bfloat16 convolutions left resnet18 at 6.1 ms where OpenVINO's bfloat16
runs it in 2.5; they wake an OpenMP team per call and keep activations in bfloat16 between steps
(a cast kernel on each side). Offered only with ``--precision bf16`` / ``auto`` on a host with
AMX-BF16 (:func:`ascendc_pack.kernels.gemm.amx.amx_offered`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels import family
from ascendc_pack.kernels.conv.direct import ConvSpec, ConvSpecError
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.gemm.amx import (TEMPLATE_NAME, AmxTiling, c_buffer_bytes, rank, space, thread_bytes,
                                          workspace_bytes)
from ascendc_pack.kernels.gemm.generator import _epilogue_lines
from ascendc_pack.kernels.target import CpuTarget

MIN_CHANNELS = 16
"""Output channels below a tile's 16 columns waste most of every tile product."""


@dataclass(frozen=True)
class AmxConvTiling(AmxTiling):
    """The AMX GEMM's tiling over the implicit GEMM's rows (output pixels) and columns (channels)."""

    error = ConvSpecError
    kind = "AMX convolution"


@dataclass(frozen=True)
class ImplicitGemm:
    """The GEMM a convolution is (what the AMX GEMM's cost model and workspace read)."""

    m: int
    n: int
    k: int
    epilogue: tuple[str, ...]


def implicit_gemm(spec: ConvSpec) -> ImplicitGemm:
    return ImplicitGemm(spec.n * spec.oh * spec.ow, spec.c_out, spec.kh * spec.kw * spec.c_in, spec.epilogue)


def amx_conv_applies(spec: ConvSpec) -> str | None:
    """Why ``spec`` has no AMX kernel (None: it has). ``x`` may be NCHW (an entry convolution read
    in place: its taps ordered (i, c, j), each kernel row of a channel one run of x); the residual
    is read NHWC."""
    if spec.residual and spec.residual_layout != "nhwc":
        return "the residual must be NHWC (channels_last)"
    if spec.c_out < MIN_CHANNELS:
        return f"{spec.c_out} output channels (a tile has {MIN_CHANNELS} columns)"
    return None


def _kp(k: int) -> int:
    return -(-k // 32) * 32


ROWS_MAX_CHANNELS = 4
"""The kernel-row variant's input channels at most (rounded into 2 or 4 a pixel)."""


def rows_channels(c_in: int) -> int:
    """The channels a pixel of x has once rounded for the kernel-row variant: ``c_in`` rounded up
    to 2 or 4 (an even count, so a kernel row's taps are whole bfloat16 pairs)."""
    return 2 if c_in <= 2 else 4


def packed_shape(spec: ConvSpec, rows: bool = False) -> tuple[int, int, int, int]:
    """The packed weight's shape: ``[ceil(O/16), KP/2, 16, 2]`` bfloat16 (KP: K padded to 32; K
    counts :func:`rows_channels` a tap with ``rows``)."""
    c = rows_channels(spec.c_in) if rows else spec.c_in
    return (-(-spec.c_out // 16), _kp(spec.kh * spec.kw * c) // 2, 16, 2)


def pack_weight(weight: torch.Tensor, x_layout: str = "nhwc") -> torch.Tensor:
    """A dense weight ``[O, C, kh, kw]`` rounded to bfloat16 (to nearest even) in the layout the
    tile unit reads: 16-column panels of k pairs, ``packed[p, k // 2, j, k % 2] = W[16p + j]`` at
    tap ``k = (i * kw + j') * C + c`` (``x_layout`` ``"nchw"``: ``k = (i * C + c) * kw + j'``;
    ``"rows"``: the ``"nhwc"`` order over :func:`rows_channels` channels, zero past C); zero past
    O and past K."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        raise ConvSpecError(f"a dense convolution weight is a [O, C, kh, kw] tensor, got "
                            f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if x_layout == "rows":
        o, c = weight.shape[:2]
        weight = torch.cat([weight.detach().float(), weight.new_zeros(o, rows_channels(c) - c, *weight.shape[2:])], 1)
    o, c, kh, kw = weight.shape
    k, panels = kh * kw * c, -(-o // 16)
    b = torch.zeros(_kp(k), panels * 16, dtype=torch.float32)
    taps = (2, 1, 3, 0) if x_layout == "nchw" else (2, 3, 1, 0)
    b[:k, :o] = weight.detach().float().permute(*taps).reshape(k, o)
    return b.to(torch.bfloat16).view(-1, 2, panels, 16).permute(2, 0, 3, 1).contiguous()


@dataclass(frozen=True)
class AmxDirectTiling(Tiling):
    """``mr`` 16 or 32 (one or two strips a block), ``nr`` 16 or 32 columns, ``rows`` output rows
    of one image a task, ``nc`` columns a task, ``bd`` threads."""

    mr: int
    nr: int
    rows: int
    nc: int
    bd: int

    error = ConvSpecError
    kind = "direct AMX convolution"


MIN_STRIP_FILL = 0.75
"""The share of its strips' 16 rows an output row must fill for the direct variant: resnet18's
7-pixel rows fill 44 % and ran 1.4x slower than the im2col kernel (450 vs 313 µs), 14-pixel rows
fill 88 % and ran 1.3x faster (147 vs 192)."""


def direct_applies(spec: ConvSpec) -> str | None:
    """Why ``spec`` has no direct AMX kernel (None: it has)."""
    why = amx_conv_applies(spec)
    if why is None and spec.x_layout != "nhwc":
        why = "x must be NHWC (channels_last)"
    if why is None and spec.c_in % 32:
        why = f"{spec.c_in} input channels (a tile reads 32 of one tap)"
    return why


def _strips_filled(spec: ConvSpec, why: str | None) -> str | None:
    """``why``, else why the output rows do not fill :data:`MIN_STRIP_FILL` of their strips (the
    direct variants compute every strip's 16 pixels)."""
    fill = spec.ow / (16 * -(-spec.ow // 16))
    if why is None and fill < MIN_STRIP_FILL:
        why = f"{spec.ow}-pixel output rows fill {fill:.0%} of their 16-pixel strips"
    return why


def direct_pays(spec: ConvSpec) -> str | None:
    """Why the direct variant is not offered for ``spec`` (None: it is): it must apply, and the
    output rows must fill :data:`MIN_STRIP_FILL` of their strips."""
    return _strips_filled(spec, direct_applies(spec))


def rows_applies(spec: ConvSpec) -> str | None:
    """Why ``spec`` has no kernel-row AMX kernel (None: it has)."""
    why = amx_conv_applies(spec)
    if why is None and spec.x_layout != "nchw":
        why = "x must be NCHW (an entry convolution's input)"
    if why is None and spec.c_in > ROWS_MAX_CHANNELS:
        why = f"{spec.c_in} input channels (the kernel-row variant rounds at most {ROWS_MAX_CHANNELS} a pixel)"
    if why is None and spec.dilation[1] != 1:
        why = f"horizontal dilation {spec.dilation[1]} (a kernel row's taps must be adjacent)"
    if why is None and spec.kw * rows_channels(spec.c_in) > 32:
        why = f"{spec.kw}-tap kernel rows of {rows_channels(spec.c_in)} channels exceed a tile row's 32 values"
    return why


def rows_pays(spec: ConvSpec) -> str | None:
    """Why the kernel-row variant is not offered for ``spec`` (None: it is)."""
    return _strips_filled(spec, rows_applies(spec))


def _rows(spec: ConvSpec) -> bool:
    """A direct tiling of ``spec`` renders the kernel-row variant (the plain one needs NHWC x)."""
    return spec.x_layout == "nchw"


def task_rows(spec: ConvSpec, rows: int) -> int:
    """The padded rows of x a task of ``rows`` output rows reads."""
    return (rows - 1) * spec.stride[0] + (spec.kh - 1) * spec.dilation[0] + 1


def xp_bytes(spec: ConvSpec, t: AmxDirectTiling) -> int:
    """A thread's rounded, zero-padded rows of x ([rows][w + 2p][c] bfloat16, :func:`rows_channels`
    channels in the kernel-row variant) and the slack a last strip reads."""
    wp = spec.w + 2 * spec.padding[1]
    c = rows_channels(spec.c_in) if _rows(spec) else spec.c_in
    return -(-(task_rows(spec, t.rows) * wp * c + 16 * spec.stride[1] * c + 32) * 2 // 64) * 64


def _direct_thread_bytes(spec: ConvSpec, t: AmxDirectTiling) -> int:
    """A thread's rounded rows of x and its C buffers (:func:`c_buffer_bytes`)."""
    return xp_bytes(spec, t) + c_buffer_bytes(t)


def direct_workspace(spec: ConvSpec, t: AmxDirectTiling) -> int:
    return t.bd * _direct_thread_bytes(spec, t) + 64


def direct_estimate_us(spec: ConvSpec, t: AmxDirectTiling, target: CpuTarget) -> float:
    """Rank-only estimate (µs): per task the rounding of the rows of x it reads, its strip blocks'
    tile products (16 cycles each, a block's loads beside them) and epilogues; the busiest thread;
    a fork/join of the pool when threaded."""
    strips_per_row = -(-spec.ow // 16)
    ksteps = spec.kh if _rows(spec) else spec.kh * spec.kw * spec.c_in // 32
    tm, tn = t.mr // 16, t.nr // 16
    row_rounding = (spec.w + 2 * spec.padding[1]) * spec.c_in / 16 * 2

    def task(rows: int, cols: int) -> float:
        blocks = -(-rows * strips_per_row // tm) * -(-cols // t.nr)
        return 200 + task_rows(spec, rows) * row_rounding + \
            blocks * (ksteps * (max(16 * tm * tn, 10 * (tm + tn)) + 4) + 40 * tm * tn + 16 * tm * tn * 8)

    tasks = [task(min(t.rows, spec.oh - r), min(t.nc, spec.c_out - j))
             for j in range(0, spec.c_out, t.nc) for _ in range(spec.n) for r in range(0, spec.oh, t.rows)]
    loads = [0.0] * t.bd
    for c in sorted(tasks, reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads) / (target.ghz * 1e3) + (4.0 if t.bd > 1 else 0.0)


def propose_direct(spec: ConvSpec, target: CpuTarget, topn: int = 6) -> list[KernelCandidate]:
    """Up to ``min(topn, 6)`` distinct candidates, best (lowest estimate) first: strips 1 or 2 a
    block, 16 or 32 columns a block, every core or one, rows per task balancing the threads."""
    out, seen = [], set()
    for bd in sorted({1, target.cores}):
        for rows in sorted({max(1, -(-spec.oh // (k * bd))) for k in (1, 2, 4)}):
            for mr in (32, 16):
                for nr in (32, 16):
                    if nr > 16 and spec.c_out <= 16:
                        continue
                    nc = -(-spec.c_out // nr) * nr
                    t = AmxDirectTiling(mr, nr, rows, nc, bd)
                    cand = Candidate(t.tiling_repr, direct_workspace(spec, t), bd)
                    if cand.kernel_key not in seen:
                        seen.add(cand.kernel_key)
                        out.append(KernelCandidate(t, cand, direct_estimate_us(spec, t, target)))
    out.sort(key=lambda c: (c.est_us, c.candidate.tiling_repr))
    return out[:max(1, min(topn, 6))]


def propose(spec: ConvSpec, target: CpuTarget, topn: int = 6) -> list[KernelCandidate]:
    """Up to ``min(topn, 6)`` distinct candidates, best (lowest estimate) first; a row's gather
    costs about two strided rows' rounding (one run per tap)."""
    g = implicit_gemm(spec)
    return rank(g, space(g.m, g.n, target.cores, AmxConvTiling), target, topn, gather=2.0)


def _interleave(cp: int) -> list[list[int]]:
    """The kernel-row variant's rounding of x: for each 32-value vector of 16 pixels x ``cp``
    channels, where its element ``e`` (pixel p, channel c) comes from in ``[channel 0 | channel 1]``
    (indices below 32) and ``[channel 2 | channel 3]`` (``_mm512_permutex2var_epi16``)."""
    out = []
    for v in range(cp // 2):
        pix = [((32 * v + e) // cp, e % cp) for e in range(32)]
        out.append([(32 if c >= 2 else 0) + (c % 2) * 16 + p for p, c in pix])
    return out


def render(spec: ConvSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (shapes and tiling compiled in; a :class:`AmxDirectTiling`
    renders the direct variant, the kernel-row one for an NCHW ``x``)."""
    direct = cand is not None and isinstance(cand.tiling, AmxDirectTiling)
    rows = direct and _rows(spec)
    why = rows_applies(spec) if rows else direct_applies(spec) if direct else amx_conv_applies(spec)
    if why is not None:
        variant = "kernel-row " if rows else "direct " if direct else ""
        raise ConvSpecError(f"direct conv {spec.name}: no {variant}AMX kernel: {why}")
    g, t, c = implicit_gemm(spec), cand.tiling, cand.candidate
    cp = rows_channels(spec.c_in) if rows else spec.c_in
    if rows:
        g = dataclasses.replace(g, k=spec.kh * spec.kw * cp)
    conv = dict(n=spec.n, h=spec.h, w=spec.w, c=spec.c_in, oh=spec.oh, ow=spec.ow, kh=spec.kh, kw=spec.kw,
                stride=spec.stride, padding=spec.padding, dilation=spec.dilation, direct=direct,
                nchw=spec.x_layout == "nchw", rows=rows, cp=cp, kstep=spec.kw * cp if rows else 32,
                interleave=_interleave(cp) if rows else None)
    per_thread = _direct_thread_bytes(spec, t) if direct else thread_bytes(g, t)
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, m=g.m, n=g.n, k=g.k, conv=conv, bias=spec.bias,
        residuals=[(0, g.n, 1)] if spec.residual else [], t=t, thread_bytes=per_thread,
        xp_bytes=xp_bytes(spec, t) if direct else 0, n_inputs=spec.n_inputs, epilogue=_epilogue_lines(spec))


GENERATOR = Generator("conv_amx", __name__, TEMPLATE_NAME, propose, render, AmxConvTiling,
                      lambda spec, t: workspace_bytes(implicit_gemm(spec), t))
DIRECT = Generator("conv_amx_direct", __name__, TEMPLATE_NAME, propose_direct, render, AmxDirectTiling,
                   direct_workspace, direct_estimate_us)
ROWS = Generator("conv_amx_rows", __name__, TEMPLATE_NAME, propose_direct, render, AmxDirectTiling,
                 direct_workspace, direct_estimate_us)


def plan(spec: ConvSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources."""
    return family.plan(GENERATOR, spec, config, target)


def plan_direct(spec: ConvSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """The direct variant's :func:`plan`."""
    return family.plan(DIRECT, spec, config, target)


def plan_rows(spec: ConvSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """The kernel-row variant's :func:`plan`."""
    return family.plan(ROWS, spec, config, target)


__all__ = ["AmxConvTiling", "AmxDirectTiling", "DIRECT", "GENERATOR", "ImplicitGemm", "MIN_CHANNELS", "MIN_STRIP_FILL",
           "ROWS", "ROWS_MAX_CHANNELS", "amx_conv_applies", "direct_applies", "direct_pays", "implicit_gemm",
           "pack_weight", "packed_shape", "plan", "plan_direct", "plan_rows", "propose", "propose_direct", "render",
           "rows_applies", "rows_channels", "rows_pays", "xp_bytes"]
