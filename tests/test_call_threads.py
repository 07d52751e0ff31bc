"""The tuned thread cap of a whole call (ascendc_pack/tune/call_threads.py, manifest ``call_threads``):
candidates, the choice rule, the manifest record, a real build that times the finished bundle,
the runtime applying the cap (and the caller overriding it), the cache of warm rebuilds."""

from __future__ import annotations

import json

import pytest
import torch

import ascendc_pack.tune.call_threads as ct
import ascendc_pack_runtime as rt
from ascendc_pack.config import host_cores
from ascendc_pack.pipeline import build
from ascendc_pack_runtime.archive import read_head
from ascendc_pack_runtime.errors import ManifestFieldError
from ascendc_pack_runtime.host import host_cpu_model, parse_cpu_model, usable_cores
from ascendc_pack_runtime.manifest import CallThreads, Manifest
from ascendc_pack_runtime.tools import inspect_bundle, run_bundle
from .bundle_fixtures import repack


class Small(torch.nn.Module):
    def forward(self, x, y):
        return torch.softmax(x * 2.0 + y, dim=-1), (x - y).abs().sum(dim=0)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)


def test_candidates_start_with_every_core_and_end_with_one():
    assert ct.candidate_caps(1) == [1]
    assert ct.candidate_caps(2) == [2, 1]
    assert ct.candidate_caps(3) == [3, 1]
    assert ct.candidate_caps(8) == [8, 4, 1]


@pytest.mark.parametrize("medians, cap", [
    ({2: 100.0, 1: 50.0}, 1),     # one thread much faster: capped
    ({2: 100.0, 1: 96.0}, None),  # within the margin: noise must not cap the model
    ({2: 50.0, 1: 100.0}, None),  # every core fastest: no cap
    ({8: 100.0, 4: 60.0, 1: 70.0}, 4),
    ({2: 100.0, 1: 100.0}, None)])
def test_a_cap_is_chosen_only_when_clearly_faster(medians, cap):
    assert ct.choose(medians, max(medians)) == cap


@pytest.mark.parametrize("per_round, done", [
    ({2: [50.0, 52.0, 51.0], 1: [100.0, 98.0, 99.0]}, True),   # 3 rounds, one winner by ~2x: stop
    ({2: [50.0, 52.0], 1: [100.0, 98.0]}, False),             # too few rounds
    ({2: [50.0, 52.0, 95.0], 1: [100.0, 98.0, 99.0]}, False), # one round within 2x the margin
    ({2: [50.0, 120.0, 51.0], 1: [100.0, 98.0, 99.0]}, False),# the rounds disagree on the winner
    ({2: [50.0, 52.0, 51.0], 1: [100.0, 98.0]}, False),      # only rounds every cap finished count
    ({8: [90.0] * 3, 4: [60.0] * 3, 1: [70.0] * 3}, True)])
def test_timing_stops_early_only_when_every_round_agrees_by_a_wide_margin(per_round, done):
    assert ct.settled(per_round) is done


@pytest.mark.parametrize("samples, kept", [
    ([(100.0, 0.5), (60.0, 0.01)], (60.0, 0.01)),                 # contended, then a clean retake
    ([(100.0, 0.5), (90.0, 0.3), (95.0, 0.4)], (90.0, 0.3)),      # contended throughout: the least
    ([(70.0, 0.0)], (70.0, 0.0))])                                # clean at once: no retake
def test_a_sample_taken_while_another_process_held_a_core_is_taken_again(monkeypatch, samples, kept):
    script = iter(samples)
    monkeypatch.setattr(ct, "_sample", lambda *a: next(script))
    assert ct._time_round(None, [], {}) == kept
    assert next(script, None) is None   # no more samples than needed


class _FakeModel:
    class contract:
        mutations = ()

    def __init__(self, threads):
        self.threads = threads

    def close(self):
        pass


def test_contended_timings_record_no_cap_and_are_not_cached(monkeypatch, tmp_path):
    """One thread has no teammate to wait for, so with a core taken it wins: that must not cap
    the bundle, nor stay in the cache."""
    monkeypatch.setattr(rt, "load", lambda path, threads: _FakeModel(threads))
    medians, waits = {2: 100.0, 1: 50.0}, {2: 0.0, 1: 0.0}
    monkeypatch.setattr(ct, "_time_round", lambda m, args, restore: (medians[m.threads], waits[m.threads]))
    record, wait = ct.measure(tmp_path / "x.ascpack", (), 2)
    assert record.cap == 1 and wait == 0.0                   # quiet: one thread clearly faster
    waits[1] = 0.4
    record, wait = ct.measure(tmp_path / "x.ascpack", (), 2)
    assert record.cap is None and wait == 0.4 and dict(record.candidates) == {2: 100.0, 1: 50.0}
    monkeypatch.setattr(ct, "measure", lambda *a: (record, 0.4))
    assert ct.tune_call_threads(tmp_path / "x.ascpack", (), 2, tmp_path / "cache", "graph") == record
    assert not (tmp_path / "cache" / ct.CACHE_SUBDIR).exists()   # the next build times again


