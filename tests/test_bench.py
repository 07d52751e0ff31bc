"""Tests of the benchmark suite (ascendc_pack/bench/, bench/run_all.py).

The protocol and report logic run on fake timers and made-up rounds (no number here reaches a
document); the real runs use tiny models, one to three rounds, and the cheapest contenders.
Nothing asserts a wall-clock time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ascendc_pack import bench
from ascendc_pack.bench import contention, extras, kernels, report, stats
from ascendc_pack.bench.model import LEAD_IN_MS, _Run, _summarize
from ascendc_pack.cli.main import main

from .conftest import EXAMPLES, ROOT

TINY = """
import torch

class Tiny(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y).sum(dim=-1)

def get_model():
    return Tiny()

def get_example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 64, generator=g), torch.randn(64, generator=g))
"""

# torch.export cannot trace the data-dependent `if`: every exported contender fails, eager works
DATA_DEPENDENT = """
import torch

class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1

def get_model():
    return Branchy()

def get_example_inputs():
    return (torch.ones(8, 8),)
"""

# the process dies in the model's second call (the reference run makes one call, a worker more)
DIES = """
import os
import torch

class Dies(torch.nn.Module):
    calls = 0

    def forward(self, x):
        Dies.calls += 1
        if Dies.calls == 2:
            os._exit(7)
        return x + 1

def get_model():
    return Dies()

def get_example_inputs():
    return (torch.ones(2),)
