"""Generated GEMM kernels (ascendc_pack/kernels/gemm/generator.py, templates/kernel/gemm.cpp.j2) against eager.

Every candidate (topn 10) of every case is compiled and run: shapes with no tails (256^3), odd
tails in M, N and K (37x61x29), tiny, skinny (M=1, a batch-1 linear), K over the cache block
(several K blocks, accumulation in C / in the workspace) and batched (bmm, B batched or shared),
B as [K, N] or transposed [N, K] (nn.Linear's weight), each with a fused epilogue; together the
cases cover every epilogue step and every pack mode (none / call / load). All specs compile in
one ``compile_gemms`` call into a module-wide cache directory, so compiles run in parallel and
once.

Tolerance: tests/kernel_check.py's per-dtype tolerance (float32 2e-5, float16 2e-3, bfloat16
1.6e-2), scaled by sqrt(K / 16) for float32: the kernel and eager sum K products in different
orders (and eager's oneDNN/MKL differs from itself across shapes), and that rounding difference
grows like sqrt(K). A wrong answer (a missed k step, a wrong column) is off by O(1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest
import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels.gemm.generator import (EPILOGUE_OPS, MAX_CANDIDATES, GemmSpec, GemmSpecError, compile_gemms,
                                                 estimate_us, propose)
from ascendc_pack.kernels.target import CpuTarget
from ascendc_pack.kernels.gemm.launch import GemmKernel, eager_reference, random_operands
from tests.kernel_check import tolerance

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

CASES = [
    # name: spec (names must be unique: they are kernel names)
    GemmSpec.linear("tiny_nk", 3, 5, 7, epilogue=("relu",)),
    GemmSpec.matmul("tiny_kn", 3, 5, 7),
    GemmSpec.linear("tails_nk", 37, 61, 29, epilogue=("gelu",)),
    GemmSpec("tails_kn_const", 37, 61, 29, b_constant=True, epilogue=("add", "silu", "add")),
    GemmSpec.linear("skinny_nk", 1, 203, 77, epilogue=("gelu_tanh",)),
    GemmSpec.matmul("skinny_kn", 1, 203, 77, epilogue=("sigmoid",)),
    GemmSpec.linear("square_nk", 256, 256, 256, epilogue=("add",)),
    GemmSpec.linear("gated_mul_nk", 37, 61, 29, bias=True, epilogue=("mul", "relu")),  # Llama's up(x) * gate
    GemmSpec.matmul("square_kn", 256, 256, 256, epilogue=("relu",)),
    GemmSpec.linear("klarge_nk", 8, 40, 2000),
    GemmSpec.matmul("klarge_kn", 9, 37, 1500, epilogue=("gelu",)),
    GemmSpec.matmul("bmm_kn", 37, 61, 29, batch=3, epilogue=("relu", "add"), residual_strides=((0, 61, 1),)),
    GemmSpec.matmul("bmm_nk", 37, 61, 29, batch=3, transpose_b=True, epilogue=("sigmoid",)),
    GemmSpec.linear("linear3d", 20, 33, 48, batch=2, epilogue=("add",), residual_strides=((0, 0, 1),)),
    GemmSpec("strided_b", 37, 61, 29, b_strides=(0, 130, 2), epilogue=("relu",)),  # B = X[:, ::2]
    GemmSpec.matmul("k1_nk", 5, 17, 1, transpose_b=True, epilogue=("relu",)),  # K = 1
    GemmSpec.matmul("n1", 300, 1, 3),  # N = 1: one partial vector
    # 1x1 convolutions on channels_last rows (mobilenet_v3): hardswish, hardsigmoid
    GemmSpec.linear("conv1x1_hswish", 196, 40, 24, epilogue=("hardswish",)),
    GemmSpec.linear("conv1x1_se", 1, 72, 18, epilogue=("hardsigmoid",)),
    # 16-bit inputs compute in float32 and round where eager rounds
    GemmSpec.linear("tails_bf16", 37, 61, 29, dtype="bfloat16", epilogue=("gelu",)),
    GemmSpec.matmul("bmm_fp16", 37, 61, 29, batch=2, dtype="float16", epilogue=("add",)),
    GemmSpec.linear("klarge_bf16", 5, 70, 1200, dtype="bfloat16", epilogue=("silu",)),
]


def gemm_tolerance(spec: GemmSpec) -> float:
    tol, _ = tolerance(DT[spec.dtype])
    return tol * max(1.0, math.sqrt(spec.k / 16)) if spec.dtype == "float32" else tol


def assert_close(out: torch.Tensor, ref: torch.Tensor, spec: GemmSpec, what: str):
    tol = gemm_tolerance(spec)
    assert out.dtype == ref.dtype and out.shape == ref.shape, \
        f"{what}: {out.dtype}{list(out.shape)} vs {ref.dtype}{list(ref.shape)}"
    ok = torch.isclose(out.double(), ref.double(), atol=tol, rtol=tol, equal_nan=True)
    if not bool(ok.all()):
        idx = tuple((~ok).nonzero()[0].tolist())
        pytest.fail(f"{what}: {int((~ok).sum())} mismatches (tol {tol:.2e}), first at {list(idx)}: "
                    f"got {out[idx].item()}, expected {ref[idx].item()}")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gemm_cache")


@pytest.fixture(scope="module")
def builds(cache_dir):
    config = BuildConfig(topn=MAX_CANDIDATES, cache_dir=cache_dir, jobs=2)
    return {b.spec.name: b for b in compile_gemms(CASES, config)}


@pytest.mark.parametrize("spec", CASES, ids=[s.name for s in CASES])
def test_every_candidate_matches_eager(spec, builds):
    build = builds[spec.name]
    a, b, bias, residuals = random_operands(spec)
    ref = eager_reference(spec, a, b, bias, residuals)
    assert 1 <= len(build.candidates) <= MAX_CANDIDATES
    assert len({c.candidate.kernel_key for c in build.candidates}) == len(build.candidates)
    for gc, cc in zip(build.candidates, build.compiled.candidates):
        assert cc.ok, cc.error
        kernel = GemmKernel(spec, cc.so_path, cc.candidate.kernel_key)
        assert kernel.b_packed == (gc.tiling.pack == "load")
        b_in = kernel.prepare_b(b)
        out = kernel(a, b_in, bias, residuals)
        assert_close(out, ref, spec, gc.candidate.tiling_repr)
        # a second call into the same output (stale values there must not leak in), one thread
        out2 = kernel(a, b_in, bias, residuals, out=torch.full_like(out, float("nan")), max_threads=1)
        assert torch.equal(out2, out) or gc.tiling.bd > 1, gc.candidate.tiling_repr
        assert_close(out2, ref, spec, gc.candidate.tiling_repr + " (max_threads=1)")


def test_cases_cover_every_epilogue_and_pack_mode(builds):
    steps = {op for s in CASES for op in s.epilogue}
    assert steps == set(EPILOGUE_OPS)
    packs = {gc.tiling.pack for b in builds.values() for gc in b.candidates}
    assert packs == {"none", "call", "load"}
    assert {gc.tiling.bd for b in builds.values() for gc in b.candidates} >= {1}


@pytest.mark.parametrize("name", ["tails_kn_const", "tiny_nk", "bmm_nk"])
def test_special_values_propagate_like_eager(builds, name):
    """NaN and +-inf in A and B give NaN/inf exactly where eager has them (through silu, relu,
    sigmoid; eager's erf-gelu maps +inf to NaN, a quirk the kernel does not copy: gelu(+inf) =
    +inf, as torch.compile computes it)."""
    spec = next(s for s in CASES if s.name == name)
    a, b, bias, res = random_operands(spec, seed=1)
    a[..., 0, 1], a[..., -1, 0], a[..., 1, -1] = float("nan"), float("inf"), float("-inf")
    b[..., 2, 2] = float("inf")
    ref = eager_reference(spec, a, b, bias, res)
    for gc, cc in zip(builds[spec.name].candidates, builds[spec.name].compiled.candidates):
        kernel = GemmKernel(spec, cc.so_path, cc.candidate.kernel_key)
        out = kernel(a, kernel.prepare_b(b), bias, res)
        assert torch.equal(out.isnan(), ref.isnan()), gc.candidate.tiling_repr
        assert torch.equal(out.isinf(), ref.isinf()), gc.candidate.tiling_repr
        assert_close(out, ref, spec, gc.candidate.tiling_repr)


def test_packed_layout_is_the_documented_one(builds):
    """gemm_abi.h: panel p holds B[k][p*NR + j] at ((p * K) + k) * NR + j, zero past N."""
    spec = next(s for s in CASES if s.name == "tails_nk")
    _, b, _, _ = random_operands(spec)
    for gc, cc in zip(builds[spec.name].candidates, builds[spec.name].compiled.candidates):
        nr = gc.tiling.nr
        packed = GemmKernel(spec, cc.so_path).pack_b(b).data
        panels = math.ceil(spec.n / nr)
        want = torch.zeros(spec.k, panels * nr)
        want[:, :spec.n] = b
        assert torch.equal(packed.view(panels, spec.k, nr), want.view(spec.k, panels, nr).transpose(0, 1))


def test_builds_for_a_portable_isa(tmp_path):
    """-march=x86-64-v2 (SSE4.2: 4 lanes, 16 registers) builds and matches too."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    spec = GemmSpec.linear("portable", 37, 61, 29, epilogue=("gelu",))
    config = BuildConfig(topn=3, cache_dir=tmp_path, jobs=2, march="x86-64-v2")
    [build] = compile_gemms([spec], config)
    assert all(gc.tiling.lanes == 4 for gc in build.candidates)
    a, b, bias, _ = random_operands(spec)
    ref = eager_reference(spec, a, b, bias)
    for cc in build.compiled.candidates:
        assert cc.ok, cc.error
        kernel = GemmKernel(spec, cc.so_path)
        assert_close(kernel(a, kernel.prepare_b(b), bias), ref, spec, cc.candidate.tiling_repr)


