"""Tactics through the whole pipeline (ascendc_pack/tactics/tune.py, tactics/lower.py, the graph,
the bundle, the manifest): every tactic kind builds and matches eager in a fresh process, every
candidate renders in graph.cpp, a wrong candidate is disqualified, a warm rebuild profiles
nothing, an unvisited cond branch keeps candidate 0, identical steps share one measurement."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ascendc_pack_runtime as rt
import ascendc_pack.tactics.dispatch as T
import ascendc_pack.tactics.tune as tactic_tune
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.frontend.capture import capture
from ascendc_pack.config import BuildConfig
from ascendc_pack.passes.fold import fold_constants
from ascendc_pack.pipeline import build, prepare
from ascendc_pack.tactics.families.gemm import CONV_TILINGS
from ascendc_pack.tactics.rewrite import find_tactics, in_layout_chain
from ascendc_pack.tactics.report import manifest_tactics
from ascendc_pack.tactics.tune import TacticTuner
from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.errors import ManifestFieldError

from ascendc_pack_runtime.tools import inspect_text

from .bundle_fixtures import build_root, read_bundle

FAST = Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0)


class AllKinds(nn.Module):
    """A convolution chain (BatchNorm, residual, pooling, a grouped conv, a flatten of a
    spatial output), linears with epilogues, and multi-head attention."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.c3 = nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(4 * 4 * 4, 16)
        self.ln = nn.LayerNorm(16)  # the attention's input is then a fused kernel's output (a planned buffer)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ff = nn.Linear(16, 32)
        self.out = nn.Linear(32, 16)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x, t):
        y = F.relu(self.bn(self.c1(x.sigmoid())))  # the chain's input is a fused kernel's output
        y = F.max_pool2d(y, 2)
        y = F.hardswish(self.c2(y) + y)
        f = self.fc(self.c3(y).flatten(1))
        n = self.ln(t)
        a = self.attn(n, n, n, need_weights=False)[0]
        h = F.gelu(self.ff(a + f.unsqueeze(1)))
        return self.out(h) + t, f


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 8, 8, generator=g), torch.randn(2, 5, 16, generator=g)


def _model():
    torch.manual_seed(0)
    return AllKinds().eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return build_root(tmp_path_factory) / "build_cache"


def _build(tmp_path, cache, model=None, inputs=None, **kw):
    model, inputs = model or _model(), inputs or _inputs()
    out = tmp_path / "m.ascpack"
    kw.setdefault("topn", 4)
    res = build(model, inputs, output=out, cache_dir=cache, jobs=2, protocol=FAST, **kw)
    return res, out


def _member(path, name: str) -> bytes:
    return next(data for info, data in read_bundle(path) if info.name == name)


