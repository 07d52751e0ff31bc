"""Precision as a tactic dimension (``--precision``, ``--accuracy-budget``; docs/PRECISION.md):
options and their errors, the budget's metric, every bfloat16 candidate against eager within its
stated tolerance, the end-to-end search (including a budget too tight for any step), the manifest
record, ``inspect``, ``run --check`` by the recorded budget on held-out inputs, and the runtime's
ISA refusal of a host without native bfloat16."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import ascendc_pack_runtime as rt
import ascendc_pack.tactics.dispatch as T
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.cli.main import main
from ascendc_pack.config import DEFAULT_ACCURACY_BUDGET, BuildConfig
from ascendc_pack.errors import ConfigError
from ascendc_pack.pipeline import build
from ascendc_pack.tactics import precision as P
from ascendc_pack.tactics.dispatch.gemm import onednn_supports
from ascendc_pack.tactics.dispatch.int8 import int8_offered
from ascendc_pack.tactics.dispatch.lowp import (STEP_TOLERANCE, bf16_feature, bf16_offered, low_precision_tactics,
                                                precision_of)
from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.accuracy import check_budget, relative_error
from ascendc_pack_runtime.errors import ManifestFieldError

from .bundle_fixtures import build_root

FAST = Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0)
needs_bf16 = pytest.mark.skipif(bf16_offered() is not None, reason=f"no native bfloat16 here: {bf16_offered()}")
needs_onednn_bf16 = pytest.mark.skipif(not onednn_supports("bfloat16"), reason="no oneDNN bfloat16 in this torch")


# ---- options ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"precision": "fp16"}, "--precision must be one of fp32, bf16, int8, auto"),
    ({"precision": "bf16", "accuracy_budget": "1%"}, "--accuracy-budget must be a relative error between 0 and 1"),
    ({"precision": "bf16", "accuracy_budget": 0}, "between 0 and 1"),
    ({"precision": "bf16", "accuracy_budget": 1.5}, "between 0 and 1"),
    ({"precision": "bf16", "accuracy_budget": True}, "between 0 and 1"),
    ({"accuracy_budget": 0.05}, "pass --precision bf16, int8 or auto with it"),
    ({"precision": "fp32", "accuracy_budget": 0.05}, "with fp32 nothing is rounded"),
])
def test_bad_precision_options_name_the_problem_and_the_fix(kw, message):
    with pytest.raises(ConfigError, match=message):
        BuildConfig.resolve(**kw)


def test_precision_defaults():
    assert BuildConfig.resolve().precision is None and BuildConfig.resolve().accuracy_budget is None
    cfg = BuildConfig.resolve(precision="bf16")
    assert cfg.low_precision and cfg.accuracy_budget == DEFAULT_ACCURACY_BUDGET == 0.01
    assert BuildConfig.resolve(precision="auto", accuracy_budget="0.002").accuracy_budget == 0.002
    assert not BuildConfig.resolve(precision="fp32").low_precision


def test_cli_refuses_bad_values_before_loading_the_model(tmp_path):
    never = tmp_path / "never.py"
    never.write_text("raise SystemExit('the model file must not be loaded')\n")
    r = CliRunner().invoke(main, ["build", str(never), "--precision", "bf16", "--accuracy-budget", "two"])
    assert r.exit_code == 1 and "--accuracy-budget must be a relative error" in r.output and "loaded" not in r.output
    r = CliRunner().invoke(main, ["build", str(never), "--precision", "fp8"])
    assert r.exit_code == 2 and "'fp8' is not one of" in r.output


# ---- the metric -----------------------------------------------------------------------------------

def test_relative_error_and_the_budget_check():
    e = torch.tensor([3.0, 4.0])
    assert relative_error(e, e.clone()) == 0.0
    assert relative_error(e, torch.tensor([3.0, 4.5])) == pytest.approx(0.1)
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.zeros(2), torch.ones(2)) == float("inf")
    assert relative_error(e, torch.tensor([3.0, float("nan")])) == float("inf")
    assert relative_error(torch.tensor([float("-inf"), 1.0]), torch.tensor([float("-inf"), 1.0])) == 0.0
    assert relative_error(e, torch.ones(3)) == float("inf")
    ok, bad = check_budget(["a", "b"], [e, e], [torch.tensor([3.0, 4.01]), torch.tensor([3.0, 5.0])], 0.01)
    assert ok.ok and ok.describe() == "a: relative error 0.002 (budget 0.01)"
    assert not bad.ok and "exceeds the accuracy budget 0.01" in bad.problem
    (ints,) = check_budget(["i"], [torch.tensor([1, 2])], [torch.tensor([1, 3])], 0.5)
    assert not ints.ok  # integer outputs stay exact whatever the budget


# ---- every bfloat16 candidate against eager --------------------------------------------------------

STEPS = [
    T.LinearStep(m=64, k=128, n=96, epilogue=T.Epilogue(unary="gelu")),
    T.LinearStep(m=33, k=80, n=48, bias=False, weight_layout="kn", epilogue=T.Epilogue(binary="add", unary="relu")),
    T.LinearStep(m=16, k=64, n=64, epilogue=T.Epilogue(affine=True, unary="silu")),
    T.ConvStep(x_shape=(2, 16, 12, 12), out_channels=32, kernel=(3, 3), padding=(1, 1),
               epilogue=T.Epilogue(affine=True, binary="add", unary="relu")),
    T.ConvStep(x_shape=(2, 16, 12, 12), out_channels=16, kernel=(3, 3), padding=(1, 1), groups=16,
               layout="channels_last", epilogue=T.Epilogue(unary="hardswish")),
    T.ConvStep(x_shape=(1, 8, 9, 9), out_channels=24, kernel=(1, 1), stride=(2, 2), bias=False),
    T.AttentionStep(batch=2, heads=4, q_len=16, kv_len=16, head_dim=8, mask="bool", mask_shape=(2, 1, 1, 16)),
    T.AttentionStep(batch=2, heads=4, q_len=16, kv_len=16, head_dim=8, kv_heads=2, causal=True),
    T.AttentionStep(batch=2, heads=4, q_len=16, kv_len=20, head_dim=8, mask="float", mask_shape=(16, 20)),
]


@needs_onednn_bf16
@pytest.mark.parametrize("step", STEPS, ids=lambda s: f"{s.kind}-{getattr(s, 'epilogue', None) or s.mask}")
def test_every_bf16_candidate_matches_eager_within_its_step_tolerance(step):
    cands = low_precision_tactics(step, ("bf16",))
    assert cands and all(t.param("precision") == "bf16" and t.name.endswith("_bf16") for t in cands)
    for seed in (0, 1):
        env = T.random_env(step, seed)
        ref = T.reference(step, env)
        weights, acts = T.split(env)
        for t in cands:
            got = T.run(t, acts, T.prepare(t, weights))
            assert got.dtype == ref.dtype == torch.float32 and got.shape == ref.shape
            err = relative_error(ref, got)
            assert 0 < err <= STEP_TOLERANCE["bf16"], (t.name, err)   # rounded, but within the stated tolerance
    assert low_precision_tactics(step, ()) == []


def test_bf16_is_offered_only_with_native_bfloat16():
    assert bf16_feature({"avx2", "avx512f"}) is None and "no native bfloat16" in (bf16_offered({"avx2"}) or "")
    assert bf16_feature({"avx512_bf16", "amx_bf16"}) == "avx512_bf16" and bf16_feature({"bf16"}) == "bf16"


# ---- the search, on made-up errors ----------------------------------------------------------------

class _FakeTuner:
    """What :func:`P.choose` reads from a TacticTuner, with one linear step per name."""

    def __init__(self, gains):
        from ascendc_pack.tactics.tune import TacticChoice, TacticResult

        step = T.LinearStep(m=8, k=8, n=8)
        cands = [T.gemm.onednn_tactic(step), T.gemm.aten_tactic(step), *low_precision_tactics(step, ("bf16",))]
        self.instances, self.choices, self.reached = [], {}, set()
        self.offered, self.not_offered = ("bf16",), None
        for name, gain in gains.items():
            s = type("S", (), {"name": name, "tactic_kind": "linear"})()
            ch = TacticChoice(name, "linear", step.to_json(), cands, [TacticResult(i, t.key, t.name) for i, t in
                                                                      enumerate(cands)], captured=1)
            ch.results[0].median_us, ch.results[2].median_us = 100.0 + gain, 100.0
            ch.low = {"bf16": 2}
            ch.uses = [{"chosen_index": 0}]
            self.instances.append(s)
            self.choices[name] = ch
            self.reached.add(id(s))


def _search(monkeypatch, gains: dict, cost: dict, budget: float):
    """Run the search with an additive made-up error per switched step."""
    tuner = _FakeTuner(gains)
    calls = []

    def error(self, switch):
        calls.append(sorted(switch))
        return sum(cost[n] for n in switch)

    monkeypatch.setattr(P._Evaluator, "__init__", lambda self, tuner, sets: setattr(self, "runs", 0) or
                        setattr(self, "memo", {}))
    monkeypatch.setattr(P._Evaluator, "error", lambda self, switch: (setattr(self, "runs", self.runs + 1), error(
        self, switch))[1])
    decisions = {id(s): 0 for s in tuner.instances}
    report = P.choose(tuner, decisions, [()], "bf16", budget)
    switched = {s.name for s in tuner.instances if decisions[id(s)] == 2}
    return report, switched, calls


def test_search_takes_every_step_when_all_fit(monkeypatch):
    report, switched, calls = _search(monkeypatch, {"a": 50, "b": 30, "c": 10}, {"a": 1e-3, "b": 1e-3, "c": 1e-3}, 0.01)
    assert switched == {"a", "b", "c"} and len(calls) == 1 and report.error == pytest.approx(3e-3)
    assert report.computes == "bf16" and "3 of 3 tactic steps run in bf16" in report.describe()


def test_search_falls_back_step_by_step_in_order_of_gain(monkeypatch):
    # b costs too much; a (largest gain) and c fit: the prefix bisection keeps a, the step-by-step pass adds c
    report, switched, calls = _search(monkeypatch, {"a": 50, "b": 30, "c": 10}, {"a": 4e-3, "b": 8e-3, "c": 4e-3},
                                      0.01)
    assert switched == {"a", "c"} and report.error == pytest.approx(8e-3) and report.error <= 0.01
    assert calls[0] == ["a", "b", "c"] and ["a", "b"] in calls and ["a", "c"] in calls
    assert report.evaluations == len(calls) <= P.MAX_EVALUATIONS + 1


def test_a_budget_too_tight_for_any_step_keeps_float32_and_says_so(monkeypatch):
    report, switched, _ = _search(monkeypatch, {"a": 50, "b": 30}, {"a": 1e-3, "b": 1e-3}, 1e-4)
    assert switched == set() and report.computes == "fp32" and report.error == 0.0
    assert "too tight for any low-precision step" in report.describe() and "every step stays float32" in \
        report.describe()


def test_a_step_costing_more_error_than_it_saves_time_is_given_back(monkeypatch):
    """The trim: head (5 µs of 1035 gained, half the error) goes back to float32; mid halves the
    error too but costs 10 % more time (error x time ** TRIM_WEIGHT grows): it stays in bf16; body
    gains more than TRIM_SHARE of the total and is not tried."""
    report, switched, calls = _search(monkeypatch, {"body": 1000, "mid": 30, "head": 5},
                                      {"body": 1e-3, "mid": 1e-3, "head": 2e-3}, 0.01)
    assert switched == {"body", "mid"} and report.trimmed == ("head",) and report.error == pytest.approx(2e-3)
    assert calls == [["body", "head", "mid"], ["body", "mid"], ["body"]]
    assert "kept float32 where switching cost more error than it saved time: head" in report.describe()
    assert report.to_json()["trimmed"] == ["head"] and report.to_json()["steps"]["head"] == "fp32"


def test_steps_that_do_not_gain_are_not_switched(monkeypatch):
    report, switched, calls = _search(monkeypatch, {"a": -5}, {"a": 1e-3}, 0.01)
    assert switched == set() and calls == [] and "faster here" in report.note


# ---- the manifest record ---------------------------------------------------------------------------

def test_manifest_precision_record_round_trips_and_is_checked():
    rec = contract.Precision("bf16", 0.01, "relative_l2", 0.004, "bf16", ("avx512_bf16",), 2)
    assert contract.Precision.from_json(json.loads(json.dumps(rec.to_json()))) == rec and rec.low
    for key, value, match in (("budget", 2, "budget"), ("metric", "max_abs", "metric"), ("computes", "fp8", "computes"),
                              ("error", -1, "error")):
        with pytest.raises(ManifestFieldError, match=match):
            contract.Precision.from_json({**rec.to_json(), key: value})
    c = contract.TacticCandidate(0, "a" * 32, "onednn_bf16", None, False, False, "bf16")
    assert c.to_json()["precision"] == "bf16" and contract.TacticCandidate.from_json(c.to_json(), "c") == c
    assert "precision" not in contract.TacticCandidate(0, "a" * 32, "aten", None, False, False).to_json()


# ---- end to end -------------------------------------------------------------------------------------

NET = """
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    \"\"\"A convolution chain, GEMMs with epilogues and attention, large enough that the cost model
    predicts the bfloat16 candidate of most heavy steps faster (a 2-row GEMV stays float32).\"\"\"

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 256)
        self.attn = nn.MultiheadAttention(256, 4, batch_first=True)
        self.ff = nn.Linear(256, 512)
        self.out = nn.Linear(512, 10)

    def forward(self, x, t):
        y = F.relu(self.c1(x))
        y = F.max_pool2d(F.relu(self.c2(y) + y), 2)
        f = self.fc(y.flatten(1)).unsqueeze(1)
        h = t + f
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.out(F.gelu(self.ff(h))).mean(1)


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, 16, 16, generator=g), torch.randn(2, 64, 256, generator=g)


