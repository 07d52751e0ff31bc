"""Generated dense direct convolution kernels (ascendc_pack/kernels/conv/direct.py,
templates/kernel/directconv.cpp.j2) against eager.

Every candidate (topn 10) of every case is compiled and run: 3x3 stride 1 with channel tails (37
in, 45 out), 3x3 stride 2 (odd sizes), the resnet downsample 1x1 stride 2, the 7x7 stride-2 stem
with 3 input channels, 5x5 padding 2, dilation 2, a non-square kernel with per-axis stride and
padding, batch 2, padding wider than the kernel's reach (output rows reading only padding), a 1x1
input; bias and none; every epilogue step, the residual add before and after a unary. A 28x28
case gets multi-thread candidates. Hand-picked tilings (``plan(tilings=)``) add the paths the
cost model may not rank: input-channel blocks with a tail (accumulation in y), one-pixel and
four-vector tiles, a channel-block tail, many row blocks on two threads. Everything compiles in
one ``compile_kernels`` call into a module-wide cache.

Tolerance: tests/kernel_check.py's float32 tolerance scaled by sqrt(K / 16), K = c_in kh kw the
reduction length (as tests/test_gemm.py): the kernel sums in another order than oneDNN.
"""

from __future__ import annotations

import hashlib
import math
import platform

import pytest
import torch

from ascendc_pack.toolchain.compiler import compile_kernels
from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels.conv.direct import (EPILOGUE_OPS, MAX_CANDIDATES, PARALLEL_MIN_US, ConvSpec, ConvSpecError,
                                     ConvTiling, check_tiling, compile_convs, fold_affine, l1_conflict, pack_weight,
                                     plan, propose, row_tiles)
from ascendc_pack.kernels.conv.direct_launch import ConvKernel, eager_reference, random_operands
from ascendc_pack.kernels.target import FALLBACK, CpuTarget
from tests.kernel_check import tolerance

S = ConvSpec
CASES = [
    # name, n, c_in, c_out, h, w, kh, kw, stride, padding, dilation (names are kernel names: unique)
    S("k3s1_tails", 1, 37, 45, 12, 12, 3, 3, 1, 1, bias=True, epilogue=("add", "relu")),
    S("k3s2_odd", 1, 24, 40, 13, 11, 3, 3, 2, 1, epilogue=("hardswish",)),
    S("k1s2_down", 1, 32, 48, 14, 14, 1, 1, 2, 0, bias=True),
    S("stem_c3", 1, 3, 24, 23, 20, 7, 7, 2, 3, bias=True, epilogue=("relu",)),
    S("k5p2", 1, 16, 20, 10, 9, 5, 5, 1, 2, bias=True, epilogue=("gelu",)),
    S("dil2", 1, 8, 16, 10, 10, 3, 3, 1, 2, 2, epilogue=("silu",)),
    S("rect_b2", 2, 12, 20, 7, 9, 3, 5, (2, 1), (1, 2), bias=True, epilogue=("sigmoid", "add")),
    S("pad_wide", 1, 8, 12, 5, 6, 3, 3, 1, 3, epilogue=("relu6",)),
    S("in1x1", 1, 5, 9, 1, 1, 3, 3, 1, 1, bias=True, epilogue=("tanh",)),
    S("k3p0_n2", 2, 12, 8, 6, 7, 3, 3, 1, 0, epilogue=("hardsigmoid",)),
    S("k3s1_28", 1, 32, 32, 28, 28, 3, 3, 1, 1, bias=True, epilogue=("add", "gelu_tanh")),
    # NCHW (contiguous) input and residual, read in place: a graph's entry convolution
    S("nchw_tails", 2, 37, 45, 12, 12, 3, 3, 1, 1, bias=True, epilogue=("add", "relu"), x_layout="nchw",
      residual_layout="nchw"),
    S("nchw_stem", 1, 3, 24, 23, 20, 7, 7, 2, 3, bias=True, epilogue=("relu",), x_layout="nchw"),
    S("nchw_x_nhwc_res", 1, 16, 20, 9, 10, 3, 3, 1, 1, epilogue=("add",), x_layout="nchw"),
]
TARGET = CpuTarget.detect(2, profile=FALLBACK)  # the cost model as written, not this host's rates
V = TARGET.lanes
# (case, tilings forced on it): every template path, whatever the cost model ranks first
FORCED = {
    "k3s1_tails": [ConvTiling(2 * V, 5, 16, 5, 1, V), ConvTiling(V, 1, 8, 12, 1, V),
                   ConvTiling(4 * V, 2, 37, 3, 2, V), ConvTiling(3 * V, 4, 10, 1, 2, V)],
    "stem_c3": [ConvTiling(V, 14 if TARGET.registers >= 16 else 6, 3, 4, 2, V)],
    "rect_b2": [ConvTiling(2 * V, 3, 5, 2, 2, V)],
    "nchw_tails": [ConvTiling(V, 1, 8, 12, 1, V), ConvTiling(4 * V, 2, 37, 3, 2, V)],
}