def _fresh_process_matches(path, model, inputs, tmp_path, env=None):
    """Load the bundle in a new Python process (``env``: more environment) and compare with eager there."""
    with torch.no_grad():
        expected = model(*inputs)
    data = tmp_path / "io.pt"
    torch.save((inputs, expected), data)
    script = textwrap.dedent("""
        import sys, torch, ascendc_pack_runtime as rt
        inputs, expected = torch.load(sys.argv[2])
        m = rt.load(sys.argv[1])
        got = m(*inputs)
        got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
        for g, e in zip(got, expected):
            assert g.shape == e.shape, (g.shape, e.shape)
            assert torch.allclose(g, e, atol=1e-4, rtol=1e-4), (g - e).abs().max()
        m.close()
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script, str(path), str(data)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_every_kind_builds_tunes_and_matches_eager_in_a_fresh_process(tmp_path, cache):
    res, out = _build(tmp_path, cache)
    kinds = {ch.kind for ch in res.tactics.values()}
    assert kinds == {"linear", "conv", "attention", "pool"}
    for ch in res.tactics.values():  # every candidate verified on the real arguments, then timed
        assert ch.visited and ch.profiled
        for r in ch.results:
            assert r.error is None and r.median_us is not None and r.values, (ch.name, r)
    _fresh_process_matches(out, _model(), _inputs(), tmp_path)
    m = rt.read_manifest(out)
    assert {t.name for t in m.tactics} == set(res.tactics)
    assert m.graph.aten_ops and all(n > 0 for n in m.graph.aten_ops.values())
    tuning = json.loads(_member(out, "tuning.json"))
    assert {t["name"] for t in tuning["tactics"]} == set(res.tactics)
    text = inspect_text(m)
    assert "tactics  " in text and "aten ops " in text


PREFERENCES = [("onednn", "onednn_cl", "flash"), ("mkl", "aten_cl", "unfused"),
               ("onednn_cl", "attention#0", "maxpool#0")]


@pytest.mark.parametrize("prefer", PREFERENCES, ids=["-".join(p) for p in PREFERENCES])
def test_every_candidate_renders_in_the_graph(tmp_path, cache, monkeypatch, prefer):
    """Force the choice of each candidate kind; the build's own check (bundle vs eager) must pass."""
    real = TacticTuner.decisions

    def forced(self):
        real(self)
        out = {}
        for s in self.instances:
            names = [t.name for t in self.choices[s.name].candidates]
            out[id(s)] = next((names.index(n) for n in prefer if n in names), 0)
        for ch in self.choices.values():
            for u, s in zip(ch.uses, [s for s in self.instances if s.name == ch.name]):
                u["chosen_index"] = out[id(s)]
        return out

    monkeypatch.setattr(TacticTuner, "decisions", forced)
    res, out = _build(tmp_path, cache)  # verify=True: a wrong graph raises VerificationError
    chosen = {ch.candidates[u["chosen_index"]].name for ch in res.tactics.values() for u in ch.uses}
    assert set(prefer) <= chosen | {"unfused"}
    source = _member(out, "graph.cpp").decode()
    if "onednn" in prefer:
        assert "(at load)" in source and "mkldnn::_reorder" in source  # packed once, at load
    if "attention#0" in prefer:  # the generated attention kernel: launched from graph.cpp, a bundle member
        m = rt.read_manifest(out)
        attn = [k for k in m.kernels if k.name.startswith("attention_")]
        assert attn and all(k.file in m.libraries() for k in attn) and "= attention_" in source
        pool = [k for k in m.kernels if k.name.startswith("maxpool_")]   # the generated max pooling, too
        assert pool and all(k.file in m.libraries() for k in pool) and "= maxpool_" in source
        _fresh_process_matches(out, _model(), _inputs(), tmp_path)


class PaddedAttention(nn.Module):
    """sdpa with a key padding mask that is a model input (bool [B, 1, 1, S])."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, keep):
        b, l, _ = x.shape
        q, k, v = self.qkv(x).view(b, l, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_a_key_padding_mask_runs_in_the_generated_attention_kernel(tmp_path, cache, monkeypatch):
    """The mask broadcasts over heads and queries; the second sequence has every key masked (0, as
    eager's safe softmax gives). The kernel is chosen for the attention step, the mask made from a
    new bool input on every call, and the bundle matches eager in a fresh process on new masks."""
    real = TacticTuner.decisions

    def forced(self):
        out = real(self)
        for s in self.instances:
            names = [t.name for t in self.choices[s.name].candidates]
            if s.tactic_kind == "attention":
                out[id(s)] = names.index("attention#0")
        return out

    monkeypatch.setattr(TacticTuner, "decisions", forced)
    torch.manual_seed(0)
    model = PaddedAttention().eval()
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(2, 1, 1, 6, generator=g) > 0.3
    keep[1] = False
    inputs = (torch.randn(2, 6, 16, generator=g), keep)
    res, out = _build(tmp_path, cache, model=model, inputs=inputs)
    (attn,) = [ch for ch in res.tactics.values() if ch.kind == "attention"]
    assert attn.desc["mask_shape"] == [2, 1, 1, 6] and all(r.error is None for r in attn.results)
    assert any(k.name.startswith("attention_") for k in rt.read_manifest(out).kernels)  # the kernel runs
    with torch.no_grad():
        assert model(*inputs)[1].abs().max() == 0
    _fresh_process_matches(out, model, inputs, tmp_path)
    other = torch.rand(2, 1, 1, 6, generator=g) > 0.5
    other[0, ..., 0] = True
    _fresh_process_matches(out, model, (torch.randn(2, 6, 16, generator=g), other), tmp_path)


@pytest.mark.parametrize("packed", [True, False], ids=["B-packed-at-load", "B-as-held"])
def test_generated_gemm_candidates_run_in_the_graph(tmp_path, cache, monkeypatch, packed):
    """A GEMM kernel chosen for every GEMM step: launched from graph.cpp, B packed at load by the
    library's ap_gemm_pack_b (or read as held), the library a listed, re-hashed bundle member."""
    real = TacticTuner.decisions

    def forced(self):
        out = real(self)
        for s in self.instances:
            cands = self.choices[s.name].candidates
            pick = [i for i, t in enumerate(cands) if getattr(t, "family", None) == "gemm" and t.extra["b_packed"] == packed]
            if pick and id(s) in self.reached:
                out[id(s)] = pick[0]
            elif cands[out[id(s)]].family == "gemm":  # a 1x1 convolution's only tiling:
                # another candidate of its chain's layout (a chain never mixes layouts)
                out[id(s)] = next(i for i, t in enumerate(cands) if in_layout_chain(t) and t.family != "gemm")
        return out

    monkeypatch.setattr(TacticTuner, "decisions", forced)
    if not packed:  # a weight's B is proposed packed at load only: offer the per-call packing instead
        from ascendc_pack.kernels.gemm import generator as G

        per_call = lambda spec, target, topn: G.propose(dataclasses.replace(spec, b_constant=False), target, topn)  # noqa: E731
        monkeypatch.setattr(G, "GENERATOR", dataclasses.replace(G.GENERATOR, propose=per_call))
        cache = tmp_path / "cache"  # proposals are cached with the kernels
    res, out = _build(tmp_path, cache)
    m = rt.read_manifest(out)
    gemms = [k for k in m.kernels if k.name.startswith("gemm_")]
    assert gemms and all(k.file in m.libraries() for k in gemms)
    # a linear's GEMM has --topn tilings, a 1x1 convolution's CONV_TILINGS
    assert all(len(k.candidates) >= (CONV_TILINGS if "_conv_" in k.name else 2) and
               k.candidates[k.chosen_index].kernel_key == k.kernel_key for k in gemms)
    source = _member(out, "graph.cpp").decode()
    assert ("AP_PACK_B" in source) == packed
    # graph.so runs their tasks on its task pool (kernel_pool.h); ASCENDC_PACK_TASK_POOL=0: OpenMP
    assert all(b"ap_kernel_launch_pool" in _member(out, k.file) for k in gemms)
    _fresh_process_matches(out, _model(), _inputs(), tmp_path)
    _fresh_process_matches(out, _model(), _inputs(), tmp_path, env={"ASCENDC_PACK_TASK_POOL": "0"})


def _tuned_with_a_wrong_candidate(tmp_path, monkeypatch, topn: int, first: bool) -> TacticTuner:
    """A linear + relu model tuned with one more candidate that computes sigmoid instead of relu
    (``first``: as candidate 0, else last), after one run."""
    real = tactic_tune.candidates_for

    def with_a_wrong_one(step, topn, target=None, precisions=(), x_range=None):
        cands = real(step, topn, target, precisions, x_range)
        if step.tactic_kind == "linear":
            desc = T.step_from_json(step.desc)
            wrong = T.gemm.onednn_tactic(dataclasses.replace(desc, epilogue=T.Epilogue(unary="sigmoid")))
            cands.insert(0 if first else len(cands), dataclasses.replace(wrong, name="wrong"))
        return cands

    monkeypatch.setattr(tactic_tune, "candidates_for", with_a_wrong_one)
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    x = torch.randn(8, 16)
    found = _found(m, x)
    tuner = TacticTuner(found.model, found.weights, BuildConfig(topn=topn, cache_dir=tmp_path), FAST,
                        compile_epilogue=False, gemm=False)
    tuner(x)
    return tuner


def test_a_wrong_candidate_is_disqualified_and_never_chosen(tmp_path, monkeypatch):
    tuner = _tuned_with_a_wrong_candidate(tmp_path, monkeypatch, topn=4, first=False)
    (ch,) = tuner.choices.values()
    bad = ch.results[-1]
    assert bad.name == "wrong" and bad.disqualified["reason"] == "wrong result" and bad.median_us is None
    assert ch.best != len(ch.results) - 1 and tuner.disqualified == 1
    assert all(r.median_us is not None for r in ch.results[:-1])
    tuner.decisions()
    (entry,) = manifest_tactics(tuner.choices)
    assert entry.candidates[-1].disqualified and entry.candidates[-1].failed
    record = json.loads(next((tmp_path / "ascendc" / "tactics").rglob("tuning.json")).read_text())
    assert record["candidates"][-1]["disqualified"]["reason"] == "wrong result"


def _found(model, *inputs):
    cap = capture(model.eval(), inputs)
    folded = fold_constants(cap.model, cap.weights)
    return find_tactics(folded.model, folded.weights)


def test_warm_rebuild_profiles_nothing_and_reuses_the_choice(tmp_path, monkeypatch):
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).eval()
    x = torch.randn(16, 32)
    found = _found(m, x)
    config = BuildConfig(topn=3, cache_dir=tmp_path)
    cold = TacticTuner(found.model, found.weights, config, FAST, compile_epilogue=False, gemm=False)
    assert cold.pending() == 2
    cold(x)
    assert cold.profiled == 2
    first = cold.decisions()
    warm = TacticTuner(found.model, found.weights, config, FAST, compile_epilogue=False, gemm=False)
    assert warm.pending() == 0
    warm(x)
    assert warm.profiled == 0
    assert list(warm.decisions().values()) == list(first.values())
    for name, ch in warm.choices.items():
        assert ch.from_cache and ch.best == cold.choices[name].best
        assert [r.median_us for r in ch.results] == [r.median_us for r in cold.choices[name].results]
        d = next((tmp_path / "ascendc" / "tactics" / name).iterdir())
        assert (d / "optimize_tactic").read_text().strip() == ch.candidates[ch.best].key
    monkeypatch.setattr(tactic_tune, "host_fingerprint", lambda: {"cpu": "another host"})
    other = TacticTuner(found.model, found.weights, config, FAST, compile_epilogue=False, gemm=False)
    assert other.pending() == 2  # timings of another host are not reused


def test_an_edited_kernel_generator_is_timed_again(tmp_path, monkeypatch):
    """The PGO record of a step with generated candidates is keyed by their libraries, whose cache
    paths carry the generator's version: an edited template does not inherit the old timings."""
    from ascendc_pack.kernels import family

    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU()).eval()
    x = torch.randn(16, 32)
    found = _found(m, x)
    config = BuildConfig(topn=2, cache_dir=tmp_path, jobs=2)

    def tuned():
        tuner = TacticTuner(found.model, found.weights, config, FAST, compile_epilogue=False)
        pending = tuner.pending()
        tuner(x)
        tuner.close()
        return tuner, pending

    cold, pending = tuned()
    assert pending == 1 and any(t.family != "dispatch" for ch in cold.choices.values() for t in ch.candidates)
    assert tuned()[1] == 0                                    # same kernels: the record is reused
    real = family.generator_version
    monkeypatch.setattr(family, "generator_version", lambda *a: real(*a) + "-edited")
    assert tuned()[1] == 1                                    # an edited generator: timed again


