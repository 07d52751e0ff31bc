"""Generated attention kernels (ascendc_pack/kernels/attention/generator.py, templates/kernel/attention.cpp.j2)
against eager.

Every candidate (topn 10) of every case is compiled and run on seeded operands and compared with
eager PyTorch's math written out (``tactics.attention_reference``): no mask; an additive float
mask broadcast over batch and heads; a bool mask with fully masked rows (0 with ``_safe_softmax``,
NaN with a written-out softmax, as eager); causal; grouped-query attention; q/k/v as the strided
views of one ``qkv`` projection (read in place, with 2-thread candidates); a shifted-window mask; ``Ev != E``; ``L != S``; sizes with tails of
every block (5 rows, 7 keys, head size 12). All specs compile in one ``compile_kernels`` call.
"""

from __future__ import annotations

import math

import pytest
import torch

from ascendc_pack.kernels.attention.generator import MAX_CANDIDATES, AttnKernel, AttnSpec, AttnSpecError, plan, propose
from ascendc_pack.toolchain.compiler import compile_kernels
from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels.target import FALLBACK, CpuTarget
from ascendc_pack.tactics.dispatch import AttentionStep, attention_reference
from tests.kernel_check import tolerance

TARGET = CpuTarget.detect(2, profile=FALLBACK)  # the cost model as written, not this host's rates


def _qkv_view_strides(b, h, l, e):
    """(batch, head, row) strides of q/k/v as views of a [B, L, 3, H, E] projection."""
    return (l * 3 * h * e, e, 3 * h * e)


def _contig(h, l, e):
    return (h * l * e, l * e, e)


def _spec(name, b, h, hk, l, s, e, ev=None, mask=None, mask_shape=None, causal=False, safe=True, views=False,
          windows=None):
    ev = ev or e
    q = _qkv_view_strides(b, h, l, e) if views else _contig(h, l, e)
    k = _qkv_view_strides(b, hk, s, e) if views else _contig(hk, s, e)
    v = _qkv_view_strides(b, hk, s, ev) if views else _contig(hk, s, ev)
    return AttnSpec(name, b, h, hk, l, s, e, ev, 1.0 / math.sqrt(e), q, k, v, mask, mask_shape, causal, safe,
                    windows)


CASES = [
    _spec("plain_vit", 1, 6, 6, 120, 120, 64, views=True),  # long enough for 2-thread candidates
    _spec("float_mask_bcast", 2, 4, 4, 33, 33, 32, mask="float", mask_shape=(2, 1, 1, 33)),
    _spec("bool_mask_full_rows", 2, 2, 2, 9, 11, 16, mask="bool", mask_shape=(2, 1, 9, 11)),
    _spec("bool_mask_unsafe", 1, 2, 2, 9, 11, 16, mask="bool", mask_shape=(1, 1, 9, 11), safe=False),
    _spec("causal_gqa", 1, 8, 2, 40, 40, 32, causal=True),
    _spec("window_mask", 8, 2, 2, 16, 16, 16, mask="float", mask_shape=(8, 1, 16, 16)),
    _spec("shifted_windows", 8, 2, 2, 16, 16, 16, mask="float", mask_shape=(4, 1, 16, 16), views=True, windows=4),
    _spec("tails_ev", 1, 3, 3, 5, 7, 12, ev=20),
    _spec("cross_long", 1, 2, 1, 4, 300, 24, mask="float", mask_shape=(1, 2, 4, 300)),
]


