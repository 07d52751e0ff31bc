"""Generated AMX bfloat16 GEMMs: a float32 :class:`~ascendc_pack.kernels.gemm.generator.GemmSpec`
computed with bfloat16 operands and float32 accumulation on the AMX tile unit (``TDPBF16PS``).

The low-precision sibling of the portable GEMM (``templates/kernel/gemm_amx.cpp.j2``): A is
rounded to bfloat16 per task (in the thread's workspace), B - a weight - is rounded and packed
once, at load, by the library's ``ap_gemm_pack_b`` (16-column panels of k pairs, the layout the
tile unit reads), C and the fused epilogue (bias, residual, activation) stay float32. The same
static kernel ABI and GEMM ABI (``gemm_abi.h``) as the portable GEMM, so the graph launches and
packs it the same way and the runtime needs nothing new, except a host with AMX: the bundle
records ``amx_bf16`` in ``target.isa``.

A tiling: a block of TM x TN 16x16 C tiles (``mr`` = 16 TM rows, ``nr`` = 16 TN columns, at most
2 x 2: four of the eight tile registers hold C, two A, two B), the rows and columns a task
covers (``mc`` x ``nc``) and the threads (``bd``). K is whole in every task (padded to 32, a
tile's depth): the task's A block in bfloat16 stays in L2.

Why: a float32 GEMM of BERT's 128x256x256 takes ~55 µs on two AVX-512 threads here; this kernel
~10 µs on one (measured). Offered only for ``--precision bf16`` / ``auto`` on a host with
AMX-BF16 and AVX512-BF16 (:func:`amx_offered`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.epilogue import EPILOGUE
from ascendc_pack.kernels import family
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.gemm.generator import GemmSpec, GemmSpecError, _epilogue_lines
from ascendc_pack.kernels.target import CpuTarget

TEMPLATE_NAME = "kernel/gemm_amx.cpp.j2"
MAX_CANDIDATES = 6
FEATURES = ("amx_bf16", "amx_tile", "avx512_bf16")
"""CPU flags the kernel executes (``/proc/cpuinfo`` names); the bundle records ``amx_bf16``."""
FEATURE = "amx_bf16"


@dataclass(frozen=True)
class AmxTiling(Tiling):
    """A candidate's parameters (see the module docstring)."""

    mr: int
    nr: int
    mc: int
    nc: int
    bd: int

    error = GemmSpecError
    kind = "AMX GEMM"


def amx_offered(flags) -> str | None:
    """Why AMX bfloat16 GEMMs are not offered on a host with CPU ``flags`` (None: they are)."""
    missing = [f for f in FEATURES if f not in set(flags)]
    return f"the host lacks {', '.join(missing)}" if missing else None


def amx_applies(spec: GemmSpec) -> str | None:
    """Why ``spec`` has no AMX kernel (None: it has): a float32 GEMM of one batch on a constant B."""
    if spec.dtype != "float32":
        return f"dtype {spec.dtype} (the AMX kernel rounds float32 operands)"
    if spec.batch != 1 or not spec.b_constant:
        return "B is not a weight shared by one batch (it is packed once, at load)"
    return None


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _kp(spec: GemmSpec) -> int:
    return _ceil(spec.k, 32) * 32