# ----------------------------------------------------------------------------- tiling


def test_candidates_are_ranked_distinct_and_keyed_like_torch_npu():
    target = CpuTarget(cores=2, lanes=16, registers=32, l1d=48 << 10, l2=1 << 20)
    cands = propose(GemmSpec.linear("x", 128, 256, 256), target, 10)
    assert len(cands) == 10
    assert [c.est_us for c in cands] == sorted(c.est_us for c in cands)
    for c in cands:
        t, cand = c.tiling, c.candidate
        text = f"{cand.tiling_repr}|{cand.workspace}|{cand.block_dim}"
        assert cand.kernel_key == hashlib.md5(text.encode()).hexdigest()
        assert cand.block_dim == t.bd <= 2 and t.nr % t.lanes == 0 and t.mc % t.mr == 0 and t.nc % t.nr == 0
        assert (cand.workspace > 0) == (t.pack == "call")
    assert "none" not in {c.tiling.pack for c in cands}  # a transposed weight is never read in place
    assert {c.tiling.bd for c in cands} == {1, 2}
    assert len({(c.tiling.mr, c.tiling.nr) for c in cands}) >= 3
    assert len(propose(GemmSpec.linear("x", 128, 256, 256), target, 3)) == 3
    # two activations: B is packed per call or read in place, and both kinds get a slot
    mm = propose(GemmSpec.matmul("y", 128, 256, 256), target, 10)
    assert {c.tiling.pack for c in mm} == {"call", "none"}