def test_the_record_round_trips_and_bad_records_name_the_field():
    rec = CallThreads(1, ((2, 3340.5), (1, 1580.25)))
    assert CallThreads.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert "capped at 1" in rec.describe() and "3.34 ms" in rec.describe()
    with pytest.raises(ManifestFieldError, match=r"call_threads.cap.*not one of the candidates"):
        CallThreads.from_json({"cap": 4, "candidates": [{"threads": 2, "median_us": 1.0}]})
    with pytest.raises(ManifestFieldError, match=r"call_threads.cap"):
        CallThreads.from_json({"cap": 0, "candidates": []})
    with pytest.raises(ManifestFieldError, match=r"call_threads.candidates\[0\].median_us"):
        CallThreads.from_json({"cap": None, "candidates": [{"threads": 1, "median_us": -1}]})


def test_the_cpu_model_is_read_from_cpuinfo_text():
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n" * 2
    assert parse_cpu_model(text) == "AMD EPYC 7B13"
    assert parse_cpu_model("processor\t: 0\nmodel name\t:\nflags\t: fpu\n") is None
    assert parse_cpu_model("") is None


def test_the_record_names_its_host_and_a_cap_carries_over_only_to_a_host_like_it():
    rec = CallThreads(1, ((2, 3340.5), (1, 1580.25)), 2, "Intel(R) Xeon(R) Processor")
    assert CallThreads.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert "median call on the 2-core Intel(R) Xeon(R) Processor build host: 2 threads 3.34 ms" in rec.describe()
    assert rec.mismatch(2, "Intel(R) Xeon(R) Processor", 2) is None
    assert rec.mismatch(2, None, 2) is None                       # CPU model unknown here: cores decide
    assert rec.mismatch(16, "Intel(R) Xeon(R) Processor", 2) == "tuned on a 2-core host, this one has 16 usable cores"
    assert "AMD EPYC 7B13" in rec.mismatch(2, "AMD EPYC 7B13", 2)
    old = CallThreads(1, ((2, 3340.5), (1, 1580.25)))             # a record from before the host was named
    assert CallThreads.from_json(old.to_json()) == old and "cores" not in old.to_json()
    assert old.mismatch(2, "AMD EPYC 7B13", 2) is None            # the manifest's cores stand in
    assert old.mismatch(4, None, 2) is not None
    with pytest.raises(ManifestFieldError, match=r"call_threads.cores"):
        CallThreads.from_json({**rec.to_json(), "cores": 0})
    with pytest.raises(ManifestFieldError, match=r"call_threads.cpu"):
        CallThreads.from_json({**rec.to_json(), "cpu": ""})


@pytest.mark.skipif(host_cores() < 2, reason="a thread cap needs 2 usable cores")
def test_a_tuned_build_times_every_cap_records_it_and_the_runtime_applies_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ct, "contention_clock", lambda: None)   # a busy CI host must not skip the cache
    cache = tmp_path / "cache"
    out = tmp_path / "small.ascpack"
    result = build(Small(), _inputs(), topn=2, output=out, cache_dir=cache, cores=2)
    rec = read_head(out).manifest.call_threads
    assert rec == result.call_threads
    assert [t for t, _ in rec.candidates] == [2, 1]
    assert all(m is not None and m > 0 for _, m in rec.candidates)
    assert rec.cap == ct.choose(dict(rec.candidates), 2)
    assert rec.cores == 2 and rec.cpu == host_cpu_model()   # the host the medians belong to
    assert "call threads:" in result.summary()
    assert "threads" in result.seconds
    applies = rec.mismatch(usable_cores(), host_cpu_model(), 2) is None   # a 2-core build on this host
    with rt.load(out) as m:
        assert m.threads == (rec.cap if applies else None)
        want = Small()(*_inputs())
        for got, ref in zip(m(*_inputs()), want):
            torch.testing.assert_close(got, ref)
    with rt.load(out, threads=2) as m:
        assert m.threads == 2            # the caller's cap wins
    assert f"threads  {rec.describe()}" in inspect_bundle(out)[0]
    # a warm rebuild reuses the cached record: the same medians, not a new measurement
    again = build(Small(), _inputs(), topn=2, output=tmp_path / "again.ascpack", cache_dir=cache, cores=2)
    assert again.call_threads == rec
    assert len(list((cache / ct.CACHE_SUBDIR).glob("*.json"))) == 1


@pytest.mark.parametrize("topn, cores, steps, timed", [
    (2, 2, {}, True),                                         # PGO: always
    (2, 1, {"tactic": 40}, False),                            # one core: nothing to cap
    (1, 2, {"fused": 3, "aten_out": 2}, False),               # a small graph at --topn 1: not worth 0.5 s
    (1, 2, {"tactic": 10, "fused": 4, "aten_out": 2}, True),  # many steps: a wake-up per step adds up
    (1, 2, {"tactic": 10, "aten_view": 40}, False)])          # views run no parallel region
