"""The C++ API (runtime/include/ascendc_pack/runtime.hpp) through examples/cpp/run_bundle.cpp:
built with g++ against the installed libtorch, run on an extracted bundle, compared with eager;
and its refusals (host ISA, unverified directory, modified members, wrong inputs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ascendc_pack_runtime.bundle import open_bundle

from .runtime_fixtures import eager_reference, example, run_bundle_binary

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="needs g++")


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    return run_bundle_binary(tmp_path_factory)


@pytest.fixture(scope="module")
def inplace(tmp_path_factory):
    """The in-place example: input x is mutated and returned (exercises write-back and aliasing)."""
    b = example(tmp_path_factory, "inplace")
    extracted = open_bundle(b.bundle, cache_dir=tmp_path_factory.mktemp("cpp_cache"))
    return b, extracted.directory


def _run(binary: Path, *args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    e.update(env or {})
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout)


def _write_inputs(prefix: Path, inputs) -> None:
    for i, t in enumerate(inputs):
        t.contiguous().numpy().tofile(f"{prefix}{i}.bin")


def test_cpp_api_matches_eager(binary, inplace, tmp_path):
    b, directory = inplace
    inputs, _ = eager_reference(b)
    eager_in = tuple(t.clone() for t in inputs)
    with torch.no_grad():
        expected = b.loaded.module(*eager_in)        # mutates eager_in[0]
    _write_inputs(tmp_path / "in", inputs)
    proc = _run(binary, directory, "--inputs", tmp_path / "in", "--outputs", tmp_path / "out", "--inputs-after",
                tmp_path / "after", "--repeat", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    specs = b.report.manifest["outputs"]
    flat = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(flat) == len(specs)
    for i, (e, spec) in enumerate(zip(flat, specs)):
        assert f"output {i} ({spec['name']}): Float [{', '.join(map(str, e.shape))}]" in proc.stdout
        got = torch.from_numpy(np.fromfile(f"{tmp_path / 'out'}{i}.bin", dtype="float32"))
        assert torch.allclose(got.reshape(e.shape), e, atol=1e-4, rtol=1e-4), f"output {i} differs"
    # the model mutates x in place: the graph wrote the new value into the caller's tensor
    assert b.report.manifest["mutations"] == [{"input": "x", "index": 0, "value": "add"}]
    for i, e in enumerate(eager_in):
        got = torch.from_numpy(np.fromfile(f"{tmp_path / 'after'}{i}.bin", dtype="float32")).reshape(e.shape)
        assert torch.allclose(got, e, atol=1e-5, rtol=1e-5), f"input {i} after the call differs from eager's"
    assert not torch.equal(eager_in[0], inputs[0])
    assert "latency p50" in proc.stdout


def test_cpp_api_refusals(binary, inplace, tmp_path):
    b, directory = inplace
    inputs, _ = eager_reference(b)
    _write_inputs(tmp_path / "in", inputs)
    manifest = b.report.manifest

    # 1. a host without the bundle's ISA features: refused before dlopen, naming the field
    proc = _run(binary, directory, "--host-cpu-flags", "sse sse2")
    if manifest["target"]["isa"] and set(manifest["target"]["isa"]) - {"sse", "sse2"}:
        assert proc.returncode == 2 and "target.isa" in proc.stderr and "--march" in proc.stderr, proc.stderr

    # 2. a directory that is not a verified extraction (no marker): refused
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    (copy / ".ascpack-verified").unlink()
    proc = _run(binary, copy)
    assert proc.returncode == 2 and "not a verified extraction" in proc.stderr

    # 3. a modified member: a size change is always caught, a same-size change with --verify-hashes
    shutil.rmtree(copy)
    shutil.copytree(directory, copy)
    src = (copy / "graph.cpp").read_bytes()
    (copy / "graph.cpp").write_bytes(src[:-1] + bytes([src[-1] ^ 1]))
    assert _run(binary, copy, "--inputs", tmp_path / "in").returncode == 0      # sizes only (default)
    proc = _run(binary, copy, "--verify-hashes")
    assert proc.returncode == 2 and "graph.cpp" in proc.stderr and "sha256" in proc.stderr
    (copy / "graph.cpp").write_bytes(src + b"\n")
    proc = _run(binary, copy)
    assert proc.returncode == 2 and "graph.cpp" in proc.stderr and "bytes" in proc.stderr

    # 4. wrong input count, shape and dtype are std::invalid_argument naming the input, never a crash
    proc = _run(binary, directory, "--inputs", tmp_path / "in", "--check-bad-inputs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rejected = [ln for ln in proc.stdout.splitlines() if ln.startswith("rejected: ")]
    assert len(rejected) == 3
    assert "takes 2 input(s), got 1" in rejected[0]
    assert "shape [3], expected [512, 2048]" in rejected[1] and "dtype Double, expected Float" in rejected[2]