def test_a_weight_gemm_spends_its_slots_on_tilings_not_on_packing_per_call():
    """``--topn 4`` on a transformer's GEMMs: before, the four slots were one tiling with B
    packed at load and per call, on 2 and on 1 thread (PGO compared one tiling with the
    libraries); now three register blocks on every thread and the best on one thread (a busy
    host's pick), none packing a constant B per call (the same kernel plus a pass over B)."""
    target = CpuTarget(cores=2, lanes=16, registers=32, l1d=48 << 10, l2=2 << 20)
    for m, n, k in ((1024, 768, 256), (1024, 256, 1024), (128, 1024, 256)):
        cands = propose(GemmSpec.linear("t", m, n, k), target, 4)
        tilings = [c.tiling for c in cands]
        assert all(t.pack == "load" for t in tilings), tilings
        assert [t.bd for t in tilings].count(2) == 3 and [t.bd for t in tilings].count(1) == 1, tilings
        assert len({(t.mr, t.nr) for t in tilings if t.bd == 2}) == 3, tilings
        assert tilings[0].mr <= 8  # 12 or 14 rows ran 3-12 % slower in context (generator._EFF_TALL)


def test_a_memory_bound_gemm_streams_each_panel_in_one_row_block():
    """A few rows against a weight bigger than L2 (a batch-1 encoder's GEMMs) only stream B: the
    kernel's first row block of a panel prefetches it in, later row blocks re-read it from cache
    and add their FMAs. Before, every tiling tied at the streaming time and the tie went to the
    name, 1- and 2-row blocks (134-142 us where one 4-row block ran 107, 4 x 2304 x 768)."""
    target = CpuTarget(cores=2, lanes=16, registers=32, l1d=48 << 10, l2=2 << 20)
    for m, n, k in ((4, 2304, 768), (4, 768, 3072), (3, 3072, 768)):
        spec = GemmSpec.linear("t", m, n, k)
        cands = propose(spec, target, 4)
        assert all(c.tiling.mr >= m for c in cands), [c.tiling for c in cands]
        rows = lambda r: estimate_us(spec, dataclasses.replace(cands[0].tiling, mr=r, mc=m), target)  # noqa: E731
        assert rows(1) > rows(2) > rows(cands[0].tiling.mr)


