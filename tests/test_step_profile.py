"""Per-step profile of a bundle's call: ``profile_steps`` and ``run --profile N``."""

from __future__ import annotations

import re

import pytest
import torch
from click.testing import CliRunner

import ascendc_pack_runtime as rt
from ascendc_pack.cli.main import main
from ascendc_pack_runtime.step_profile import StepProfile, StepTime
from ascendc_pack_runtime.tools import run_bundle

from .runtime_fixtures import eager_reference, example


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


@pytest.fixture(scope="module")
def inplace(tmp_path_factory):
    return example(tmp_path_factory, "inplace")


def test_every_kernel_launch_is_a_named_step(add_sum):
    model = rt.load(add_sum.bundle)
    inputs, _ = eager_reference(add_sum)
    prof = rt.profile_steps(model, tuple(inputs), calls=4)
    kernels = {k.name for k in model.contract.kernels}
    assert kernels and kernels <= {s.name for s in prof.steps}  # graph_interp's event per launch
    assert prof.calls == 4 and all(s.calls == 4 for s in prof.steps)
    assert [s.position for s in prof.steps] == sorted(s.position for s in prof.steps)
    assert all(s.median_us > 0 for s in prof.steps)
    assert 0 < prof.steps_us <= prof.call_median_us
    with torch.profiler.record_function("caller's own range"):  # the run event then has a parent
        assert [s.name for s in rt.profile_steps(model, tuple(inputs), calls=2).steps] == [s.name for s in prof.steps]
    model.close()


def test_run_profile_prints_the_slowest_steps(add_sum, tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDC_PACK_RUNTIME_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(main, ["run", str(add_sum.bundle), "--repeat", "2", "--profile", "3"])
    assert res.exit_code == 0, res.output
    assert re.search(r"step profile over 3 call\(s\) \(torch.profiler\): median call [\d.]+ ms", res.output)
    kernel = rt.read_manifest(add_sum.bundle).kernels[0].name
    assert re.search(rf"\d+\.\d +\d+\.\d %  {kernel}", res.output)
    res = CliRunner().invoke(main, ["run", str(add_sum.bundle), "--profile", "-1"])
    assert res.exit_code == 2 and "'--profile': -1 is not in the range x>=0" in res.output
    lines, rc, _ = run_bundle(add_sum.bundle, repeat=1, profile=-2)
    assert rc == 1 and lines == ["error: --profile must be a number of calls, 0 or more (got -2)"]
    _, rc, result = run_bundle(add_sum.bundle, repeat=1)
    assert rc == 0 and result["profile"] is None  # not asked: not profiled


def test_profile_of_a_model_that_mutates_its_inputs(inplace):
    lines, rc, result = run_bundle(inplace.bundle, repeat=1, profile=2)
    assert rc == 0, lines
    assert result["profile"].calls == 2 and result["profile"].steps


def test_calls_must_be_positive(add_sum):
    model = rt.load(add_sum.bundle)
    with pytest.raises(ValueError, match="at least 1"):
        rt.profile_steps(model, tuple(torch.zeros(s.shape) for s in model.input_specs), calls=0)
    model.close()


def test_report_ranks_steps_and_totals_names():
    prof = StepProfile(5, 100.0, (StepTime("aten::addmm", 0, 0, 30.0, 5), StepTime("fused_k", 0, 1, 10.0, 5),
                                  StepTime("aten::addmm", 1, 2, 40.0, 3)))
    assert prof.steps_us == 80.0
    assert prof.by_name() == [("aten::addmm", 2, 70.0), ("fused_k", 1, 10.0)]
    text = "\n".join(prof.lines(top=2))
    assert "4 steps" not in text and "3 steps 0.080 ms, other (interpreter + profiler) 0.020 ms" in text
    slowest = text.split("per name:")[0]
    assert slowest.index("aten::addmm #1") < slowest.index("aten::addmm\n") and "fused_k" not in slowest
    assert "70.0  70.0 %  aten::addmm" in text