def c_buffer_bytes(t) -> int:
    """The two blocks of C tiles (float32) a thread keeps: one computed while the other's
    epilogue runs (``t``: anything with ``mr`` and ``nr``)."""
    return 2 * 256 * (t.mr // 16) * (t.nr // 16) * 4


def thread_bytes(spec, t: AmxTiling) -> int:
    """A thread's workspace: its A block in bfloat16 (rows padded to the tile block) and its C
    buffers (:func:`c_buffer_bytes`), 64-byte aligned (``spec``: anything with a ``k``)."""
    mcp = _ceil(t.mc, t.mr) * t.mr
    return _ceil(mcp * _kp(spec) * 2 + c_buffer_bytes(t), 64) * 64


def workspace_bytes(spec, t: AmxTiling) -> int:
    return t.bd * thread_bytes(spec, t) + 64


def estimate_us(spec, t: AmxTiling, target: CpuTarget, gather: float = 1.0) -> float:
    """Rank-only estimate of one call (µs) of ``spec`` (anything with ``m``, ``n``, ``k`` and
    ``epilogue``): per task, the tile products (16 cycles each, TMUL's throughput) or the tile
    loads feeding them, the stream of its packed B block from memory (beside them: tile loads that
    miss the caches stall the products), A's rounding (``gather`` times a strided row's cost), the
    epilogue through a float32 block; the busiest thread's tasks; the fork/join of a parallel call.

    The weight stream: in a model every other step's weights pass through the caches between two
    calls, so a task reads its B block (bfloat16) at the host's memory rate, once per thread when
    the block fits half of L2 (the thread's next row block finds it there), else once per task.
    resnet18's 7x7-pixel 512-channel convolution (4.7 MB of weight, 49 output rows): a row split
    reads all of it on both cores, 206 µs in the build's PGO, where splitting the columns reads
    half on each."""
    kp = _kp(spec)
    tm, tn = t.mr // 16, t.nr // 16
    epi = 3 + sum(EPILOGUE[o].cycles for o in spec.epilogue)
    stream_bytes_per_cycle = target.mem_gbps / target.ghz
    row_tasks_per_thread = max(1, _ceil(spec.m, t.mc) // t.bd)

    def task_cycles(mlen: int, nlen: int) -> float:
        blocks = _ceil(mlen, t.mr) * _ceil(nlen, t.nr)
        kstep = max(16 * tm * tn, 10 * (tm + tn)) + 4
        tiles = blocks * (kp // 32) * kstep + blocks * 40 * tm * tn
        if (mlen + nlen) * kp * 2 > target.l2 * 0.75:  # the task's A and B blocks spill L2
            tiles *= 1.3
        b_bytes = _ceil(nlen, 16) * 16 * kp * 2
        stream = b_bytes / stream_bytes_per_cycle
        if b_bytes <= target.l2 / 2:
            stream /= row_tasks_per_thread
        return 300 + tiles + stream + mlen * kp / 16 * 2 * gather + mlen * _ceil(nlen, 16) * epi

    tasks = [task_cycles(min(t.mc, spec.m - i), min(t.nc, spec.n - j))
             for j in range(0, spec.n, t.nc) for i in range(0, spec.m, t.mc)]
    loads = [0.0] * t.bd
    for c in tasks:
        loads[loads.index(min(loads))] += c
    us = max(loads) / (target.ghz * 1e3)
    return us + (4.0 if t.bd > 1 else 0.0)  # fork/join on the graph's task pool, as the float32 GEMM's


def space(m: int, n: int, cores: int, tiling=None) -> list:
    """The tilings worth ranking for an ``m`` x ``n`` output (``tiling``: the class to make,
    :class:`AmxTiling` by default)."""
    tiling = tiling or AmxTiling
    out = []
    for mr in (32, 16):
        for nr in (32, 16):
            if (mr > 16 and m <= 16) or (nr > 16 and n <= 16):
                continue
            full_m, full_n = _ceil(m, mr) * mr, _ceil(n, nr) * nr
            for bd in sorted({1, cores}):
                blocks = {(full_m, full_n)}
                for split in ((bd, 2 * bd) if bd > 1 else (2, 4) if m > 256 else ()):
                    blocks.add((_ceil(_ceil(m, split), mr) * mr, full_n))
                    if m < 2 * mr * bd:  # too few rows to split: split the columns (each task rounds all of A)
                        blocks.add((full_m, _ceil(_ceil(n, split), nr) * nr))
                for mc, nc in blocks:
                    out.append(tiling(mr, nr, mc, nc, bd))
    return out


def rank(spec, tilings: list, target: CpuTarget, topn: int, **estimate) -> list[KernelCandidate]:
    """Up to ``min(topn, 6)`` distinct candidates of ``tilings``, best (lowest estimate) first."""
    scored, seen = [], set()
    for t in tilings:
        cand = Candidate(t.tiling_repr, workspace_bytes(spec, t), t.bd)
        if cand.kernel_key not in seen:
            seen.add(cand.kernel_key)
            scored.append(KernelCandidate(t, cand, estimate_us(spec, t, target, **estimate)))
    scored.sort(key=lambda c: (c.est_us, c.candidate.tiling_repr))
    return scored[:max(1, min(topn, MAX_CANDIDATES))]


def propose(spec: GemmSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 6)`` distinct candidates, best (lowest estimate) first."""
    return rank(spec, space(spec.m, spec.n, target.cores), target, topn)


def render(spec: GemmSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (shapes and tiling compiled in)."""
    why = amx_applies(spec)
    if why is not None:
        raise GemmSpecError(f"GEMM {spec.name}: no AMX kernel: {why}")
    t, c = cand.tiling, cand.candidate
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, m=spec.m, n=spec.n, k=spec.k, sa=spec.a_strides, sb=spec.b_strides,
        bias=spec.bias, residuals=spec.residual_strides, t=t, thread_bytes=thread_bytes(spec, t), conv=None,
        n_inputs=spec.n_inputs, epilogue=_epilogue_lines(spec))


GENERATOR = Generator("gemm_amx", __name__, TEMPLATE_NAME, propose, render, AmxTiling)


def plan(spec: GemmSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources."""
    return family.plan(GENERATOR, spec, config, target)


__all__ = ["AmxTiling", "FEATURE", "FEATURES", "amx_applies", "amx_offered", "c_buffer_bytes", "estimate_us", "plan",
           "propose", "rank", "render", "space", "thread_bytes", "workspace_bytes"]