"""


def _needs_ort():
    for mod in extras.NEEDS["ort"]:
        pytest.importorskip(mod, reason=f"the ONNX Runtime contender needs {mod} (bench extra)")


# ---- the timing protocol on fake timers --------------------------------------------------------

class FakeClock:
    """A nanosecond clock that moves only when a fake contender 'runs'."""

    def __init__(self):
        self.ns = 0
        self.calls: list[str] = []

    def __call__(self) -> int:
        return self.ns

    def contender(self, name: str, us_per_call):
        """A callable advancing the clock by ``us_per_call`` (a number or an iterator of numbers)."""
        it = iter(us_per_call) if not isinstance(us_per_call, (int, float)) else None

        def fn():
            self.calls.append(name)
            self.ns += int(1000 * (next(it) if it else us_per_call))

        return fn


def test_percentile_spread_and_stability():
    assert stats.percentile([1.0], 90) == 1.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert stats.percentile(list(range(11)), 90) == pytest.approx(9.0)
    s = stats.Spread.of([10.0, 10.0, 10.0, 10.0])
    assert s.median == 10.0 and s.rel_iqr == 0.0 and s.stable
    assert not stats.Spread.of([10.0, 10.0]).stable  # too few rounds to show a spread
    noisy = stats.Spread.of([10.0, 12.0, 30.0, 9.0, 11.0])
    assert noisy.rel_iqr == pytest.approx((12.0 - 10.0) / 11.0) and not noisy.stable
    assert stats.Spread(0.0, 0.0, 0.0, 5).rel_iqr == float("inf")
    with pytest.raises(ValueError):
        stats.Spread.of([])


def test_latency_stats_medians_over_calls_spread_over_rounds():
    rounds = [[10.0, 10.0, 100.0], [11.0, 11.0, 11.0], [10.0, 12.0, 10.0], [10.0, 10.0, 10.0]]
    s = stats.latency_stats(rounds)
    assert s["median_us"] == 10.0 and s["calls"] == 12 and s["rounds"] == 4 and s["min_us"] == 10.0
    assert s["round_medians_us"] == [10.0, 11.0, 10.0, 10.0]
    assert s["p90_us"] == pytest.approx(stats.percentile([u for r in rounds for u in r], 90))
    assert s["stable"] and s["spread"]["rel_iqr"] == pytest.approx(0.25 / 10.0)


def test_paired_ratio_cancels_drift_and_rotation():
    # the host slows down 3x halfway: each round's pair drifts together, the ratio does not
    a = [10.0, 10.0, 30.0, 30.0]
    b = [20.0, 20.0, 60.0, 60.0]
    r = stats.paired_ratio(a, b)
    assert r.median == 0.5 and r.rel_iqr == 0.0 and r.stable
    assert stats.paired_ratio([], []) is None
    assert stats.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert stats.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert stats.rotated([], 3) == []
    assert stats.calls_per_sample(est_us=10.0, sample_us=1000.0) == 100
    assert stats.calls_per_sample(est_us=1e9, sample_us=1000.0) == 1
    assert stats.calls_per_sample(est_us=0.0, sample_us=1e9, cap=50) == 50


def test_lead_in_calls_until_its_time_is_up():
    clock = FakeClock()
    fn = clock.contender("x", 30.0)
    assert stats.lead_in(fn, 100.0, clock=clock) == 4  # 30, 60, 90, then 120 >= 100 us
    assert stats.lead_in(fn, 1.0, clock=clock) == 1  # at least one call
    assert stats.lead_in(fn, 0.0, clock=clock) == 0 and len(clock.calls) == 5


def test_interleaved_stats_on_a_fake_clock():
    clock = FakeClock()
    fast = clock.contender("fast", 5.0)
    slow = clock.contender("slow", 20.0)
    out = stats.interleaved_stats({"fast": fast, "slow": slow}, rounds=4, target_us=40.0, clock=clock)
    assert out["fast"]["median_us"] == 5.0 and out["slow"]["median_us"] == 20.0
    assert out["fast"]["calls"] == 4 * 8 and out["slow"]["calls"] == 4 * 2  # samples of ~40 us
    assert out["fast"]["stable"] and out["slow"]["stable"]
    timed = clock.calls[6:]  # after 3 sizing calls each
    firsts = [timed[0], timed[10], timed[20], timed[30]]  # each round: 8 fast + 2 slow calls
    assert firsts == ["fast", "slow", "fast", "slow"]  # the order rotates every round


def test_interleaved_stats_flags_a_noisy_contender():
    clock = FakeClock()
    jumpy = clock.contender("jumpy", iter([10.0] * 3 + [10.0, 50.0, 10.0, 90.0, 10.0, 10.0, 70.0]))
    out = stats.interleaved_stats({"jumpy": jumpy}, rounds=7, target_us=1.0, clock=clock)
    assert out["jumpy"]["rounds"] == 7 and not out["jumpy"]["stable"]


# ---- the report logic on made-up rounds --------------------------------------------------------

def _made_up_result(tmp_path, rounds_by_cid: dict, busy_by_cid: dict | None = None, load=(10.4, 9.7, 9.7),
                    untimed: dict | None = None, idle: dict | None = None, precision: dict | None = None):
    """A bench_model-shaped result from made-up per-call rounds, summarized by the real code;
    ``untimed``: contenders that failed or were wrong (never timed); ``precision``: {cid:
    (precision, relative error)} of contenders not computing in float32."""
    res = {cid: {"label": bench.label(cid, 4), "status": "ok", "reason": None} for cid in rounds_by_cid}
    for cid, (prec, rel) in (precision or {}).items():
        res[cid].update(precision=prec, rel_error=rel)
    res.update(untimed or {})
    run = _Run(tmp_path / "m.py", tmp_path, 4, False, 1.0, lambda _: None)
    run.res = res
    result = {"model": str(tmp_path / "m.py"), "name": "m", "contenders": res, "ratios": {}, "best_peer": {},
              "contention": {"busy": "made up"} if busy_by_cid else None, "cold_start": {}, "kernels": [],
              "inputs": ["float32[2]"], "loadavg_start": list(load), "loadavg_end": list(load),
              "config": {"topn": 4, "repeat": 5, "cold_runs": 0, "sample_ms": 1.0, "same_process": False,
                         "cores": 2, "contention": bool(busy_by_cid), "busy_core": None, "rebuild": False,
                         "torch_threads": 2, "torch": "x"}}
    rounds = {"quiet": rounds_by_cid}
    if busy_by_cid:
        rounds["busy"] = busy_by_cid
    _summarize(run, result, rounds, idle)
    return result


def test_best_peer_ratio_and_unstable_rows(tmp_path):
    steady = lambda us: [[us, us]] * 5  # noqa: E731
    result = _made_up_result(tmp_path, {
        "eager": steady(100.0), "ort": steady(50.0),
        "compile": [[60.0], [200.0], [60.0], [300.0], [60.0]],  # noisy
        "bundleN": steady(40.0)})
    assert result["best_peer"]["bundleN"]["peer"] == "ort"
    assert result["best_peer"]["bundleN"]["median"] == pytest.approx(0.8)
    assert result["contenders"]["eager"]["ratio_bundleN"] == pytest.approx(0.4)
    assert not result["contenders"]["compile"]["stable"]
    text = bench.format_report(result)
    assert "÷ best fp32 peer (ONNX Runtime (no spin)): 0.80 [0.80-0.80]" in text
    assert "ok, UNSTABLE (spread" in text
    assert "load average 10.40" in text and "BUSY HOST" in text
    assert "0.67 [0.20-0.67] unstable" in text  # the ratio against the noisy contender says so
    # with the other work measured, that line judges the host, not the load average
    result["other_work"] = {"cores": 0.01, "steal_cores": 0.0, "seconds": 9.0}
    text = bench.format_report(result)
    assert "load average 10.40" in text and "(this benchmark's processes included)" in text
    assert "BUSY HOST" not in text and "other work while timing: 0.01 cores" in text and "quiet" in text


def test_after_idle_is_its_own_column_and_ratio(tmp_path):
    steady = lambda us: [[us, us]] * 3  # noqa: E731
    result = _made_up_result(tmp_path, {"eager": steady(100.0), "ort": steady(50.0), "bundleN": steady(40.0)},
                             idle={"eager": [90.0, 110.0, 100.0], "ort": [150.0] * 3, "bundleN": [120.0, 80.0, 100.0]})
    assert result["best_peer"]["bundleN"]["peer"] == "ort"  # steady state: ORT is the fastest peer
    idle = result["after_idle"]["vs_best"]["bundleN"]
    assert idle["peer"] == "eager" and idle["median"] == pytest.approx(1.0) and idle["n"] == 3  # after idle: eager
    assert result["contenders"]["ort"]["after_idle"] == {"median_us": 150.0, "bursts": 3}
    text = bench.format_report(result)
    assert "after 0.3 s idle" in text and "150.0 us" in text
    assert ".ascpack --topn 4 ÷ best peer after 0.3 s idle (eager): 1.00 [0.86-1.17] unstable" in text
    assert _made_up_result(tmp_path, {"bundleN": steady(1.0)}).get("after_idle") is None  # not run: no column
    assert "after 0.3 s idle" not in bench.format_report(_made_up_result(tmp_path, {"bundleN": steady(1.0)}))


def test_best_peer_is_taken_at_equal_precision(tmp_path):
    """OpenVINO's bfloat16 default is faster than every float32 contender but is no float32
    bundle's peer; it is reported with its error, and the bundle ratio against it is still shown."""
    steady = lambda us: [[us, us]] * 3  # noqa: E731
    result = _made_up_result(tmp_path, {"eager": steady(100.0), "ov_f32": steady(60.0), "ov": steady(30.0),
                                        "bundleN": steady(50.0)},
                             idle={"eager": [100.0] * 3, "ov_f32": [70.0] * 3, "ov": [20.0] * 3, "bundleN": [60.0] * 3},
                             precision={"ov": ("bf16", 3e-3)})
    assert result["best_peer"]["bundleN"]["peer"] == "ov_f32"
    assert result["best_peer"]["bundleN"]["median"] == pytest.approx(50 / 60)
    assert result["after_idle"]["vs_best"]["bundleN"]["peer"] == "ov_f32"
    assert result["ratios"]["bundleN"]["ov"]["median"] == pytest.approx(50 / 30)
    text = bench.format_report(result)
    assert "÷ best fp32 peer (OpenVINO f32)" in text
    assert "OpenVINO default computes in bf16: relative error 3.00e-03" in text
    # a bundle computing in bfloat16 has the bfloat16 contender as its peer
    result = _made_up_result(tmp_path, {"ov_f32": steady(60.0), "ov": steady(30.0), "bundleN": steady(25.0)},
                             precision={"ov": ("bf16", 3e-3), "bundleN": ("bf16", 2e-3)})
    assert result["best_peer"]["bundleN"]["peer"] == "ov"