def test_warm_pipeline_keeps_the_choices(tmp_path):
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).eval()
    x = (torch.randn(16, 32),)
    config = BuildConfig(topn=3, cache_dir=tmp_path, jobs=2)
    cold = prepare(m, x, config=config, input_sets=[x], protocol=FAST)
    warm = prepare(m, x, config=config, input_sets=[x], protocol=FAST)
    assert cold.tactics_profiled == 2 and warm.tactics_profiled == 0
    picks = [[u["chosen_index"] for u in ch.uses] for ch in cold.tactics.values()]
    assert [[u["chosen_index"] for u in ch.uses] for ch in warm.tactics.values()] == picks
    assert warm.captured.model.dumps() == cold.captured.model.dumps()


def test_unvisited_cond_branch_keeps_candidate_0_verified_on_synthetic_arguments(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda y: F.relu(self.a(y)), lambda y: torch.sigmoid(self.b(y)), (x,))

    x = torch.randn(4, 16).abs()
    found = _found(M(), x)
    tuner = TacticTuner(found.model, found.weights, BuildConfig(topn=3, cache_dir=tmp_path), FAST,
                        compile_epilogue=False, gemm=False)
    tuner(x)  # only the then branch runs
    decisions = tuner.decisions()
    by_unary = {s.desc["epilogue"]["unary"]: s for s in tuner.instances}
    then_ch, else_ch = tuner.choices[by_unary["relu"].name], tuner.choices[by_unary["sigmoid"].name]
    assert then_ch.visited and then_ch.profiled and decisions[id(by_unary["relu"])] == then_ch.best
    assert not else_ch.visited and not else_ch.profiled and decisions[id(by_unary["sigmoid"])] == 0
    assert else_ch.uses[0]["visited"] is False and all(r.median_us is None for r in else_ch.results)
    # candidate 0 is the cost model's pick: no run reached it, so it was verified on synthetic arguments
    assert else_ch.synthetic and else_ch.verified(0) and else_ch.to_json()["verified_on"] == "synthetic"


