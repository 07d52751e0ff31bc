"""Generated depthwise convolution kernels (ascendc_pack/kernels/conv/depthwise.py, templates/kernel/dwconv.cpp.j2)
against eager.

Every candidate (topn 10) of every case is compiled and run: 3x3 stride 1 and 2 (odd sizes), 5x5
stride 1 and 2, 7x7 and 1x1-output edge cases, a 1x1 input (every tap but one is padding),
padding wider than the kernel's half (pixels that read only padding), dilation 2, a non-square
kernel with per-axis stride and padding, batch 2, channel counts of mobilenet/efficientnet
(16 ... 576) and ones with tails (37, 5); bias and no bias; every epilogue step, the residual
add before and after a unary, on whole vectors and on lanes. A 112x112 case gets multi-thread
candidates. All specs compile in one ``compile_dwconvs`` call into a module-wide cache.

Tolerance: tests/kernel_check.py's float32 tolerance (2e-5 absolute and relative): at most 25
products per output, summed in another order than eager's.
"""

from __future__ import annotations

import hashlib
import itertools
import platform

import pytest
import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels.family import PARALLEL_MIN_US
from ascendc_pack.kernels.conv.depthwise import (EPILOGUE_OPS, MAX_CANDIDATES, DwConvSpec, DwConvSpecError,
                                 channel_parts, compile_dwconvs, fold_affine, interior, pack_weight, propose)
from ascendc_pack.kernels.conv.depthwise_launch import DwConvKernel, eager_reference, random_operands
from ascendc_pack.kernels.target import FALLBACK, CpuTarget
from tests.kernel_check import tolerance

S = DwConvSpec
CASES = [
    # name, n, c, h, w, kh, kw, stride, padding, dilation (names must be unique: they are kernel names)
    S("k3s1_c16", 1, 16, 12, 12, 3, 3, 1, 1, bias=True, epilogue=("relu",)),
    S("k3s2_c24_odd", 1, 24, 13, 11, 3, 3, 2, 1, epilogue=("hardswish",)),
    S("k5s1_c40", 1, 40, 10, 9, 5, 5, 1, 2, bias=True, epilogue=("silu",)),
    S("k5s2_c72", 1, 72, 15, 15, 5, 5, 2, 2, epilogue=("gelu",)),
    S("k3s1_c120", 1, 120, 8, 8, 3, 3, 1, 1, bias=True, epilogue=("hardsigmoid",)),
    S("k5s2_c144", 1, 144, 9, 9, 5, 5, 2, 2, bias=True, epilogue=("sigmoid",)),
    S("k5s1_c240_7x7", 1, 240, 7, 7, 5, 5, 1, 2, bias=True, epilogue=("tanh",)),
    S("k5s1_c576_7x7", 1, 576, 7, 7, 5, 5, 1, 2, bias=True, epilogue=("relu6", "add")),
    S("k3s1_c37_tails", 1, 37, 9, 11, 3, 3, 1, 1, bias=True, epilogue=("add", "gelu_tanh")),
    S("k7_out1x1_c37", 1, 37, 7, 7, 7, 7, 1, 0, bias=True, epilogue=("relu",)),
    S("k3s2_out1x1_c24", 1, 24, 3, 3, 3, 3, 2, 0),
    S("in1x1_c5", 1, 5, 1, 1, 3, 3, 1, 1, bias=True, epilogue=("add",)),
    S("pad2_k3_c16", 1, 16, 5, 6, 3, 3, 1, 2, bias=True, epilogue=("sigmoid", "add")),
    S("dil2_c24", 1, 24, 10, 10, 3, 3, 1, 2, 2, epilogue=("relu", "add")),
    S("rect_b2_c24", 2, 24, 6, 9, 3, 5, (2, 1), (1, 2), bias=True, epilogue=("add", "hardswish")),
    S("wide_c32", 1, 32, 4, 40, 3, 3, 1, 1, bias=True, epilogue=("add", "silu")),
    S("k3s1_c32_112", 1, 32, 112, 112, 3, 3, 1, 1, bias=True, epilogue=("relu",)),
]
TARGET = CpuTarget.detect(2, profile=FALLBACK)  # the cost model as written, not this host's rates


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str):
    tol, _ = tolerance(torch.float32)
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{what}: {list(out.shape)} vs {list(ref.shape)}"
    ok = torch.isclose(out, ref, atol=tol, rtol=tol, equal_nan=True)
    if not bool(ok.all()):
        idx = tuple((~ok).nonzero()[0].tolist())
        pytest.fail(f"{what}: {int((~ok).sum())} mismatches (tol {tol:.0e}), first at {list(idx)}: "
                    f"got {out[idx].item()}, expected {ref[idx].item()}")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    config = BuildConfig(topn=MAX_CANDIDATES, cache_dir=tmp_path_factory.mktemp("dwconv_cache"), jobs=2, cores=2)
    return {b.spec.name: b for b in compile_dwconvs(CASES, config, TARGET)}


