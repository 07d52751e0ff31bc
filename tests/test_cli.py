"""The command line as a user runs it (a real subprocess for the entry point)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from ascendc_pack import __version__
from ascendc_pack.cli.main import main

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


# ----------------------------------------------------------------------------- build


def test_build_reports_every_stage_and_per_stage_seconds(tmp_path):
    from ascendc_pack_runtime import read_manifest

    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.config import BuildConfig

    out = tmp_path / "add_sum.ascpack"
    args = ["build", str(EXAMPLES / "add_sum.py"), "--topn", "2", "--cache-dir", str(tmp_path / "c"), "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    err = result.stderr  # not a terminal: plain lines, one per stage start and end at least
    for line in ("capture ...", "capture done in", "fuse done in", "compile 0/2 ...", "compile 2/2 done in",
                 "tune 0/1 ...", "tune 1/1 done in", "graph compile + bundle ...", "graph compile + bundle done in"):
        assert line in err, err
    assert "\r" not in err
    summary = result.stdout.splitlines()[-1]
    for stage in ("capture", "fuse", "compile", "tune", "graph compile", "bundle"):
        assert f"{stage} " in summary and " s" in summary
    assert "2 candidate compiles, 0 cached, 0 failed; 1 kernels profiled, 0 candidates disqualified" in summary
    manifest = read_manifest(out)
    backend = get_backend(manifest.backend)
    assert manifest.backend == "cpu" == backend.name
    assert manifest.target == backend.manifest_target(BuildConfig(cache_dir=tmp_path / "c"))
    assert backend.host_problems(manifest) == []
    # warm: everything from the cache
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    assert "0 candidate compiles, 2 cached, 0 failed; 0 kernels profiled" in again.stdout
    assert "tune 0/0 done in" in again.stderr


def test_build_unknown_backend_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["build", str(EXAMPLES / "add_sum.py"), "--backend", "tpu",
                                       "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "--backend must be one of cpu, npu, npu-emu, got: 'tpu'" in result.output
    assert not list(tmp_path.iterdir())


SLOW_GXX = """#!/bin/sh
# a g++ that hangs on kernel compiles (so a test can interrupt the build mid-compile)
case " $* " in *" -shared "*) echo $$ >> "$AP_TEST_PIDS"; exec sleep 120;; esac
exec {real} "$@"
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_during_compile_stops_cleanly(tmp_path, jobs):
    import os
    import shutil
    import signal
    import time

    bin_dir, pids = tmp_path / "bin", tmp_path / "pids"
    bin_dir.mkdir()
    gxx = bin_dir / "g++"
    gxx.write_text(SLOW_GXX.format(real=shutil.which("g++")))
    gxx.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "AP_TEST_PIDS": str(pids)}
    out, cache = tmp_path / "m.ascpack", tmp_path / "c"
    proc = subprocess.Popen([sys.executable, "-m", "ascendc_pack", "build", str(EXAMPLES / "mlp.py"), "--topn", "2",
                             "--jobs", str(jobs), "--cache-dir", str(cache), "-o", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # Ctrl-C as in a terminal, even when this run's parent ignores SIGINT (a job started
                            # with `&` by a script inherits SIG_IGN, and Python then installs no handler)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not (pids.exists() and len(pids.read_text().split()) >= jobs):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the foreground group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted: no bundle was written" in stderr and "compile 0/" in stderr
    assert "interrupted in" in stderr
    assert "Traceback" not in stderr and "failed to compile" not in stderr, stderr
    assert not out.exists()
    assert not list(cache.rglob("compile_error.txt")) and not list(cache.rglob("kernel.so"))
    assert not list(cache.rglob("*.tmp"))
    deadline = time.monotonic() + 20
    for pid in map(int, pids.read_text().split()):  # the hanging compilers were killed, not orphaned
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"compiler process {pid} still runs"
            time.sleep(0.1)