def test_low_precision_outputs_are_judged_by_their_relative_error():
    from ascendc_pack.bench.contenders import LOW_PRECISION_SANITY, compare

    e = [torch.linspace(-1, 1, 100)]
    near = [e[0] + 1e-3]            # bfloat16 rounding: far outside the float32 rule
    assert compare(e, near)[0].startswith("wrong: ")
    status, err, rel = compare(e, near, precision="bf16")
    assert status == "ok" and err == pytest.approx(1e-3, rel=1e-3) and 0 < rel < 1e-2
    broken = [e[0] * (1 + 2 * LOW_PRECISION_SANITY)]
    status, _, rel = compare(e, broken, precision="bf16")
    assert status.startswith("wrong: relative error") and rel > LOW_PRECISION_SANITY
    nan = [e[0].clone()]
    nan[0][3] = float("nan")
    assert compare(e, nan, precision="bf16")[0].startswith("wrong: ")
    assert compare(e, [e[0].clone()]) == ("ok", 0.0, 0.0)


def test_wrong_and_failed_contenders_are_not_peers(tmp_path):
    result = _made_up_result(tmp_path, {"eager": [[100.0]] * 3, "bundleN": [[90.0]] * 3}, untimed={
        "aoti": {"label": "AOTInductor (.pt2)", "status": "wrong",
                 "reason": "output 0: max error 1 exceeds the allowed 1e-05"},
        "ort": {"label": "ONNX Runtime (no spin)", "status": "failed", "reason": "build: boom"}})
    assert set(result["ratios"]["bundleN"]) == {"eager", "bundleN"}
    assert result["best_peer"]["bundleN"]["peer"] == "eager"
    text = bench.format_report(result)
    assert "WRONG (not timed): output 0: max error 1" in text and "FAILED: build: boom" in text


