"""``ascendc-pack run`` / ``python -m ascendc_pack_runtime run``: --check MODEL.py (the accuracy
rule against the eager module), --save-outputs F.npz, --threads N, and numpy being optional."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ascendc_pack.cli.main import main

from .conftest import EXAMPLES
from .runtime_fixtures import eager_reference, example


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDC_PACK_RUNTIME_CACHE", str(tmp_path / "cache"))
    return CliRunner()


def _variant(write_model, body: str):
    """add_sum's signature with another forward body (x: [32, 1024], y: [1, 1024])."""
    return write_model(f"""
import torch


class Variant(torch.nn.Module):
    def forward(self, x, y):
        {body}


def get_model():
    return Variant()
""", name="variant.py")


def test_check_passes_and_prints_error_and_allowed_error(add_sum, runner):
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--check", str(EXAMPLES / "add_sum.py"), "--repeat", "2"])
    assert res.exit_code == 0, res.output
    assert "check against" in res.output and "check: OK" in res.output
    m = re.search(r"^  output_0: max error (\S+) \(allowed (\S+)\)$", res.output, re.M)
    assert m and float(m.group(1)) <= float(m.group(2)), res.output


def test_check_mismatch_exits_1_and_tolerances_override(add_sum, runner, write_model):
    off = _variant(write_model, "return torch.add(x, y).sum() + 0.5")
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--check", str(off), "--repeat", "1"])
    assert res.exit_code == 1
    assert "exceeds the allowed" in res.output and "check: MISMATCH: 1 of 1 output(s) differ from eager" in res.output
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--check", str(off), "--repeat", "1", "--atol", "1"])
    assert res.exit_code == 0 and "check: OK" in res.output, res.output
    two = _variant(write_model, "return torch.add(x, y).sum(), x")
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--check", str(two), "--repeat", "1"])
    assert res.exit_code == 1 and "the bundle gives 1 output tensors, the model file's module 2" in res.output


def test_check_refuses_a_model_file_without_a_module(add_sum, runner, write_model):
    bad = write_model("x = 1\n", name="nomodel.py")
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--check", str(bad)])
    assert res.exit_code == 1 and "get_model() (or `model`) must give a torch.nn.Module, got NoneType" in res.output
    boom = write_model("raise RuntimeError('nope')\n", name="boom.py")
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--check", str(boom)])
    assert res.exit_code == 1 and "raised RuntimeError: nope" in res.output


def test_runtime_module_check_never_imports_the_compiler(add_sum, tmp_path):
    code = f"""
import sys
from ascendc_pack_runtime.__main__ import main
rc = main(["run", {str(add_sum.bundle)!r}, "--check", {str(EXAMPLES / 'add_sum.py')!r}, "--repeat", "1",
           "--threads", "1", "--cache-dir", {str(tmp_path / 'cache')!r}])
assert "ascendc_pack" not in sys.modules, "the runtime imported the compiler package"
sys.exit(rc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: OK" in proc.stdout and "threads: cap 1" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "ascendc_pack_runtime", "run", str(add_sum.bundle), "--threads", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "'0' is not a positive integer" in proc.stderr


def test_save_outputs_round_trip(add_sum, runner, tmp_path):
    inputs, expected = eager_reference(add_sum)
    np.savez(tmp_path / "in.npz", x=inputs[0].numpy(), y=inputs[1].numpy())
    out = tmp_path / "out.npz"
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--inputs", str(tmp_path / "in.npz"), "--repeat", "1",
                               "--save-outputs", str(out), "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert f"saved 1 output(s) to {out}: output_0" in res.output and "threads: cap 1" in res.output
    names = [o["name"] for o in add_sum.report.manifest["outputs"]]
    with np.load(out) as saved:
        assert list(saved.keys()) == names
        torch.testing.assert_close(torch.from_numpy(saved[names[0]]), expected)
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--save-outputs", str(tmp_path / "no" / "dir.npz")])
    assert res.exit_code == 1 and "cannot write --save-outputs" in res.output


def test_without_numpy_the_npz_options_say_how_to_get_it(add_sum, runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)   # `import numpy` raises ImportError
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--save-outputs", str(tmp_path / "o.npz")])
    assert res.exit_code == 1 and "--save-outputs F.npz needs numpy, which is not installed: pip install numpy" in \
        res.output
    assert not (tmp_path / "cache").exists()   # refused before loading anything
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--inputs", str(tmp_path / "in.npz")])
    assert res.exit_code == 1 and "--inputs FILE.npz needs numpy, which is not installed: pip install numpy" in res.output


def test_threads_option_is_validated(add_sum, runner):
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--threads", "abc"])
    assert res.exit_code == 2 and "'abc' is not a positive integer" in res.output
    res = runner.invoke(main, ["run", str(add_sum.bundle), "--threads", "2", "--repeat", "1"])
    assert res.exit_code == 0 and "threads: cap 2" in res.output