def test_cost_model_keeps_small_gemms_on_one_thread_and_splits_big_ones():
    target = CpuTarget(cores=4, lanes=8, registers=16)
    small = propose(GemmSpec.linear("s", 4, 32, 32), target, 10)[0]
    assert small.tiling.bd == 1 and small.tiling.pack == "load"
    big = propose(GemmSpec.linear("b", 512, 1024, 1024), target, 10)[0]
    assert big.tiling.bd == 4
    skinny = propose(GemmSpec.linear("m1", 1, 1000, 512), target, 10)
    assert all(c.tiling.mr <= 2 for c in skinny[:3])  # no wasted rows for M=1
    # register blocks fit the register file: accumulators + B vectors + a broadcast
    for c in propose(GemmSpec.linear("b", 512, 1024, 1024), target, 10):
        w = c.tiling.nr // c.tiling.lanes
        assert c.tiling.mr * w * (2 if c.tiling.mr * w < 8 else 1) + w + 1 <= target.registers


def test_target_detects_vector_width_and_caches():
    t = CpuTarget.detect(2, "x86-64-v2", caches={"L1d": 32768, "L2": 1 << 19})
    assert (t.lanes, t.registers, t.l1d, t.l2, t.cores) == (4, 16, 32768, 1 << 19, 2)
    assert CpuTarget.detect(3, "x86-64-v3", caches={}).lanes == 8


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(m=0), "m must be a positive int"),
    (dict(k=2.5), "k must be a positive int"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(epilogue=("tanh",)), "unsupported epilogue step"),
    (dict(a_strides=(0, 1, 7)), "A must be row-major"),
    (dict(batch=2, b_strides=(35, 5, 1), b_constant=True), "shared by all batches"),
    (dict(epilogue=("add",), residual_strides=()), "need as many residual"),
    (dict(epilogue=("add",), residual_strides=((0, -1, 1),)), "non-negative ints"),
    (dict(name="../x"), "GEMM kernel name"),
])
def test_bad_specs_get_typed_errors(kwargs, match):
    base = dict(name="g", m=3, n=5, k=7)
    with pytest.raises(GemmSpecError, match=match):
        GemmSpec(**{**base, **kwargs})


