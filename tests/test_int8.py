"""int8 precision (``--precision int8``; docs/PRECISION.md "int8"): the quantization parameters,
every int8 candidate against eager within its step tolerance, calibration on the calibration
inputs (and a build on other inputs not reusing its scales), the search falling back from int8 to
bfloat16 under ``auto``, and an end-to-end build: budget, manifest, ``inspect``, the quantization
fused into the kernels around, ``run --check`` on held-out inputs in a fresh process and the
runtime's refusal of a host without int8 dot products."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import ascendc_pack_runtime as rt
import ascendc_pack.tactics.dispatch as T
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.cli.main import main
from ascendc_pack.config import BuildConfig
from ascendc_pack.pipeline import build
from ascendc_pack.tactics import precision as P
from ascendc_pack.tactics.calibrate import activation_ranges
from ascendc_pack.tactics.decide import offered_precisions
from ascendc_pack.tactics.dispatch.int8 import int8_feature, int8_offered, quant_params
from ascendc_pack.tactics.dispatch.lowp import STEP_TOLERANCE, low_precision_tactics
from ascendc_pack_runtime.accuracy import relative_error

from .bundle_fixtures import build_root

FAST = Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0)
needs_int8 = pytest.mark.skipif(int8_offered() is not None, reason=f"no int8 here: {int8_offered()}")


# ---- quantization parameters and the offer ----------------------------------------------------------

def test_quant_params_cover_the_range_with_an_exact_zero():
    q = quant_params(-1.0, 3.0)
    assert q.scale == pytest.approx(4.0 / 255) and q.zero_point == round(1.0 / q.scale) == 64
    assert quant_params(0.5, 2.0).zero_point == 0             # widened to hold 0: zero stays exact
    assert quant_params(-2.0, -0.5).zero_point == 255
    assert quant_params(0.0, 0.0) == quant_params(float("nan"), 1.0) == quant_params(0, float("inf"))
    assert quant_params(0.0, 0.0).scale == 1.0


def test_int8_is_offered_only_with_int8_dot_products():
    assert int8_feature({"avx2", "avx512f"}) is None and "no int8 dot product" in (int8_offered({"avx2"}) or "")
    assert int8_feature({"avx512_vnni", "amx_int8"}) == "avx512_vnni" and int8_feature({"avx_vnni"}) == "avx_vnni"


def test_auto_offers_every_low_precision_the_host_has(monkeypatch):
    import ascendc_pack.tactics.decide as D

    monkeypatch.setattr(D, "bf16_offered", lambda: None)
    monkeypatch.setattr(D, "int8_offered", lambda: "no VNNI")
    assert offered_precisions(BuildConfig.resolve(precision="auto")) == (("bf16",), "int8: no VNNI")
    assert offered_precisions(BuildConfig.resolve(precision="int8")) == ((), "int8: no VNNI")
    monkeypatch.setattr(D, "int8_offered", lambda: None)
    assert offered_precisions(BuildConfig.resolve(precision="auto"))[0] == ("bf16", "int8")


# ---- every int8 candidate against eager ---------------------------------------------------------------

STEPS = [
    T.LinearStep(m=64, k=128, n=96, epilogue=T.Epilogue(unary="gelu")),
    T.LinearStep(m=33, k=80, n=48, bias=False, weight_layout="kn", epilogue=T.Epilogue(binary="add", unary="relu")),
    T.LinearStep(m=16, k=64, n=64, epilogue=T.Epilogue(affine=True, unary="relu")),
    T.ConvStep(x_shape=(2, 16, 12, 12), out_channels=32, kernel=(3, 3), padding=(1, 1),
               epilogue=T.Epilogue(affine=True, binary="add", unary="relu")),
    T.ConvStep(x_shape=(2, 16, 12, 12), out_channels=16, kernel=(3, 3), padding=(1, 1), groups=16,
               layout="channels_last", epilogue=T.Epilogue(unary="hardswish")),
    T.ConvStep(x_shape=(1, 8, 9, 9), out_channels=24, kernel=(1, 1), stride=(2, 2), bias=False),
]


@needs_int8
@pytest.mark.parametrize("step", STEPS, ids=lambda s: f"{s.kind}-{s.epilogue.label}")
def test_every_int8_candidate_matches_eager_within_its_step_tolerance(step):
    assert low_precision_tactics(step, ("int8",)) == []          # no calibrated range: no int8 candidate
    for seed in (0, 1):
        env = T.random_env(step, seed)
        x = env["x"]
        (t,) = low_precision_tactics(step, ("int8",), (float(x.min()), float(x.max())))
        assert t.name == "onednn_int8" and t.param("precision") == "int8" and t.param("x_scale") > 0
        ref = T.reference(step, env)
        weights, acts = T.split(env)
        got = T.run(t, acts, T.prepare(t, weights))
        assert got.dtype == ref.dtype == torch.float32 and got.shape == ref.shape
        assert 0 < relative_error(ref, got) <= STEP_TOLERANCE["int8"], t.name
        assert "weight_int8" in T.stored_weights(t) and "weight" not in T.stored_weights(t)   # a quarter the bytes


@needs_int8
def test_values_outside_the_calibrated_range_saturate():
    step = STEPS[0]
    env = T.random_env(step)
    (t,) = low_precision_tactics(step, ("int8",), (-0.5, 0.5))   # far narrower than N(0, 1) inputs
    weights, acts = T.split(env)
    err = relative_error(T.reference(step, env), T.run(t, acts, T.prepare(t, weights)))
    assert err > STEP_TOLERANCE["int8"]    # verification disqualifies such a candidate


# ---- the search: int8 first, bfloat16 when int8 costs too much ---------------------------------------

def test_auto_falls_back_from_int8_to_bf16_per_step(monkeypatch):
    from ascendc_pack.tactics.tune import TacticChoice, TacticResult

    step = T.LinearStep(m=8, k=8, n=8)
    cands = [T.gemm.onednn_tactic(step), T.gemm.aten_tactic(step), *low_precision_tactics(step, ("bf16",)),
             *low_precision_tactics(step, ("int8",), (-3.0, 3.0))]
    assert [t.param("precision", "fp32") for t in cands] == ["fp32", "fp32", "bf16", "int8"]

    class Tuner:
        offered, not_offered = ("bf16", "int8"), None

    tuner = Tuner()
    tuner.instances, tuner.choices, tuner.reached = [], {}, set()
    for name in ("a", "b"):
        s = type("S", (), {"name": name, "tactic_kind": "linear"})()
        ch = TacticChoice(name, "linear", step.to_json(), cands, [TacticResult(i, t.key, t.name)
                                                                  for i, t in enumerate(cands)], captured=1)
        ch.results[0].median_us, ch.results[2].median_us, ch.results[3].median_us = 100.0, 60.0, 40.0
        ch.low = {"bf16": 2, "int8": 3}
        tuner.instances.append(s)
        tuner.choices[name] = ch
        tuner.reached.add(id(s))
    cost = {2: 1e-3, 3: 8e-3}   # int8 costs 0.008 a step, bf16 0.001: both in int8 is over 0.01

    monkeypatch.setattr(P._Evaluator, "__init__", lambda self, tuner, sets: setattr(self, "runs", 0) or
                        setattr(self, "memo", {}))
    monkeypatch.setattr(P._Evaluator, "error", lambda self, switch: (setattr(self, "runs", self.runs + 1),
                                                                     sum(cost[i] for i in switch.values()))[1])
    decisions = {id(s): 0 for s in tuner.instances}
    report = P.choose(tuner, decisions, [()], "auto", 0.01)
    assert sorted(decisions.values()) == [2, 3] and report.error == pytest.approx(9e-3)   # one int8, one bf16
    assert report.computes == "bf16+int8"


# ---- calibration ---------------------------------------------------------------------------------------

NET = """
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    \"\"\"A residual convolution chain and GEMMs with epilogues: int8 candidates for all of them.\"\"\"

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 256)
        self.ff = nn.Linear(256, 512)
        self.out = nn.Linear(512, 10)

    def forward(self, x):
        y = F.relu(self.c1(x))
        y = F.max_pool2d(F.relu(self.c2(y) + y), 2)
        h = F.gelu(self.fc(y.flatten(1)))
        return self.out(F.relu(self.ff(h)))


