"""1x1 convolutions as the generated GEMM on channels_last rows (ascendc_pack/tactic_gemm.py).

A mobile-style block (1x1 expand + BatchNorm + hardswish from an NCHW input, depthwise 3x3, a
squeeze-excitation pair of 1x1 convolutions on [N, C, 1, 1], a 1x1 projection + BatchNorm + the
residual): every GEMM candidate of every 1x1 step is verified against eager and timed; forced to
the GEMMs, the bundle matches eager in a fresh process and reads channels_last operands in place
(no per-call copy of a GEMM operand but the entry's NCHW input).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ascendc_pack.config import BuildConfig
from ascendc_pack_runtime.tensor_meta import same_layout
from ascendc_pack.program import TacticStep
from ascendc_pack.tactic_gemm import CONV_TILINGS, ConvGemmTactic, conv_gemm_spec
from ascendc_pack.tactic_tune import TacticTuner

from .bundle_fixtures import build_root
from .test_tactic_pipeline import FAST, _build, _found, _fresh_process_matches, _member


class MobileBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.expand = nn.Conv2d(8, 24, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(24)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.se1, self.se2 = nn.Conv2d(24, 8, 1), nn.Conv2d(8, 24, 1)
        self.project = nn.Conv2d(24, 8, 1)
        self.bn2 = nn.BatchNorm2d(8)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = F.hardswish(self.bn1(self.expand(x)))  # the chain's entry: NCHW input
        y = self.dw(y)
        g = F.hardsigmoid(self.se2(F.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        return self.bn2(self.project(y * g)) + x


def _model():
    torch.manual_seed(0)
    return MobileBlock().eval()


def _input():
    return torch.randn(2, 8, 6, 5, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return build_root(tmp_path_factory) / "conv_gemm_cache"


def _conv(**kw) -> TacticStep:
    desc = {"kernel": [1, 1], "stride": [1, 1], "padding": [0, 0], "groups": 1, "dtype": "float32",
            "x_shape": [2, 8, 6, 5], "out_channels": 24, "bias": False,
            "epilogue": {"affine": True, "binary": None, "unary": "hardswish"}}
    desc.update(kw)
    return TacticStep(name="conv_t", tactic_kind="conv", desc=desc, bind={}, shapes={}, outputs=["y"], steps=[])


def test_which_convolutions_are_gemms():
    spec = conv_gemm_spec(_conv())
    assert (spec.m, spec.n, spec.k, spec.bias, spec.epilogue) == (2 * 6 * 5, 24, 8, True, ("hardswish",))
    assert conv_gemm_spec(_conv(epilogue={"affine": False, "binary": "add", "unary": "relu"})).epilogue == \
        ("add", "relu")
    for not_a_gemm in (dict(kernel=[3, 3]), dict(stride=[2, 2]), dict(padding=[1, 1]), dict(groups=2),
                       dict(dtype="bfloat16"), dict(epilogue={"affine": False, "binary": "mul", "unary": None}),
                       dict(epilogue={"affine": False, "binary": None, "unary": "tanh"})):
        assert conv_gemm_spec(_conv(**not_a_gemm)) is None, not_a_gemm


def test_every_gemm_candidate_of_every_1x1_convolution_is_verified_and_timed(tmp_path):
    x = _input()
    found = _found(_model(), x)
    tuner = TacticTuner(found.model, found.weights, BuildConfig(topn=4, cache_dir=tmp_path, jobs=2), FAST,
                        compile_epilogue=False)
    try:
        tuner(x)
    finally:
        tuner.close()
    convs = [ch for ch in tuner.choices.values() if ch.kind == "conv" and ch.desc["kernel"] == [1, 1]]
    assert len(convs) == 4  # expand, the two SE convolutions, project
    for ch in convs:
        gemms = [(t, r) for t, r in zip(ch.candidates, ch.results) if isinstance(t, ConvGemmTactic)]
        assert 1 <= len(gemms) <= CONV_TILINGS, ch.name
        for t, r in gemms:  # verified in the kernel sandbox against eager, then timed
            assert r.error is None and r.disqualified is None and r.median_us is not None, (ch.name, r)
            cl = torch.empty(t.out_shape).contiguous(memory_format=torch.channels_last).stride()
            assert same_layout(t.out_shape, r.values["out"].stride, t.out_shape, cl)  # C is the NHWC rows


def test_1x1_convolutions_run_as_gemms_in_the_graph(tmp_path, cache, monkeypatch):
    """Forced to the GEMM candidates (the other steps to channels_last oneDNN): the build's own
    check and a fresh process match eager; channels_last operands are read as views."""
    real = TacticTuner.decisions

    def forced(self):
        out = real(self)
        for s in self.instances:
            names = [t.name for t in self.choices[s.name].candidates]
            pick = next((i for i, t in enumerate(self.choices[s.name].candidates) if isinstance(t, ConvGemmTactic)),
                        None)
            if pick is None:
                pick = next((names.index(n) for n in ("onednn_cl", "onednn") if n in names), 0)
            out[id(s)] = pick
        for ch in self.choices.values():
            for u, s in zip(ch.uses, [s for s in self.instances if s.name == ch.name]):
                u["chosen_index"] = out[id(s)]
        return out

    monkeypatch.setattr(TacticTuner, "decisions", forced)
    res, out = _build(tmp_path, cache, _model(), (_input(),))
    chosen = [ch.candidates[u["chosen_index"]] for ch in res.tactics.values() for u in ch.uses]
    assert sum(isinstance(t, ConvGemmTactic) for t in chosen) == 4
    _fresh_process_matches(out, _model(), (_input(),), tmp_path)
    run = _member(out, "graph.cpp").decode().split("kRun[]")[1]
    copies = [line for line in run.splitlines() if "aten.clone" in line or "AP_RELAYOUT" in line]
    assert len(copies) == 2, copies  # the NCHW input x, read as the expand's A and the project's residual