def test_contention_slowdowns(tmp_path):
    quiet = {"ort": [[10.0]] * 4, "bundleN": [[8.0]] * 4}
    busy = {"ort": [[20.0]] * 4, "bundleN": [[12.0]] * 4}
    result = _made_up_result(tmp_path, quiet, busy)
    c = result["contention"]
    assert c["slowdown"]["ort"]["median"] == pytest.approx(2.0)
    assert c["slowdown"]["bundleN"]["median"] == pytest.approx(1.5)
    assert c["vs_ort"]["bundleN"]["median"] == pytest.approx(0.75)
    assert c["busy_vs_ort"]["bundleN"]["median"] == pytest.approx(0.6)
    text = bench.format_report(result)
    assert ".ascpack --topn 4 slowdown ÷ ONNX Runtime slowdown: 0.75" in text
    assert "busy latency ÷ ONNX Runtime busy latency: 0.60" in text
    no_ort = contention.slowdowns({"bundleN": [1.0] * 3}, {"bundleN": [2.0] * 3}, bench.BUNDLES)
    assert no_ort["vs_ort"] == {} == no_ort["busy_vs_ort"] and no_ort["slowdown"]["bundleN"]["median"] == 2.0


def test_noisy_kernel_timings_give_no_bandwidth_or_percentage(monkeypatch):
    """The old report printed `copy GB/s 0.0` and `% of copy 80243%` from a noisy copy timing."""
    stable = {"median_us": 10.0, "stable": True, "spread": {"rel_iqr": 0.01}}
    lines = kernels._kernel_lines("k", 4096, {
        "#0 t": stable, "eager": stable, "torch.compile": stable,
        "memcpy (same bytes)": {"median_us": 8000.0, "stable": False, "spread": {"rel_iqr": 0.9}}})
    assert "unstable (not derived from noisy rows)" in lines[-1] and "%" not in lines[-1]
    assert "unstable" in lines[3] and " 0.0 " not in lines[3]
    choices = {"k": {"spec": None, "chosen_index": 0, "visited": True, "candidate": {"tiling_repr": "t"},
                     "results": [{"median_us": 2.0, "samples_us": [1.0, 2.0, 9.0, 30.0, 2.0]}]}}
    monkeypatch.setattr(kernels, "kernel_bytes", lambda spec: 4096)
    rows = kernels.model_kernel_rows(choices, rounds=3)
    assert not rows[0]["winner_stable"] and rows[0]["gbs"] is None and "pct_of_copy" not in rows[0]
    head, cells = report.kernel_rows({"kernels": rows})
    assert cells[0][head.index("GB/s")] == "unstable" and cells[0][head.index("% of copy")] == "-"
    assert kernels.fmt_gbs(0.0004) == "0.0004" and report.fmt_us(97755.8) == "97.8 ms"


def test_missing_package_names_it_and_the_install_command(monkeypatch, write_model):
    assert extras.missing(["json", "no_such_module_xyz"]) == ["no_such_module_xyz"]
    monkeypatch.setattr(extras, "missing", lambda mods: [m for m in mods if m == "onnxscript"])
    with pytest.raises(extras.MissingExtraError) as err:
        bench.bench_model(write_model(TINY), contenders=["eager", "ort"], log=lambda _: None)
    msg = str(err.value)
    assert "`onnxscript`" in msg and "pip install 'ascendc-pack[bench]'" in msg
    assert "--contenders eager,compile,compile_freeze,compile_ascendc,aoti,ov_f32,ov,bundle1,bundleN,bundleN_bf16" in msg
    result = CliRunner().invoke(main, ["bench", str(write_model(TINY))])
    assert result.exit_code == 1 and "pip install 'ascendc-pack[bench]'" in result.output
    assert "No module named" not in result.output