def inputs(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(64, 16, 16, 16, generator=g),)


def get_model():
    torch.manual_seed(0)
    return Net().eval()


def get_example_inputs():
    return inputs(0)


def get_calibration_inputs():
    return [inputs(1)]
"""


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    from ascendc_pack.frontend.loader import load_model_file

    root = tmp_path_factory.mktemp("int8")
    model_file = root / "net.py"
    model_file.write_text(NET)
    return load_model_file(model_file), model_file


def test_activation_ranges_cover_every_calibration_set(net):
    from ascendc_pack.frontend.capture import capture
    from ascendc_pack.tactics.rewrite import find_tactics

    loaded, _ = net
    captured = capture(loaded.module, loaded.example_inputs)
    found = find_tactics(captured.model, captured.weights)
    sets = loaded.all_input_sets
    ranges = activation_ranges(found.model, found.weights, sets)
    assert len(ranges) == 5 and all(lo <= 0 <= hi for lo, hi in ranges.values())
    entry = [r for name, r in ranges.items() if name.startswith("conv_c16")][0]
    x = torch.cat([s[0] for s in sets])
    assert entry == (float(x.min()), float(x.max()))    # the first convolution reads the inputs themselves
    one = activation_ranges(found.model, found.weights, sets[:1])
    assert any(one[n] != ranges[n] for n in ranges)     # another calibration set, other ranges


# ---- end to end ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(net, tmp_path_factory):
    if int8_offered() is not None:
        pytest.skip(f"no int8 here: {int8_offered()}")
    loaded, model_file = net
    cache = build_root(tmp_path_factory) / "build_cache"
    out = tmp_path_factory.mktemp("int8_bundle") / "int8.ascpack"
    res = build(loaded.module, loaded.example_inputs, calibration_inputs=loaded.calibration_inputs, output=out,
                cache_dir=cache, jobs=2, protocol=FAST, precision="int8", accuracy_budget=0.05)
    return loaded, model_file, res, out, cache


def test_int8_build_stays_within_its_budget_and_records_it(built):
    _, _, res, out, _ = built
    p = res.precision
    assert p.computes == "int8" and 0 < p.error <= p.budget == 0.05 and p.input_sets == 2
    kinds = {ch.kind for ch in res.tactics.values() for u in ch.uses
             if ch.candidates[u["chosen_index"]].name == "onednn_int8"}
    assert kinds == {"linear", "conv"}
    assert all(c.ok for c in res.verification)
    assert "int8 requested, accuracy budget 0.05" in res.summary()
    assert "int8 scales come from 2 calibration input set(s)" in res.summary()   # few sets: said so
    m = rt.read_manifest(out)
    assert m.precision.computes == "int8" and m.precision.requires and set(m.precision.requires) <= set(m.target.isa)
    ops = set(m.graph.aten_ops or {})
    assert not ops & {"aten.round.default", "aten.clamp.default", "aten._to_copy.default"}, ops   # quantization fused
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "onednn_int8 (int8)" in r.output and "precision int8 requested; computes int8" in \
        r.output


def test_int8_bundle_checks_held_out_inputs_by_its_budget_in_a_fresh_process(built, tmp_path):
    loaded, model_file, res, out, _ = built
    run = subprocess.run([sys.executable, "-m", "ascendc_pack", "run", str(out), "--check", str(model_file),
                          "--repeat", "1", "--seed", "7"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "by the accuracy budget 0.05" in run.stdout and "check: OK" in run.stdout
    ns: dict = {}
    exec(compile(NET, "net.py", "exec"), ns)
    m = rt.load(out)
    held_out = ns["inputs"](9)
    with torch.no_grad():
        assert 0 < relative_error(loaded.module(*held_out), m(*held_out)) <= res.precision.budget
        # inputs four times wider than calibrated saturate: the error the budget does not cover, measured
        wide = ns["inputs"](9, 4.0)
        assert relative_error(loaded.module(*wide), m(*wide)) > res.precision.error
    m.close()


def test_other_calibration_inputs_do_not_reuse_the_scales(built, tmp_path):
    loaded, _, res, _, cache = built
    other = [tuple(3.0 * t for t in s) for s in loaded.calibration_inputs]
    res2 = build(loaded.module, loaded.example_inputs, calibration_inputs=other, output=tmp_path / "o.ascpack",
                 cache_dir=cache, jobs=2, protocol=FAST, precision="int8", accuracy_budget=0.05)
    scales = lambda r: {ch.name: t.param("x_scale") for ch in r.tactics.values() for t in ch.candidates  # noqa: E731
                        if t.name == "onednn_int8"}
    assert scales(res) and all(scales(res2)[n] != s for n, s in scales(res).items())


def test_the_runtime_refuses_a_host_without_int8_dot_products(built):
    from ascendc_pack_runtime import host

    _, _, _, out, _ = built
    m = rt.read_manifest(out)
    with pytest.raises(rt.MissingCpuFeaturesError) as ei:
        host.check_host(m, cpu_flags=frozenset(host.host_cpu_flags() or ()) - set(m.precision.requires))
    assert m.precision.requires[0] in str(ei.value) and "--precision int8" in str(ei.value)


def test_cli_builds_int8(net, tmp_path):
    if int8_offered() is not None:
        pytest.skip(f"no int8 here: {int8_offered()}")
    _, model_file = net
    out = tmp_path / "cli.ascpack"
    r = CliRunner().invoke(main, ["build", str(model_file), "--precision", "int8", "--accuracy-budget", "0.05",
                                  "-o", str(out), "--cache-dir", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert "run in int8" in r.output and rt.read_manifest(out).precision.requested == "int8"


CHAIN = """
import torch
from torch import nn