def kernels(build):
    for dc, cc in zip(build.candidates, build.compiled.candidates):
        assert cc.ok, cc.error
        yield dc, DwConvKernel(build.spec, cc.so_path, cc.candidate.kernel_key)


@pytest.mark.parametrize("spec", CASES, ids=[s.name for s in CASES])
def test_every_candidate_matches_eager(spec, builds):
    build = builds[spec.name]
    x, w, bias, res = random_operands(spec)
    ref = eager_reference(spec, x, w, bias, res)
    w_in = pack_weight(w)
    assert 1 <= len(build.candidates) <= MAX_CANDIDATES
    assert len({c.candidate.kernel_key for c in build.candidates}) == len(build.candidates)
    for dc, kernel in kernels(build):
        out = kernel(x, w_in, bias, res)
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert_close(out, ref, dc.candidate.tiling_repr)
        # into a NaN-filled output (every element must be written), on one thread: the same bits
        out2 = kernel(x, w_in, bias, res, out=torch.full_like(out, float("nan")), max_threads=1)
        assert torch.equal(out2, out), dc.candidate.tiling_repr


def test_cases_cover_every_epilogue_tails_and_threads(builds):
    assert {op for s in CASES for op in s.epilogue} == set(EPILOGUE_OPS)
    tilings = [dc.tiling for b in builds.values() for dc in b.candidates]
    assert {t.bd for t in tilings} == {1, 2}  # the 112x112 case proposes both
    assert max(t.owb for t in tilings) >= 7 and max(t.cb for t in tilings) >= 3 * TARGET.lanes
    lanes = {p.lanes for s in CASES for t in tilings for p in channel_parts(s.c, t.cb, t.lanes)}
    assert 1 in lanes and len(lanes) >= 3  # whole vectors and power-of-two tail chunks


@pytest.mark.parametrize("name", ["k3s1_c16", "k5s1_c40", "k3s2_c24_odd", "k3s1_c37_tails"])
def test_special_values_propagate_like_eager(builds, name):
    """NaN and +-inf inputs give NaN/inf exactly where eager has them (through relu, silu,
    hardswish, an add and gelu_tanh)."""
    spec = next(s for s in CASES if s.name == name)
    x, w, bias, res = random_operands(spec, seed=1)
    x[0, 0, 1, 1], x[0, -1, 0, 0], x[0, 1, -1, -1] = float("nan"), float("inf"), float("-inf")
    x[0, 2, 4, 3] = float("inf")
    ref = eager_reference(spec, x, w, bias, res)
    for dc, kernel in kernels(builds[spec.name]):
        out = kernel(x, pack_weight(w), bias, res)
        assert torch.equal(out.isnan(), ref.isnan()), dc.candidate.tiling_repr
        assert torch.equal(out.isinf(), ref.isinf()), dc.candidate.tiling_repr
        assert_close(out, ref, dc.candidate.tiling_repr)