def test_cond_branch_with_a_lowered_tactic_builds(tmp_path, cache, monkeypatch):
    """A lowered step inside a branch reads weights made at build (threaded in as operands)."""
    monkeypatch.setattr(TacticTuner, "decisions", lambda self: {
        id(s): len(self.choices[s.name].candidates) - 1 if id(s) in self.reached else 0 for s in self.instances})

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 16)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x, img):
            y = torch.cond(x.sum() > 0, lambda y: F.relu(self.a(y)), lambda y: self.a(y) * 2, (x,))
            return y, F.relu(self.bn(img))

    model, inputs = M().eval(), (torch.randn(4, 16).abs(), torch.randn(1, 4, 3, 3))
    res, out = _build(tmp_path, cache, model, inputs, topn=3)
    x2 = (-inputs[0], inputs[1])
    got, want = rt.load(out)(*x2), model(*x2)
    assert torch.allclose(got[0], want[0], atol=1e-5)


def test_identical_steps_share_one_measurement(tmp_path):
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU()).eval()
    x = torch.randn(4, 16)
    found = _found(m, x)
    tuner = TacticTuner(found.model, found.weights, BuildConfig(topn=3, cache_dir=tmp_path), FAST,
                        compile_epilogue=False, gemm=False)
    assert len(tuner.instances) == 2 and len(tuner.choices) == 1 and tuner.pending() == 1
    tuner(x)
    tuner.decisions()
    (ch,) = tuner.choices.values()
    assert tuner.profiled == 1 and len(ch.uses) == 2
    assert len({u["chosen_index"] for u in ch.uses}) == 1