def get_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).eval()


def get_example_inputs():
    return (torch.randn(64, 256, generator=torch.Generator().manual_seed(0)),)
"""


def test_an_int8_step_feeding_only_the_next_int8_step_returns_its_uint8_operand(tmp_path, monkeypatch):
    """GEMM -> ReLU -> GEMM, both in int8: the first returns the second's uint8 operand (oneDNN
    requantizes), so the only quantization kernel left is the first GEMM's input; the bundle still
    meets its budget against eager."""
    if int8_offered() is not None:
        pytest.skip(f"no int8 here: {int8_offered()}")
    from ascendc_pack.frontend.loader import load_model_file

    monkeypatch.setattr(P, "candidates", lambda tuner, decisions: [
        (1.0, name, (ch.low["int8"],)) for name, ch in tuner.choices.items() if "int8" in ch.low])
    (tmp_path / "chain.py").write_text(CHAIN)
    loaded = load_model_file(tmp_path / "chain.py")
    out = tmp_path / "chain.ascpack"
    res = build(loaded.module, loaded.example_inputs, output=out, cache_dir=tmp_path / "c", jobs=2, protocol=FAST,
                precision="int8", accuracy_budget=0.05)
    assert res.precision.steps and set(res.precision.steps.values()) == {"int8"}
    quantizing = [k.name for k in rt.read_manifest(out).kernels if "round" in k.name]
    assert len(quantizing) == 1, quantizing
    m = rt.load(out)
    x = torch.randn(64, 256)
    with torch.no_grad():
        assert 0 < relative_error(loaded.module(x), m(x)) <= 0.05
    m.close()


def test_the_search_charges_int8_the_passes_pgo_does_not_time():
    """The input's quantization always; an epilogue the quantized op cannot fuse (SiLU, a residual
    add) over the float32 result too; nothing for attention (no int8 candidate)."""
    from ascendc_pack.kernels.target import CpuTarget
    from ascendc_pack.tactics.predict import int8_passes_us

    target = CpuTarget.detect(2, "native")
    conv = T.ConvStep(x_shape=(1, 16, 112, 112), out_channels=96, kernel=(1, 1)).to_json()
    relu = {**conv, "epilogue": {"affine": True, "binary": None, "unary": "relu"}}
    silu = {**conv, "epilogue": {"affine": True, "binary": None, "unary": "silu"}}
    assert 0 < int8_passes_us("conv", conv, target) == int8_passes_us("conv", relu, target) \
        < int8_passes_us("conv", silu, target)
    lin = T.LinearStep(m=128, k=256, n=512).to_json()
    assert int8_passes_us("linear", lin, target) < int8_passes_us(
        "linear", {**lin, "epilogue": {"affine": False, "binary": "add", "unary": None}}, target)
    assert int8_passes_us("attention", {}, target) == 0.0