def _operands(spec: AttnSpec, seed: int = 0) -> dict:
    """Seeded q, k, v in the spec's strides (views of larger buffers), and the mask."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, (shape, stride, dtype) in spec.input_layouts().items():
        if n == "mask":
            if dtype == "bool":
                m = torch.rand(shape, generator=g) > 0.4
                m[..., 0, :] = False  # a fully masked row per batch / head
                out[n] = m
            else:
                out[n] = torch.randn(shape, generator=g) * 3
                if spec.mask_windows:  # swin's: -100 across regions, so exp() of those scores is denormal in eager
                    out[n] += torch.where(torch.rand(shape, generator=g) > 0.5, 0.0, -100.0)
            continue
        size = 1 + sum((d - 1) * st for d, st in zip(shape, stride))
        buf = torch.randn(size, generator=g)
        out[n] = buf.as_strided(shape, stride)
    return out


def _reference(spec: AttnSpec, named: dict) -> torch.Tensor:
    step = AttentionStep(spec.batch, spec.heads, spec.q_len, spec.kv_len, spec.head_dim, spec.kv_heads,
                         spec.v_head_dim, spec.scale, spec.mask, spec.mask_shape, spec.causal, spec.safe_softmax,
                         mask_windows=spec.mask_windows)
    with torch.no_grad():
        ref = attention_reference(step, named)
    if not spec.safe_softmax and spec.mask == "bool":  # a written-out softmax: NaN on fully masked rows
        dead = ~named["mask"].any(-1, keepdim=True).expand(spec.batch, spec.heads, spec.q_len, 1)
        ref = torch.where(dead, torch.full_like(ref, float("nan")), ref)
    return ref


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    config = BuildConfig.resolve(topn=MAX_CANDIDATES, cache_dir=tmp_path_factory.mktemp("attn_cache"), jobs=2)
    out = [plan(s, config, TARGET) for s in CASES]
    for b, ck in zip(out, compile_kernels([b.build for b in out], config)):
        b.compiled = ck
    return out


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c.name for c in CASES])
def test_every_candidate_matches_eager(builds, case):
    b = builds[case]
    named = _operands(b.spec)
    ref = _reference(b.spec, named)
    tol, _ = tolerance(torch.float32)
    assert len(b.candidates) >= 2
    for cand, cc in zip(b.candidates, b.compiled.candidates):
        assert cc.ok, cc.error
        kernel = AttnKernel(b.spec, cc.so_path, cand.candidate.kernel_key)
        got = kernel(named)
        assert got.shape == ref.shape and got.stride() == b.spec.out_strides
        ok = torch.isclose(got, ref, atol=tol, rtol=tol, equal_nan=True)
        assert bool(ok.all()), f"{b.spec.name} {cand.tiling}: max error {(got - ref).abs().nan_to_num().max()}"
        if b.spec.mask == "bool":
            assert (got[:, :, 0].isnan().all() if not b.spec.safe_softmax else (got[:, :, 0] == 0).all())


def test_operands_in_another_layout_are_copied_not_misread(builds):
    b = builds[0]  # generated for q/k/v views of a qkv projection
    named = {n: t.contiguous() for n, t in _operands(b.spec).items()}
    kernel = AttnKernel(b.spec, b.compiled.candidates[0].so_path)
    tol, _ = tolerance(torch.float32)
    assert torch.allclose(kernel(named), _reference(b.spec, named), atol=tol, rtol=tol)


def test_wrong_operands_are_refused_with_the_expected_shape(builds):
    b = builds[1]
    kernel = AttnKernel(b.spec, b.compiled.candidates[0].so_path)
    named = _operands(b.spec)
    with pytest.raises(AttnSpecError, match=r"input 'mask' missing"):
        kernel({n: t for n, t in named.items() if n != "mask"})
    with pytest.raises(AttnSpecError, match=r"q is torch.float32\[2, 4, 33, 31\], the kernel expects float32\[2, 4, 33, 32\]"):
        kernel({**named, "q": named["q"][..., :31]})
    with pytest.raises(AttnSpecError, match="not this spec's"):
        AttnKernel(CASES[0], b.compiled.candidates[0].so_path)


@pytest.mark.parametrize("kw, match", [
    (dict(kv_heads=4, heads=6), "must divide heads=6"),
    (dict(mask="float", mask_shape=(1, 3, 8, 8)), "mask_shape must be 4 sizes"),
    (dict(mask="bits"), "mask must be one of"),
    (dict(head_dim=1024), "head sizes above 512"),
    (dict(kv_len=2 << 20), "left to torch's flash attention"),
    (dict(q_strides=(1, 2)), "q_strides must be 3 non-negative ints"),
    (dict(batch=0), "batch must be a positive int"),
    (dict(mask="float", mask_shape=(3, 1, 8, 8), mask_windows=3), "multiple of it"),
    (dict(mask="float", mask_shape=(2, 1, 8, 8), mask_windows=1), "mask_shape must be 4 sizes"),
])
def test_bad_specs_name_the_field(kw, match):
    base = dict(name="a", batch=1, heads=2, kv_heads=2, q_len=8, kv_len=8, head_dim=16, v_head_dim=16, scale=0.25,
                q_strides=(256, 128, 16), k_strides=(256, 128, 16), v_strides=(256, 128, 16))
    with pytest.raises(AttnSpecError, match=match):
        AttnSpec(**{**base, **kw})


def test_a_long_attention_gets_threaded_candidates_and_a_short_one_not(builds):
    assert {c.tiling.bd for c in builds[0].candidates} == {1, TARGET.cores} or TARGET.cores == 1
    assert {c.tiling.bd for c in builds[-2].candidates} == {1}  # tails_ev: a few microseconds


def test_proposals_are_distinct_and_never_exceed_the_cores():
    for spec in CASES:
        cands = propose(spec, TARGET, MAX_CANDIDATES)
        keys = [c.candidate.kernel_key for c in cands]
        assert len(set(keys)) == len(keys) and 1 <= len(keys) <= MAX_CANDIDATES
        assert all(1 <= c.tiling.bd <= TARGET.cores for c in cands)
        regs = TARGET.registers
        assert all(c.tiling.mr * c.tiling.nrv + c.tiling.nrv < regs for c in cands)


def test_spec_round_trips_through_json():
    for spec in CASES:
        assert AttnSpec.from_json(spec.to_json()) == spec


def test_pgo_times_the_kernel_on_the_graphs_task_pool(builds, tmp_path, monkeypatch):
    """The build's PGO binds generated kernels to the task pool graph.so runs them on
    (ascendc_pack/autotune/timing_pool.py); with ASCENDC_PACK_TASK_POOL=0 it times OpenMP, as graph.so runs."""
    from ascendc_pack.autotune.timing_pool import timing_pool

    config = BuildConfig.resolve(cache_dir=tmp_path)
    pool = timing_pool(config)
    assert pool
    b = builds[0]
    named = _operands(b.spec)
    ref = _reference(b.spec, named)
    tol, _ = tolerance(torch.float32)
    threaded = [(c, cc) for c, cc in zip(b.candidates, b.compiled.candidates) if c.tiling.bd > 1]
    assert threaded
    for cand, cc in threaded:
        kernel = AttnKernel(b.spec, cc.so_path)
        assert kernel.lib.takes_pool
        out = kernel.new_output()
        run = kernel.lib.bind(kernel.operands(named), [out], kernel.workspace_buffer, pool=pool)
        for _ in range(20):  # repeated jobs on the same pool
            out.fill_(float("nan"))
            assert run() == 0
            assert torch.allclose(out, ref, atol=tol, rtol=tol), cand.tiling
    monkeypatch.setenv("ASCENDC_PACK_TASK_POOL", "0")
    assert timing_pool(config) is None
