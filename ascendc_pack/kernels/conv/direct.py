"""Generated dense direct convolution kernels (NHWC, float32, groups = 1) with tiling candidates.

A :class:`ConvSpec` (static shape, stride, padding, dilation, bias, fused pointwise epilogue)
describes ``y = epilogue(conv2d(x, weight, bias))``. Memory layouts: ``x`` is NHWC (a
channels_last ``[N, C, H, W]`` tensor) or, with ``x_layout="nchw"``, NCHW (a contiguous one, read in
place: an entry convolution needs no relayouted copy of its input; likewise the residual); the weight ``[O, C, kh, kw]`` is repacked once by Python
into output-channel blocks ``[O/OCB][kh][kw][C][OCB]`` (:func:`pack_weight`, zero-padded tail
block; fold an eval BatchNorm into it first with :func:`fold_affine`); ``y`` is NHWC (a
channels_last ``[N, O, OH, OW]`` tensor).

The kernel is the GEMM's register-blocked micro-kernel applied in place (an implicit im2col): a
register tile of ``owb`` output pixels of one row x ``ocb / lanes`` vectors of output channels
accumulates, for every kernel tap and input channel, the broadcast input value of each pixel
times the weight vectors. The cost model (:func:`propose`) ranks up to 10 tilings
(:class:`ConvTiling`); each candidate renders to its own source
(``templates/kernel/directconv.cpp.j2``, the static kernel ABI), so
:func:`ascendc_pack.toolchain.compiler.compile_kernels` caches and compiles them like any fused kernel;
:class:`~ascendc_pack.kernels.conv.direct_launch.ConvKernel` launches one on tensors and
:func:`~ascendc_pack.kernels.conv.direct_launch.eager_reference` is what it must match. docs/DIRECTCONV.md
has the details.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import PackError
from ascendc_pack.ir.epilogue import EPILOGUE, c_statement
from ascendc_pack.kernels import family
from ascendc_pack.kernels.conv.common import EPILOGUE_OPS, UNARY_OPS, ConvGeometry, Pair, fold_affine, interior, out_size  # noqa: F401
from ascendc_pack.kernels.family import PARALLEL_MIN_US, FamilyBuild, Generator, KernelCandidate, Tiling  # noqa: F401
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.fused.tiling import Target
from ascendc_pack.kernels.target import CpuTarget

MAX_CANDIDATES = 10
# memory layouts x and the residual may have: "nhwc" (a channels_last [N, C, H, W] tensor) or
# "nchw" (a contiguous one: read in place, e.g. a graph input, instead of a relayouted copy)
LAYOUTS = ("nhwc", "nchw")
TEMPLATE_NAME = "kernel/directconv.cpp.j2"


class ConvSpecError(PackError, ValueError):
    """A direct-convolution spec or kernel call is inconsistent (the message names the field and
    the fix)."""


@dataclass(frozen=True)
class ConvSpec(ConvGeometry):
    """One static dense convolution ``y = epilogue(conv2d(x, w, bias, stride, padding,
    dilation))`` (groups = 1): ``x`` ``[n, c_in, h, w]`` stored ``x_layout`` (NHWC by default),
    weight ``[c_out, c_in, kh, kw]`` (read packed, :func:`pack_weight`), ``y`` NHWC
    ``[n, oh, ow, c_out]``; float32. ``epilogue`` steps run in order after the bias (see
    :data:`EPILOGUE_OPS`; one ``add`` at most: the residual of y's shape, stored
    ``residual_layout``)."""

    error = ConvSpecError
    kind = "direct conv"

    name: str
    n: int
    c_in: int
    c_out: int
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
    x_layout: str = "nhwc"
    residual_layout: str = "nhwc"

    def __post_init__(self):
        self.check_fields(("n", "c_in", "c_out", "h", "w", "kh", "kw"))
        if self.dtype != "float32":
            raise ConvSpecError(f"direct conv {self.name}: dtype must be float32, got {self.dtype!r}; "
                                f"other dtypes run as ATen")
        for what in ("x_layout", "residual_layout"):
            if getattr(self, what) not in LAYOUTS:
                raise ConvSpecError(f"direct conv {self.name}: {what} must be one of {', '.join(LAYOUTS)}, got "
                                    f"{getattr(self, what)!r}")
        if not isinstance(self.bias, bool):
            raise ConvSpecError(f"direct conv {self.name}: bias must be True or False, got {self.bias!r}")
        object.__setattr__(self, "epilogue", tuple(self.epilogue))
        bad = [op for op in self.epilogue if op not in EPILOGUE_OPS]
        if bad:
            raise ConvSpecError(f"direct conv {self.name}: unsupported epilogue step(s) {bad}; fusable steps "
                                f"are {', '.join(EPILOGUE_OPS)} (leave others to a separate kernel)")
        self.check_geometry()
        if self.n * max(self.h * self.w * self.c_in, self.oh * self.ow * self.c_out) >= 1 << 31:
            raise ConvSpecError(f"direct conv {self.name}: a tensor of 2^31 elements or more; split the batch "
                                f"(n) or leave the convolution to ATen")


    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """The output as torch shapes it, ``[N, O, OH, OW]`` (stored channels_last)."""
        return (self.n, self.c_out, self.oh, self.ow)


    @property
    def flops(self) -> int:
        return 2 * self.n * self.oh * self.ow * self.c_out * self.c_in * self.kh * self.kw

    @staticmethod
    def from_conv(name: str, x_shape, weight_shape, stride=1, padding=0, dilation=1, *, bias: bool = False,
                  epilogue=(), x_layout: str = "nhwc", residual_layout: str = "nhwc") -> ConvSpec:
        """The spec of ``conv2d(x, weight, stride=, padding=, dilation=)`` (groups 1) on ``x`` of
        ``x_shape`` ``[N, C, H, W]`` (as torch shapes it; stored as ``x_layout`` says) and a
        weight of ``weight_shape`` ``[O, C, kh, kw]``."""
        n, c, h, w = x_shape
        o, wc, kh, kw = weight_shape
        if wc != c:
            raise ConvSpecError(f"direct conv {name}: the weight has {wc} input channels, x has {c}; only "
                                f"groups=1 convolutions are generated (depthwise ones: dwconv)")
        return ConvSpec(name, n, c, o, h, w, kh, kw, stride, padding, dilation, bias=bias, epilogue=tuple(epilogue),
                        x_layout=x_layout, residual_layout=residual_layout)

    def to_json(self) -> dict:
        return {**asdict(self), "epilogue": list(self.epilogue)}

    @staticmethod
    def from_json(d: dict) -> ConvSpec:
        return ConvSpec(**{**d, **{k: tuple(d[k]) for k in ("stride", "padding", "dilation", "epilogue")}})

    def spec_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def pack_weight(weight: torch.Tensor, ocb: int) -> torch.Tensor:
    """A dense weight ``[O, C, kh, kw]`` as the ``[ceil(O/ocb), kh, kw, C, ocb]`` float32 blocks
    the kernel reads (``ocb``: the candidate's output-channel block, ``ConvKernel.ocb``); output
    channels past O are zero."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        raise ConvSpecError(f"a dense convolution weight is a [O, C, kh, kw] tensor, got "
                            f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if not isinstance(ocb, int) or isinstance(ocb, bool) or ocb < 1:
        raise ConvSpecError(f"pack_weight: ocb must be a positive int (the candidate's ConvKernel.ocb), got {ocb!r}")
    o, c, kh, kw = weight.shape
    blocks = -(-o // ocb)
    padded = torch.zeros(blocks * ocb, c, kh, kw, dtype=torch.float32)
    padded[:o] = weight.detach()
    return padded.view(blocks, ocb, c, kh, kw).permute(0, 3, 4, 2, 1).contiguous()


# ----------------------------------------------------------------------------- tiling + cost


@dataclass(frozen=True)
class ConvTiling(Tiling):
    """A candidate's parameters: ``ocb`` output channels per block (``ocb / lanes`` vectors per
    register tile), ``owb`` output pixels of a row per register tile (``owb x ocb / lanes``
    accumulators), ``kc`` input channels per block (the block's weights, ``kh x kw x kc x ocb``,
    stay in L1 while the rows of a task run; earlier blocks accumulate in y), ``rb`` output rows
    per task, ``bd`` threads (OpenMP over batch x row blocks x channel blocks)."""

    ocb: int
    owb: int
    kc: int
    rb: int
    bd: int
    lanes: int

    kind = "direct-convolution"
    error = ConvSpecError

def check_tiling(spec: ConvSpec, t: ConvTiling, target: CpuTarget) -> None:
    """Raise :class:`ConvSpecError` unless ``t`` is a tiling the template can build for
    ``spec`` on ``target`` (vector width, register file, thread limit)."""
    problems = []
    if t.lanes != target.lanes:
        problems.append(f"lanes={t.lanes}, the target's vectors hold {target.lanes} floats")
    if t.ocb < t.lanes or t.ocb % t.lanes:
        problems.append(f"ocb={t.ocb} is not a positive multiple of lanes={t.lanes}")
    if min(t.owb, t.kc, t.rb, t.bd) < 1:
        problems.append("owb, kc, rb and bd must be >= 1")
    elif (t.owb * (t.ocb // t.lanes) * (2 if t.owb * t.ocb // t.lanes < 8 else 1) + t.ocb // t.lanes + 1
          > target.registers):
        problems.append(f"owb={t.owb} x ocb/lanes={t.ocb // t.lanes} accumulators, the weight vectors and a "
                        f"broadcast need more than {target.registers} registers")
    if t.bd > target.cores:
        problems.append(f"bd={t.bd} exceeds the core limit {target.cores}")
    if problems:
        raise ConvSpecError(f"direct conv {spec.name}: tiling {t.tiling_repr} cannot be built: " + "; ".join(problems))


def row_tiles(ow: int, owb: int) -> list[tuple[int, int]]:
    """(first column, pixels) of a row's register tiles: ``ceil(ow / owb)`` tiles of two sizes
    differing by one, the larger first (56 columns, owb 6: 6 x 6 then 4 x 5; no short tail)."""
    nt = -(-ow // owb)
    hi = -(-ow // nt)
    n_hi = ow - (hi - 1) * nt
    sizes = [hi] * n_hi + [hi - 1] * (nt - n_hi)
    return [(sum(sizes[:i]), p) for i, p in enumerate(sizes)]


def edge_floats(spec: ConvSpec, t: ConvTiling) -> int:
    """Floats of one thread's edge buffer (the zero-padded input patch of a tile reading padding
    columns), 0 when no tile reads padding."""
    lo, hi = spec.interior_cols
    tiles = row_tiles(spec.ow, t.owb)
    if all(ow0 >= lo and ow0 + p <= hi for ow0, p in tiles):
        return 0
    span = (tiles[0][1] - 1) * spec.stride[1] + (spec.kw - 1) * spec.dilation[1] + 1
    return spec.kh * span * min(t.kc, spec.c_in)


def workspace_bytes(spec: ConvSpec, t: ConvTiling) -> int:
    """Scratch bytes a candidate needs: an edge buffer per thread (64 spare bytes align it)."""
    per_thread = -(-edge_floats(spec, t) // 16) * 16 * 4
    return t.bd * per_thread + 64 if per_thread else 0


# Fraction of FMA peak the template's register tile reaches, by vectors (nv) and pixels (p):
# measured single-threaded with the micro-kernel alone sweeping an image (3x3 C=64 and the 7x7/2
# C=3 stem, best of 3 under load) on the build host (AVX2, Zen 3, 16 registers, FMA peak 89
# GFLOP/s). One-vector tiles broadcast one input per FMA and issue about one broadcast per cycle;
# one-pixel tiles load more weight vectors than they use twice
_EFF = {1: {1: 0.27, 2: 0.47, 3: 0.6, 4: 0.65, 5: 0.68, 6: 0.65, 7: 0.65, 8: 0.7, 10: 0.7, 12: 0.7, 14: 0.7},
        2: {1: 0.42, 2: 0.78, 3: 0.88, 4: 0.93, 5: 0.94, 6: 0.97},
        3: {1: 0.5, 2: 0.65, 3: 0.8, 4: 0.92},
        4: {1: 0.5, 2: 0.85}}
# Machine constants of the estimate (cycles unless named). Rank only: fitted to the measured
# single-thread times of resnet18's convolutions on the build host, see docs/DIRECTCONV.md
FMA_PORTS = 2.0
IN_SITU = 0.88  # the tile in the kernel (input rows and y streaming by) vs alone
TILE_CYCLES = 60.0  # a register tile's call, row setup and store
EDGE_COPY_CYCLES = 1.5  # per vector of an edge tile's copied patch
L2_MISFIT = 1.15  # a channel block's weights (kh x kw x kc x ocb) do not stay in L2
L1_CONFLICT = 1.6  # an input block's taps map to more L1 lines per set than it has ways


def tile_cycles(p: int, nv: int) -> float:
    """Cycles per (tap, input channel) step of a p-pixel x nv-vector register tile."""
    eff = _EFF.get(nv, {}).get(p) or min(_EFF.get(nv, _EFF[4]).values())
    return p * nv / FMA_PORTS / (eff * IN_SITU)


def l1_conflict(spec: ConvSpec, ocb: int, kc: int, l1d: int) -> bool:
    """Whether the weights of an input block (kh x kw taps of kc x ocb floats, taps c_in x ocb
    floats apart) put more lines in one L1 set than it has ways (64 sets of 64 B assumed): with
    c_in x ocb x 4 a multiple of 4 KiB every tap lands on the same sets and an input block thrashes
    L1 (measured 1.3-2x slower)."""
    if kc >= spec.c_in:
        return False
    sets, ways = 64, max(1, l1d // 4096)
    count = [0] * sets
    lines = -(-kc * ocb * 4 // 64)
    for tap in range(spec.kh * spec.kw):
        first = tap * spec.c_in * ocb * 4 // 64
        for i in range(min(lines, sets)):
            count[(first + i) % sets] += 1 + (lines - 1 - i) // sets
    return max(count) > ways


def _row_taps(spec: ConvSpec) -> list[int]:
    (_, size, k, s, p, d), _ = spec._axes()
    return [sum(0 <= o * s - p + i * d < size for i in range(k)) for o in range(spec.oh)]


def estimate_us(spec: ConvSpec, t: ConvTiling, target: CpuTarget) -> float:
    """Rank-only estimate of one call (microseconds): the busiest thread's register tiles (pixel,
    channel and input-channel tails, padded kernel rows skipped, edge tiles' copies, weights
    missing L2 or conflicting in L1, the epilogue), or, when larger, moving the tensors (input
    once per channel block, weights once per row block, y once per input block) from memory;
    plus the wake-up and closing barrier of a parallel region (tiling.Target)."""
    s, vec = spec, t.lanes
    kc = min(t.kc, s.c_in)
    kblocks = [(kc, s.c_in // kc)] + ([(s.c_in % kc, 1)] if s.c_in % kc else [])
    full_ob, tail_o = divmod(s.c_out, t.ocb)
    oblocks = [(t.ocb // vec, full_ob)] + ([(-(-tail_o // vec), 1)] if tail_o else [])
    lo, hi = s.interior_cols
    tiles = row_tiles(s.ow, t.owb)
    span = lambda p: (p - 1) * s.stride[1] + (s.kw - 1) * s.dilation[1] + 1  # noqa: E731
    w_block = s.kh * s.kw * kc * t.ocb * 4
    factor = (L2_MISFIT if w_block > target.l2 * 0.5 else 1.0) * \
        (L1_CONFLICT if l1_conflict(s, t.ocb, kc, target.l1d) else 1.0)
    epi = 1 + int(s.bias) + sum(EPILOGUE[op].cycles for op in s.epilogue)
    taps = sum(_row_taps(s)) * s.kw  # taps of one output column over every row of an image
    cyc_image = 0.0  # one image, every channel block and input block
    for nv, ob_count in oblocks:
        cyc_image += ob_count * s.oh * s.ow * nv * epi  # the epilogue, once per output vector
        for kcl, kb_count in kblocks:
            row = 0.0  # one output row; its steps are those of an average row
            for ow0, p in tiles:
                edge = not (ow0 >= lo and ow0 + p <= hi)
                copy = EDGE_COPY_CYCLES * s.kh * span(p) * -(-kcl // vec) if edge else 0.0
                row += TILE_CYCLES + copy + 2 * p * nv + tile_cycles(p, nv) * kcl * factor * taps / s.oh
            cyc_image += ob_count * kb_count * row * s.oh
    ohb = -(-s.oh // t.rb)
    obs = full_ob + int(bool(tail_o))
    tasks = s.n * ohb * obs
    busiest = -(-tasks // t.bd) * cyc_image / (ohb * obs)  # tasks are about equal
    compute = busiest / (target.ghz * 1e3)
    # traffic: x once per channel block (from L2 when a task's input rows fit half of it), the
    # weights once per row block (from L2 when a block's fit), y once per input block
    x_bytes = s.n * s.h * s.w * s.c_in * 4
    w_bytes = obs * t.ocb * s.c_in * s.kh * s.kw * 4
    y_bytes = s.n * s.oh * s.ow * s.c_out * 4 * (2 * -(-s.c_in // kc) - 1 + int(s.residual))
    rows_in = min(s.h, (t.rb - 1) * s.stride[0] + (s.kh - 1) * s.dilation[0] + 1)
    x_mem = x_bytes * (1 if rows_in * s.w * s.c_in * 4 <= target.l2 * 0.5 else obs)
    w_mem = w_bytes * (1 if w_bytes <= target.l2 * 0.5 else s.n * ohb)
    mem = (x_mem + w_mem + y_bytes) / (target.mem_gbps * 1e3 * min(t.bd, tasks))
    us = max(compute, mem) + 0.2 * min(compute, mem)
    if t.bd > 1:
        us += Target.parallel_overhead_us + Target.barrier_us
    return us


def _register_tiles(target: CpuTarget, spec: ConvSpec) -> list[tuple[int, int]]:
    """(pixels, vectors) tiles whose accumulators, weight vectors and a broadcast fit the
    registers (the GEMM's rule), pixels as the rows really get them (:func:`row_tiles`), no
    vectors past the output channels."""
    cvec = -(-spec.c_out // target.lanes)
    out = []
    for nv in (1, 2, 3, 4, 6):
        for p in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14):
            accs = p * nv * (2 if p * nv < 8 else 1)
            if accs + nv + 1 > target.registers or (nv > 1 and nv > cvec):
                continue
            tile = (row_tiles(spec.ow, p)[0][1], nv)  # the largest tile a row really gets
            if tile not in out:
                out.append(tile)
    return out


def _space(spec: ConvSpec, target: CpuTarget) -> list[ConvTiling]:
    vec, cores = target.lanes, target.cores
    bds = sorted({1, cores} | ({cores // 2} if cores >= 4 else set()))
    out = []
    for p, nv in _register_tiles(target, spec):
        ocb = nv * vec
        # all channels, or an input block whose weights take half of L1 / all of it (when its
        # taps do not conflict in L1: with c_in x ocb x 4 a multiple of 4 KiB they all would)
        kcs = {spec.c_in}
        for f in (0.5, 1.0):
            kc = int(target.l1d * f / (spec.kh * spec.kw * ocb * 4)) // 8 * 8
            if 8 <= kc < spec.c_in and not l1_conflict(spec, ocb, kc, target.l1d):
                kcs.add(kc)
        obs = -(-spec.c_out // ocb)
        in_row = spec.w * spec.c_in * 4  # bytes of one input row
        fit = (int(target.l2 * 0.5 / in_row) - (spec.kh - 1) * spec.dilation[0] - 1) // spec.stride[0] + 1
        for bd in bds:
            # one task per image and channel block, rows whose input takes half of L2, or row
            # blocks that give every thread 1, 2 or 4 tasks
            rbs = {spec.oh} | ({max(1, fit)} if fit < spec.oh else set())
            for split in ((1, 2, 4) if bd > 1 else ()):
                ohb = -(-bd * split // (spec.n * obs))
                rbs.add(-(-spec.oh // min(ohb, spec.oh)))
            for rb in sorted(rbs):
                tasks = spec.n * -(-spec.oh // rb) * obs
                if bd > 1 and tasks < bd:
                    continue
                for kc in sorted(kcs):
                    out.append(ConvTiling(ocb, p, kc, rb, bd, vec))
    return out


def propose(spec: ConvSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 10)`` distinct candidates, best (lowest estimate) first, deterministic,
    never more threads than ``target.cores``. Multi-thread candidates appear only where the best
    single-thread estimate is at least :data:`PARALLEL_MIN_US` and they are within
    ``PAYOFF_MARGIN`` of it. The list keeps variety for PGO: the best of every thread count, then
    of up to three register tiles per thread count, then the best input-blocked one (kc < c_in)
    come before the runners-up."""
    scored = family.scored(spec, target, _space(spec, target), workspace_bytes, estimate_us)
    ranked: dict[int, KernelCandidate] = {}  # by id: insertion-ordered
    firsts: dict = {}
    for c in scored:
        firsts.setdefault(("bd", c.tiling.bd), c)
        tiles = firsts.setdefault(("tiles", c.tiling.bd), {})
        if len(tiles) < 3:
            tiles.setdefault((c.tiling.owb, c.tiling.ocb), c)
        if c.tiling.kc < spec.c_in:
            firsts.setdefault(("kc",), c)
    for key, value in firsts.items():
        if key[0] != "tiles":
            ranked.setdefault(id(value), value)
    for key, value in firsts.items():
        for c in (value.values() if key[0] == "tiles" else ()):
            ranked.setdefault(id(c), c)
    for c in scored:
        ranked.setdefault(id(c), c)
    return sorted(list(ranked.values())[:max(1, min(topn, MAX_CANDIDATES))],
                  key=lambda c: (c.est_us, c.candidate.tiling_repr))


# ----------------------------------------------------------------------------- render + build


_RESIDUAL_C = {"nhwc": "v += rp[j];", "nchw": "v += rp[j * OH * OW];"}


def epilogue_lines(spec: ConvSpec) -> list[str]:
    """C statements on the float ``v`` of output channel ``j`` of a tile row: bias, the steps."""
    return (["v += bp[j];"] if spec.bias else []) + \
        [_RESIDUAL_C[spec.residual_layout] if op == "add" else c_statement(op) for op in spec.epilogue]


def render(spec: ConvSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (a static kernel: shapes and tiling compiled in)."""
    t, c = cand.tiling, cand.candidate
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, s=spec, t=t, oh=spec.oh, ow=spec.ow, cols=spec.interior_cols,
        ob=-(-spec.c_out // t.ocb), n_inputs=spec.n_inputs, steps=epilogue_lines(spec),
        thread_floats=-(-edge_floats(spec, t) // 16) * 16)


GENERATOR = Generator("directconv", __name__, TEMPLATE_NAME, propose, render, ConvTiling, workspace_bytes,
                      estimate_us, check_tiling)


def plan(spec: ConvSpec, config: BuildConfig, target: CpuTarget | None = None,
         tilings: list[ConvTiling] | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` (or take ``tilings`` as given, in that
    order: e.g. one fixed tiling per step) and render their sources."""
    return family.plan(GENERATOR, spec, config, target, tilings)


def compile_convs(specs: list[ConvSpec], config: BuildConfig, target: CpuTarget | None = None,
                  **compile_kwargs) -> list[FamilyBuild]:
    """Plan every spec and compile all their candidates in one ``compile_kernels`` call."""
    return family.compile_all(GENERATOR, specs, config, target, **compile_kwargs)


__all__ = ["GENERATOR", "ConvSpec", "ConvSpecError", "ConvTiling", "EPILOGUE_OPS",
           "MAX_CANDIDATES", "PARALLEL_MIN_US", "UNARY_OPS", "check_tiling", "compile_convs", "edge_floats",
           "epilogue_lines", "estimate_us", "fold_affine", "interior", "l1_conflict", "pack_weight", "plan", "propose",
           "render", "row_tiles", "tile_cycles", "workspace_bytes"]
