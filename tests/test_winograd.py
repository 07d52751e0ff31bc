"""Generated Winograd F(2x2, 3x3) convolution kernels (ascendc_pack/kernels/conv/winograd.py,
templates/kernel/winograd.cpp.j2) against eager.

Every proposed candidate of every case is compiled and run: input and output channel tails (37
in, 45 out, odd image sizes), fewer input channels than a vector (5), batch 2 without padding,
padding 2, a 28x28 case with two-thread candidates (shared and local bands), bias and none, the
residual add and activations. Hand-picked tilings add the paths the cost model may not rank:
several bands of one image, shared and local, on two threads; one-vector tiles of 12; four-vector
tiles with a channel-block tail; task blocks smaller than a band. Everything compiles in one
``compile_kernels`` call into a module-wide cache.

Tolerance: the direct kernel's (tests/test_directconv.py: float32 scaled by sqrt(c_in kh kw / 16)).
"""

from __future__ import annotations

import pytest
import torch

import ascendc_pack.kernels.conv.winograd as winograd
from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels.conv.direct import ConvSpec, ConvSpecError
from ascendc_pack.kernels.conv.direct_launch import WinogradKernel, eager_reference, random_operands
from ascendc_pack.kernels.target import FALLBACK, CpuTarget
from ascendc_pack.kernels.conv.winograd import WinoTiling, check_spec, check_tiling, pack_weight, plan, propose
from tests.test_directconv import assert_close, compile_cases
from tests.test_directconv import kernels as direct_kernels