def test_topn_1_takes_each_steps_predicted_candidate_verified_not_timed(tmp_path):
    """The fast default build: candidate 0 is the cost model's pick; --topn 1 verifies it on the
    real arguments (no timing, no tuning record) and the bundle runs it."""
    prep = prepare(_model(), _inputs(), config=BuildConfig(topn=1, cache_dir=tmp_path, jobs=2),
                   input_sets=[_inputs()], protocol=FAST)
    assert prep.tactics_profiled == 0
    assert not (tmp_path / "ascendc" / "tactics").exists()   # nothing timed, nothing recorded
    for ch in prep.tactics.values():
        assert not ch.profiled and all(r.median_us is None for r in ch.results)
        assert ch.predicted_us[0] == min(p for p in ch.predicted_us if p is not None)  # candidate 0: predicted best
        assert [t.name for t in ch.candidates].count("aten") + [t.name for t in ch.candidates].count("unfused") == 1
        if ch.captured != 0:   # the pick (verified), the generated kernels' first tilings, the fallback
            assert ch.checked and ch.verified(0)
    assert all(u["chosen_index"] == 0 for ch in prep.tactics.values() if ch.kind != "conv" for u in ch.uses)
    picks = {ch.candidates[u["chosen_index"]].name.split("#")[0] for ch in prep.tactics.values() for u in ch.uses}
    assert picks & {"onednn", "onednn_cl", "flash", "mkl", "gemm", "attention", "dwconv", "directconv"}
    assert prep.captured.model.program.tactic_steps()   # lowered, not the ATen steps as captured


