"""Generated GEMM kernels: C = epilogue(A·B [+ bias]) as static kernels with tiling candidates.

The CPU analogue of AscendC's matmul templates (issue 12): a :class:`GemmSpec` (static shapes,
strides, dtype, bias, fused pointwise epilogue) gets up to 10 candidate tilings from a cost model
(:func:`propose`): a register block MR x NR (NR a multiple of the vector width), cache blocks
MC/NC/KC sized from the host's L1/L2, a thread count (block_dim), and how B reaches the
micro-kernel:

* ``pack=none`` - read B in place (float32 B with contiguous rows, i.e. [K, N]);
* ``pack=call`` - every call first packs B into NR-wide panels in the workspace;
* ``pack=load`` - B is a constant (a weight): the graph packs it once, at load time, with the
  candidate's exported ``ap_gemm_pack_b`` (layout in ``ascendc_pack/gemm_abi.h``) and passes the
  packed buffer as input 1.

Each candidate renders to its own source (``templates/kernel/gemm.cpp.j2``) implementing the
static kernel ABI, so :func:`ascendc_pack.toolchain.compiler.compile_kernels` and the runtime's
``KernelLibrary`` handle it like any fused kernel. :class:`~ascendc_pack.kernels.gemm.launch.GemmKernel`
launches one on tensors (packing B when the candidate wants it);
:func:`~ascendc_pack.kernels.gemm.launch.eager_reference` is what it must match.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import torch


from ascendc_pack.cache import check_component
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import PackError
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.epilogue import EPILOGUE, c_statement
from ascendc_pack.kernels import family
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.target import CpuTarget

log = logging.getLogger("ascendc_pack")

MAX_CANDIDATES = 10
TEMPLATE_NAME = "kernel/gemm.cpp.j2"
DTYPES = {"float32": ("float", torch.float32), "bfloat16": ("uint16_t", torch.bfloat16),
          "float16": ("uint16_t", torch.float16)}
RESIDUAL_OPS = ("add", "mul")
EPILOGUE_OPS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish", "hardsigmoid") + RESIDUAL_OPS
"""Pointwise steps a GEMM can fuse, applied in order after the bias; ``add`` / ``mul`` add /
multiply by the next residual input (a tensor broadcastable to [batch, M, N], strides in the
spec; ``mul``: e.g. a gated MLP's ``up(x) * silu(gate(x))``)."""

_CONVERT = {  # dtype -> (to float, from float, round to the dtype)
    "float32": ("x", "v", "v"),
    "bfloat16": ("ap_bf16_to_f32(x)", "ap_f32_to_bf16(v)", "ap_round_bf16(v)"),
    "float16": ("ap_f16_to_f32(x)", "ap_f32_to_f16(v)", "ap_round_f16(v)"),
}


class GemmSpecError(PackError, ValueError):
    """A GEMM spec or a GEMM kernel call is inconsistent (message names the problem and the fix)."""


# ----------------------------------------------------------------------------- spec


Strides = tuple[int, int, int]


@dataclass(frozen=True)
class GemmSpec:
    """One static GEMM ``C[b] = epilogue(A[b] @ B[b] (+ bias))``, C contiguous [batch, M, N].

    Strides are in elements, in logical order: ``a_strides`` = (batch, m, k) with k-stride 1
    (row-major A), ``b_strides`` = (batch, k, n) of B as the graph holds it: (0, N, 1) is a
    [K, N] matrix, (0, 1, K) an nn.Linear weight [N, K] (any strides work: candidates that do not
    pack B need n-stride 1); batch stride 0 = one B for every batch.
    ``b_constant``: B is a weight, so candidates may pack it once at load time. ``residual_strides``
    has one (batch, m, n) triple per ``add`` step (0 broadcasts). ``dtype`` is that of every input
    and of C; the kernel computes in float32 and rounds where eager's ops round."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "float32"
    a_strides: Strides | None = None
    b_strides: Strides | None = None
    b_constant: bool = False
    bias: bool = False
    epilogue: tuple[str, ...] = ()
    residual_strides: tuple[Strides, ...] | None = None

    def __post_init__(self):
        try:
            check_component(self.name, "GEMM kernel name")
        except ValueError as e:
            raise GemmSpecError(str(e)) from None
        for what in ("m", "n", "k", "batch"):
            v = getattr(self, what)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GemmSpecError(f"GEMM {self.name}: {what} must be a positive int, got {v!r}")
        if self.dtype not in DTYPES:
            raise GemmSpecError(f"GEMM {self.name}: dtype must be one of {', '.join(DTYPES)}, got "
                                f"{self.dtype!r}; other dtypes run as ATen")
        bad = [op for op in self.epilogue if op not in EPILOGUE_OPS]
        if bad:
            raise GemmSpecError(f"GEMM {self.name}: unsupported epilogue step(s) {bad}; fusable steps are "
                                f"{', '.join(EPILOGUE_OPS)} (leave others to a separate kernel)")
        m, n, k = self.m, self.n, self.k
        object.__setattr__(self, "epilogue", tuple(self.epilogue))
        object.__setattr__(self, "a_strides", self._strides("a_strides", self.a_strides, (m * k, k, 1)))
        object.__setattr__(self, "b_strides", self._strides("b_strides", self.b_strides, (k * n, n, 1)))
        n_res = self.n_residuals
        res = ((m * n, n, 1),) * n_res if self.residual_strides is None else \
            tuple(self._strides("residual_strides", r, None) for r in self.residual_strides)
        if len(res) != n_res:
            raise GemmSpecError(f"GEMM {self.name}: {n_res} 'add'/'mul' epilogue step(s) need as many residual "
                                f"stride triples, got {len(res)}")
        if self.batch == 1:  # the batch stride of a single batch is meaningless: keep one spelling
            res = tuple((0,) + r[1:] for r in res)
            object.__setattr__(self, "a_strides", (0,) + self.a_strides[1:])
            object.__setattr__(self, "b_strides", (0,) + self.b_strides[1:])
        object.__setattr__(self, "residual_strides", res)
        if self.a_strides[2] != 1 and k > 1:
            raise GemmSpecError(f"GEMM {self.name}: A must be row-major (k-stride 1), got strides "
                                f"{self.a_strides}; make A contiguous before the GEMM")
        object.__setattr__(self, "a_strides", self.a_strides[:2] + (1,))
        if self.b_constant and self.b_strides[0] != 0:
            raise GemmSpecError(f"GEMM {self.name}: a constant (packable) B must be shared by all "
                                f"batches (batch stride 0), got strides {self.b_strides}")

    def _strides(self, what: str, value, default) -> Strides:
        value = default if value is None else tuple(value)
        if len(value) != 3 or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in value):
            raise GemmSpecError(f"GEMM {self.name}: {what} must be 3 non-negative ints (batch, row, column "
                                f"strides in elements), got {value!r}")
        return value

    @staticmethod
    def linear(name: str, m: int, n: int, k: int, *, bias: bool = True, epilogue=(), dtype="float32",
               batch: int = 1, residual_strides=None) -> GemmSpec:
        """``F.linear(x, weight[N, K], bias)`` on x [batch, M, K], weight constant (packable)."""
        return GemmSpec(name, m, n, k, batch, dtype, None, (0, 1, k), True, bias, tuple(epilogue),
                        residual_strides)

    @staticmethod
    def matmul(name: str, m: int, n: int, k: int, *, batch: int = 1, transpose_b: bool = False,
               epilogue=(), dtype="float32", bias: bool = False, residual_strides=None) -> GemmSpec:
        """``torch.mm`` / ``torch.bmm`` of two activations: B [batch, K, N], or [batch, N, K]
        read transposed (``A @ B.transpose(-1, -2)``, as in attention's Q·Kᵀ)."""
        bstride = (k * n if batch > 1 else 0,) + ((1, k) if transpose_b else (n, 1))
        return GemmSpec(name, m, n, k, batch, dtype, None, bstride, False, bias, tuple(epilogue),
                        residual_strides)

    @property
    def b_transposed(self) -> bool:
        """B's rows are not contiguous (an [N, K] weight, or strided): it must be packed."""
        return self.b_strides[2] != 1

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def n_inputs(self) -> int:
        return 2 + int(self.bias) + len(self.residual_strides)

    @property
    def n_residuals(self) -> int:
        """Residual inputs the epilogue reads (one per ``add`` / ``mul``)."""
        return sum(op in RESIDUAL_OPS for op in self.epilogue)

    def to_json(self) -> dict:
        return {**asdict(self), "epilogue": list(self.epilogue)}

    @staticmethod
    def from_json(d: dict) -> GemmSpec:
        return GemmSpec(**{**d, "epilogue": tuple(d.get("epilogue", ())),
                           "residual_strides": tuple(tuple(r) for r in d.get("residual_strides") or ())})

    def spec_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


# ----------------------------------------------------------------------------- tiling + cost


@dataclass(frozen=True)
class GemmTiling(Tiling):
    """A candidate's parameters (see the module docstring)."""

    mr: int
    nr: int
    lanes: int
    mc: int
    nc: int
    kc: int
    bd: int
    pack: str

    error = GemmSpecError
    kind = "GEMM"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil(a, b) * b


def _layout_bytes(spec: GemmSpec, t: GemmTiling) -> tuple[int, int, int]:
    """(shared workspace bytes, bytes per thread, tail-buffer offset in floats per thread)."""
    packed = spec.batch if spec.b_strides[0] else 1
    shared = _round_up(packed * _ceil(spec.n, t.nr) * spec.k * t.nr * 4, 64) if t.pack == "call" else 0
    acc = t.mc * _round_up(t.nc, t.nr) if spec.dtype != "float32" and spec.k > t.kc else 0
    tail = t.kc * t.nr if t.pack == "none" and spec.n % t.nr else 0
    return shared, _round_up((acc + tail) * 4, 64), acc


def workspace_bytes(spec: GemmSpec, t: GemmTiling) -> int:
    """Scratch bytes a candidate needs (64 spare bytes let the kernel align it)."""
    shared, per_thread, _ = _layout_bytes(spec, t)
    total = shared + t.bd * per_thread
    return total + 64 if total else 0


# Fraction of FMA peak a register block reaches in its k loop, by vectors per row, for blocks of
# up to 4 rows and of 6 or more (measured single-threaded, 128x256x256, on the AVX-512 host this
# was written on: few rows re-stream the B panel and broadcast more per FMA)
_EFF_FEW_ROWS = {1: 0.8, 2: 0.68, 3: 0.73, 4: 0.8, 6: 0.8}
_EFF_MANY_ROWS = {1: 0.87, 2: 1.0, 3: 0.97, 4: 1.0, 6: 1.0}
# ... and what 12 or 14 rows keep of that in a model: PGO of transformer_block's four GEMMs
# (M 1024, K 256 and 1024; 2-vCPU Xeon, 48 KiB L1) timed 14 rows 5-12 % and 12 rows 3-9 % slower
# than 6 or 8 in context, where the single-threaded loop had them even (MR rows of A are MR
# streams into L1 beside the B panel)
_EFF_TALL = {12: 0.95, 14: 0.92}


def _ukernel_cycles(r: int, w: int) -> float:
    """Cycles per k step of an r x w-vector register block: r*w FMAs on 2 pipes at the block's
    measured efficiency, and no faster than FMA latency (4) over its independent accumulators."""
    chains = r * w * (2 if r * w < 8 else 1)
    eff = min((_EFF_MANY_ROWS if r >= 6 else _EFF_FEW_ROWS).get(w, 0.8), chains / 8) * _EFF_TALL.get(r, 1.0)
    return r * w / 2.0 / eff


def pool_loads(tasks: list[float], threads: int) -> list[float]:
    """Each thread's share of ``tasks`` as the graph's task pool hands them out (task_pool.h): the
    first thread free takes the next task, the caller from the front and the workers from the back.
    Blocks of unequal size can then leave a thread idle: cond_model's 256x1024x1024 GEMM in 128 x
    672 and 128 x 352 blocks ran its caller's two large ones while the worker ran the small ones
    (`--topn 1` 2.02 ms against 1.52 for `--topn 4`), where handing tasks out in order balanced them."""
    loads = [0.0] * threads
    front, back = 0, len(tasks) - 1
    while front <= back:
        w = loads.index(min(loads))
        if w == 0 or threads == 1:
            loads[w] += tasks[front]
            front += 1
        else:
            loads[w] += tasks[back]
            back -= 1
    return loads


def estimate_us(spec: GemmSpec, t: GemmTiling, target: CpuTarget) -> float:
    """Rank-only estimate of one call in microseconds (PGO measures; this orders candidates):
    the busiest thread's micro-kernel cycles (tails, cache misfits, epilogue) or, when larger,
    the time to stream the operands from the cache level they live in; plus packing per call
    and the fork/join of a parallel region."""
    m, n, k, vec = spec.m, spec.n, spec.k, t.lanes
    epi = 2 + sum(EPILOGUE[o].cycles for o in spec.epilogue) + (6 if spec.dtype != "float32" else 0)
    factor = 1.0  # cache fit: the KC x NR panel about in L1, the MC x KC block of A in L2
    if t.kc * t.nr * 4 > target.l1d * 2:
        factor *= 1.15
    if t.mc * t.kc * (4 if spec.dtype == "float32" else 2) > target.l2 * 0.6:
        factor *= 1.15
    if t.pack == "none" and k > 32:
        factor *= 1.1 if (spec.b_strides[1] * 4) % 4096 else 1.3  # rows of B in L1 sets / pages

    # a panel reused across row blocks but not held by L1 streams from L2: one FMA per loaded
    # vector (MR=1) cannot keep up (6x slower, measured), two barely
    spill = t.kc * t.nr * 4 > target.l1d * 0.75 and m > t.mr
    factor *= {1: 6.0, 2: 1.1}.get(t.mr, 1.0) if spill else 1.0

    def block_cycles(mlen: int, nlen: int) -> float:
        rows = [(t.mr, mlen // t.mr)] + ([(mlen % t.mr, 1)] if mlen % t.mr else [])
        cols = [(t.nr // vec, nlen // t.nr)] + ([(_ceil(nlen % t.nr, vec), 1)] if nlen % t.nr else [])
        cyc = sum(nr_ * nc_ * (k * _ukernel_cycles(r, w) * factor + 30) for r, nr_ in rows for w, nc_ in cols)
        return cyc + mlen * _ceil(nlen, vec) * (epi + 2 * (_ceil(k, t.kc) - 1))  # tile merges + epilogue

    mb, nb = _ceil(m, t.mc), _ceil(n, t.nc)
    batches = min(spec.batch, 64)
    tasks = [block_cycles(min(t.mc, m - i * t.mc), min(t.nc, n - j * t.nc))
             for _ in range(batches) for j in range(nb) for i in range(mb)]
    nt = t.bd
    busiest = max(pool_loads(tasks, nt)) * spec.batch / batches
    us = busiest / (target.ghz * 1e3)
    # operand streaming: B (as the kernel reads it) once per row block, A once per column block
    b_batches = spec.batch if spec.b_strides[0] else 1
    b_bytes = b_batches * _round_up(n, t.nr) * k * 4
    elem = 4 if spec.dtype == "float32" else 2
    c_bytes = spec.batch * m * n * elem * (1 + spec.n_residuals)
    traffic = b_bytes * mb + spec.batch * m * k * elem * nb + c_bytes
    gbps = target.l2_gbps if b_bytes <= target.l2 * 0.5 * nt else target.mem_gbps
    stream_us = traffic / (gbps * 1e3 * min(nt, len(tasks)))
    if stream_us > us:
        # Memory-bound: the first row block of a panel streams it in (prefetching as it goes, its
        # FMAs hidden behind the loads); the other row blocks re-read it from cache after. A
        # 4 x 2304 x 768 weight GEMM ran in 107 us as one 4-row block, 134-142 as 1- or 2-row ones.
        row_blocks = _ceil(min(t.mc, m), t.mr)
        us = stream_us + us * (row_blocks - 1) / row_blocks
    if t.pack == "call":  # one more pass over B (transposing is slower), shared by the threads
        per_elem = 1.5 if spec.b_transposed else 0.6
        us += b_batches * n * k * per_elem / min(nt, _ceil(n, t.nr)) / (target.ghz * 1e3) + (1.0 if nt > 1 else 0)
    if nt > 1:
        us += 4.0  # fork/join; more on a busy host, where small kernels must stay single-threaded
    return us


def _register_blocks(target: CpuTarget) -> list[tuple[int, int]]:
    """(MR, vectors per row) pairs whose accumulators, B vectors and a broadcast fit the registers."""
    blocks = []
    for r in (1, 2, 3, 4, 6, 8, 12, 14):
        for w in (1, 2, 3, 4, 6):
            accs = r * w * (2 if r * w < 8 else 1)
            if accs + w + 1 <= target.registers and (r * w >= 4 or r == 1):
                blocks.append((r, w))
    return blocks


def _space(spec: GemmSpec, target: CpuTarget, cores: int) -> list[GemmTiling]:
    m, n, k, vec = spec.m, spec.n, spec.k, target.lanes
    packs = ["call"] + (["load"] if spec.b_constant else [])
    if spec.dtype == "float32" and not spec.b_transposed:
        packs.append("none")
    bds = sorted({1, cores} | ({cores // 2} if cores >= 4 else set()))
    out = []
    for r, w in _register_blocks(target):
        nr = w * vec
        if (r > m and r > 1) or (w > 1 and (w - 1) * vec >= n):
            continue  # a block that only ever runs as a tail, or a vector that is always empty
        kcs = set()  # the KC x NR panel in half of L1, or about all of it
        for kc_cache in {max(32, int(target.l1d * f / (nr * 4)) // 16 * 16) for f in (0.5, 1.0)}:
            kcs.add(k if k <= kc_cache * 1.5 else kc_cache)
        for kc in kcs:
            mc_cache = max(r, int(target.l2 * 0.5 / (kc * 4)) // r * r)
            mc_full = min(mc_cache, _round_up(m, r))
            nc_full = min(_round_up(n, nr), max(nr, int(target.l2 * 0.5 / (kc * 4)) // nr * nr))
            for bd in bds:
                blocks = {(mc_full, nc_full)}
                for split in ((bd, bd * 2) if bd > 1 else ()):  # enough tasks for the threads
                    blocks.add((mc_full, max(nr, _round_up(_ceil(n, split), nr))))
                    blocks.add((max(r, _round_up(_ceil(m, split), r)), nc_full))
                for mc, nc in blocks:
                    for pack in packs:
                        out.append(GemmTiling(r, nr, vec, mc, nc, kc, bd, pack))
    return out


def propose(spec: GemmSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, 10)`` distinct candidates, best (lowest estimate) first. The list keeps
    variety for PGO: the best of every (pack, threads) kind (of every thread count, for a
    constant B: loading it packed beats packing it per call) and of every register block come
    before the runners-up."""
    scored, seen = [], set()
    for t in _space(spec, target, target.cores):
        cand = Candidate(t.tiling_repr, workspace_bytes(spec, t), t.bd)
        if cand.kernel_key not in seen:
            seen.add(cand.kernel_key)
            scored.append(KernelCandidate(t, cand, estimate_us(spec, t, target)))
    scored.sort(key=lambda c: (c.est_us, c.candidate.tiling_repr))
    ranked: dict[int, KernelCandidate] = {}  # by id: insertion-ordered, no deep comparisons
    # a constant B packed per call is the same kernel plus a pass over B: not a kind worth a slot
    threads = (lambda t: t.bd) if spec.b_constant else (lambda t: (t.pack, t.bd))
    for kind in (threads, lambda t: (t.mr, t.nr)):
        firsts = {}
        for c in scored:
            firsts.setdefault(kind(c.tiling), c)
        for c in firsts.values():
            ranked.setdefault(id(c), c)
    for c in scored:
        ranked.setdefault(id(c), c)
    return sorted(list(ranked.values())[:max(1, min(topn, MAX_CANDIDATES))],
                  key=lambda c: (c.est_us, c.candidate.tiling_repr))


# ----------------------------------------------------------------------------- render + build


def _epilogue_lines(spec: GemmSpec) -> list[str]:
    """C statements on `v` after the GEMM: bias, the steps, a rounding after each for 16-bit."""
    rnd = ["v = rnd(v);"] if spec.dtype != "float32" else []
    lines = (["v += to_f32(g.bias[n]);"] if spec.bias else []) + rnd
    for j, op in enumerate(spec.epilogue):
        i = sum(o in RESIDUAL_OPS for o in spec.epilogue[:j])  # the residual input an add/mul reads
        lines += [c_statement(op) if op not in RESIDUAL_OPS else
                  f"v {'+' if op == 'add' else '*'}= to_f32(g.res{i}[bb * SR{i}_B + m * SR{i}_M + n * SR{i}_N]);"] + rnd
    return lines


def render(spec: GemmSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (a static kernel: shapes and tiling compiled in)."""
    t, c = cand.tiling, cand.candidate
    shared, per_thread, tail_offset = _layout_bytes(spec, t)
    to_f32, from_f32, rnd = _CONVERT[spec.dtype]
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, dtype=spec.dtype, ctype=DTYPES[spec.dtype][0], to_f32=to_f32,
        from_f32=from_f32, rnd=rnd, batch=spec.batch, m=spec.m, n=spec.n, k=spec.k, sa=spec.a_strides,
        sb=spec.b_strides, bias=spec.bias, residuals=spec.residual_strides, t=t,
        shared_bytes=shared, thread_bytes=per_thread, tail_offset=tail_offset,
        acc_in_ws=spec.dtype != "float32" and spec.k > t.kc, mtail=spec.m % t.mr != 0,
        ntail=spec.n % t.nr != 0, n_inputs=spec.n_inputs, epilogue=_epilogue_lines(spec))


GENERATOR = Generator("gemm", __name__, TEMPLATE_NAME, propose, render, GemmTiling, keep_proposal=True)


def plan(spec: GemmSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources. The proposal is
    kept in the GEMM's cache directory (a warm rebuild skips the cost model)."""
    return family.plan(GENERATOR, spec, config, target)


def compile_gemms(specs: list[GemmSpec], config: BuildConfig, target: CpuTarget | None = None,
                  **compile_kwargs) -> list[FamilyBuild]:
    """Plan every spec and compile all their candidates in one ``compile_kernels`` call."""
    return family.compile_all(GENERATOR, specs, config, target, **compile_kwargs)
