"""Convolutions run by generated kernels: 1x1 convolutions as the generated GEMM on channels_last
rows (ascendc_pack/tactics/families/gemm.py), depthwise and dense ones by the depthwise and the direct
convolution kernels (ascendc_pack/tactics/families/conv.py), and the layouts the planner predicts
around convolutions.

A mobile-style block (a dense 3x3 stem + BatchNorm + relu from an NCHW input, 1x1 expand +
BatchNorm + hardswish, depthwise 3x3 + BatchNorm + relu, a squeeze-excitation pair of 1x1
convolutions on [N, C, 1, 1], a 1x1 projection + BatchNorm + the residual): every generated-kernel
candidate of every step is verified against eager and timed; forced to the generated kernels,
the bundle matches eager in a fresh process and reads channels_last operands in place (no
per-call copy of an operand but the entry's NCHW input).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ascendc_pack_runtime as rt

from ascendc_pack.config import BuildConfig
from ascendc_pack_runtime.tensor_meta import same_layout
from ascendc_pack.ir.program import TacticStep
from ascendc_pack.tactics.families.conv import CONV_KERNEL_TILINGS, WINOGRAD_TILINGS
from ascendc_pack.tactics.families.gemm import CONV_TILINGS, conv_gemm_spec
from ascendc_pack.tactics.tune import TacticTuner

from .bundle_fixtures import build_root
from .test_tactic_pipeline import FAST, _build, _found, _fresh_process_matches, _member


class MobileBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.expand = nn.Conv2d(8, 24, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(24)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24, bias=False)
        self.bn_dw = nn.BatchNorm2d(24)
        self.se1, self.se2 = nn.Conv2d(24, 8, 1), nn.Conv2d(8, 24, 1)
        self.project = nn.Conv2d(24, 8, 1)
        self.bn2 = nn.BatchNorm2d(8)
        with torch.no_grad():
            for bn in (self.bn0, self.bn1, self.bn_dw, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        s = F.relu(self.bn0(self.stem(x)))  # the chain's entry: NCHW input
        y = F.hardswish(self.bn1(self.expand(s)))
        y = F.relu(self.bn_dw(self.dw(y)))
        g = F.hardsigmoid(self.se2(F.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        return self.bn2(self.project(y * g)) + s


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
                       dict(dtype="bfloat16"), dict(epilogue={"affine": False, "binary": "sub", "unary": None}),
                       dict(epilogue={"affine": False, "binary": None, "unary": "tanh"})):
        assert conv_gemm_spec(_conv(**not_a_gemm)) is None, not_a_gemm


def test_every_generated_candidate_of_every_convolution_is_verified_and_timed(tmp_path):
    x = _input()
    found = _found(_model(), x)
    tuner = TacticTuner(found.model, found.weights, BuildConfig(topn=4, cache_dir=tmp_path, jobs=2), FAST,
                        compile_epilogue=False)
    try:
        tuner(x)
    finally:
        tuner.close()
    convs = [ch for ch in tuner.choices.values() if ch.kind == "conv"]
    assert len(convs) == 6  # stem, expand, depthwise, the two SE convolutions, project
    for ch in convs:
        generated = [(t, r) for t, r in zip(ch.candidates, ch.results) if t.family != "dispatch"]
        assert generated, ch.name
        families = [t.family for t, _ in generated]
        most = max(CONV_TILINGS, CONV_KERNEL_TILINGS, WINOGRAD_TILINGS)
        assert all(families.count(f) <= most for f in families), ch.name
        # the stem (its x arrives NCHW) also gets the direct kernel reading x in place
        assert ("directconv_nchw" in families) == (ch.desc.get("position") != "interior" and "directconv" in families)
        for t, r in generated:  # verified in the kernel sandbox against eager, then timed
            assert r.error is None and r.disqualified is None and r.median_us is not None, (ch.name, r)
            out_shape = tuple(r.values["out"].shape)
            cl = torch.empty(out_shape).contiguous(memory_format=torch.channels_last).stride()
            assert same_layout(out_shape, r.values["out"].stride, out_shape, cl)  # C is the NHWC rows


def _force_generated(monkeypatch, families: tuple):
    """Builds choose the generated GEMM or a kernel of ``families`` wherever one is a candidate."""
    real = TacticTuner.decisions

    def generated(t):
        return t.family == "gemm" or t.family in families

    def forced(self):
        out = real(self)
        for s in self.instances:
            names = [t.name for t in self.choices[s.name].candidates]
            pick = next((i for i, t in enumerate(self.choices[s.name].candidates) if generated(t)), None)
            if pick is None:
                pick = next((names.index(n) for n in ("onednn_cl", "onednn") if n in names), 0)
            out[id(s)] = pick
        for ch in self.choices.values():
            for u, s in zip(ch.uses, [s for s in self.instances if s.name == ch.name]):
                u["chosen_index"] = out[id(s)]
        return out

    monkeypatch.setattr(TacticTuner, "decisions", forced)


def _relayouts(bundle) -> list[str]:
    run = _member(bundle, "graph.cpp").decode().split("kRun[]")[1]
    return [line for line in run.splitlines() if "aten.clone" in line or "AP_RELAYOUT" in line]


@pytest.mark.parametrize("stem", ["directconv", "directconv_nchw"])
def test_convolutions_run_as_generated_kernels_in_the_graph(tmp_path, cache, monkeypatch, stem):
    """Forced to the generated kernels: the build's own check and a fresh process match eager;
    channels_last operands are read in place, and the stem's NCHW input by ``directconv_nchw``;
    the libraries are bundle members."""
    _force_generated(monkeypatch, ("dwconv", stem))
    res, out = _build(tmp_path, cache, _model(), (_input(),))
    chosen = [ch.candidates[u["chosen_index"]] for ch in res.tactics.values() for u in ch.uses]
    assert sum(t.family == "gemm" for t in chosen) == 4
    assert {t.family for t in chosen if t.family not in ("gemm", "dispatch")} == {"dwconv", stem}
    _fresh_process_matches(out, _model(), (_input(),), tmp_path)
    names = {k.name for k in rt.read_manifest(out).kernels}
    assert any(n.startswith("dwconv_conv_") for n in names) and any(n.startswith(f"{stem}_conv_") for n in names)
    assert sum(n.startswith("gemm_conv_") for n in names) == 4
    copies = _relayouts(out)
    # the NCHW input x: copied for the NHWC stem, read in place by the other
    assert len(copies) == (1 if stem == "directconv" else 0), copies


class ResidualBlock(nn.Module):
    """examples/conv_block.py's shape of graph: the convolution's residual is its own NCHW input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)) + x)
        return F.avg_pool2d(y, 2), y.mean((2, 3))