def test_takes_nhwc_shaped_tensors_and_folded_batchnorm(builds):
    """x and the residual may be given as contiguous [N, H, W, C]; an eval BatchNorm folded by
    fold_affine into weight and bias matches conv -> BatchNorm in eager."""
    spec = next(s for s in CASES if s.name == "k3s1_c37_tails")
    x, w, _, res = random_operands(spec)
    bn = torch.nn.BatchNorm2d(spec.c).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in (bn.running_mean, bn.weight, bn.bias):
            t.copy_(torch.randn(spec.c, generator=g))
        bn.running_var.copy_(torch.rand(spec.c, generator=g) + 0.5)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    wf, bf = fold_affine(w, None, scale.detach(), (bn.bias - bn.running_mean * scale).detach())
    with torch.no_grad():
        conv = torch.nn.functional.conv2d(x, w, None, 1, 1, 1, spec.c)
        ref = torch.nn.functional.gelu(bn(conv) + res, approximate="tanh")
    _, kernel = next(kernels(builds[spec.name]))
    out = kernel(x.permute(0, 2, 3, 1).contiguous(), pack_weight(wf), bf, res.permute(0, 2, 3, 1).contiguous())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_builds_for_a_portable_isa(tmp_path):
    """-march=x86-64-v2 (SSE4.2: 4 lanes, 16 registers) builds and matches too."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    spec = S("portable", 1, 37, 9, 10, 5, 5, 2, 2, bias=True, epilogue=("add", "hardswish"))
    config = BuildConfig(topn=3, cache_dir=tmp_path, jobs=2, march="x86-64-v2")
    [build] = compile_dwconvs([spec], config)
    assert all(dc.tiling.lanes == 4 for dc in build.candidates)
    x, w, bias, res = random_operands(spec)
    ref = eager_reference(spec, x, w, bias, res)
    for dc, kernel in kernels(build):
        assert_close(kernel(x, pack_weight(w), bias, res), ref, dc.candidate.tiling_repr)


# ----------------------------------------------------------------------------- tiling


def test_candidates_are_ranked_distinct_deterministic_and_keyed_like_torch_npu():
    target = CpuTarget(cores=2, lanes=8, registers=16, l1d=32 << 10, l2=512 << 10)
    spec = S("x", 1, 96, 56, 56, 3, 3, 1, 1, bias=True, epilogue=("relu",))
    cands = propose(spec, target, 10)
    assert len(cands) == 10 and cands == propose(spec, target, 10)
    assert [c.est_us for c in cands] == sorted(c.est_us for c in cands)
    for c in cands:
        t, cand = c.tiling, c.candidate
        text = f"{cand.tiling_repr}|{cand.workspace}|{cand.block_dim}"
        assert cand.kernel_key == hashlib.md5(text.encode()).hexdigest() and cand.workspace == 0
        assert cand.block_dim == t.bd <= 2 and t.cb % t.lanes == 0 and t.lanes == 8
        assert t.owb * (t.cb // t.lanes) + t.cb // t.lanes <= target.registers  # accumulators + weights
    assert len({(c.tiling.cb, c.tiling.owb) for c in cands}) >= 4
    assert len(propose(spec, target, 3)) == 3 and len(propose(spec, target, 1)) == 1


def test_cost_model_keeps_small_convs_on_one_thread_and_splits_big_ones():
    four = CpuTarget(cores=4, lanes=8, registers=16)
    for spec in (S("tiny", 1, 16, 7, 7, 3, 3, 1, 1), S("m576", 1, 576, 7, 7, 5, 5, 1, 2, bias=True),
                 S("m72", 1, 72, 56, 56, 3, 3, 2, 1, bias=True, epilogue=("relu",))):
        cands = propose(spec, four, 10)
        assert all(c.tiling.bd == 1 for c in cands), spec.name
        assert cands[0].est_us < PARALLEL_MIN_US
    big = propose(S("big", 1, 96, 112, 112, 3, 3, 1, 1, bias=True), four, 10)
    assert big[0].tiling.bd == 4 and {c.tiling.bd for c in big} >= {1, 4}
    assert all(c.tiling.bd <= 4 for c in big)
    assert all(c.tiling.bd == 1 for c in propose(S("b1", 1, 96, 112, 112, 3, 3, 1, 1), CpuTarget(cores=1), 10))
    assert all(c.tiling.bd <= 2 for c in propose(S("b2", 2, 96, 112, 112, 3, 3, 1, 1), CpuTarget(cores=2), 10))


@pytest.mark.parametrize("c", [1, 3, 5, 8, 16, 24, 37, 40, 72, 120, 144, 1152])
@pytest.mark.parametrize("lanes, cb", [(4, 4), (4, 12), (8, 8), (8, 16), (8, 32), (16, 16), (16, 48)])
def test_channel_parts_cover_every_channel_once(c, lanes, cb):
    parts = channel_parts(c, cb, lanes)
    covered = [ch for p in parts for ch in range(p.c0, p.c0 + p.blocks * p.vectors * p.lanes)]
    assert covered == list(range(c))
    assert all(p.lanes == lanes or (p.lanes < lanes and p.lanes & (p.lanes - 1) == 0 and p.vectors == 1)
               for p in parts)


@pytest.mark.parametrize("size, k, s, p, d",
                         list(itertools.product((1, 2, 7, 12), (1, 3, 5), (1, 2), (0, 1, 2, 4), (1, 2))))
def test_interior_is_exactly_the_positions_reading_no_padding(size, k, s, p, d):
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    if out < 1:
        return
    lo, hi = interior(out, size, k, s, p, d)
    inside = [o for o in range(out) if all(0 <= o * s - p + i * d < size for i in range(k))]
    assert (list(range(lo, hi)) == inside) and lo <= hi <= out


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=0), "n must be a positive int"),
    (dict(c=2.5), "c must be a positive int"),
    (dict(kh=0), "kh must be a positive int"),
    (dict(stride=(0, 1)), "stride must be an int or a pair of ints >= 1"),
    (dict(padding=-1), "padding must be an int or a pair of ints >= 0"),
    (dict(dilation=(1,)), "dilation must be an int or a pair"),
    (dict(dtype="float16"), "dtype must be float32"),
    (dict(epilogue=("mul",)), "unsupported epilogue step"),
    (dict(epilogue=("add", "relu", "add")), "one residual input"),
    (dict(h=2, kh=5), "larger than the padded input height"),
    (dict(w=3, kw=3, dilation=2, padding=(1, 0)), "larger than the padded input width"),
    (dict(name="../x"), "depthwise conv kernel name"),
])
def test_bad_specs_get_typed_errors(kwargs, match):
    base = dict(name="d", n=1, c=8, h=6, w=6, kh=3, kw=3)
    with pytest.raises(DwConvSpecError, match=match):
        DwConvSpec(**{**base, **kwargs})


def test_bad_operands_get_typed_errors_not_crashes(builds):
    spec = next(s for s in CASES if s.name == "k3s1_c37_tails")
    _, kernel = next(kernels(builds[spec.name]))
    x, w, bias, res = random_operands(spec)
    wp = pack_weight(w)
    with pytest.raises(DwConvSpecError, match="x is .* NHWC memory"):
        kernel(x.contiguous(), wp, bias, res)  # NCHW
    with pytest.raises(DwConvSpecError, match="x must be a CPU float32"):
        kernel(x.double(), wp, bias, res)
    with pytest.raises(DwConvSpecError, match="pack a .C, 1, kh, kw. weight with pack_weight"):
        kernel(x, w, bias, res)
    with pytest.raises(DwConvSpecError, match="bias .the kernel adds one."):
        kernel(x, wp, None, res)
    with pytest.raises(DwConvSpecError, match="adds a residual, got none"):
        kernel(x, wp, bias)
    with pytest.raises(DwConvSpecError, match="residual is"):
        kernel(x, wp, bias, res[:, :, :-1])
    with pytest.raises(DwConvSpecError, match="out is"):
        kernel(x, wp, bias, res, out=torch.empty(1, spec.c, spec.oh, spec.ow))
    with pytest.raises(DwConvSpecError, match=r"a depthwise weight is \[C, 1, kh, kw\]"):
        pack_weight(torch.zeros(8, 2, 3, 3))
    other = next(s for s in CASES if s.name == "k3s1_c16")
    with pytest.raises(DwConvSpecError, match="not this spec's"):
        DwConvKernel(other, builds[spec.name].compiled.candidates[0].so_path)


def test_spec_round_trips_through_json():
    for spec in CASES:
        assert DwConvSpec.from_json(spec.to_json()) == spec
    assert S("a", 1, 8, 5, 5, 3, 3, 2, 1) == S("a", 1, 8, 5, 5, 3, 3, (2, 2), (1, 1), (1, 1))
    assert DwConvSpec.from_conv("a", (1, 8, 5, 5), 3, 2, 1) == S("a", 1, 8, 5, 5, 3, 3, 2, 1)