def test_bad_operands_get_typed_errors_not_crashes(builds):
    spec = next(s for s in CASES if s.name == "square_nk")
    build = builds[spec.name]
    cc = build.compiled.candidates[0]
    kernel = GemmKernel(spec, cc.so_path)
    a, b, bias, res = random_operands(spec)
    b_in = kernel.prepare_b(b)
    with pytest.raises(GemmSpecError, match="A is"):
        kernel(a[:, :100], b_in, bias, res)
    with pytest.raises(GemmSpecError, match="float32 tensor"):
        kernel(a.double(), b_in, bias, res)
    with pytest.raises(GemmSpecError, match="bias .the kernel adds one. must be"):
        kernel(a, b_in, None, res)
    with pytest.raises(GemmSpecError, match="residual"):
        kernel(a, b_in, bias, [])
    with pytest.raises(GemmSpecError, match="residual 0 must broadcast"):
        kernel(a, b_in, bias, [torch.zeros(3, 3)])
    with pytest.raises(GemmSpecError, match="reads B packed with NR" if kernel.b_packed else "not packed"):
        kernel(a, b if kernel.b_packed else kernel.pack_b(b), bias, res)
    other = next((GemmKernel(spec, c.so_path) for g, c in zip(build.candidates, build.compiled.candidates)
                  if g.tiling.nr != kernel.nr), None)
    if kernel.b_packed and other is not None:  # a B packed for another panel width is refused
        with pytest.raises(GemmSpecError, match="reads B packed with NR"):
            kernel(a, other.pack_b(b), bias, res)
    with pytest.raises(GemmSpecError, match=r"B \(as \[K, N\]\) is"):
        kernel.pack_b(b[:-1])
    with pytest.raises(GemmSpecError, match="reads B packed" if kernel.b_packed else "must be a CPU"):
        kernel(a, "b", bias, res)
    with pytest.raises(GemmSpecError, match="out is"):
        kernel(a, b_in, bias, res, out=torch.empty(3, 3))


def test_spec_round_trips_through_json():
    spec = CASES[10]
    assert GemmSpec.from_json(spec.to_json()) == spec
    assert spec.spec_text() == GemmSpec.from_json(spec.to_json()).spec_text()


def test_the_cost_model_hands_out_blocks_as_the_task_pool_does():
    """The caller takes blocks from the front, the workers from the back (task_pool.h): two large
    blocks then two small ones leave the caller with both large ones, which in-order dynamic
    scheduling would have split. The first candidates' blocks then split evenly between the threads
    (cond_model's 256x1024x1024 GEMM was cut in 128 x 672 and 128 x 352 blocks: --topn 1 ran 1.31x
    --topn 4)."""
    from ascendc_pack.kernels.gemm.generator import pool_loads

    assert pool_loads([672, 672, 352, 352], 2) == [1344, 704]
    assert pool_loads([512, 512, 512, 512], 2) == [1024, 1024]
    assert pool_loads([3, 1, 1, 1], 1) == [6]
    target = CpuTarget(cores=2, lanes=16, registers=32, l1d=48 << 10, l2=2 << 20)
    for m, n, k in ((256, 1024, 1024), (256, 2048, 1024), (256, 1024, 2048)):
        t = propose(GemmSpec.linear("c", m, n, k), target, 1)[0].tiling
        blocks = [min(t.mc, m - i) * min(t.nc, n - j) for j in range(0, n, t.nc) for i in range(0, m, t.mc)]
        loads = pool_loads(blocks, t.bd)
        assert max(loads) <= 1.05 * sum(loads) / len(loads), (m, n, k, t.tiling_repr, loads)