def test_topn_1_times_the_caps_only_for_many_steps(topn, cores, steps, timed):
    assert ct.worth_timing(topn, cores, steps) is timed


class Deep(torch.nn.Module):
    """:data:`~ascendc_pack.tune.call_threads.MANY_STEPS` small GEMMs: a call of many steps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(ct.MANY_STEPS))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.mark.skipif(host_cores() < 2, reason="a cap needs 2+ cores to choose from")
def test_a_topn_1_build_of_many_steps_times_the_caps(tmp_path):
    out = tmp_path / "deep.ascpack"
    x = torch.randn(4, 64)
    result = build(Deep(), (x,), topn=1, output=out, cache_dir=tmp_path / "cache", cores=2)
    rec = read_head(out).manifest.call_threads
    assert rec is not None and rec == result.call_threads
    assert [t for t, _ in rec.candidates] == [2, 1] and all(us > 0 for _, us in rec.candidates)
    # the choice rule's cap, or none where another process (a test worker) held a core meanwhile
    assert rec.cap in (ct.choose(dict(rec.candidates), 2), None)
    with rt.load(out) as m:
        torch.testing.assert_close(m(x), Deep()(x))


def test_topn_1_builds_of_few_steps_record_no_cap(tmp_path):
    out = tmp_path / "small1.ascpack"
    result = build(Small(), _inputs(), topn=1, output=out, cache_dir=tmp_path / "cache")
    assert result.call_threads is None
    assert read_head(out).manifest.call_threads is None
    assert "call_threads" not in read_head(out).manifest.to_json()
    with rt.load(out) as m:
        assert m.threads is None


def test_a_recorded_cap_is_applied_reported_by_run_and_overridden_by_the_caller(tmp_path):
    src = tmp_path / "small.ascpack"
    build(Small(), _inputs(), topn=1, output=src, cache_dir=tmp_path / "cache")

    def cap_at_1(manifest, _members):
        manifest["call_threads"] = {"cap": 1, "candidates": [{"threads": 2, "median_us": 300.0},
                                                             {"threads": 1, "median_us": 100.0}]}

    capped = repack(src, tmp_path / "capped.ascpack", cap_at_1)
    with rt.load(capped) as m:
        assert m.threads == 1
    with rt.load(capped, threads=2) as m:
        assert m.threads == 2
    lines, status, _ = run_bundle(capped, repeat=2)
    assert status == 0
    assert any("threads: cap 1 (tuned at build: manifest call_threads)" in line for line in lines), lines
    lines, status, _ = run_bundle(capped, repeat=2, threads=2)
    assert any(line.startswith("threads: cap 2 (fused") for line in lines), lines


def test_a_cap_tuned_on_another_host_is_not_applied_and_every_tool_says_why(tmp_path):
    src = tmp_path / "small.ascpack"
    build(Small(), _inputs(), topn=1, output=src, cache_dir=tmp_path / "cache")
    here, other = usable_cores(), usable_cores() + 14

    def cap_at_1(cores):
        def edit(manifest, _members):
            manifest["call_threads"] = {"cap": 1, "candidates": [{"threads": cores, "median_us": 300.0},
                                                                 {"threads": 1, "median_us": 100.0}],
                                        "cores": cores, "cpu": host_cpu_model() or "some CPU"}
        return edit

    same = repack(src, tmp_path / "same.ascpack", cap_at_1(here))
    with rt.load(same) as m:
        assert m.threads == 1 and m.threads_note is None
    elsewhere = repack(src, tmp_path / "elsewhere.ascpack", cap_at_1(other))
    with rt.load(elsewhere) as m:
        assert m.threads is None
        assert m.threads_note == f"the build's cap of 1 not applied: tuned on a {other}-core host, " \
                                 f"this one has {here} usable cores"
        for got, ref in zip(m(*_inputs()), Small()(*_inputs())):
            torch.testing.assert_close(got, ref)
    with rt.load(elsewhere, threads=1) as m:
        assert m.threads == 1                 # the caller can still cap it
    lines, status, _ = run_bundle(elsewhere, repeat=2)
    assert status == 0
    assert any(line.startswith("threads: no cap") and f"tuned on a {other}-core host" in line
               and "--threads N caps" in line for line in lines), lines
    assert f"on this host: the build's cap of 1 not applied: tuned on a {other}-core host" in inspect_bundle(elsewhere)[0]


def test_a_manifest_whose_cap_is_not_a_candidate_is_refused(tmp_path):
    out = tmp_path / "small.ascpack"
    build(Small(), _inputs(), topn=2, output=out, cache_dir=tmp_path / "cache", cores=2)
    d = read_head(out).manifest.to_json()
    d["call_threads"] = {"cap": 7, "candidates": [{"threads": 2, "median_us": 10.0}]}
    with pytest.raises(ManifestFieldError, match="call_threads.cap"):
        Manifest.from_json(d)