def test_topn_1_falls_back_when_candidate_0_fails_verification(tmp_path, monkeypatch):
    tuner = _tuned_with_a_wrong_candidate(tmp_path, monkeypatch, topn=1, first=True)
    (ch,) = tuner.choices.values()
    assert ch.candidates[0].name == "wrong" and ch.results[0].disqualified["reason"] == "wrong result"
    assert ch.checked and ch.best == 1 and tuner.profiled == 0
    (step,) = tuner.instances
    assert tuner.decisions()[id(step)] == 1   # the next candidate that passed, never the wrong one


def test_manifest_tactic_entries_round_trip_and_are_checked():
    cands = (contract.TacticCandidate(0, "a" * 32, "aten", 10.0, False, False),
             contract.TacticCandidate(1, "b" * 32, "onednn", 5.0, False, False))
    t = contract.TacticStep("linear_x", "linear", 1, "b" * 32, True, cands,
                            ({"inputs": ["x"], "outputs": ["y"], "chosen_index": 1, "chain": 0},))
    assert contract.TacticStep.from_json(json.loads(json.dumps(t.to_json())), "tactics[0]") == t
    bad = t.to_json()
    bad["chosen_key"] = "a" * 32
    with pytest.raises(ManifestFieldError, match="chosen_index"):
        contract.TacticStep.from_json(bad, "tactics[0]")
    bad = t.to_json()
    bad["uses"][0]["chosen_index"] = 5
    with pytest.raises(ManifestFieldError, match=r"uses\[0\]\.chosen_index"):
        contract.TacticStep.from_json(bad, "tactics[0]")


def test_gated_mlp_multiplies_in_the_gemm_epilogue(tmp_path, cache, monkeypatch):
    """Llama's ``down(silu(gate(x)) * up(x))``: the up projection's GEMM multiplies by the gate in
    its epilogue (``mul``); every GEMM candidate is verified, and the bundle forced to them matches."""

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up, self.down = nn.Linear(16, 40), nn.Linear(16, 40, bias=False), nn.Linear(40, 16)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    monkeypatch.setattr(TacticTuner, "decisions", lambda self: {
        id(s): next((i for i, t in enumerate(self.choices[s.name].candidates) if t.family == "gemm"), 0)
        for s in self.instances})
    torch.manual_seed(0)
    model, x = Gated().eval(), torch.randn(2, 6, 16)
    res, out = _build(tmp_path, cache, model, (x,))
    (up,) = [ch for ch in res.tactics.values() if ch.desc["epilogue"]["binary"] == "mul"]
    gemms = [(t, r) for t, r in zip(up.candidates, up.results) if t.family == "gemm"]
    assert gemms and all(t.spec.epilogue == ("mul",) and r.error is None for t, r in gemms)
    assert all(ch.candidates[u["chosen_index"]].family == "gemm" for ch in res.tactics.values() for u in ch.uses)
    _fresh_process_matches(out, model, (x,), tmp_path)


