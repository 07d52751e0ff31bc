"""The runtime as its own distribution (docs/DESIGN.md §4.9): build the ``ascendc-pack-runtime``
wheel from ``runtime/``, install it with the ``serve`` extra into a fresh venv that has no
ascendc_pack (torch==2.13.0, the local CPU build), and there load, verify, run and serve a bundle
built here: one real V2 request from tritonclient, outputs equal to eager's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from .conftest import ROOT
from .runtime_fixtures import eager_reference, example
from .serve_helpers import Server, infer, io_names

PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input"]


def run(cmd, cwd: Path, timeout: float = 900, env=None) -> str:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of runtime/ (a build writes build/ and *.egg-info beside its sources)."""
    tmp = tmp_path_factory.mktemp("runtime_wheel")
    src = shutil.copytree(ROOT / "runtime", tmp / "runtime", ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                                        "*.egg-info"))
    run([sys.executable, *PIP, "wheel", "--no-deps", "-q", src, "-w", tmp / "dist"], tmp)
    (whl,) = (tmp / "dist").glob("ascendc_pack_runtime-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with torch==2.13.0 and the wheel with its ``serve`` extra; the python in it."""
    where = tmp_path_factory.mktemp("runtime_venv")
    run([sys.executable, "-m", "venv", where / "venv"], where)
    python = where / "venv" / "bin" / "python"
    run([python, *PIP, "install", "-q", "--no-compile", "torch==2.13.0", f"{wheel}[serve]"], where)
    return python


def test_the_wheel_holds_the_runtime_and_headers_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ascendc_pack_runtime", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "ascendc_pack_runtime/include/ascendc_pack/runtime.hpp" in names
    assert "ascendc_pack_runtime/include/ascendc_pack/graph_interp.h" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert {re.match(r"[\w.-]+", r)[0] for r in requires if "extra ==" not in r} == {"torch", "zstandard"}
    assert any(r.startswith("kserve") and 'extra == "serve"' in r for r in requires)


SCRIPT = textwrap.dedent("""\
    import importlib.util, json, sys
    import torch
    import ascendc_pack_runtime as rt
    assert importlib.util.find_spec("ascendc_pack") is None, "the compiler is installed here"
    bundle, data = sys.argv[1], torch.load(sys.argv[2])
    model = rt.load(bundle)
    out = model(*data["inputs"])
    outs = out if isinstance(out, (tuple, list)) else (out,)
    ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(outs, data["expected"]))
    print(json.dumps({"ok": ok, "runtime": rt.__file__, "headers": str(rt.include_dir())}))
""")


def test_a_fresh_venv_without_the_compiler_loads_runs_and_serves_a_bundle(venv, tmp_path_factory):
    built = example(tmp_path_factory, "mlp")
    inputs, expected = eager_reference(built)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    work = tmp_path_factory.mktemp("runtime_wheel_run")  # not the checkout: its ascendc_pack is not on sys.path
    torch.save({"inputs": inputs, "expected": tuple(expected)}, work / "data.pt")
    (work / "check.py").write_text(SCRIPT)
    env = dict(os.environ, ASCENDC_PACK_RUNTIME_CACHE=str(work / "rt_cache"))
    env.pop("PYTHONPATH", None)
    result = json.loads(run([venv, "check.py", built.bundle, work / "data.pt"], work, env=env).splitlines()[-1])
    assert result["ok"] and str(venv.parents[1]) in result["runtime"]
    assert Path(result["headers"], "ascendc_pack", "kernel_abi.h").is_file()
    assert "ok" in run([venv, "-m", "ascendc_pack_runtime", "verify", built.bundle], work, env=env).lower()

    import tritonclient.http as httpclient

    srv = Server(built.bundle, work / "server.log", work / "srv_cache", name="mlp",
                 command=[str(venv), "-m", "ascendc_pack_runtime.server"], cwd=work)
    with srv:
        name_in, name_out = io_names(built.bundle)
        client = httpclient.InferenceServerClient(srv.url)
        x = inputs[0].numpy()
        got = infer(client, "mlp", name_in, name_out, x, binary=True)
        client.close()
    np.testing.assert_allclose(got, expected[0].numpy(), rtol=1e-4, atol=1e-5)
