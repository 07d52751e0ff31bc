"""Warm rebuilds: an unchanged model on a warm cache redoes no work it can reuse (issue: builds in
seconds), and still comes out the same and verified (docs/DESIGN.md §2)."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch

import ascendc_pack.kernels.gemm.generator as gemm_mod
import ascendc_pack.graph.render as render_mod
from ascendc_pack.package.bundle import _weights_blob
from ascendc_pack.pipeline import build
from ascendc_pack.ir.program import ModelProgram, Program, TensorSpec
from ascendc_pack.graph.render import RENDER_CACHE_SUBDIR
from ascendc_pack.tactics.tune import TacticTuner
from ascendc_pack.tune.python_mode import PythonModeModule
from ascendc_pack_runtime.archive import read_head


class LinearGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 48)
        self.b = torch.nn.Linear(48, 16)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x))) * 2.0


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        return torch.cond(x.mean() > 0, lambda h: torch.relu(h) + 1, lambda h: torch.sigmoid(h) * 3, (h,))


def _build(model, inputs, tmp_path, tag, **kw):
    return build(model, inputs, topn=2, cache_dir=tmp_path / "cache", output=tmp_path / f"{tag}.ascpack", **kw)


def _visited(path) -> dict:
    m = read_head(path).manifest
    return {**{k.name: k.visited for k in m.kernels}, **{t.name: t.visited for t in (m.tactics or ())}}


def _refuse(*_a, **_k):
    raise AssertionError("a warm rebuild redid this")


def test_warm_rebuild_reuses_every_stage_and_writes_the_same_bundle(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, x = LinearGelu().eval(), (torch.randn(8, 32),)
    cold = _build(model, x, tmp_path, "cold")
    assert cold.kernels_compiled > 0 and cold.tactics_profiled > 0
    assert len(list((tmp_path / "cache" / RENDER_CACHE_SUBDIR).iterdir())) == 1
    # nothing is left to tune and the program has no torch.cond: no run, no cost model, no render
    for target, name in ((TacticTuner, "__call__"), (PythonModeModule, "__call__"), (gemm_mod, "propose"),
                         (render_mod, "plan_graph")):
        monkeypatch.setattr(target, name, _refuse)
    warm = _build(model, x, tmp_path, "warm")
    assert (warm.kernels_compiled, warm.kernels_profiled, warm.tactics_profiled) == (0, 0, 0)
    assert warm.verification and all(c.ok for c in warm.verification)   # still checked against eager
    assert (tmp_path / "warm.ascpack").read_bytes() == (tmp_path / "cold.ascpack").read_bytes()
    assert all(_visited(tmp_path / "warm.ascpack").values())


def test_warm_rebuild_of_a_cond_model_still_learns_which_branches_run(tmp_path):
    torch.manual_seed(0)
    model, x = Branchy().eval(), (torch.rand(4, 16) + 0.1,)   # only the relu branch runs
    _build(model, x, tmp_path, "cold")
    _build(model, x, tmp_path, "warm")
    cold, warm = _visited(tmp_path / "cold.ascpack"), _visited(tmp_path / "warm.ascpack")
    assert warm == cold
    assert True in cold.values() and False in cold.values()   # the untaken branch stays unvisited


def test_unusable_cache_entries_are_redone_with_a_warning(tmp_path, caplog):
    torch.manual_seed(0)
    model, x = LinearGelu().eval(), (torch.randn(8, 32),)
    _build(model, x, tmp_path, "cold")
    cache = tmp_path / "cache"
    broken = [*(cache / RENDER_CACHE_SUBDIR).iterdir(), *cache.glob("ascendc/gemm_*/*/proposal-*.json")]
    assert len(broken) >= 2
    for f in broken:
        f.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="ascendc_pack"):
        again = _build(model, x, tmp_path, "again")
    assert all(c.ok for c in again.verification)
    assert "graph render cache entry" in caplog.text and "GEMM proposal" in caplog.text
    assert json.loads(broken[0].read_text())   # rewritten


def test_weights_stream_into_the_archive_in_their_stored_layouts():
    g = torch.Generator().manual_seed(0)
    plain = torch.randn(3, 5, generator=g)
    nhwc = torch.randn(2, 3, 4, 4, generator=g).contiguous(memory_format=torch.channels_last)  # dense, permuted
    sliced = torch.randn(6, 7, generator=g)[:, 1:5]                                             # not dense
    weights = {"w0": plain, "w1": nhwc, "w2": sliced}
    values = {k: TensorSpec(tuple(t.shape), "float32") for k, t in weights.items()}
    model = ModelProgram("m", Program(list(weights), [], [], values), list(weights), {}, [], {}, [], {}, [])
    blob, entries, layouts = _weights_blob(model, weights)
    data = blob.reader().read()
    assert len(data) == blob.size and hashlib.sha256(data).hexdigest() == blob.sha256
    assert layouts["w1"][1] == nhwc.stride() and layouts["w2"][1] == (4, 1)
    for e in entries:
        assert e.offset % 64 == 0
        stored = torch.frombuffer(bytearray(data[e.offset:e.offset + e.nbytes]), dtype=torch.float32)
        stored = stored.as_strided(e.shape, e.stride) if e.nbytes else stored
        assert torch.equal(stored, weights[e.name])


@pytest.mark.parametrize("bad", ["[]", "[[{\"mr\": 1}, 0, 1.0]]", "nonsense"])
def test_a_bad_gemm_proposal_is_proposed_again(tmp_path, bad):
    from ascendc_pack.config import BuildConfig

    spec = gemm_mod.GemmSpec("gemm_t", 16, 32, 24, b_constant=True)
    config = BuildConfig.resolve(topn=2, cache_dir=tmp_path)
    first = gemm_mod.plan(spec, config)
    (stored,) = tmp_path.glob("ascendc/gemm_t/*/proposal-*.json")
    stored.write_text(bad)
    again = gemm_mod.plan(spec, config)
    assert [c.candidate for c in again.candidates] == [c.candidate for c in first.candidates]


class ConvMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


def test_meta_layouts_are_kept_across_builds(tmp_path, monkeypatch, caplog):
    import ascendc_pack.passes.meta_layouts as ga

    torch.manual_seed(0)
    model, x = ConvMean().eval(), (torch.randn(1, 3, 12, 12),)
    monkeypatch.setattr(ga, "_META_MEMO", {})
    calls = []
    real = ga._meta_outputs
    monkeypatch.setattr(ga, "_meta_outputs", lambda *a: calls.append(a) or real(*a))
    _build(model, x, tmp_path, "cold")
    (stored,) = (tmp_path / "cache" / "ascendc" / "meta_layouts").iterdir()
    assert calls and len(json.loads(stored.read_text())) >= len(calls)
    # a new process: an empty memo, filled from the file; no meta kernel runs again
    monkeypatch.setattr(ga, "_META_MEMO", {})
    monkeypatch.setattr(ga, "_meta_outputs", _refuse)
    assert all(c.ok for c in _build(model, x, tmp_path, "warm").verification)
    # an unusable file: a warning, the layouts computed again, the file rewritten
    monkeypatch.setattr(ga, "_META_MEMO", {})
    monkeypatch.setattr(ga, "_meta_outputs", real)
    stored.write_text("[1, 2")
    with caplog.at_level(logging.WARNING, logger="ascendc_pack"):
        assert all(c.ok for c in _build(model, x, tmp_path, "again").verification)
    assert "meta layout cache" in caplog.text and json.loads(stored.read_text())


def test_eager_reference_runs_torch_cond_as_plain_python_and_restores_it():
    from ascendc_pack.frontend.check import check_against_eager, plain_cond

    torch.manual_seed(0)
    model = Branchy().eval()
    sets = [(torch.rand(4, 16) + 0.1,), (-torch.rand(4, 16) - 0.1,)]
    expected = [model(*s) for s in sets]   # torch's own cond
    original = torch.cond
    checks = check_against_eager(model, sets, lambda x: expected[0] if x.mean() > 0 else expected[1])
    assert all(c.ok for c in checks) and torch.cond is original
    with pytest.raises(ZeroDivisionError), plain_cond():
        assert torch.cond is not original
        1 / 0
    assert torch.cond is original
    wrong = check_against_eager(model, sets, lambda x: expected[1])   # the other branch's result
    assert not wrong[0].ok and wrong[1].ok