def conv_tolerance(spec: ConvSpec) -> float:
    tol, _ = tolerance(torch.float32)
    return tol * max(1.0, math.sqrt(spec.c_in * spec.kh * spec.kw / 16))


def assert_close(out: torch.Tensor, ref: torch.Tensor, spec: ConvSpec, what: str):
    tol = conv_tolerance(spec)
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{what}: {list(out.shape)} vs {list(ref.shape)}"
    ok = torch.isclose(out, ref, atol=tol, rtol=tol, equal_nan=True)
    if not bool(ok.all()):
        idx = tuple((~ok).nonzero()[0].tolist())
        pytest.fail(f"{what}: {int((~ok).sum())} mismatches (tol {tol:.1e}), first at {list(idx)}: "
                    f"got {out[idx].item()}, expected {ref[idx].item()}")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Every case's proposal and the forced tilings, compiled in one compile_kernels call."""
    config = BuildConfig(topn=MAX_CANDIDATES, cache_dir=tmp_path_factory.mktemp("directconv_cache"), jobs=2, cores=2)
    return compile_cases(plan, CASES, FORCED, config)


def compile_cases(plan, cases, forced, config) -> dict:
    """``plan`` (a generator's) of every case and of each ``forced`` case's tilings (kernel name
    ``<case>_forced``), compiled in one compile_kernels call; the builds by kernel name."""
    planned = [plan(s, config, TARGET) for s in cases]
    planned += [plan(S(**{**next(s for s in cases if s.name == name).to_json(), "name": name + "_forced"}),
                     config, TARGET, tilings) for name, tilings in forced.items()]
    for b, ck in zip(planned, compile_kernels([b.build for b in planned], config)):
        b.compiled = ck
    return {b.spec.name: b for b in planned}


def kernels(build, launcher=ConvKernel):
    """(candidate, launcher of its compiled library) of every candidate of ``build``."""
    for cand, cc in zip(build.candidates, build.compiled.candidates):
        assert cc.ok, cc.error
        yield cand, launcher(build.spec, cc.so_path, cc.candidate.kernel_key)


@pytest.mark.parametrize("name", [s.name for s in CASES] + [n + "_forced" for n in FORCED])
def test_every_candidate_matches_eager(name, builds):
    build = builds[name]
    spec = build.spec
    x, w, bias, res = random_operands(spec)
    ref = eager_reference(spec, x, w, bias, res)
    assert 1 <= len(build.candidates) <= MAX_CANDIDATES
    assert len({c.candidate.kernel_key for c in build.candidates}) == len(build.candidates)
    for cand, kernel in kernels(build):
        wp = kernel.prepare_weight(w)
        out = kernel(x, wp, bias, res)
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert_close(out, ref, spec, cand.candidate.tiling_repr)
        # into a NaN-filled output (every element must be written), on one thread: the same bits
        # (tasks own disjoint outputs, so the thread count never changes a sum's order)
        out2 = kernel(x, wp, bias, res, out=torch.full_like(out, float("nan")), max_threads=1)
        assert torch.equal(out2, out), cand.candidate.tiling_repr


def test_cases_cover_every_epilogue_tail_and_path(builds):
    assert {op for s in CASES for op in s.epilogue} == set(EPILOGUE_OPS)
    tilings = [(b.spec, c.tiling) for b in builds.values() for c in b.candidates]
    assert {t.bd for _, t in tilings} == {1, 2}
    assert any(t.kc < s.c_in and s.c_in % t.kc for s, t in tilings)  # input blocks with a tail
    assert any(s.c_out % t.ocb for s, t in tilings)  # a channel block past c_out
    assert any(len({p for _, p in row_tiles(s.ow, t.owb)}) == 2 for s, t in tilings)  # rows of two tile sizes
    assert any(t.owb == 1 for _, t in tilings) and any(t.ocb == 4 * V for _, t in tilings)
    assert any(b.compiled.candidates[0].candidate.workspace > 0 for b in builds.values())  # edge buffers