S = ConvSpec
CASES = [
    S("wg_tails", 1, 37, 45, 13, 11, 3, 3, 1, 1, bias=True, epilogue=("add", "relu")),
    S("wg_c5", 1, 5, 16, 6, 7, 3, 3, 1, 1, epilogue=("hardswish",)),
    S("wg_b2p0", 2, 16, 24, 7, 9, 3, 3, 1, 0, epilogue=("silu",)),
    S("wg_p2", 1, 16, 16, 5, 6, 3, 3, 1, 2, bias=True, epilogue=("sigmoid", "add")),
    S("wg_28", 1, 32, 40, 28, 28, 3, 3, 1, 1, bias=True, epilogue=("gelu",)),
]
TARGET = CpuTarget.detect(2, profile=FALLBACK)  # the cost model as written, not this host's rates
V = TARGET.lanes
FORCED = {
    "wg_28": [WinoTiling(2 * V, 6, 18, 3, 2, V, 0), WinoTiling(2 * V, 6, 12, 2, 2, V, 1),
              WinoTiling(V, 12, 12, 14, 2, V, 0), WinoTiling(4 * V, 2, 8, 1, 2, V, 1)],
    "wg_tails": [WinoTiling(3 * V, 4, 8, 2, 1, V, 0), WinoTiling(4 * V, 2, 4, 1, 2, V, 1)],
    "wg_b2p0": [WinoTiling(2 * V, 4, 4, 3, 2, V, 1)],  # local whole-image bands: one per image
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    config = BuildConfig(topn=winograd.MAX_CANDIDATES, cache_dir=tmp_path_factory.mktemp("winograd_cache"), jobs=2,
                         cores=2)
    return compile_cases(plan, CASES, FORCED, config)


def kernels(build):
    return direct_kernels(build, WinogradKernel)


@pytest.mark.parametrize("name", [s.name for s in CASES] + [n + "_forced" for n in FORCED])
def test_every_candidate_matches_eager(name, builds):
    build = builds[name]
    spec = build.spec
    x, w, bias, res = random_operands(spec)
    ref = eager_reference(spec, x, w, bias, res)
    assert 1 <= len(build.candidates) <= winograd.MAX_CANDIDATES
    for cand, kernel in kernels(build):
        u = kernel.prepare_weight(w)
        out = kernel(x, u, bias, res)
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert_close(out, ref, spec, cand.candidate.tiling_repr)
        # into a NaN-filled output (every element written), on one thread: the same bits (a
        # task owns its tiles' outputs, so the thread count never changes a sum's order)
        out1 = kernel(x, u, bias, res, out=torch.full_like(out, float("nan")), max_threads=1)
        assert torch.equal(out1, out), cand.candidate.tiling_repr


def test_cases_cover_both_band_modes_and_tails(builds):
    tilings = [(b.spec, c.tiling) for b in builds.values() for c in b.candidates]
    assert {t.bd for _, t in tilings} == {1, 2} and {t.local for _, t in tilings} == {0, 1}
    assert any(s.c_out % t.ocb for s, t in tilings)  # a channel block past c_out
    assert any(t.br < winograd.tiles(s)[0] for s, t in tilings)  # several bands per image
    assert any(t.tblk < t.br * winograd.tiles(s)[1] for s, t in tilings)  # several tasks per band
    assert {t.ocb // V for _, t in tilings} >= {1, 2, 3, 4}


def test_a_non_finite_input_stays_non_finite(builds):
    """Where eager's output is NaN or inf, so is the kernel's (Winograd's transforms mix the
    4x4 patch: the 2x2 tiles reading a non-finite input are NaN as a whole; docs/WINOGRAD.md)."""
    spec = CASES[0]
    x, w, bias, res = random_operands(spec, seed=1)
    x[0, 0, 1, 1], x[0, -1, 0, 0], x[0, 3, -1, -1] = float("nan"), float("inf"), float("-inf")
    ref = eager_reference(spec, x, w, bias, res)
    far = torch.ones_like(ref, dtype=torch.bool)  # pixels whose tiles read none of the three
    far[:, :, :4, :4] = far[:, :, -4:, -4:] = False
    for cand, kernel in kernels(builds[spec.name]):
        out = kernel(x, kernel.prepare_weight(w), bias, res)
        assert not out[~ref.isfinite()].isfinite().any(), cand.candidate.tiling_repr
        assert_close(out[far], ref[far], spec, cand.candidate.tiling_repr)


# ----------------------------------------------------------------------------- weights


def test_transformed_weight_is_g_w_gt_packed():
    """packed[b, p, c, o] = (G w[b*ocb+o, c] G^T)[p // 4, p % 4], zero past O; G w G^T of a
    weight that is one tap at the centre is the documented outer product."""
    w = torch.randn(21, 6, 3, 3)
    g = torch.tensor([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=torch.float64)
    for ocb in (8, 16):
        p = pack_weight(w, ocb)
        assert p.shape == (-(-21 // ocb), 16, 6, ocb) and p.dtype == torch.float32 and p.is_contiguous()
        for o, c in ((0, 0), (20, 5), (9, 3)):
            u = (g @ w[o, c].double() @ g.T).reshape(16).float()
            torch.testing.assert_close(p[o // ocb, :, c, o % ocb], u)
        assert not p.reshape(-1, 16, 6, ocb).permute(0, 3, 1, 2).reshape(-1, 16, 6)[21:].any()
    centre = torch.zeros(1, 1, 3, 3)
    centre[0, 0, 1, 1] = 1.0
    col = torch.tensor([0.0, 0.5, -0.5, 0.0])
    assert torch.equal(pack_weight(centre, 8)[0, :, 0, 0].reshape(4, 4), torch.outer(col, col))
    with pytest.raises(ConvSpecError, match=r"\[O, C, 3, 3\]"):
        pack_weight(torch.zeros(4, 4, 5, 5), 8)
    with pytest.raises(ConvSpecError, match="ocb must be a positive int"):
        pack_weight(w, 0)


def test_launcher_checks_the_packed_weight(builds):
    spec = CASES[0]
    x, w, bias, res = random_operands(spec)
    _, kernel = next(kernels(builds[spec.name]))
    with pytest.raises(ConvSpecError, match="prepare_weight"):
        kernel(x, w.contiguous(), bias, res)  # the raw [O, C, 3, 3] weight, not transformed
    with pytest.raises(ConvSpecError, match=r"the weight must be \[45, 37, 3, 3\]"):
        kernel.prepare_weight(torch.zeros(45, 36, 3, 3))


# ----------------------------------------------------------------------------- spec + tiling


@pytest.mark.parametrize("change, message", [
    (dict(kh=5, kw=5, padding=(2, 2)), "a 5x5 kernel"), (dict(stride=(2, 2)), "stride"),
    (dict(dilation=(2, 2), padding=(2, 2)), "dilation"), (dict(padding=(3, 3)), "padding"),
    (dict(x_layout="nchw"), "NCHW")])
def test_specs_the_transform_does_not_compute_are_refused(change, message):
    spec = S("wg_refused", 1, 16, 16, 9, 9, 3, 3, 1, 1)
    bad = S(**{**spec.to_json(), **change})
    with pytest.raises(ConvSpecError, match=message) as e:
        check_spec(bad)
    assert "use the direct kernel" in str(e.value)
    with pytest.raises(ConvSpecError, match=message):
        propose(bad, TARGET)


@pytest.mark.parametrize("tiling, message", [
    (WinoTiling(2 * V, 6, 20, 2, 1, V), "tblk a multiple of tb"),
    (WinoTiling(2 * V, 6, 18, 2, 1, V, 2), "local 0 or 1"),
    (WinoTiling(8 * V, 6, 18, 2, 1, V), "registers"),
    (WinoTiling(2 * V, 6, 18, 15, 1, V), "tile rows"),
    (WinoTiling(2 * V, 6, 18, 2, 3, V), "core limit"),
    (WinoTiling(V + 1, 6, 18, 2, 1, V), "multiple of lanes")])
def test_tilings_the_template_cannot_build_are_refused(tiling, message):
    spec = S("wg_tiling", 1, 16, 16, 28, 28, 3, 3, 1, 1)
    with pytest.raises(ConvSpecError, match=message):
        check_tiling(spec, tiling, TARGET)
    with pytest.raises(ConvSpecError, match=message):
        plan(spec, BuildConfig(topn=1, cores=2), TARGET, [tiling])


def test_proposals_are_deterministic_varied_and_within_the_core_limit():
    spec = S("wg_prop", 1, 64, 64, 56, 56, 3, 3, 1, 1, bias=True, epilogue=("relu",))
    a, b = propose(spec, TARGET, 6), propose(spec, TARGET, 6)
    assert [c.candidate.kernel_key for c in a] == [c.candidate.kernel_key for c in b]
    assert all(c.tiling.bd <= TARGET.cores for c in a)
    first, second = a[0].tiling, a[1].tiling
    assert (first.ocb, first.local) != (second.ocb, second.local)  # PGO's second tiling differs
    assert WinoTiling.parse(first.tiling_repr) == first
    with pytest.raises(ConvSpecError, match="not a Winograd tiling"):
        WinoTiling.parse("ocb=16;tb=6")
    small = S("wg_small", 1, 16, 16, 6, 6, 3, 3, 1, 1)  # tiny: no thread pays for its wake-up
    assert all(c.tiling.bd == 1 for c in propose(small, TARGET, 6))
