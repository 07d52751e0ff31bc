"""Generated AMX bfloat16 attention kernels: the float32 kernel's :class:`~ascendc_pack.kernels.attention.generator.AttnSpec`
with Q·Kᵀ and P·V on the AMX tile unit (``TDPBF16PS``: bfloat16 operands, float32 accumulation).

``templates/kernel/attention_amx.cpp.j2``: a first task job packs each kv head's Kᵀ and V, rounded
to bfloat16, into 16-column panels of k pairs (the layout the tile unit reads); then one task per
``qb`` query rows of a head rounds its q rows, computes the ``qb x S`` scores in blocks of up to 2 x
2 tiles into a float32 buffer, runs the float32 kernel's row softmax (scale, masks, safe softmax,
``ap_exp``) on them, rounds the numerators to bfloat16 and multiplies them by V, scaling each output
row by 1 / its float32 sum. Inputs, output and ABI are the float32 kernel's, so the graph launches
either; only a host with AMX-BF16 may run it (the bundle records ``amx_bf16``).

Why: the float32 kernel's multiply-adds are most of vit_s16's attention (360 µs a layer of a 12.9
ms bfloat16 bundle); on the tile unit they cost a few percent of it and the softmax is what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.kernels import family
from ascendc_pack.kernels.attention.generator import AttnSpec, AttnSpecError, _ceil, template_args
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.target import CpuTarget

TEMPLATE_NAME = "kernel/attention_amx.cpp.j2"
MAX_CANDIDATES = 6
QUERY_BLOCKS = (32, 64, 128)


@dataclass(frozen=True)
class AmxAttnTiling(Tiling):
    """``qb`` query rows per task (a multiple of 32: two row tiles), ``bd`` threads."""

    qb: int
    bd: int

    error = AttnSpecError
    kind = "AMX attention"


def _layout(spec: AttnSpec, t: AmxAttnTiling) -> tuple[int, int]:
    """(shared, per-thread) workspace bytes, multiples of 64: the packed Kᵀ and V of every kv head;
    a task's rounded q rows and numerators, float32 scores, row scales and one P·V block."""
    ep, sp = _ceil(spec.head_dim, 32) * 32, _ceil(spec.kv_len, 32) * 32
    kt = _ceil(spec.kv_len, 16) * ep * 16
    vp = _ceil(spec.v_head_dim, 16) * sp * 16
    shared = spec.batch * spec.kv_heads * (kt + vp) * 2
    thread = t.qb * (ep + sp) * 2 + t.qb * sp * 4 + t.qb * 4 + 32 * 32 * 4
    return _ceil(shared, 64) * 64, _ceil(thread, 64) * 64


def workspace(spec: AttnSpec, t: AmxAttnTiling) -> int:
    shared, thread = _layout(spec, t)
    return shared + t.bd * thread + 64  # 64 spare bytes: the kernel aligns the base


def estimate_us(spec: AttnSpec, t: AmxAttnTiling, target: CpuTarget) -> float:
    """Rank-only estimate of one call (µs): per task the tile products (16 cycles each) of its
    padded rows, the softmax (~1 cycle a score) and the roundings; the busiest thread's tasks; the
    packing job; two pool jobs' fork/join when threaded."""
    ep, sp = _ceil(spec.head_dim, 32) * 32, _ceil(spec.kv_len, 32) * 32
    npk, npv = _ceil(spec.kv_len, 16), _ceil(spec.v_head_dim, 16)

    def task(nl: int) -> float:
        rt = _ceil(nl, 16)
        tiles = rt * npk * (ep // 32) + rt * npv * (sp // 32)
        return 300 + tiles * 18 + nl * spec.kv_len * 1.2 + rt * 16 * (ep + sp) / 16

    full, last = divmod(spec.q_len, t.qb)
    tasks = sorted(([task(t.qb)] * full + ([task(last)] if last else [])) * (spec.batch * spec.heads), reverse=True)
    loads = [0.0] * t.bd
    for c in tasks:
        loads[loads.index(min(loads))] += c
    pack = spec.batch * spec.kv_heads * (npk * 16 * ep / 16 * 4 + npv * sp / 2 * 4) / t.bd
    return (max(loads) + pack) / (target.ghz * 1e3) + (8.0 if t.bd > 1 else 0.0)


def propose(spec: AttnSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 6)`` distinct candidates, best estimate first (a block of twice the query
    rows is skipped: it would only run as its tail)."""
    tilings = [AmxAttnTiling(qb, bd) for qb in QUERY_BLOCKS if qb == QUERY_BLOCKS[0] or qb < 2 * spec.q_len
               for bd in sorted({1, target.cores})]
    scored = sorted((KernelCandidate(t, Candidate(t.tiling_repr, workspace(spec, t), t.bd),
                                     estimate_us(spec, t, target)) for t in tilings),
                    key=lambda c: (c.est_us, c.candidate.tiling_repr))
    return scored[:max(1, min(topn, MAX_CANDIDATES))]


def render(spec: AttnSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (shapes, strides and tiling compiled in)."""
    shared, thread = _layout(spec, cand.tiling)
    return template_env().get_template(TEMPLATE_NAME).render(
        **template_args(spec, cand, isa), shared_bytes=shared, thread_bytes=thread)


GENERATOR = Generator("attention_amx", __name__, TEMPLATE_NAME, propose, render, AmxAttnTiling)


def plan(spec: AttnSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources."""
    return family.plan(GENERATOR, spec, config, target)


__all__ = ["AmxAttnTiling", "GENERATOR", "MAX_CANDIDATES", "estimate_us", "plan", "propose", "render", "workspace"]