def test_a_where_masked_causal_attention_builds_and_matches_eager(tmp_path, cache):
    """A Llama-style ``torch.where(mask, scores, -inf)`` with a constant causal mask is one causal
    attention step (issue 42: its two bmm stayed ATen); the bundle matches eager in a new process."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.register_buffer("mask", torch.ones(12, 12, dtype=torch.bool).tril())

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 12, 3, 4, 8).permute(2, 0, 3, 1, 4)
            s = torch.where(self.mask, q @ k.transpose(-2, -1) / 8 ** 0.5, float("-inf"))
            return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, 12, 32)

    torch.manual_seed(0)
    model, inputs = Block().eval(), (torch.randn(2, 12, 32),)
    res, out = _build(tmp_path, cache, model, inputs, topn=2)
    (attn,) = [ch for ch in res.tactics.values() if ch.kind == "attention"]
    assert attn.desc["causal"] and attn.desc["mask"] is None and attn.visited
    _fresh_process_matches(out, model, inputs, tmp_path)


def test_a_linear_steps_pool_kernel_wins_within_the_margin_of_a_library_pick():
    """PGO times a step alone; in the graph an OpenMP library step between task-pool kernels costs
    more (swin_t): a generated GEMM within POOL_MARGIN (at most POOL_MARGIN_US) of the fastest
    library candidate is chosen, one beyond it is not, and other kinds keep the fastest."""
    from types import SimpleNamespace

    from ascendc_pack.tactics.decide import POOL_MARGIN, POOL_MARGIN_US, TacticChoice, TacticResult, pick_by_precision

    def choice(kind, gemm_us):
        cands = [SimpleNamespace(name="aten", family="dispatch"), SimpleNamespace(name="onednn", family="dispatch"),
                 SimpleNamespace(name="gemm#0", family="gemm"), SimpleNamespace(name="gemm#1", family="gemm")]
        results = [TacticResult(i, f"k{i}", c.name, us) for i, (c, us) in
                   enumerate(zip(cands, (2000.0, 1000.0, gemm_us, gemm_us + 1)))]
        ch = TacticChoice("s", kind, {}, cands, results, best=1)
        pick_by_precision(ch)
        return ch.candidates[ch.best].name

    assert choice("linear", 1000.0 + POOL_MARGIN_US - 1) == "gemm#0"  # 8 % of 1 ms is over the cap
    assert choice("linear", 1000.0 + POOL_MARGIN_US + 5) == "onednn"
    assert choice("conv", 1010.0) == "onednn"

    def low_choice(amx_us):   # the same within a low precision: ch.low's pick
        bf16 = lambda name, family: SimpleNamespace(name=name, family=family,  # noqa: E731
                                                    param=lambda key, default=None: "bf16" if key == "precision"
                                                    else default)
        cands = [SimpleNamespace(name="aten", family="dispatch"), bf16("onednn_bf16", "dispatch"),
                 bf16("gemm_amx_bf16#0", "gemm_amx_bf16")]
        results = [TacticResult(i, f"k{i}", c.name, us) for i, (c, us) in enumerate(zip(cands, (900.0, 105.2, amx_us)))]
        ch = TacticChoice("s", "linear", {}, cands, results, best=0)
        pick_by_precision(ch)
        return ch.candidates[ch.low["bf16"]].name

    assert low_choice(107.5) == "gemm_amx_bf16#0"          # vit_s16's qkv
    assert low_choice(105.2 * (1 + POOL_MARGIN) + 1) == "onednn_bf16"