# ---- real runs ---------------------------------------------------------------------------------

def _ok(result, cid):
    c = result["contenders"][cid]
    assert c["status"] == "ok", c
    assert c["check"] == "ok" and c["max_error"] is not None, c
    assert c["median_us"] > 0 and c["p90_us"] >= c["median_us"] and c["calls"] >= 1 and "spread" in c
    return c


def test_eager_and_onnxruntime_in_worker_processes_with_contention(write_model, tmp_path):
    _needs_ort()
    r = bench.bench_model(write_model(TINY), contenders=["eager", "ort"], repeat=2, cold_runs=0, sample_ms=2,
                          work_dir=tmp_path / "work", contention=True, idle_bursts=2, log=lambda _: None)
    _ok(r, "eager")
    ort_ = _ok(r, "ort")
    assert ort_["size"] > 0 and ort_["build_s"] > 0 and ort_["rounds"] == 2 and ort_["busy"]["rounds"] == 2
    assert (tmp_path / "work" / "logs" / "run-ort.log").exists()  # it ran in its own process
    assert set(r["contention"]["slowdown"]) == {"eager", "ort"} and "not pinned" in r["contention"]["busy"]
    assert ort_["after_idle"]["bursts"] == 2 and ort_["after_idle"]["median_us"] > 0
    assert r["config"]["lead_in_ms"] == LEAD_IN_MS > 0
    text = bench.format_report(r)
    assert "ONNX Runtime" in text and "one process per contender" in text and "slowdown" in text


def test_openvino_f32_and_default_in_worker_processes(write_model, tmp_path):
    """OpenVINO converts the model once; both contenders load that artifact in their own process,
    f32 checked by the accuracy rule, the default with its precision and relative error."""
    pytest.importorskip("openvino", reason="the OpenVINO contenders need openvino (bench extra)")
    r = bench.bench_model(write_model(TINY), contenders=["eager", "ov_f32", "ov"], repeat=2, cold_runs=0, sample_ms=2,
                          work_dir=tmp_path / "work", idle_bursts=0, log=lambda _: None)
    f32, default = _ok(r, "ov_f32"), _ok(r, "ov")
    assert f32["precision"] == "fp32" and f32["rel_error"] < 1e-6 and f32["artifact"].endswith(".xml")
    assert default["artifact"] == f32["artifact"] and default["size"] == f32["size"] > 0  # one conversion
    assert default["precision"] in ("fp32", "bf16", "fp16") and default["rel_error"] is not None
    assert (tmp_path / "work" / "logs" / "run-ov.log").exists() and (tmp_path / "work" / "logs" / "run-ov_f32.log").exists()
    assert not (tmp_path / "work" / "logs" / "build-ov.log").exists()  # not converted twice
    assert "OpenVINO f32" in bench.format_report(r)


LINEARS = """
import torch

def get_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()

def get_example_inputs():
    return (torch.randn(128, 512, generator=torch.Generator().manual_seed(0)),)

def get_calibration_inputs():
    return [(torch.randn(128, 512, generator=torch.Generator().manual_seed(1)),)]
"""


def test_onnxruntime_int8_and_the_int8_bundle_are_peers_at_int8(write_model, tmp_path):
    """ONNX Runtime's static quantization (calibrated on the model file's inputs) and the
    ``--precision int8`` bundle: each reports int8 with its error, and the bundle's best peer is
    ONNX Runtime int8, not a float32 contender."""
    _needs_ort()
    from ascendc_pack.tactics.dispatch.int8 import int8_offered

    if int8_offered() is not None:
        pytest.skip(f"no int8 here: {int8_offered()}")
    r = bench.bench_model(write_model(LINEARS), topn=1, contenders=["eager", "ort_int8", "bundleN_int8"], repeat=2,
                          cold_runs=0, sample_ms=2, work_dir=tmp_path / "work", idle_bursts=0, log=lambda _: None)
    ort8, b8 = _ok(r, "ort_int8"), _ok(r, "bundleN_int8")
    assert ort8["precision"] == "int8" and ort8["artifact"].endswith(".int8.onnx") and 0 < ort8["rel_error"] < 0.25
    assert b8["precision"] == "int8" and 0 < b8["rel_error"] <= 0.02
    assert r["best_peer"]["bundleN_int8"]["peer"] == "ort_int8"
    text = bench.format_report(r)
    assert "ONNX Runtime int8 (static)" in text and "best int8 peer (ONNX Runtime int8 (static))" in text