@pytest.mark.parametrize("family", ["directconv", "directconv_nchw"])
def test_a_residual_that_is_the_input_is_read_once(tmp_path, cache, monkeypatch, family):
    """x is the convolution's input and its residual: one NHWC copy serves both, or the
    in-place kernel reads both NCHW; the bundle matches eager in a fresh process."""
    _force_generated(monkeypatch, (family,))
    torch.manual_seed(0)
    model, x = ResidualBlock().eval(), torch.randn(2, 8, 6, 6, generator=torch.Generator().manual_seed(2))
    res, out = _build(tmp_path, cache, model, (x,))
    chosen = [ch.candidates[u["chosen_index"]] for ch in res.tactics.values() for u in ch.uses]
    assert [t.family for t in chosen] == [family]
    _fresh_process_matches(out, model, (x,), tmp_path)
    assert len(_relayouts(out)) == (1 if family == "directconv" else 0), _relayouts(out)


class BasicBlock(nn.Module):
    """resnet's BasicBlock at 16 channels: two 3x3 stride-1 convolutions (Winograd's kind), the
    first reading the NCHW input, the second interior with the residual."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.Conv2d(16, 16, 3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm2d(16), nn.BatchNorm2d(16)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


def test_winograd_candidates_are_verified_and_run_in_the_graph(tmp_path, cache, monkeypatch):
    """Every 3x3 stride-1 step gets WINOGRAD_TILINGS Winograd candidates, verified against eager
    and timed; forced to them, the bundle matches eager in a fresh process."""
    torch.manual_seed(0)
    model, x = BasicBlock().eval(), torch.randn(1, 16, 9, 10, generator=torch.Generator().manual_seed(3))
    found = _found(model, x)
    tuner = TacticTuner(found.model, found.weights, BuildConfig(topn=4, cache_dir=tmp_path / "t", jobs=2), FAST,
                        compile_epilogue=False)
    try:
        tuner(x)
    finally:
        tuner.close()
    for ch in tuner.choices.values():
        wino = [(t, r) for t, r in zip(ch.candidates, ch.results) if getattr(t, "family", None) == "winograd"]
        assert len(wino) == WINOGRAD_TILINGS, ch.name
        assert all(r.error is None and r.disqualified is None and r.median_us is not None for _, r in wino), ch.name
    _force_generated(monkeypatch, ("winograd",))
    res, out = _build(tmp_path, cache, model, (x,))
    chosen = [ch.candidates[u["chosen_index"]] for ch in res.tactics.values() for u in ch.uses]
    assert [t.family for t in chosen] == ["winograd", "winograd"]
    _fresh_process_matches(out, model, (x,), tmp_path)
    assert sum(k.name.startswith("winograd_conv_") for k in rt.read_manifest(out).kernels) == 2


@pytest.mark.parametrize("x_cl", [False, True], ids=["x-nchw", "x-cl"])
@pytest.mark.parametrize("w_cl", [False, True], ids=["w-nchw", "w-cl"])
@pytest.mark.parametrize("case", [((1, 16, 9, 9), (16, 1, 3, 3), 16), ((1, 16, 9, 9), (24, 16, 3, 3), 1),
                                  ((2, 16, 5, 5), (24, 16, 1, 1), 1), ((1, 16, 1, 1), (8, 16, 1, 1), 1),
                                  ((2, 8, 5, 5), (8, 2, 3, 3), 4)], ids=["dw", "3x3", "1x1", "se", "grouped"])
def test_planned_convolution_layout_is_the_cpu_kernels(case, x_cl, w_cl):
    """ATen's meta convolution says NCHW; the planner predicts what the CPU kernels return."""
    from ascendc_pack.passes.meta_layouts import meta_layouts
    from ascendc_pack.ir.program import AtenStep, Ref

    xs, ws, groups = case
    x, w = torch.randn(xs), torch.randn(ws)
    x = x.contiguous(memory_format=torch.channels_last) if x_cl else x
    w = w.contiguous(memory_format=torch.channels_last) if w_cl else w
    args = [Ref("x"), Ref("w"), None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups]
    step = AtenStep("aten.convolution.default", args, {}, ["y"])
    specs = {"x": (tuple(x.shape), x.stride(), "float32"), "w": (tuple(w.shape), w.stride(), "float32")}
    [(shape, stride, _)] = meta_layouts(step, specs.__getitem__)
    y = torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)
    assert shape == tuple(y.shape) and same_layout(shape, stride, y.shape, y.stride())
