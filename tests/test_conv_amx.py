"""The generated AMX bfloat16 convolution (kernels/conv/amx.py, the ``conv`` mode of
templates/kernel/gemm_amx.cpp.j2): every candidate against eager, the weight packing, which steps
it takes, and a ``--precision bf16`` build of a small CNN that picks it. Skipped on a host without
AMX-BF16."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import ascendc_pack_runtime as rt
from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels import family
from ascendc_pack.kernels.conv import amx
from ascendc_pack.kernels.conv.direct import ConvSpec, ConvSpecError
from ascendc_pack.kernels.conv.direct_launch import (AmxConvKernel, AmxDirectConvKernel, AmxRowsConvKernel, eager_reference,
                                                     random_operands)
from ascendc_pack.kernels.gemm.amx import amx_offered
from ascendc_pack.kernels.target import CpuTarget
from ascendc_pack.tactics.dispatch.lowp import STEP_TOLERANCE
from ascendc_pack.toolchain.compiler import host_cpu_flags
from ascendc_pack_runtime.accuracy import relative_error

from .bundle_fixtures import assert_within_budget, build_bf16, build_root

WHY_NOT = amx_offered(host_cpu_flags())
needs_amx = pytest.mark.skipif(WHY_NOT is not None, reason=f"no AMX bfloat16 here: {WHY_NOT}")

SPECS = [
    ConvSpec.from_conv("amxc_stem", (1, 3, 30, 26), (32, 3, 7, 7), 2, 3, bias=True, epilogue=("relu",)),
    ConvSpec.from_conv("amxc_block", (2, 32, 9, 11), (48, 32, 3, 3), 1, 1, bias=True, epilogue=("add", "relu")),
    ConvSpec.from_conv("amxc_down", (1, 40, 14, 14), (64, 40, 3, 3), 2, 1, epilogue=("gelu",)),      # C off 16
    ConvSpec.from_conv("amxc_1x1s2", (1, 64, 12, 12), (24, 64, 1, 1), 2, 0, bias=True),              # O off 16
    ConvSpec.from_conv("amxc_dilated", (1, 16, 13, 13), (16, 16, 3, 3), 1, 2, dilation=2, epilogue=("silu",)),
    ConvSpec.from_conv("amxc_rect", (1, 24, 10, 17), (40, 24, 1, 5), (1, 2), (0, 2), bias=True, epilogue=("add",)),
    # x NCHW, read in place (an entry convolution; taps ordered (i, c, j))
    ConvSpec.from_conv("amxc_stem_nchw", (1, 3, 30, 26), (32, 3, 7, 7), 2, 3, bias=True, epilogue=("relu",),
                       x_layout="nchw"),
    ConvSpec.from_conv("amxc_patch_nchw", (2, 3, 32, 48), (24, 3, 16, 16), 16, 0, bias=True, x_layout="nchw"),
    ConvSpec.from_conv("amxc_dilated_nchw", (1, 5, 11, 9), (16, 5, 3, 3), 1, 2, dilation=2, epilogue=("add", "relu"),
                       x_layout="nchw"),
]


DIRECT_SPECS = [   # the direct variant: input channels a multiple of 32
    ConvSpec.from_conv("amxd_block", (2, 32, 9, 11), (48, 32, 3, 3), 1, 1, bias=True, epilogue=("add", "relu")),
    ConvSpec.from_conv("amxd_down", (1, 64, 14, 13), (40, 64, 3, 3), 2, 1, epilogue=("gelu",)),     # O off 16
    ConvSpec.from_conv("amxd_dilated", (1, 32, 13, 13), (32, 32, 3, 3), 1, 2, dilation=2, epilogue=("silu",)),
    ConvSpec.from_conv("amxd_1x1s2", (1, 64, 12, 12), (24, 64, 1, 1), 2, 0, bias=True),
    ConvSpec.from_conv("amxd_rect", (1, 32, 10, 37), (40, 32, 1, 5), (1, 2), (0, 2), bias=True, epilogue=("add",)),
]
ROWS_SPECS = [     # the kernel-row variant: NCHW x of at most 4 channels (rounded into 2 or 4 a pixel)
    ConvSpec.from_conv("amxr_stem", (2, 3, 30, 26), (32, 3, 7, 7), 2, 3, bias=True, epilogue=("relu",),
                       x_layout="nchw"),                                                           # W, OW off 16
    ConvSpec.from_conv("amxr_gray", (1, 1, 19, 35), (20, 1, 3, 5), (1, 2), (1, 2), x_layout="nchw"),  # O off 16
    ConvSpec.from_conv("amxr_res", (1, 4, 12, 37), (16, 4, 3, 3), 1, 1, bias=True, epilogue=("add", "relu"),
                       x_layout="nchw"),                                       # 4 channels, NHWC residual
    ConvSpec.from_conv("amxr_vdil", (1, 2, 17, 33), (48, 2, 3, 8), 1, (2, 3), (2, 1), epilogue=("silu",),
                       x_layout="nchw"),                              # vertical dilation, a 32-value row
]
KERNELS = {amx.GENERATOR.name: AmxConvKernel, amx.DIRECT.name: AmxDirectConvKernel,
           amx.ROWS.name: AmxRowsConvKernel}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if WHY_NOT is not None:
        pytest.skip(f"no AMX bfloat16 here: {WHY_NOT}")
    config = BuildConfig.resolve(cache_dir=build_root(tmp_path_factory) / "build_cache", jobs=2, topn=6)
    target = CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir)
    builds = family.compile_all(amx.GENERATOR, SPECS, config, target)
    direct = family.compile_all(amx.DIRECT, DIRECT_SPECS, config, target)
    rows = family.compile_all(amx.ROWS, ROWS_SPECS, config, target)
    return {**{s.name: (amx.GENERATOR.name, b) for s, b in zip(SPECS, builds)},
            **{s.name: (amx.DIRECT.name, b) for s, b in zip(DIRECT_SPECS, direct)},
            **{s.name: (amx.ROWS.name, b) for s, b in zip(ROWS_SPECS, rows)}}


def _rounded_reference(spec: ConvSpec, x, w, bias, res):
    """The convolution in float64 on bfloat16-rounded x and weight (what the kernel multiplies; it
    accumulates in float32, so this is near-exact), then the epilogue in float64."""
    r = lambda t: t.bfloat16().double()  # noqa: E731
    y = F.conv2d(r(x), r(w), bias.double() if bias is not None else None, spec.stride, spec.padding, spec.dilation)
    for op in spec.epilogue:
        y = y + res.double() if op == "add" else {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[op](y)
    return y


@needs_amx
@pytest.mark.parametrize("spec", SPECS + DIRECT_SPECS + ROWS_SPECS, ids=lambda s: s.name)
def test_every_amx_conv_candidate_matches_eager(spec, compiled):
    """Every tiling (im2col, direct and kernel-row): within the bf16 step tolerance of float32 eager, and
    within float32 rounding of the same convolution on bfloat16-rounded operands (a gather,
    padding, strip or packing error shows there at once)."""
    x, w, bias, res = random_operands(spec, seed=spec.c_in)
    want32, want_rounded = eager_reference(spec, x, w, bias, res), _rounded_reference(spec, x, w, bias, res)
    generator, build = compiled[spec.name]
    assert len(build.candidates) >= 2
    for cc in build.compiled.candidates:
        assert cc.ok, cc.error
        k = KERNELS[generator](spec, cc.so_path, cc.candidate.kernel_key)
        got = k(x, k.prepare_weight(w), bias, res)
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert relative_error(want32, got) <= STEP_TOLERANCE["bf16"], cc.candidate.tiling_repr
        assert relative_error(want_rounded, got) < 1e-5, cc.candidate.tiling_repr


def test_the_nchw_packing_orders_taps_by_row_channel_column():
    w = torch.randn(20, 3, 2, 3)
    p = amx.pack_weight(w, "nchw")
    for o, c, i, j in ((0, 0, 0, 0), (19, 2, 1, 2), (17, 1, 0, 2), (5, 2, 1, 0)):
        k = (i * 3 + c) * 3 + j
        assert p[o // 16, k // 2, o % 16, k % 2] == w[o, c, i, j].bfloat16()


def test_the_kernel_row_packing_pads_each_tap_to_the_rounded_channels():
    """k = (i * kw + j) * CP + c with CP = 4 for 3 channels; the fourth channel's rows are zero."""
    w = torch.randn(20, 3, 2, 3)
    p = amx.pack_weight(w, "rows")
    spec = ConvSpec.from_conv("pk", (1, 3, 8, 8), (20, 3, 2, 3), x_layout="nchw")
    assert tuple(p.shape) == amx.packed_shape(spec, rows=True) == (2, 16, 16, 2)   # K = 24 padded to 32
    for o, c, i, j in ((0, 0, 0, 0), (19, 2, 1, 2), (17, 1, 0, 2), (5, 2, 1, 0)):
        k = (i * 3 + j) * 4 + c
        assert p[o // 16, k // 2, o % 16, k % 2] == w[o, c, i, j].bfloat16()
    assert not p[:, 1::2, :, 1].any()   # c = 3: odd k of every odd pair
    assert amx.rows_channels(1) == amx.rows_channels(2) == 2 and amx.rows_channels(3) == 4


def test_the_packed_weight_is_the_tile_layout():
    """packed[p, k // 2, j, k % 2] = W[16p + j] at tap k = (i * kw + j') * C + c, bfloat16, zero past O and K."""
    w = torch.randn(20, 3, 2, 3)
    p = amx.pack_weight(w)
    spec = ConvSpec.from_conv("pk", (1, 3, 8, 8), (20, 3, 2, 3))
    assert p.dtype == torch.bfloat16 and tuple(p.shape) == amx.packed_shape(spec) == (2, 16, 16, 2)
    for o, c, i, j in ((0, 0, 0, 0), (19, 2, 1, 2), (17, 1, 0, 2), (5, 2, 1, 0)):
        k = (i * 3 + j) * 3 + c
        assert p[o // 16, k // 2, o % 16, k % 2] == w[o, c, i, j].bfloat16()
    assert not p[1, :, 4:].any() and not p[:, 9:].any()   # channels 20..31 and taps 18..31
    with pytest.raises(ConvSpecError, match=r"\[O, C, kh, kw\]"):
        amx.pack_weight(torch.randn(4, 4))


def test_which_convolutions_have_an_amx_kernel():
    nchw = ConvSpec.from_conv("a", (1, 64, 8, 8), (16, 64, 3, 3), x_layout="nchw")
    assert amx.amx_conv_applies(nchw) is None and "NHWC" in amx.direct_applies(nchw)
    res_nchw = ConvSpec.from_conv("r", (1, 16, 8, 8), (16, 16, 3, 3), 1, 1, epilogue=("add",), x_layout="nchw",
                                  residual_layout="nchw")
    assert "residual" in amx.amx_conv_applies(res_nchw)
    assert "output channels" in amx.amx_conv_applies(ConvSpec.from_conv("b", (1, 16, 8, 8), (8, 16, 3, 3)))
    assert amx.amx_conv_applies(ConvSpec.from_conv("c", (1, 3, 8, 8), (16, 3, 3, 3))) is None
    assert "32 of one tap" in amx.direct_applies(ConvSpec.from_conv("d", (1, 48, 8, 8), (16, 48, 3, 3)))
    assert amx.direct_pays(ConvSpec.from_conv("e", (1, 64, 14, 14), (16, 64, 3, 3), 1, 1)) is None
    seven = ConvSpec.from_conv("g", (1, 64, 7, 7), (16, 64, 3, 3), 1, 1)   # runs, but 9 of 16 strip rows wasted
    assert amx.direct_applies(seven) is None and "fill 44%" in amx.direct_pays(seven)
    with pytest.raises(ConvSpecError, match="no AMX kernel"):
        amx.render(res_nchw, None, "")
    stem = ConvSpec.from_conv("s", (1, 3, 224, 224), (64, 3, 7, 7), 2, 3, x_layout="nchw")
    assert amx.rows_pays(stem) is None
    assert "NCHW" in amx.rows_applies(dataclasses.replace(stem, x_layout="nhwc"))
    assert "at most 4" in amx.rows_applies(ConvSpec.from_conv("h", (1, 5, 8, 8), (16, 5, 3, 3), x_layout="nchw"))
    assert "exceed a tile row" in amx.rows_applies(ConvSpec.from_conv("i", (1, 3, 20, 20), (16, 3, 9, 9),
                                                                      x_layout="nchw"))
    assert "dilation" in amx.rows_applies(ConvSpec.from_conv("j", (1, 3, 20, 20), (16, 3, 3, 3), 1, 2, 2,
                                                             x_layout="nchw"))
    assert "fill 44%" in amx.rows_pays(ConvSpec.from_conv("k", (1, 3, 14, 14), (16, 3, 3, 3), 2, 1,
                                                          x_layout="nchw"))
    thin = ConvSpec.from_conv("f", (1, 48, 8, 8), (16, 48, 3, 3))
    with pytest.raises(ConvSpecError, match="no direct AMX kernel"):
        amx.render(thin, amx.propose_direct(ConvSpec.from_conv("f", (1, 64, 8, 8), (16, 64, 3, 3)),
                                            CpuTarget.detect(2))[0], "")


@needs_amx
def test_a_misuse_of_the_kernel_names_the_fix(compiled):
    spec = SPECS[1]
    cc = compiled[spec.name][1].compiled.candidates[0]
    k = AmxConvKernel(spec, cc.so_path, cc.candidate.kernel_key)
    x, w, bias, res = random_operands(spec)
    with pytest.raises(ConvSpecError, match="bfloat16.*prepare_weight"):
        k(x, w, bias, res)                                     # the weight not packed
    with pytest.raises(ConvSpecError, match="channels_last"):
        k(x.contiguous(), k.prepare_weight(w), bias, res)      # x NCHW


# ---- in a build ----------------------------------------------------------------------------------

CNN = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 5, 2, 2, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.c1 = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.c2 = nn.Conv2d(32, 32, 3, 1, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.c2(self.c1(x)))
        return self.head(x.mean((2, 3)))


def get_model():
    torch.manual_seed(0)
    m = Block().eval()
    for bn in (m.stem[1], m.c1[1]):
        bn.running_mean.uniform_(-0.2, 0.2); bn.running_var.uniform_(0.5, 2.0)
    return m


def get_example_inputs():
    return (torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(0)),)
"""


@needs_amx
def test_a_bf16_build_picks_amx_convolutions_and_the_bundle_requires_amx(tmp_path_factory):
    loaded, out, res = build_bf16(CNN, tmp_path_factory.mktemp("amxconv"), build_root(tmp_path_factory) / "build_cache", 2)
    offered = [t for ch in res.tactics.values() for t in ch.candidates if t.family == "conv_amx_bf16"]
    assert len({t.spec.name for t in offered}) == 3, res.summary()   # each dense convolution got candidates
    direct = {t.spec.name for ch in res.tactics.values() for t in ch.candidates if t.family == "conv_amx_direct_bf16"}
    assert len(direct) == 2, res.summary()                            # the two on 32 channels, not the stem
    nchw = {t.spec.name for ch in res.tactics.values() for t in ch.candidates if t.family == "conv_amx_nchw_bf16"}
    assert len(nchw) == 1, res.summary()                              # the stem, reading the NCHW input in place
    rows = {t.spec.name for ch in res.tactics.values() for t in ch.candidates if t.family == "conv_amx_rows_bf16"}
    assert rows == {n.replace("conv_amx_nchw_", "conv_amxr_") for n in nchw}, res.summary()   # and its kernel rows
    for ch in res.tactics.values():                                    # every AMX candidate verified
        assert all(r.ok for t, r in zip(ch.candidates, ch.results) if t.family.startswith("conv_amx"))
    assert_within_budget(loaded, out, res)
    chosen = {ch.candidates[u["chosen_index"]].family for ch in res.tactics.values() for u in ch.uses}
    if chosen & {"conv_amx_bf16", "conv_amx_direct_bf16", "conv_amx_rows_bf16"}:   # PGO's pick (timed, not asserted): then AMX is required
        assert "amx_bf16" in rt.read_manifest(out).precision.requires
