"""The command line as a user runs it (a real subprocess for the entry point)."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from ascendc_pack import __version__
from ascendc_pack.cli import main

from .conftest import EXAMPLES


def test_python_m_help_and_version():
    out = subprocess.run([sys.executable, "-m", "ascendc_pack", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and __version__ in out.stdout
    out = subprocess.run([sys.executable, "-m", "ascendc_pack", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "capture" in out.stdout


def test_capture_prints_program_and_checks_reference():
    result = CliRunner().invoke(main, ["capture", str(EXAMPLES / "add_sum.py")])
    assert result.exit_code == 0, result.output
    assert "aten.add.Tensor" in result.output and "aten.sum.dim_IntList" in result.output
    assert "reference executor matches eager on example inputs" in result.output


def test_capture_json():
    result = CliRunner().invoke(main, ["capture", "--json", "--no-check", str(EXAMPLES / "add_sum.py")])
    assert result.exit_code == 0
    assert '"format_version": 1' in result.output


def test_capture_bad_file_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(main, ["capture", str(tmp_path / "missing.py")])
    assert result.exit_code == 1
    assert "error:" in result.output and "no such file" in result.output