def get_model():
    torch.manual_seed(0)
    return Net().eval()


def get_example_inputs():
    return inputs(0)


def get_calibration_inputs():
    return [inputs(1)]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One bf16 build (topn 1: the cost model's picks, verified) and one with a too tight budget."""
    if bf16_offered() is not None:
        pytest.skip(f"no native bfloat16 here: {bf16_offered()}")
    from ascendc_pack.frontend.loader import load_model_file

    root = tmp_path_factory.mktemp("precision")
    model_file = root / "net.py"
    model_file.write_text(NET)
    loaded = load_model_file(model_file)
    cache = build_root(tmp_path_factory) / "build_cache"
    out, tight = root / "bf16.ascpack", root / "tight.ascpack"
    kw = dict(calibration_inputs=loaded.calibration_inputs, cache_dir=cache, jobs=2, protocol=FAST, precision="bf16")
    res = build(loaded.module, loaded.example_inputs, output=out, **kw)
    res_tight = build(loaded.module, loaded.example_inputs, output=tight, accuracy_budget=1e-7, **kw)
    return loaded, model_file, res, out, res_tight, tight


def test_bf16_build_stays_within_its_budget_and_records_it(built):
    _, _, res, out, _, _ = built
    p = res.precision
    assert p.computes == "bf16" and 0 < p.error <= p.budget == 0.01 and p.input_sets == 2
    kinds = {ch.kind for ch in res.tactics.values() for u in ch.uses
             if precision_of(ch.candidates[u["chosen_index"]]) == "bf16"}
    assert kinds >= {"linear", "conv"}   # each kind's bfloat16 candidate (oneDNN's or an AMX kernel) chosen
    assert all(c.ok for c in res.verification)   # the bundle against eager, by the budget
    text = res.summary()
    assert "precision: bf16 requested, accuracy budget 0.01" in text and f"error {p.error:.3g} <= budget 0.01" in text
    m = rt.read_manifest(out)
    assert m.precision.computes == "bf16" and m.precision.error == pytest.approx(p.error)
    assert m.precision.requires and set(m.precision.requires) <= set(m.target.isa)
    assert any(c.precision == "bf16" for t in m.tactics for c in t.candidates)
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "(bf16)" in r.output and "precision bf16 requested; computes bf16" in r.output


def test_a_budget_too_tight_yields_the_float32_bundle_and_says_so(built):
    _, _, _, _, res, out = built
    assert res.precision.computes == "fp32" and "too tight for any low-precision step" in res.summary()
    m = rt.read_manifest(out)
    assert m.precision.computes == "fp32" and not m.precision.requires
    assert all(c.precision == "fp32" or c.index != t.chosen_index for t in m.tactics for c in t.candidates)


def test_run_check_uses_the_recorded_budget_on_held_out_inputs_in_a_fresh_process(built, tmp_path):
    loaded, model_file, res, out, _, _ = built
    for seed in (3, 4):  # random inputs no build saw, in a new process
        run = subprocess.run([sys.executable, "-m", "ascendc_pack", "run", str(out), "--check", str(model_file),
                              "--repeat", "1", "--seed", str(seed)], capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "by the accuracy budget 0.01" in run.stdout and "check: OK" in run.stdout
    ns: dict = {}
    exec(compile(NET, "net.py", "exec"), ns)
    held_out = ns["inputs"](5)
    with torch.no_grad():
        want = loaded.module(*held_out)
    m = rt.load(out)
    assert 0 < relative_error(want, m(*held_out)) <= res.precision.budget
    m.close()


def test_the_runtime_refuses_a_host_without_native_bfloat16(built, tmp_path, monkeypatch):
    from ascendc_pack_runtime import host

    _, _, _, out, _, _ = built
    m = rt.read_manifest(out)
    flags = frozenset(host.host_cpu_flags() or ()) - set(m.precision.requires)
    with pytest.raises(rt.MissingCpuFeaturesError) as ei:
        host.check_host(m, cpu_flags=flags)
    msg = str(ei.value)
    assert m.precision.requires[0] in msg and "--precision bf16" in msg and ei.value.field == "target.isa"
    with pytest.raises(ManifestFieldError, match="precision.requires"):
        contract.Manifest.from_json({**m.to_json(), "target": {**m.target.to_json(), "isa": ["sse2"]}})


def test_every_kind_of_bf16_step_lowers_with_its_conversions_fused(tmp_path_factory, monkeypatch):
    """Every step switched to its oneDNN / flash bfloat16 candidate (GEMM, convolution chain,
    attention; the AMX kernels, which take float32 and need no conversions, are not offered here):
    the lowered steps keep only the heavy op, their conversions and the float32 rest of the
    epilogue become ATen steps the fuser fuses (no aten::_to_copy left as a call), and the bundle
    matches eager within the budget."""
    if bf16_offered() is not None:
        pytest.skip(f"no native bfloat16 here: {bf16_offered()}")
    from ascendc_pack.frontend.loader import load_model_file
    from ascendc_pack.tactics.families.gemm import OnAmx

    monkeypatch.setattr(OnAmx, "offered", lambda self: "not offered in this test")

    def every_step(tuner, decisions):
        return [(1.0, name, (ch.low["bf16"],)) for name, ch in tuner.choices.items() if "bf16" in ch.low]

    monkeypatch.setattr(P, "candidates", every_step)
    root = tmp_path_factory.mktemp("every_bf16")
    (root / "net.py").write_text(NET)
    loaded = load_model_file(root / "net.py")
    out = root / "all.ascpack"
    res = build(loaded.module, loaded.example_inputs, calibration_inputs=loaded.calibration_inputs, output=out,
                cache_dir=build_root(tmp_path_factory) / "build_cache", jobs=2, protocol=FAST, precision="bf16",
                accuracy_budget=0.2)
    chosen = {ch.kind: ch.candidates[u["chosen_index"]].name for ch in res.tactics.values() for u in ch.uses
              if ch.candidates[u["chosen_index"]].name.endswith("_bf16")}
    assert set(chosen) == {"linear", "conv", "attention"}, chosen
    assert all(c.ok for c in res.verification) and res.precision.error <= 0.2
    m = rt.read_manifest(out)
    assert "aten._to_copy.default" not in (m.graph.aten_ops or {})   # fused into the kernels around


def test_a_widen_move_narrow_round_trip_is_cancelled_bit_exactly():
    """bfloat16 -> float32 -> views and a copy -> bfloat16 is the views and the copy on the
    bfloat16 value (exact); a chain something else reads in float32 stays for that reader."""
    from ascendc_pack.frontend.executor import run_program
    from ascendc_pack.ir.program import AtenStep, Program, Ref, TensorSpec
    from ascendc_pack.tactics.lower_casts import cancel_round_trips

    def spec(shape, dtype, stride=None):
        return TensorSpec(tuple(shape), dtype, stride)

    steps = [AtenStep("aten._to_copy.default", [Ref("u")], {"dtype": torch.float32}, ["w"]),
             AtenStep("aten.view.default", [Ref("w"), [4, 2, 6]], {}, ["v"]),
             AtenStep("aten.permute.default", [Ref("v"), [1, 0, 2]], {}, ["p"]),
             AtenStep("aten.clone.default", [Ref("p")], {"memory_format": torch.contiguous_format}, ["c"]),
             AtenStep("aten._to_copy.default", [Ref("c")], {"dtype": torch.bfloat16}, ["out"]),
             AtenStep("aten.mul.Tensor", [Ref("v"), 2.0], {}, ["other"])]   # a float32 reader of v
    values = {"u": spec((4, 12), "bfloat16", (12, 1)), "w": spec((4, 12), "float32", (12, 1)),
              "v": spec((4, 2, 6), "float32", (12, 6, 1)), "p": spec((2, 4, 6), "float32", (6, 12, 1)),
              "c": spec((2, 4, 6), "float32", (24, 6, 1)), "out": spec((2, 4, 6), "bfloat16", (24, 6, 1)),
              "other": spec((4, 2, 6), "float32", (12, 6, 1))}
    p = Program(["u"], steps, ["out", "other"], values)
    q = cancel_round_trips(p)
    ops = [s.op for s in q.steps]
    assert ops.count("aten._to_copy.default") == 1 and "aten.alias.default" in ops   # the float32 one, for `other`
    u = torch.randn(4, 12).to(torch.bfloat16)
    want, got = run_program(p, [u]), run_program(q, [u])
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(want, got))


class GeluMlp(torch.nn.Module):
    """A GEMM with a GELU epilogue (its own fused kernel when a library computes the GEMM) and one
    with only its bias (no epilogue pass)."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@needs_bf16
@needs_onednn_bf16
def test_a_bf16_library_candidate_is_timed_with_its_epilogue_pass(tmp_path, monkeypatch):
    """PGO times oneDNN's bfloat16 GEMM by its core, then the epilogue's fused kernel (where the
    step has a pointwise epilogue) or the conversion of its output back to float32 (a bias-only
    step), which the lowered step runs as a pass of its own; a generated kernel fuses it, and an
    int8 candidate is timed by its core alone."""
    import ascendc_pack.tactics.epilogue_timing as timing
    from ascendc_pack.kernels.fused.build import FusedKernel

    wrapped, in_tail, tail_launches = [], [], []
    then, launch = timing.then, FusedKernel.__call__

    def tail(second):
        in_tail.append(1)
        try:
            second()
        finally:
            in_tail.pop()

    def recording_then(first, second):
        wrapped.append(first)
        return then(first, lambda: tail(second))

    def counting_launch(self, *args, **kwargs):
        if in_tail:
            tail_launches.append(self)
        return launch(self, *args, **kwargs)

    cast_shapes, cast_back = [], timing.cast_back

    def recording_cast_back(out):
        cast_shapes.append(tuple(out.shape))
        return cast_back(out)

    monkeypatch.setattr(timing, "then", recording_then)
    monkeypatch.setattr(timing, "cast_back", recording_cast_back)
    monkeypatch.setattr(FusedKernel, "__call__", counting_launch)
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    res = build(GeluMlp().eval(), (x,), topn=2, output=tmp_path / "m.ascpack", cache_dir=tmp_path / "cache", jobs=2,
                protocol=FAST, precision="bf16")
    names = {ch.name.split("_")[1]: [t.name for t in ch.candidates] for ch in res.tactics.values()}
    assert "onednn_bf16" in names["m64k256n512"] and "onednn_bf16" in names["m64k512n256"]
    assert len(wrapped) == 2 and tail_launches  # up's oneDNN candidate timed with the GELU's fused kernel,
    assert cast_shapes == [(64, 256)]  # down's (bias only) with its output's conversion back
    assert all(c.ok for c in res.verification)
    if int8_offered() is None:  # an int8 step quantizes its input in a pass the producer's epilogue joins
        wrapped.clear()
        res = build(GeluMlp().eval(), (x,), topn=2, output=tmp_path / "i8.ascpack", cache_dir=tmp_path / "cache",
                    jobs=2, protocol=FAST, precision="int8", accuracy_budget=0.05)
        assert any(t.name == "onednn_int8" for ch in res.tactics.values() for t in ch.candidates) and not wrapped