def test_example_against_bundle(tmp_path):
    """A real run on an example with the cheapest contenders: eager and the --topn 1 bundle."""
    r = bench.bench_model(EXAMPLES / "add_sum.py", topn=1, contenders=["eager", "bundle1"], repeat=3, idle_bursts=1,
                          cold_runs=0, sample_ms=2, same_process=True, log=lambda _: None)
    _ok(r, "eager")
    b = _ok(r, "bundle1")
    assert b["candidate_compiles"] >= 1 and "tune" in b["stages"] and b["build_s"] > 0
    assert r["best_peer"]["bundle1"]["peer"] == "eager" and r["best_peer"]["bundle1"]["n"] == 3
    assert r["kernels"] and r["kernels_of"] == "bundle1"
    text = bench.format_report(r)
    assert ".ascpack --topn 1 ÷ best fp32 peer (eager)" in text and "candidate compiles" in text


def test_failed_contenders_are_reported_not_raised(write_model):
    r = bench.bench_model(write_model(DATA_DEPENDENT), contenders=["eager", "aoti", "bundle1"], repeat=1, idle_bursts=1,
                          cold_runs=1, sample_ms=1, same_process=True, log=lambda _: None)
    _ok(r, "eager")
    for cid in ("aoti", "bundle1"):
        c = r["contenders"][cid]
        assert c["status"] == "failed" and c["reason"].startswith("build: "), c
    assert {k: e["error"] for k, e in r["cold_start"].items()} == {
        "pt2": "not run: AOTInductor (.pt2) failed", "ascpack": "not run: .ascpack --topn 1 failed"}
    assert r["kernels"] == [] and r["best_peer"] == {}
    assert bench.format_report(r).count("FAILED: build: ") == 2


def test_dead_worker_is_reported(write_model):
    r = bench.bench_model(write_model(DIES), contenders=["eager"], repeat=1, idle_bursts=1, cold_runs=0, log=lambda _: None)
    c = r["contenders"]["eager"]
    assert c["status"] == "failed" and "exited with code 7" in c["reason"], c


def test_model_that_raises_fails_every_contender(write_model):
    broken = write_model(TINY.replace("return torch.relu", "raise KeyError('boom'); return torch.relu"))
    r = bench.bench_model(broken, contenders=["eager", "compile"], repeat=1, idle_bursts=1, cold_runs=0, log=lambda _: None)
    for c in r["contenders"].values():
        assert c["status"] == "failed" and "eager reference run" in c["reason"] and "boom" in c["reason"], c
    assert "FAILED" in bench.format_report(r)


def test_onnx_runtime_missing_an_inplace_update_is_wrong_and_not_timed(write_model):
    _needs_ort()
    model = write_model(TINY.replace("return torch.relu(x + y)", "x.add_(y)\n        return torch.relu(x)"))
    r = bench.bench_model(model, contenders=["eager", "ort"], repeat=1, idle_bursts=1, cold_runs=0, sample_ms=1,
                          same_process=True, log=lambda _: None)
    assert r["contenders"]["eager"]["check"] == "ok"
    ort_ = r["contenders"]["ort"]
    assert ort_["status"] == "wrong" and ort_["max_error"] < 1e-5  # the outputs are right ...
    assert ort_["reason"].startswith("input 0 after the call")  # ... x is not updated
    assert "median_us" not in ort_ and "ort" not in r["ratios"].get("bundleN", {})


@pytest.mark.slow
def test_compile_freezing_and_aoti_built_timed_and_cold_started(write_model):
    r = bench.bench_model(write_model(TINY), contenders=["eager", "compile_freeze", "aoti"], repeat=1, idle_bursts=1, cold_runs=1,
                          sample_ms=1, log=lambda _: None)
    assert _ok(r, "compile_freeze")["build_s"] > 0  # its first call
    c = _ok(r, "aoti")
    assert c["size"] > 0 and c["build_s"] > 0 and set(r["cold_start"]) == {"pt2"}
    entry = r["cold_start"]["pt2"]
    assert "error" not in entry and len(entry["runs"]) == 1 and entry["median_total_s"] > 0


