"""``ascendc-pack inspect | verify | run`` and ``python -m ascendc_pack_runtime``."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ascendc_pack.cli.main import main

from .runtime_fixtures import eager_reference, example, missing_host_feature, pack, parts_of, reg


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDC_PACK_RUNTIME_CACHE", str(tmp_path / "cache"))
    return CliRunner()


def test_inspect_summary_and_json(add_sum, runner):
    res = runner.invoke(main, ["inspect", str(add_sum.bundle)])
    assert res.exit_code == 0, res.output
    out = res.output
    m = add_sum.report.manifest
    k = m["kernels"][0]
    for text in ("model    add_sum", f"-march={m['target']['march']}", "x: float32[32, 1024]",
                 "y: float32[1, 1024]", "output_0: float32[]", k["name"], k["kernel_key"], k["tiling_repr"],
                 "not visited (candidate 0 kept)", "0 visited by PGO", "* #0", f"torch    {torch.__version__}",
                 "graph.so", "weights  0 tensors"):
        assert text in out, f"{text!r} missing from:\n{out}"
    res = runner.invoke(main, ["inspect", "--json", str(add_sum.bundle)])
    assert res.exit_code == 0 and json.loads(res.output) == m


def test_inspect_shows_candidates_timings_and_visited(add_sum):
    from ascendc_pack_runtime.manifest import Candidate, Kernel, Manifest, kernel_key_of
    from ascendc_pack_runtime.tools import inspect_text

    base = Manifest.from_json(add_sum.report.manifest)
    cands = [Candidate(i, kernel_key_of(t, 0, bd), t, 0, bd, med, failed)
             for i, (t, bd, med, failed) in enumerate([("t=1", 2, 12.5, False), ("t=2", 4, 8.25, False),
                                                       ("t=3", 4, None, True)])]
    kernel = Kernel("fused_k", cands[1].kernel_key, "t=2", 0, 4, base.kernels[0].file, True, 1, tuple(cands))
    m = dataclasses.replace(base, kernels=(kernel,)).validate()
    text = inspect_text(m)
    assert "1 fused, 1 visited by PGO" in text and "[visited]" in text
    assert re.search(r"\s #0\s+12\.5 us", text) and re.search(r"\* #1\s+8\.2 us", text)
    assert re.search(r"#2\s+failed", text)


def test_verify_exit_codes_and_one_line_per_problem(add_sum, runner, tmp_path):
    res = runner.invoke(main, ["verify", str(add_sum.bundle)])
    assert res.exit_code == 0 and res.output.startswith("OK ")
    p = parts_of(add_sum.bundle)
    p.member("graph.cpp")[1] += b"//"
    p.members.append([reg("../evil", b"x"), b"x"])
    p.manifest["target"]["isa"].append(missing_host_feature())
    bad = tmp_path / "bad.ascpack"
    bad.write_bytes(pack(p))
    res = runner.invoke(main, ["verify", str(bad)])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["MemberSizeError", "UnsafeMemberNameError",
                                                  "MissingCpuFeaturesError"]
    trunc = tmp_path / "trunc.ascpack"
    trunc.write_bytes(add_sum.bundle.read_bytes()[:-100])
    res = runner.invoke(main, ["verify", str(trunc)])
    assert res.exit_code == 1 and res.output.startswith("CorruptArchiveError: ")
    assert not (tmp_path / "cache").exists()   # verify writes nothing


def test_run_random_and_npz(add_sum, runner, tmp_path):
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--random", "--repeat", "5"])
    assert res.exit_code == 0, res.output
    assert "output 0 output_0: float32[]" in res.output
    assert re.search(r"latency over 5 call\(s\).*p50 [\d.]+ ms, p90 [\d.]+ ms, p99 [\d.]+ ms", res.output)
    inputs, expected = eager_reference(add_sum)
    np.savez(tmp_path / "in.npz", x=inputs[0].numpy(), y=inputs[1].numpy())
    from ascendc_pack_runtime.tools import run_bundle

    lines, rc, result = run_bundle(add_sum.bundle, inputs_file=str(tmp_path / "in.npz"), repeat=2)
    assert rc == 0 and result["outputs"] == [{"dtype": "float32", "shape": []}]
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--inputs", str(tmp_path / "in.npz"), "--repeat", "2"])
    assert res.exit_code == 0 and "in.npz" in res.output
    np.savez(tmp_path / "wrong.npz", x=inputs[0].numpy()[:, :10], y=inputs[1].numpy())
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--inputs", str(tmp_path / "wrong.npz")])
    assert res.exit_code == 1 and "shape [32, 10], expected [32, 1024]" in res.output
    p = parts_of(add_sum.bundle)
    p.manifest["torch"]["version"] = "1.13.0"
    bad = tmp_path / "old.ascpack"
    bad.write_bytes(pack(p))
    res = runner.invoke(main, ["run", str(bad)])
    assert res.exit_code == 1 and "TorchVersionMismatchError" in res.output


def test_runtime_module_cli_extracts_for_the_cpp_api(add_sum, tmp_path):
    env_cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "ascendc_pack_runtime", "extract", str(add_sum.bundle),
                           "--cache-dir", str(env_cache)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    d = proc.stdout.strip()
    assert d.startswith(str(env_cache)) and (env_cache / d.split("/")[-1] / ".ascpack-verified").is_file()
