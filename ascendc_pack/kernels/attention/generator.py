"""Generated attention kernels (float32) with tiling candidates (docs/ATTENTION.md).

An :class:`AttnSpec` is one static ``softmax(Q·Kᵀ·scale + mask)·V`` over ``q`` [B, H, L, E],
``k`` [B, Hkv, S, E], ``v`` [B, Hkv, S, Ev] (grouped-query attention: query head ``h`` reads kv
head ``h // (H / Hkv)``), each read in place with the strides it arrives in (the last dimension
dense; the views of a fused ``qkv`` projection need no copy), an optional mask (``"float"``:
added to the scores; ``"bool"``: True keeps a score) broadcast from its own shape, an optional
causal mask (``j <= i``), or a shifted-window mask (window ``b % W``'s, ``mask_windows``).
The output is written ``[B, L, H, Ev]`` in memory (a ``[B, H, L, Ev]``
tensor with strides ``(L·H·Ev, Ev, H·Ev, 1)``), the layout torch's flash attention returns, so
the usual ``transpose(1, 2).reshape(B, L, H·Ev)`` after it is a view.

The kernel (``templates/kernel/attention.cpp.j2``) runs two task jobs: packing Kᵀ into panels of
``NR`` columns and V into rows padded to whole vectors (per kv head, shared by its query heads
and query blocks), then one task per ``QB`` query rows of one head: the ``QB x S`` scores by an
``MR x NRV``-vector register block over the Kᵀ panels into a thread-local buffer (L1/L2), the
scale, masks and a row softmax in place (:func:`ap_exp`), and P·V by a ``PV_MR x PVW``-vector
block, scaled by each row's ``1 / sum`` on the store. A fully masked row gives 0 with
``safe_softmax`` (SDPA's ``_safe_softmax``), NaN without (a written-out ``softmax``), as eager.

:func:`propose` ranks tilings by a rank-only estimate; every candidate renders to its own source
and compiles through :func:`ascendc_pack.toolchain.compiler.compile_kernels` like a fused kernel.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass

import torch

from ascendc_pack_runtime.kernels import KernelLibrary

from ascendc_pack.cache import check_component
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import PackError
from ascendc_pack.kernels import family
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.fused.tiling import Target
from ascendc_pack.kernels.target import CpuTarget

MAX_CANDIDATES = 10
TEMPLATE_NAME = "kernel/attention.cpp.j2"
MASKS = (None, "float", "bool")
MAX_HEAD_DIM = 512
MAX_SCORE_BYTES = 4 << 20
"""A task's score buffer (``QB x S`` floats) at most: longer sequences get fewer rows per task;
a ``kv_len`` whose single row does not fit is left to torch's flash attention."""


class AttnSpecError(PackError, ValueError):
    """An attention-kernel spec or call is inconsistent (the message names the field and the fix)."""