@pytest.mark.parametrize("name", ["k3s1_tails", "stem_c3", "k3s2_odd", "rect_b2"])
def test_special_values_propagate_like_eager(builds, name):
    """NaN and +-inf inputs give NaN/inf exactly where eager has them (through relu, hardswish,
    sigmoid and the residual add, on interior and edge tiles)."""
    spec = next(s for s in CASES if s.name == name)
    x, w, bias, res = random_operands(spec, seed=1)
    x[0, 0, 1, 1], x[0, -1, 0, 0], x[-1, 1, -1, -1] = float("nan"), float("inf"), float("-inf")
    ref = eager_reference(spec, x, w, bias, res)
    for cand, kernel in kernels(builds[name]):
        out = kernel(x, kernel.prepare_weight(w), bias, res)
        assert torch.equal(out.isnan(), ref.isnan()), cand.candidate.tiling_repr
        assert torch.equal(out.isinf(), ref.isinf()), cand.candidate.tiling_repr
        assert_close(out, ref, spec, cand.candidate.tiling_repr)


def test_takes_nhwc_shaped_tensors_and_folded_batchnorm(builds):
    """x and the residual may be given as contiguous [N, H, W, C]; an eval BatchNorm folded by
    fold_affine into weight and bias matches conv -> BatchNorm -> add -> relu in eager (resnet's
    BasicBlock tail)."""
    spec = next(s for s in CASES if s.name == "k3s1_tails")
    x, w, _, res = random_operands(spec)
    bn = torch.nn.BatchNorm2d(spec.c_out).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in (bn.running_mean, bn.weight, bn.bias):
            t.copy_(torch.randn(spec.c_out, generator=g))
        bn.running_var.copy_(torch.rand(spec.c_out, generator=g) + 0.5)
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        wf, bf = fold_affine(w, None, scale, bn.bias - bn.running_mean * scale)
        ref = torch.relu(bn(torch.nn.functional.conv2d(x, w, None, 1, 1)) + res)
    _, kernel = next(kernels(builds[spec.name]))
    out = kernel(x.permute(0, 2, 3, 1).contiguous(), pack_weight(wf, kernel.ocb), bf,
                 res.permute(0, 2, 3, 1).contiguous())
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_builds_for_a_portable_isa(tmp_path):
    """-march=x86-64-v2 (SSE4.2: 4 lanes, 16 registers) builds and matches too."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    spec = S("portable", 1, 11, 13, 9, 10, 3, 3, 2, 1, bias=True, epilogue=("add", "hardswish"))
    config = BuildConfig(topn=3, cache_dir=tmp_path, jobs=2, march="x86-64-v2")
    [build] = compile_convs([spec], config)
    assert all(c.tiling.lanes == 4 for c in build.candidates)
    x, w, bias, res = random_operands(spec)
    ref = eager_reference(spec, x, w, bias, res)
    for cand, kernel in kernels(build):
        assert_close(kernel(x, kernel.prepare_weight(w), bias, res), ref, spec, cand.candidate.tiling_repr)


# ----------------------------------------------------------------------------- packing


def test_packed_layout_is_the_documented_one():
    """[O/OCB][kh][kw][C][OCB]: packed[b, i, j, c, o] = weight[b * OCB + o, c, i, j], zero past O."""
    w = torch.randn(45, 7, 3, 2)
    for ocb in (8, 16, 24):
        p = pack_weight(w, ocb)
        assert p.shape == (math.ceil(45 / ocb), 3, 2, 7, ocb) and p.is_contiguous()
        for b, i, j, c, o in ((0, 0, 0, 0, 0), (1, 2, 1, 6, 3), (p.shape[0] - 1, 1, 0, 3, (45 - 1) % ocb)):
            assert p[b, i, j, c, o] == w[b * ocb + o, c, i, j]
        back = p.permute(0, 4, 3, 1, 2).reshape(-1, 7, 3, 2)  # [O/OCB * OCB, C, kh, kw]
        assert torch.equal(back[:45], w) and not back[45:].any()
    with pytest.raises(ConvSpecError, match=r"\[O, C, kh, kw\]"):
        pack_weight(torch.zeros(4, 4), 8)
    with pytest.raises(ConvSpecError, match="ocb must be a positive int"):
        pack_weight(w, 0)


# ----------------------------------------------------------------------------- tiling


def test_candidates_are_ranked_distinct_deterministic_and_keyed_like_torch_npu():
    target = CpuTarget(cores=2, lanes=8, registers=16, l1d=32 << 10, l2=512 << 10)
    spec = S("x", 1, 64, 64, 56, 56, 3, 3, 1, 1, bias=True, epilogue=("relu",))
    cands = propose(spec, target, 10)
    assert len(cands) == 10 and cands == propose(spec, target, 10)
    assert [c.est_us for c in cands] == sorted(c.est_us for c in cands)
    for c in cands:
        t, cand = c.tiling, c.candidate
        text = f"{cand.tiling_repr}|{cand.workspace}|{cand.block_dim}"
        assert cand.kernel_key == hashlib.md5(text.encode()).hexdigest()
        assert cand.block_dim == t.bd <= 2 and t.ocb % t.lanes == 0 and t.lanes == 8
        check_tiling(spec, t, target)  # accumulators + weight vectors + a broadcast fit 16 registers
        assert ConvTiling.parse(cand.tiling_repr) == t
    assert {c.tiling.bd for c in cands} == {1, 2} and len({(c.tiling.owb, c.tiling.ocb) for c in cands}) >= 3
    assert len(propose(spec, target, 3)) == 3 and len(propose(spec, target, 1)) == 1


def test_cost_model_keeps_small_convs_on_one_thread_and_splits_big_ones():
    four = CpuTarget(cores=4, lanes=8, registers=16)
    for spec in (S("tiny", 1, 16, 16, 7, 7, 3, 3, 1, 1), S("c512_1x1", 1, 512, 512, 1, 1, 1, 1),
                 S("k1", 1, 64, 128, 28, 28, 1, 1, 2, 0, bias=True), next(s for s in CASES if s.name == "k3s1_tails")):
        cands = propose(spec, four, 10)
        assert all(c.tiling.bd == 1 for c in cands), spec.name
        assert cands[0].est_us < PARALLEL_MIN_US, spec.name
    big = propose(S("big", 1, 64, 64, 56, 56, 3, 3, 1, 1, bias=True), four, 10)
    assert big[0].tiling.bd == 4 and {c.tiling.bd for c in big} >= {1, 4} and all(c.tiling.bd <= 4 for c in big)
    assert big[0].est_us * 3 < min(c.est_us for c in big if c.tiling.bd == 1)
    assert all(c.tiling.bd == 1 for c in propose(S("b1", 1, 64, 64, 56, 56, 3, 3, 1, 1), CpuTarget(cores=1), 10))
    # the stem's 3 input channels: every tile still vectorizes over output channels
    stem = propose(S("stem", 1, 3, 64, 224, 224, 7, 7, 2, 3), CpuTarget(cores=2), 10)
    assert all(c.tiling.kc == 3 and c.tiling.ocb >= 8 for c in stem)


def test_input_blocks_never_conflict_in_l1():
    """With c_in x ocb x 4 a multiple of 4 KiB every tap of an input block maps to the same L1
    sets (measured 1.3-2x slower): such blocks are never proposed."""
    spec = S("c64", 1, 64, 64, 56, 56, 3, 3, 1, 1)
    assert l1_conflict(spec, 16, 32, 32 << 10) and not l1_conflict(spec, 16, 64, 32 << 10)
    assert not l1_conflict(S("c37", 1, 37, 45, 12, 12, 3, 3, 1, 1), 16, 16, 32 << 10)
    target = CpuTarget(cores=2, lanes=8, registers=16, l1d=32 << 10)
    for spec in (S("a", 1, 64, 64, 56, 56, 3, 3, 1, 1), S("b", 1, 128, 128, 28, 28, 3, 3, 1, 1)):
        for c in propose(spec, target, 10):
            assert not l1_conflict(spec, c.tiling.ocb, c.tiling.kc, target.l1d), c.tiling


@pytest.mark.parametrize("ow", [1, 2, 5, 7, 14, 28, 56, 112, 113])
@pytest.mark.parametrize("owb", [1, 2, 3, 4, 5, 6, 14])
def test_row_tiles_cover_every_column_once_in_two_sizes(ow, owb):
    tiles = row_tiles(ow, owb)
    assert [c for ow0, p in tiles for c in range(ow0, ow0 + p)] == list(range(ow))
    sizes = [p for _, p in tiles]
    assert len(tiles) == math.ceil(ow / owb) and max(sizes) <= owb and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
    assert row_tiles(56, 6) == [(6 * i, 6) for i in range(6)] + [(36 + 5 * i, 5) for i in range(4)]


@pytest.mark.parametrize("tiling, match", [
    (ConvTiling(12, 4, 8, 1, 1, 8), "not a positive multiple of lanes"),
    (ConvTiling(16, 8, 8, 1, 1, 8), "registers"),
    (ConvTiling(16, 4, 8, 1, 4, 8), "core limit"),
    (ConvTiling(16, 4, 8, 1, 1, 4), "lanes=4"),
])
def test_unbuildable_tilings_are_refused(tiling, match):
    with pytest.raises(ConvSpecError, match=match):
        check_tiling(CASES[0], tiling, CpuTarget(cores=2, lanes=8, registers=16))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=0), "n must be a positive int"),
    (dict(c_in=2.5), "c_in must be a positive int"),
    (dict(c_out=True), "c_out must be a positive int"),
    (dict(kh=0), "kh must be a positive int"),
    (dict(stride=(0, 1)), "stride must be an int or a pair of ints >= 1"),
    (dict(padding=-1), "padding must be an int or a pair of ints >= 0"),
    (dict(dilation=(1,)), "dilation must be an int or a pair"),
    (dict(dtype="float16"), "dtype must be float32"),
    (dict(bias=1), "bias must be True or False"),
    (dict(epilogue=("mul",)), "unsupported epilogue step"),
    (dict(epilogue=("add", "relu", "add")), "one residual input"),
    (dict(h=2, kh=5), "larger than the padded input height"),
    (dict(w=3, kw=3, dilation=2, padding=(1, 0)), "larger than the padded input width"),
    (dict(n=1 << 16, h=256, w=256), "2\\^31 elements"),
    (dict(name="../x"), "direct conv kernel name"),
    (dict(x_layout="NCHW"), "x_layout must be one of nhwc, nchw"),
    (dict(residual_layout="cl"), "residual_layout must be one of nhwc, nchw"),
])
def test_bad_specs_get_typed_errors(kwargs, match):
    base = dict(name="d", n=1, c_in=8, c_out=8, h=6, w=6, kh=3, kw=3)
    with pytest.raises(ConvSpecError, match=match):
        ConvSpec(**{**base, **kwargs})
    with pytest.raises(ConvSpecError, match="groups=1"):
        ConvSpec.from_conv("g", (1, 8, 6, 6), (8, 4, 3, 3))


def test_bad_operands_get_typed_errors_not_crashes(builds):
    spec = next(s for s in CASES if s.name == "k3s1_tails")
    _, kernel = next(kernels(builds[spec.name]))
    x, w, bias, res = random_operands(spec)
    wp = kernel.prepare_weight(w)
    with pytest.raises(ConvSpecError, match="x is .* NHWC memory"):
        kernel(x.contiguous(), wp, bias, res)  # NCHW
    with pytest.raises(ConvSpecError, match="x must be a CPU float32"):
        kernel(x.double(), wp, bias, res)
    with pytest.raises(ConvSpecError, match="pack the .O, C, kh, kw. weight"):
        kernel(x, w, bias, res)
    with pytest.raises(ConvSpecError, match="packed weight"):  # packed for another channel block
        kernel(x, pack_weight(w, kernel.ocb + V), bias, res)
    with pytest.raises(ConvSpecError, match="the weight must be"):
        kernel.prepare_weight(w[:, :-1])
    with pytest.raises(ConvSpecError, match="bias .the kernel adds one."):
        kernel(x, wp, None, res)
    with pytest.raises(ConvSpecError, match="adds a residual, got none"):
        kernel(x, wp, bias)
    with pytest.raises(ConvSpecError, match="residual is"):
        kernel(x, wp, bias, res[:, :, :-1])
    with pytest.raises(ConvSpecError, match="out is"):
        kernel(x, wp, bias, res, out=torch.empty(1, spec.c_out, spec.oh, spec.ow))
    nchw = next(s for s in CASES if s.name == "nchw_tails")
    _, nchw_kernel = next(kernels(builds[nchw.name]))
    x, w, bias, res = random_operands(nchw)
    wp = nchw_kernel.prepare_weight(w)
    with pytest.raises(ConvSpecError, match="x .x_layout / residual_layout 'nchw'. must be a contiguous"):
        nchw_kernel(x.contiguous(memory_format=torch.channels_last), wp, bias, res)
    with pytest.raises(ConvSpecError, match="residual .x_layout / residual_layout 'nchw'. must be a contiguous"):
        nchw_kernel(x, wp, bias, res.contiguous(memory_format=torch.channels_last))
    other = next(s for s in CASES if s.name == "k3s2_odd")
    with pytest.raises(ConvSpecError, match="not this spec's"):
        ConvKernel(other, builds[spec.name].compiled.candidates[0].so_path)


def test_spec_round_trips_through_json():
    for spec in CASES:
        assert ConvSpec.from_json(spec.to_json()) == spec
    assert S("a", 1, 8, 4, 5, 5, 3, 3, 2, 1) == S("a", 1, 8, 4, 5, 5, 3, 3, (2, 2), (1, 1), (1, 1))
    assert ConvSpec.from_conv("a", (1, 8, 5, 5), (4, 8, 3, 3), 2, 1) == S("a", 1, 8, 4, 5, 5, 3, 3, 2, 1)