@pytest.mark.slow
def test_torch_compile_with_our_backend_is_a_contender_but_not_a_peer(write_model):
    r = bench.bench_model(write_model(TINY), contenders=["eager", "compile_ascendc", "bundleN"], topn=2, repeat=1,
                          idle_bursts=1, cold_runs=1, sample_ms=1, log=lambda _: None)
    c = _ok(r, "compile_ascendc")
    assert c["label"] == "torch.compile ascendc_pack --topn 2" and c["check"] == "ok" and c["build_s"] > 0
    assert "compile_ascendc" not in bench.PEERS and r["best_peer"]["bundleN"]["peer"] == "eager"
    assert r["ratios"]["bundleN"]["compile_ascendc"]["median"] > 0  # bundle ÷ Python mode, paired by round


@pytest.mark.slow
def test_bundles_with_rebuild_cold_start_and_kernels(write_model):
    """Two bundles (--topn 1 and 2) built, rebuilt warm, timed, cold-started; the kernel table."""
    r = bench.bench_model(write_model(TINY), topn=2, contenders=["bundle1", "bundleN"], repeat=1, idle_bursts=1, cold_runs=1,
                          sample_ms=1, same_process=True, rebuild=True, log=lambda _: None)
    for cid in ("bundle1", "bundleN"):
        c = _ok(r, cid)
        assert c["size"] > 0 and c["build_s"] > 0 and "tune" in c["stages"]
    rb = r["contenders"]["bundleN"]["rebuild"]
    assert rb["candidate_compiles"] == 0 and rb["build_s"] > 0  # the warm cache compiled nothing
    assert r["ratios"]["bundleN"]["bundleN"]["median"] == pytest.approx(1.0)
    assert r["best_peer"] == {}  # bundles only: no peer
    entry = r["cold_start"]["ascpack"]
    assert entry["of"] == "bundleN" and "error" not in entry and entry["median_total_s"] > 0
    assert r["kernels"][0]["candidates"] == 2 and r["kernels"][0]["copy_us"] > 0
    text = bench.format_report(r)
    assert "cold start" in text and "fused kernels of .ascpack --topn 2" in text and "rebuild" in text


def test_cli_bench_and_unknown_contender(write_model, tmp_path):
    model = write_model(TINY)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", str(model), "--contenders", "eager", "--same-process",
                                       "--repeat", "1", "--cold-runs", "0", "--idle-bursts", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "eager" in result.output and "median" in result.output and "load average" in result.output
    assert json.loads(out.read_text())["contenders"]["eager"]["status"] == "ok"
    result = CliRunner().invoke(main, ["bench", str(model), "--contenders", "tvm"])
    assert result.exit_code == 1 and "unknown contenders" in result.output
    result = CliRunner().invoke(main, ["bench", str(tmp_path / "missing.py")])
    assert result.exit_code == 1 and "no such file" in result.output
    result = CliRunner().invoke(main, ["bench", str(model), "--contenders", "eager", "--contention", "--busy-core", "4096"])
    assert result.exit_code == 1 and "--busy-core 4096 is not a core" in result.output


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    return run_all


def test_run_all_writes_report(write_model, tmp_path):
    model = write_model(TINY, "tiny.py")
    out = tmp_path / "PERF.md"
    _run_all().main(["--models", str(model), "--contenders", "eager", "--same-process", "--repeat", "1",
                     "--cold-runs", "0", "--sample-ms", "1", "--no-contention", "--no-rebuild", "--no-chart", "--idle-bursts", "1",
                     "--out", str(out)])
    text = out.read_text()
    assert "## Machine" in text and "run_all.py --models" in text and "### tiny" in text
    assert "| eager |" in text and "vector ISA flags" in text and "load average at start" in text
    assert "- other work while timing: " in text and "other work while timing (the busiest model)" in text
    assert "after idle ÷ best peer" in text and "1 times per contender" in text
    assert "## Build times" in text and "## Summary" in text
    assert not (tmp_path / "performance.png").exists()  # no bundle ratio, no chart


