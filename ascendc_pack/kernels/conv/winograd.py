"""Generated Winograd F(2x2, 3x3) convolution kernels (NHWC, float32, 3x3, stride 1, groups 1)
with tiling candidates.

The spec is the direct convolution's :class:`~ascendc_pack.kernels.conv.direct.ConvSpec` restricted to
what the transform computes (:func:`check_spec`): a 3x3 kernel, stride 1, dilation 1, NHWC ``x``
and residual. Each 2x2 output tile is ``A^T [(G w G^T) . (B^T d B)] A`` of its 4x4 input patch
``d``: the output channels of one of the 16 transformed positions are a GEMM over the input
channels (``16 x tiles x C x O`` multiply-adds instead of the direct ``36 x tiles x C x O``: 2.25x
fewer), and the transforms are additions only. The weight is transformed and packed once by
Python (:func:`pack_weight`: ``[O/OCB][16][C][OCB]``, in float64 before the cast; fold an eval
BatchNorm into it first).

The kernel (``templates/kernel/winograd.cpp.j2``) runs per *band* of ``br`` tile rows of an
image: the band's input transform ``V[16][tiles][C]`` into the workspace (threads split the
tile rows), a barrier, then tasks of ``tblk`` tiles x ``ocb`` output channels (threads take
them dynamically): per position the register-blocked product (``tb`` tiles x ``ocb / lanes``
vectors, the direct convolution's micro-kernel shape), then the output transform, bias and the
fused epilogue straight into y. The cost model (:func:`propose`) ranks the tilings; every
candidate is verified against eager like every kernel (Winograd's rounding differs from a direct
sum's: it must stay within the float32 tolerance). docs/WINOGRAD.md has the details.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.epilogue import EPILOGUE
from ascendc_pack.kernels import family
from ascendc_pack.kernels.conv.direct import TILE_CYCLES, ConvSpec, ConvSpecError, epilogue_lines, tile_cycles
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.fused.tiling import Target
from ascendc_pack.kernels.target import CpuTarget

MAX_CANDIDATES = 6
TEMPLATE_NAME = "kernel/winograd.cpp.j2"
MIN_CHANNELS = 16
"""The positions' products are GEMMs over the input channels: with fewer the transforms dominate
and the direct kernel wins (the tactic pipeline offers Winograd only from here)."""

# G (4x3) of F(2x2, 3x3): U = G w G^T
_G = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]], dtype=torch.float64)
# cycles of the transforms, per vector: an input tile's 16 loads, 32 additions and 16 stores;
# an output tile's 16 loads and 24 additions (the cost model's; rank only)
IN_TILE_CYCLES = 40.0
OUT_TILE_CYCLES = 24.0
OUT_CALL_CYCLES = 60.0  # an output transform's call and pixel loops, per tile and channel block


def check_spec(spec: ConvSpec) -> None:
    """Raise :class:`ConvSpecError` unless the F(2x2, 3x3) kernel computes ``spec``."""
    problems = []
    if (spec.kh, spec.kw) != (3, 3):
        problems.append(f"a {spec.kh}x{spec.kw} kernel (Winograd F(2x2,3x3) is 3x3 only)")
    if spec.stride != (1, 1) or spec.dilation != (1, 1):
        problems.append(f"stride {spec.stride}, dilation {spec.dilation} (both must be 1)")
    if max(spec.padding) > 2:
        problems.append(f"padding {spec.padding} (at most 2)")
    if spec.x_layout != "nhwc" or spec.residual_layout != "nhwc":
        problems.append("x or the residual stored NCHW (the kernel reads NHWC memory)")
    if problems:
        raise ConvSpecError(f"winograd conv {spec.name}: " + "; ".join(problems) + "; use the direct kernel")


def pack_weight(weight: torch.Tensor, ocb: int) -> torch.Tensor:
    """A 3x3 weight ``[O, C, 3, 3]`` transformed (``G w G^T``, float64) and packed as the
    ``[ceil(O/ocb), 16, C, ocb]`` float32 blocks the kernel reads; channels past O are zero."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
        raise ConvSpecError(f"a Winograd convolution weight is a [O, C, 3, 3] tensor, got "
                            f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if not isinstance(ocb, int) or isinstance(ocb, bool) or ocb < 1:
        raise ConvSpecError(f"winograd pack_weight: ocb must be a positive int (the candidate's tiling), got {ocb!r}")
    o, c = weight.shape[:2]
    u = torch.einsum("ik,ockl,jl->ocij", _G, weight.detach().to(torch.float64), _G).reshape(o, c, 16)
    blocks = -(-o // ocb)
    padded = torch.zeros(blocks * ocb, c, 16, dtype=torch.float64)
    padded[:o] = u
    return padded.view(blocks, ocb, c, 16).permute(0, 3, 2, 1).contiguous().to(torch.float32)


# ----------------------------------------------------------------------------- tiling + cost


@dataclass(frozen=True)
class WinoTiling(Tiling):
    """A candidate's parameters: ``ocb`` output channels per block (``ocb / lanes`` vectors of a
    register tile), ``tb`` tiles per register tile, ``tblk`` tiles per task (a multiple of
    ``tb``), ``br`` tile rows per band (the transformed input of a band is one buffer), ``bd``
    threads, ``local``: 1 when a thread runs whole bands in buffers of its own (no barrier), 0
    when the threads share each band (its transform, a barrier, its tasks)."""

    ocb: int
    tb: int
    tblk: int
    br: int
    bd: int
    lanes: int
    local: int = 0

    kind = "Winograd"
    error = ConvSpecError

def tiles(spec: ConvSpec) -> tuple[int, int]:
    """Tile rows and tile columns of an image (2x2 output pixels per tile)."""
    return -(-spec.oh // 2), -(-spec.ow // 2)


def slots(spec: ConvSpec, t: WinoTiling) -> int:
    """Tile slots of the band buffer: a band's tiles rounded up to a register tile's multiple."""
    return -(-min(t.br, tiles(spec)[0]) * tiles(spec)[1] // t.tb) * t.tb


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def buffer_floats(spec: ConvSpec, t: WinoTiling) -> tuple[int, int]:
    """Floats of the band buffer V and of one thread's product buffer M (both 64-byte rounded)."""
    return _round16(16 * slots(spec, t) * spec.c_in), _round16(16 * t.tblk * t.ocb)


def workspace_bytes(spec: ConvSpec, t: WinoTiling) -> int:
    """Scratch bytes: the band buffer (one per thread when ``local``) and a product buffer per
    thread, 64 spare bytes to align them."""
    v, m = buffer_floats(spec, t)
    return ((v + m) * t.bd if t.local else v + t.bd * m) * 4 + 64


def check_tiling(spec: ConvSpec, t: WinoTiling, target: CpuTarget) -> None:
    """Raise :class:`ConvSpecError` unless the template can build ``t`` for ``spec``."""
    check_spec(spec)
    problems = []
    if t.lanes != target.lanes:
        problems.append(f"lanes={t.lanes}, the target's vectors hold {target.lanes} floats")
    if t.ocb < t.lanes or t.ocb % t.lanes:
        problems.append(f"ocb={t.ocb} is not a positive multiple of lanes={t.lanes}")
    if min(t.tb, t.tblk, t.br, t.bd) < 1 or t.tblk % t.tb or t.local not in (0, 1):
        problems.append("tb, tblk, br and bd must be >= 1, tblk a multiple of tb, local 0 or 1")
    elif t.tb * (t.ocb // t.lanes) * (2 if t.tb * t.ocb // t.lanes < 8 else 1) + t.ocb // t.lanes + 1 \
            > target.registers:
        problems.append(f"tb={t.tb} x ocb/lanes={t.ocb // t.lanes} accumulators, the weight vectors and a "
                        f"broadcast need more than {target.registers} registers")
    if t.br > tiles(spec)[0]:
        problems.append(f"br={t.br} exceeds the image's {tiles(spec)[0]} tile rows")
    if t.bd > target.cores:
        problems.append(f"bd={t.bd} exceeds the core limit {target.cores}")
    if problems:
        raise ConvSpecError(f"winograd conv {spec.name}: tiling {t.tiling_repr} cannot be built: "
                            + "; ".join(problems))


def estimate_us(spec: ConvSpec, t: WinoTiling, target: CpuTarget) -> float:
    """Rank-only estimate of one call (microseconds): the busiest thread's products (register
    tiles over the input channels, per position and channel block), transforms, epilogue and
    band-buffer reads (from L2 per channel block; to memory and back when the buffer misses L2),
    or, when larger, the traffic of the transformed weights; plus each band's two barriers when
    threaded and shared."""
    s, vec = spec, t.lanes
    th, tw = tiles(s)
    full_ob, tail_o = divmod(s.c_out, t.ocb)
    oblocks = [(t.ocb // vec, full_ob)] + ([(-(-tail_o // vec), 1)] if tail_o else [])
    obs = full_ob + int(bool(tail_o))
    epi = 1 + int(s.bias) + sum(EPILOGUE[op].cycles for op in s.epilogue)
    cvec = -(-s.c_in // vec) + (s.c_in % vec) * (vec - 1) / vec  # tail channels go one at a time
    bands = [min(t.br, th - b) for b in range(0, th, t.br)]
    cyc, tasks_total, mem = 0.0, 0, 0.0
    v_bytes_band = 16 * slots(s, t) * s.c_in * 4  # the buffer
    u_bytes = obs * t.ocb * s.c_in * 16 * 4
    for rows in bands:
        n_tiles = rows * tw
        groups = -(-n_tiles // t.tblk)
        reg_tiles = -(-n_tiles // t.tb)
        v_bytes = 16 * n_tiles * s.c_in * 4
        cyc += n_tiles * cvec * IN_TILE_CYCLES
        if v_bytes_band > target.l2 * 0.5:  # the band buffer goes to memory and back
            cyc += 2 * v_bytes / (target.mem_gbps / target.ghz)
        for nv, count in oblocks:
            cyc += count * 16 * reg_tiles * (tile_cycles(t.tb, nv) * s.c_in + TILE_CYCLES)
            cyc += count * n_tiles * (OUT_CALL_CYCLES + nv * OUT_TILE_CYCLES + 4 * nv * epi)
            cyc += count * v_bytes / (target.l2_gbps / target.ghz)  # each channel block reads the band buffer
        tasks_total += groups * obs
        # the transformed weights: once per band, or once per task group when they miss L2
        mem += u_bytes * (1 if u_bytes <= target.l2 * 0.5 else groups)
    cyc *= s.n
    mem *= s.n
    # shared: each band's tasks split over the threads; local: whole bands do
    tasks = s.n * len(bands) if t.local else max(1, tasks_total // len(bands))
    par = min(t.bd, tasks)
    compute = cyc / par * (-(-tasks // par) * par / tasks) / (target.ghz * 1e3)
    mem_us = mem / (target.mem_gbps * 1e3 * par)
    us = max(compute, mem_us) + 0.2 * min(compute, mem_us)
    if t.bd > 1:
        us += Target.parallel_overhead_us + (Target.barrier_us if t.local else 2 * len(bands) * s.n * Target.barrier_us)
    return us


_REGISTER_TILES = ((6, 2), (4, 3), (2, 4), (12, 1), (4, 2))


def _space(spec: ConvSpec, target: CpuTarget) -> list[WinoTiling]:
    vec, cores = target.lanes, target.cores
    th, tw = tiles(spec)
    cvec = -(-spec.c_out // vec)
    out = []
    for tb, nv in _REGISTER_TILES:
        accs = tb * nv * (2 if tb * nv < 8 else 1)
        if accs + nv + 1 > target.registers or (nv > 1 and nv > cvec):
            continue
        ocb = nv * vec
        # the whole image in one band, or bands whose buffer takes half of L2
        fit = max(1, int(target.l2 * 0.5 / (16 * tw * spec.c_in * 4)))
        for br in sorted({th, min(th, fit)}):
            band_tiles = br * tw
            for tblk in sorted({-(-min(band_tiles, 48) // tb) * tb, -(-min(band_tiles, 16) // tb) * tb}):
                for bd in sorted({1, cores}):
                    # local bands when threaded and there are bands enough
                    for local in ((0, 1) if bd > 1 and (br < th or spec.n >= bd) else (0,)):
                        out.append(WinoTiling(ocb, tb, tblk, br, bd, vec, local))
    return out


def propose(spec: ConvSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 6)`` distinct candidates (multi-thread ones where they pay:
    :func:`~ascendc_pack.kernels.family.scored`), the best first, then for variety the best of
    another output-channel block and of the other band mode, then the rest by estimate."""
    check_spec(spec)
    scored = family.scored(spec, target, _space(spec, target), workspace_bytes, estimate_us)
    # variety for PGO (the estimate ranks register tiles and band modes within ~20 %): the best,
    # then the best of another output-channel block, then the best of the other band mode
    firsts: dict = {}
    for c in scored:
        firsts.setdefault("best", c)
        if c.tiling.ocb != scored[0].tiling.ocb:
            firsts.setdefault("ocb", c)
        if c.tiling.local != scored[0].tiling.local:
            firsts.setdefault("local", c)
    ranked = list({id(c): c for c in [*firsts.values(), *scored]}.values())
    return ranked[:max(1, min(topn, MAX_CANDIDATES))]


# ----------------------------------------------------------------------------- render + build


def render(spec: ConvSpec, cand, isa: str) -> str:
    """C++ source of one candidate (a static kernel: shapes and tiling compiled in)."""
    t, c = cand.tiling, cand.candidate
    v_floats, m_floats = buffer_floats(spec, t)
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, s=spec, t=t, oh=spec.oh, ow=spec.ow, ob=-(-spec.c_out // t.ocb),
        vt=slots(spec, t), v_floats=v_floats, m_floats=m_floats, n_inputs=spec.n_inputs,
        steps=epilogue_lines(spec))


GENERATOR = Generator("winograd", __name__, TEMPLATE_NAME, propose, render, WinoTiling, workspace_bytes,
                      estimate_us, check_tiling)


def plan(spec: ConvSpec, config: BuildConfig, target: CpuTarget | None = None,
         tilings: list[WinoTiling] | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` (or take ``tilings`` as given, in that
    order) and render their sources."""
    return family.plan(GENERATOR, spec, config, target, tilings)


__all__ = ["GENERATOR", "MAX_CANDIDATES", "MIN_CHANNELS", "WinoTiling", "buffer_floats", "check_spec", "check_tiling",
           "estimate_us", "pack_weight", "plan", "propose", "render", "slots", "tiles", "workspace_bytes"]