def _positive(name: str, what: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise AttnSpecError(f"attention kernel {name}: {what} must be a positive int, got {v!r}")


@dataclass(frozen=True)
class AttnSpec:
    """One static attention (see the module docstring). ``q_strides`` / ``k_strides`` /
    ``v_strides``: the (batch, head, row) strides in elements, the last dimension dense;
    ``mask_shape``: 4-D, each dimension 1 (broadcast) or the full size, stored contiguous;
    ``mask_windows`` W (shifted-window attention): batch ``b`` reads the mask of window ``b % W``
    (``mask_shape[0]`` is W)."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_head_dim: int
    scale: float
    q_strides: tuple[int, int, int]
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    mask: str | None = None
    mask_shape: tuple[int, int, int, int] | None = None
    causal: bool = False
    safe_softmax: bool = True
    mask_windows: int | None = None

    def __post_init__(self):
        try:
            check_component(self.name, "attention kernel name")
        except ValueError as e:
            raise AttnSpecError(str(e)) from None
        for what in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "v_head_dim"):
            _positive(self.name, what, getattr(self, what))
        if self.heads % self.kv_heads:
            raise AttnSpecError(f"attention kernel {self.name}: kv_heads={self.kv_heads} must divide "
                                f"heads={self.heads} (grouped-query attention)")
        if max(self.head_dim, self.v_head_dim) > MAX_HEAD_DIM:
            raise AttnSpecError(f"attention kernel {self.name}: head sizes above {MAX_HEAD_DIM} are left to "
                                f"torch's attention, got {self.head_dim} / {self.v_head_dim}")
        if self.mask not in MASKS:
            raise AttnSpecError(f"attention kernel {self.name}: mask must be one of {MASKS}, got {self.mask!r}")
        for what in ("q_strides", "k_strides", "v_strides"):
            v = tuple(getattr(self, what))
            if len(v) != 3 or any(not isinstance(e, int) or e < 0 for e in v):
                raise AttnSpecError(f"attention kernel {self.name}: {what} must be 3 non-negative ints "
                                    f"(batch, head, row strides; the last dimension dense), got {v!r}")
            object.__setattr__(self, what, v)
        if self.mask is None:
            object.__setattr__(self, "mask_shape", None)
        else:
            w = self.mask_windows
            if w is not None and (self.mask != "float" or not isinstance(w, int) or w < 1 or self.batch % w):
                raise AttnSpecError(f"attention kernel {self.name}: mask_windows={w!r} needs a float mask and a "
                                    f"batch ({self.batch}) that is a multiple of it")
            full = (w or self.batch, self.heads, self.q_len, self.kv_len)
            ms = tuple(self.mask_shape or ())
            if len(ms) != 4 or any(m not in (1, f) for m, f in zip(ms, full)):
                raise AttnSpecError(f"attention kernel {self.name}: mask_shape must be 4 sizes, each 1 or "
                                    f"{list(full)}'s, got {list(ms)}; broadcast the mask to 4-D first")
            object.__setattr__(self, "mask_shape", ms)
        if self.kv_len * 4 > MAX_SCORE_BYTES:
            raise AttnSpecError(f"attention kernel {self.name}: kv_len {self.kv_len} needs a score row over "
                                f"{MAX_SCORE_BYTES >> 20} MiB; left to torch's flash attention")

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.q_len, self.v_head_dim)

    @property
    def out_strides(self) -> tuple[int, int, int, int]:
        """``[B, L, H, Ev]`` memory (the layout torch's flash attention returns)."""
        h, ev = self.heads, self.v_head_dim
        return (self.q_len * h * ev, ev, h * ev, 1)

    @property
    def mask_strides(self) -> tuple[int, int, int, int] | None:
        """Strides of the contiguous mask, 0 along broadcast dimensions."""
        if self.mask is None:
            return None
        out, acc = [], 1
        for n in reversed(self.mask_shape):
            out.append(0 if n == 1 else acc)
            acc *= n
        return tuple(reversed(out))

    @property
    def n_inputs(self) -> int:
        return 3 + int(self.mask is not None)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.heads * self.q_len * self.kv_len * (self.head_dim + self.v_head_dim)

    def input_layouts(self) -> dict[str, tuple[tuple, tuple, str]]:
        """(shape, strides, dtype) of each input as the kernel reads it."""
        b, h, hk, l, s = self.batch, self.heads, self.kv_heads, self.q_len, self.kv_len
        out = {"q": ((b, h, l, self.head_dim), (*self.q_strides, 1), "float32"),
               "k": ((b, hk, s, self.head_dim), (*self.k_strides, 1), "float32"),
               "v": ((b, hk, s, self.v_head_dim), (*self.v_strides, 1), "float32")}
        if self.mask:
            out["mask"] = (self.mask_shape, self.mask_strides, "float32" if self.mask == "float" else "bool")
        return out

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> AttnSpec:
        fixed = {k: tuple(d[k]) for k in ("q_strides", "k_strides", "v_strides") if d.get(k) is not None}
        if d.get("mask_shape") is not None:
            fixed["mask_shape"] = tuple(d["mask_shape"])
        return AttnSpec(**{**d, **fixed})

    def spec_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


# ----------------------------------------------------------------------------- tiling + cost


@dataclass(frozen=True)
class AttnTiling(Tiling):
    """``qb`` query rows per task; the scores' register block ``mr`` rows x ``nrv`` vectors (the
    Kᵀ panel width); P·V's ``pv_mr`` rows x ``pvw`` vectors; ``bd`` threads; ``lanes`` floats
    per vector."""

    qb: int
    mr: int
    nrv: int
    pv_mr: int
    pvw: int
    bd: int
    lanes: int

    error = AttnSpecError
    kind = "attention"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _layout(spec: AttnSpec, t: AttnTiling) -> tuple[int, int]:
    """(shared, per-thread) workspace bytes, each a multiple of 64: packed Kᵀ and V; the scores
    and row scales of one task."""
    nr = t.nrv * t.lanes
    sp = _ceil(spec.kv_len, nr) * nr
    evp = _ceil(spec.v_head_dim, t.lanes) * t.lanes
    shared = spec.batch * spec.kv_heads * (sp * spec.head_dim + spec.kv_len * evp) * 4
    thread = (t.qb * sp + t.qb) * 4
    return _ceil(shared, 64) * 64, _ceil(thread, 64) * 64


def workspace(spec: AttnSpec, t: AttnTiling) -> int:
    shared, thread = _layout(spec, t)
    return shared + t.bd * thread + 64  # 64 spare bytes: the kernel aligns the base


# machine constants of the estimate (cycles; rank only)
FMA_PORTS, LOAD_PORTS, FMA_LATENCY = 2.0, 2.0, 4.0
TILE_CYCLES = 20.0  # a register block's call, setup and store
EXP_CYCLES = 16.0   # per vector of a softmax row (scale, mask, max, exp, sum)


STEP_CYCLES = 1.0   # a step's loop and address overhead, beside its FMAs and loads


def _block_cycles(rows: int, vectors: int, depth: int) -> float:
    """A ``rows x vectors`` register block over ``depth`` multiply-adds per accumulator."""
    fmas = rows * vectors
    per_step = max(fmas / FMA_PORTS, (rows + vectors) / LOAD_PORTS, FMA_LATENCY) + STEP_CYCLES
    return depth * per_step + TILE_CYCLES + fmas


def _rows_cycles(n: int, mr: int, per_block) -> float:
    return (n // mr) * per_block(mr) + (per_block(1) * (n % mr))


def estimate_us(spec: AttnSpec, t: AttnTiling, target: CpuTarget) -> float:
    """Rank-only estimate of one call (µs): the busiest thread's tasks (score blocks over the
    padded Kᵀ panels, softmax rows, P·V blocks, row tails at one row per block), the packing
    job, and the two jobs' wake-ups when threaded."""
    nr = t.nrv * t.lanes
    panels = _ceil(spec.kv_len, nr)
    wv = _ceil(spec.v_head_dim, t.lanes)
    pvw = min(wv, t.pvw)
    chunks = _ceil(wv, pvw)

    def task(nl: int) -> float:
        qk = _rows_cycles(nl, t.mr, lambda r: panels * _block_cycles(r, t.nrv, spec.head_dim))
        sm = nl * _ceil(spec.kv_len, t.lanes) * EXP_CYCLES
        pv = chunks * _rows_cycles(nl, t.pv_mr, lambda r: _block_cycles(r, pvw, spec.kv_len))
        return qk + sm + pv

    full, last = divmod(spec.q_len, t.qb)
    per_head = full * [task(t.qb)] + ([task(last)] if last else [])
    tasks = sorted(per_head * (spec.batch * spec.heads), reverse=True)
    loads = [0.0] * t.bd  # dynamic schedule: the next task goes to the least loaded thread
    for c in tasks:
        loads[loads.index(min(loads))] += c
    cycles = max(loads)
    # the score buffer: from L1 when it fits, else its passes come from L2
    shared, thread = _layout(spec, t)
    if thread > target.l1d:
        cycles *= 1.0 + 0.15 * min(1.0, thread / target.l2)
    pack = spec.batch * spec.kv_heads * panels * nr * (spec.head_dim + wv * t.lanes) / max(1, t.bd)
    us = (cycles + pack) / (target.ghz * 1e3)
    if t.bd > 1:
        us += 2 * (Target.parallel_overhead_us + Target.barrier_us)
    return us


QK_BLOCKS = ((8, 2), (6, 2), (4, 4), (4, 2), (2, 4))
PV_BLOCKS = ((6, 4), (4, 4), (3, 4), (8, 2), (4, 2))


def _space(spec: AttnSpec, target: CpuTarget) -> list[AttnTiling]:
    regs, vec = target.registers, target.lanes
    bds = sorted({1, target.cores})
    out = []
    for qb in (8, 16, 32, 64, 128):
        if qb > 8 and qb >= 2 * spec.q_len:
            continue  # a block twice the rows would only ever run as its tail
        if qb * _ceil(spec.kv_len, vec) * vec * 4 > MAX_SCORE_BYTES and qb > 8:
            continue
        for (mr, nrv), (pm, pw) in itertools.product(QK_BLOCKS, PV_BLOCKS):
            if mr * nrv + nrv >= regs or pm * pw + pw >= regs or mr > qb or pm > qb:
                continue
            for bd in bds:
                out.append(AttnTiling(qb, mr, nrv, pm, pw, bd, vec))
    return out


_VARIETY = (lambda t: (t.mr, t.nrv), lambda t: (t.pv_mr, t.pvw), lambda t: t.qb)
"""PGO sees the best of each score block, of each P·V block and of each rows-per-task first."""


def propose(spec: AttnSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 10)`` distinct candidates, best estimate first, never more threads than
    ``target.cores``: the varied best of the best thread count (:data:`_VARIETY`), and the best
    of the other thread count last (PGO confirms or refutes the threading)."""
    scored = family.scored(spec, target, _space(spec, target), workspace, estimate_us)
    groups = [family.varied([c for c in scored if c.tiling.bd == bd], _VARIETY) for bd in sorted({c.tiling.bd for c in scored})]
    groups.sort(key=lambda g: g[0].est_us)
    n = max(1, min(topn, MAX_CANDIDATES))
    others = [g[0] for g in groups[1:]]
    picked = groups[0][:max(1, n - len(others))] + others
    return sorted(picked[:n], key=lambda c: (c.est_us, c.candidate.tiling_repr))


# ----------------------------------------------------------------------------- render + build


def template_args(spec: AttnSpec, cand: KernelCandidate, isa: str) -> dict:
    """What an attention template reads of a spec and a candidate (both attention kernels'),
    besides the tiling ``t`` and the workspace layout."""
    c = cand.candidate
    return dict(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, batch=spec.batch, heads=spec.heads, kv_heads=spec.kv_heads,
        q_len=spec.q_len, kv_len=spec.kv_len, head_dim=spec.head_dim, v_head_dim=spec.v_head_dim,
        q_strides=spec.q_strides, k_strides=spec.k_strides, v_strides=spec.v_strides,
        out_strides=spec.out_strides, mask=spec.mask, mask_strides=spec.mask_strides,
        scale=f"{float(spec.scale)!r}f", causal=spec.causal, safe_softmax=spec.safe_softmax,
        mask_windows=spec.mask_windows or 0, t=cand.tiling, n_inputs=spec.n_inputs)


def render(spec: AttnSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (a static kernel: shapes, strides and tiling compiled in)."""
    shared, thread = _layout(spec, cand.tiling)
    return template_env().get_template(TEMPLATE_NAME).render(
        **template_args(spec, cand, isa), shared_bytes=shared, thread_bytes=thread)


GENERATOR = Generator("attention", __name__, TEMPLATE_NAME, propose, render, AttnTiling)


def plan(spec: AttnSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources."""
    return family.plan(GENERATOR, spec, config, target)


# ----------------------------------------------------------------------------- launching


class AttnKernel:
    """One compiled candidate on torch tensors: checks the operands' shapes and layouts against
    the spec, allocates the output (``[B, L, H, Ev]`` memory) and launches."""

    def __init__(self, spec: AttnSpec, so_path, kernel_key: str | None = None):
        self.spec = spec
        self.lib = KernelLibrary(so_path, kernel_key)
        if self.lib.info["n_inputs"] != spec.n_inputs or self.lib.info["name"] != spec.name:
            raise AttnSpecError(f"attention kernel {spec.name}: {so_path} is kernel {self.lib.info['name']} "
                                f"with {self.lib.info['n_inputs']} inputs, not this spec's")
        self.workspace_buffer = torch.empty(self.lib.info["workspace"], dtype=torch.uint8)

    def operands(self, named: dict) -> list[torch.Tensor]:
        """``q``, ``k``, ``v`` (and ``mask``) of ``named`` in the kernel's layouts: each as it is
        when it already has them, else a copy (checked: shape and dtype must be the spec's)."""
        out = []
        for n, (shape, stride, dtype) in self.spec.input_layouts().items():
            t = named.get(n)
            if t is None:
                raise AttnSpecError(f"attention kernel {self.spec.name}: input {n!r} missing")
            if n == "mask" and t.dim() < 4:
                t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
            if tuple(t.shape) != tuple(shape) or str(t.dtype).removeprefix("torch.") != dtype:
                raise AttnSpecError(f"attention kernel {self.spec.name}: {n} is {t.dtype}{list(t.shape)}, the "
                                    f"kernel expects {dtype}{list(shape)}")
            if not _has_strides(t, stride):
                t = torch.empty_strided(shape, stride, dtype=t.dtype).copy_(t)
            out.append(t)
        return out

    def new_output(self) -> torch.Tensor:
        return torch.empty_strided(self.spec.out_shape, self.spec.out_strides)

    def __call__(self, named: dict, out: torch.Tensor | None = None) -> torch.Tensor:
        out = self.new_output() if out is None else out
        rc = self.lib.launch(self.operands(named), [out], self.workspace_buffer)
        if rc != 0:
            raise RuntimeError(f"attention kernel {self.spec.name} ({self.lib.kernel_key}) failed with status {rc}")
        return out


def _has_strides(t: torch.Tensor, stride) -> bool:
    return all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride))


__all__ = ["AttnSpec", "AttnSpecError", "AttnTiling", "KernelCandidate", "GENERATOR", "AttnKernel", "MAX_CANDIDATES",
           "estimate_us", "plan", "propose", "render", "template_args", "workspace"]