SPIN = "import time\nwhile time.process_time() < 0.4: pass"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_other_work_counts_the_benchmarks_processes_as_its_own(tmp_path):
    """Ticks of this process tree: a reaped child's and a live grandchild's count; a process
    outside the tree (double-forked, reparented) counts only in the host's busy ticks."""
    from ascendc_pack.bench.machine import _tree_ticks, cpu_sample

    hz, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    t0 = _tree_ticks(me)
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    assert _tree_ticks(me) - t0 >= 0.3 * hz  # the reaped child
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; sleep 5', SPIN])
    try:
        deadline = time.monotonic() + 30
        while _tree_ticks(me) - t0 < 0.6 * hz:  # the grandchild, live, under the shell
            assert time.monotonic() < deadline, "the grandchild's ticks never showed in the tree"
            time.sleep(0.05)
    finally:
        shell.kill()
        shell.wait()
    pid_file = tmp_path / "orphan.pid"
    before = cpu_sample()
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" & echo $! > "{pid_file}"', SPIN], check=True)
    orphan = Path("/proc", pid_file.read_text().strip())
    deadline = time.monotonic() + 30
    while orphan.exists() and (orphan / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the orphan never finished"
        time.sleep(0.05)
    after = cpu_sample()
    assert after.own - before.own < 0.2 * hz  # not ours (sh's few ticks and this loop at most)
    assert after.busy - before.busy >= 0.3 * hz


def test_other_work_in_cores_and_the_quiet_rule():
    from ascendc_pack.bench.machine import CpuSample, describe_other_work, other_work

    hz = os.sysconf("SC_CLK_TCK")
    start = CpuSample(wall=100.0, busy=1000, steal=10, own=500)
    quiet = other_work(start, CpuSample(wall=110.0, busy=1000 + 15 * hz, steal=10, own=500 + 15 * hz - hz // 2))
    assert quiet == {"cores": 0.05, "steal_cores": 0.0, "seconds": 10.0}
    assert "quiet (< 0.1 cores)" in describe_other_work(quiet)
    busy = other_work(start, CpuSample(wall=110.0, busy=1000 + 15 * hz, steal=10 + 2 * hz, own=500 + 14 * hz))
    assert busy["cores"] == 0.1 and busy["steal_cores"] == 0.2
    assert "BUSY HOST" in describe_other_work(busy)
    assert other_work(start, None) is None and "not measured" in describe_other_work(None)
    assert other_work(start, start) is None  # no time passed


def test_run_all_lists_examples_and_bench_models():
    models = _run_all().MODELS
    assert {"add_sum", "conv_block", "transformer_4x512"} <= set(models)
    assert all(Path(p).is_file() for p in models.values()) and "_bench_deps" not in models


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib (bench extra)")
    ratio = lambda m, stable=True: {"median": m, "q1": m, "q3": m, "n": 3, "rel_iqr": 0.0, "stable": stable}  # noqa: E731
    made_up = {"name": "m", "contenders": {  # plotting only: no number here reaches a document
        "eager": {"status": "ok"}, "ort": {"status": "wrong"}, "bundleN": {"status": "ok"}},
        "ratios": {"bundleN": {"eager": ratio(0.5), "compile": ratio(1.2, stable=False)}}}
    _run_all().chart([made_up, {**made_up, "name": "n"}], tmp_path / "c.png", 4)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_build_time_table(monkeypatch, capsys, tmp_path):
    """`python -m ascendc_pack.bench build`: cold bundle vs AOTI vs torch.compile, warm rebuild."""
    from ascendc_pack.bench import command

    def made_up(model_file, **kw):  # no number here reaches a document
        assert kw["rebuild"] and kw["repeat"] == 0 and set(kw["contenders"]) == set(command.BUILD_CONTENDERS)
        return {"name": Path(model_file).stem, "loadavg_start": [0.5, 0.5, 0.5], "loadavg_end": [0.6, 0.5, 0.5],
                "config": {"torch": "x", "cores": 2}, "contenders": {
                    "compile": {"label": "torch.compile", "status": "ok", "first_call_s": 4.0},
                    "compile_freeze": {"label": "torch.compile freezing", "status": "failed", "reason": "boom"},
                    "aoti": {"label": "AOTInductor (.pt2)", "status": "ok", "build_s": 40.0, "load_at_build": [0.7, 0, 0]},
                    "bundleN": {"label": ".ascpack --topn 4", "status": "ok", "build_s": 30.0, "candidate_compiles": 12,
                                "load_at_build": [1.2, 0, 0],
                                "stages": {"load": 1.5, "capture": 2.0, "graph_compile": 20.0},
                                "rebuild": {"build_s": 3.0, "candidate_compiles": 0}}}}

    monkeypatch.setattr(command, "bench_model", made_up)
    command.main(["build", "a.py", "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("a "))
    assert row.split()[:4] == ["a", "30.00", "1.50", "2.00"] and row.endswith("0.75  0.7 / 1.2")  # bundle ÷ AOTI, loads
    assert "10%" in row and "12" in row and "at start: load average 0.50" in out
    assert "a: torch.compile freezing: failed: boom" in out
    assert json.loads((tmp_path / "b.json").read_text())[0]["name"] == "a"
