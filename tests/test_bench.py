"""Smoke tests of the model benchmark (ascendc_pack/bench.py `model`, bench/run_all.py).

Tiny models, one or two rounds; nothing here asserts a timing. Each contender's code path
(worker processes, AOTInductor, ONNX Runtime, bundles, cold start, kernel table, report, chart)
runs at least once.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from ascendc_pack import bench
from ascendc_pack.cli import main

from .conftest import ROOT

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



def _ok(result, cid):
    c = result["contenders"][cid]
    assert c["status"] == "ok", c
    assert c["check"] == "ok" and c["max_abs_diff"] < 1e-4, c
    assert c["median_us"] > 0 and c["p90_us"] >= c["median_us"] and c["calls"] >= 1
    return c


def test_percentile_and_reason():
    assert bench._percentile([1.0], 90) == 1.0
    assert bench._percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert bench._percentile(list(range(11)), 90) == pytest.approx(9.0)
    assert bench._reason(RuntimeError("\n  first line\nsecond")) == "RuntimeError: first line"
    assert len(bench._reason(ValueError("x" * 1000))) == 300


def test_eager_and_onnxruntime_in_worker_processes(write_model, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = write_model(TINY)
    r = bench.bench_model(model, contenders=["eager", "ort"], repeat=2, cold_runs=0, sample_ms=2,
                          work_dir=tmp_path / "work", log=lambda _: None)
    _ok(r, "eager")
    ort_ = _ok(r, "ort")
    assert ort_["size"] > 0 and ort_["build_s"] > 0 and ort_["rounds"] == 2
    assert (tmp_path / "work" / "logs" / "run-ort.log").exists()  # it ran in its own process
    text = bench.format_report(r)
    assert "ONNX Runtime" in text and "one process per contender" in text


def test_failed_contenders_are_reported_not_raised(write_model):
    model = write_model(DATA_DEPENDENT)
    r = bench.bench_model(model, contenders=["eager", "aoti", "bundle1"], repeat=1, cold_runs=1,
                          sample_ms=1, same_process=True, log=lambda _: None)
    _ok(r, "eager")
    for cid in ("aoti", "bundle1"):
        c = r["contenders"][cid]
        assert c["status"] == "failed" and c["reason"].startswith("build: "), c
    assert {k: e["error"] for k, e in r["cold_start"].items()} == {
        "pt2": "not run: AOTInductor (.pt2) failed", "ascpack": "not run: .ascpack --topn 1 failed"}
    assert r["kernels"] == []
    text = bench.format_report(r)
    assert text.count("FAILED: build: ") == 2


def test_dead_worker_is_reported(write_model):
    r = bench.bench_model(write_model(DIES), contenders=["eager"], repeat=1, cold_runs=0, log=lambda _: None)
    c = r["contenders"]["eager"]
    assert c["status"] == "failed" and "exited with code 7" in c["reason"], c


def test_model_that_raises_fails_every_contender(write_model):
    broken = write_model(TINY.replace("return torch.relu", "raise KeyError('boom'); return torch.relu"))
    r = bench.bench_model(broken, contenders=["eager", "ort"], repeat=1, cold_runs=0, log=lambda _: None)
    for c in r["contenders"].values():
        assert c["status"] == "failed" and "eager reference run" in c["reason"] and "boom" in c["reason"], c
    assert "FAILED" in bench.format_report(r)


@pytest.mark.slow
def test_aoti_built_timed_and_cold_started(write_model):
    r = bench.bench_model(write_model(TINY), contenders=["eager", "aoti"], repeat=1, cold_runs=1, sample_ms=1,
                          same_process=True, log=lambda _: None)
    c = _ok(r, "aoti")
    assert c["size"] > 0 and c["build_s"] > 0
    assert "ratio_bundleN" not in c and set(r["cold_start"]) == {"pt2"}
    entry = r["cold_start"]["pt2"]
    assert "error" not in entry and len(entry["runs"]) == 1 and entry["median_total_s"] > 0


@pytest.mark.slow
def test_bundles_with_cold_start_and_kernels(write_model):
    """Two bundles (--topn 1 and 2) built, timed, cold-started; the kernel table."""
    r = bench.bench_model(write_model(TINY), topn=2, contenders=["bundle1", "bundleN"], repeat=1, cold_runs=1,
                          sample_ms=1, same_process=True, log=lambda _: None)
    for cid in ("bundle1", "bundleN"):
        c = _ok(r, cid)
        assert c["size"] > 0 and c["build_s"] > 0 and "tune" in c["stages"]
    assert r["contenders"]["bundleN"]["ratio_bundleN"] == pytest.approx(1.0)
    assert set(r["cold_start"]) == {"ascpack"} and r["cold_start"]["ascpack"]["of"] == "bundleN"
    entry = r["cold_start"]["ascpack"]
    assert "error" not in entry and len(entry["runs"]) == 1 and entry["median_total_s"] > 0
    assert r["kernels"] and r["kernels_of"] == "bundleN"
    k = r["kernels"][0]
    assert k["candidates"] == 2 and k["bytes"] > 0 and k["copy_us"] > 0 and k["winner_us"] > 0
    text = bench.format_report(r)
    assert "cold start" in text and "fused kernels of .ascpack --topn 2" in text


def test_onnx_runtime_missing_an_inplace_update_is_flagged(write_model):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = write_model(TINY.replace("return torch.relu(x + y)", "x.add_(y)\n        return torch.relu(x)"))
    r = bench.bench_model(model, contenders=["eager", "ort"], repeat=1, cold_runs=0, sample_ms=1,
                          same_process=True, log=lambda _: None)
    assert r["contenders"]["eager"]["check"] == "ok"
    ort_ = r["contenders"]["ort"]
    assert ort_["status"] == "ok" and ort_["max_abs_diff"] < 1e-5  # the outputs are right ...
    assert ort_["check"].startswith("mismatch: input 0 after the call")  # ... x is not updated


def test_cli_bench_and_unknown_contender(write_model, tmp_path):
    model = write_model(TINY)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", str(model), "--contenders", "eager", "--same-process",
                                       "--repeat", "1", "--cold-runs", "0", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "eager" in result.output and "median us" in result.output
    assert json.loads(out.read_text())["contenders"]["eager"]["status"] == "ok"
    result = CliRunner().invoke(main, ["bench", str(model), "--contenders", "tvm"])
    assert result.exit_code == 1 and "unknown contenders" in result.output
    result = CliRunner().invoke(main, ["bench", str(tmp_path / "missing.py")])
    assert result.exit_code == 1 and "no such file" in result.output


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    return run_all


def test_run_all_writes_report(write_model, tmp_path):
    model = write_model(TINY, "tiny.py")
    out = tmp_path / "PERF.md"
    _run_all().main(["--models", str(model), "--contenders", "eager", "--same-process", "--repeat", "1",
                     "--cold-runs", "0", "--sample-ms", "1", "--out", str(out)])
    text = out.read_text()
    assert "## Machine" in text and "run_all.py --models" in text and "### tiny" in text
    assert "| eager |" in text and "vector ISA flags" in text
    assert not (tmp_path / "performance.png").exists()  # no bundle ratio, no chart


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    made_up = {"name": "m", "contenders": {  # plotting only: no number here reaches a document
        "eager": {"status": "ok", "ratio_bundleN": 0.5}, "ort": {"status": "failed"},
        "bundleN": {"status": "ok", "ratio_bundleN": 1.0}}}
    _run_all().chart([made_up, {**made_up, "name": "n"}], tmp_path / "c.png", 4)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
