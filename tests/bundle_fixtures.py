"""Shared helpers of the bundle and runtime tests: build every example once per test process
(graph.so compiles are the slow part), and read / rewrite bundles to craft broken ones."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import zstandard

from ascendc_pack.package.bundle import BundleReport, build_bundle, choices_from_candidate0
from ascendc_pack.config import BuildConfig
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.kernels.fused.build import prepare_kernels
from ascendc_pack.frontend.loader import LoadedModel
from ascendc_pack.pipeline import capture_file
from ascendc_pack.ir.program import ModelProgram

from .conftest import EXAMPLE_NAMES, EXAMPLES


@dataclass
class BuiltExample:
    name: str
    bundle: Path
    fused: ModelProgram
    weights: dict
    choices: dict
    loaded: LoadedModel
    report: BundleReport
    config: BuildConfig


_BUILT: dict[str, BuiltExample] = {}


def build_root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "bundle_build"


def build_model_file(path: Path, out: Path, config: BuildConfig) -> BuiltExample:
    """capture -> fuse -> compile candidate 0 of every kernel -> bundle (no PGO)."""
    loaded, captured = capture_file(path)
    fused = fuse(captured.model)
    kernels = prepare_kernels(fused.program, config)
    choices = choices_from_candidate0(fused, kernels)
    report = build_bundle(fused, captured.weights, choices, out, config)
    return BuiltExample(loaded.name, report.path, fused, captured.weights, choices, loaded, report, config)


def build_examples(tmp_path_factory) -> dict[str, BuiltExample]:
    """Every example of examples/ built once per test process (candidate 0 of each kernel)."""
    if not _BUILT:
        root = build_root(tmp_path_factory)
        config = BuildConfig.resolve(topn=1, cache_dir=root / "build_cache", jobs=2)
        for name in EXAMPLE_NAMES:
            _BUILT[name] = build_model_file(EXAMPLES / f"{name}.py", root / "out" / f"{name}.ascpack", config)
    return _BUILT


# ----------------------------------------------------------------------------- raw bundles


def read_bundle(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Every member of a bundle, in archive order, with its bytes."""
    out = []
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            while (m := tar.next()) is not None:
                data = tar.extractfile(m).read() if m.isreg() else b""
                out.append((m, data))
    return out


def manifest_of(path: Path) -> dict:
    info, data = read_bundle(path)[0]
    assert info.name == "manifest.json"
    return json.loads(data)


def write_raw(path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """Write members as given (any type, any name) into a zstd tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def repack(src: Path, dst: Path, edit: Callable[[dict, list[list]], None], fix_hashes: bool = False) -> Path:
    """Rewrite a bundle: ``edit(manifest, members)`` may change the manifest dict and the
    ``[name, bytes]`` list of other members in place; ``fix_hashes`` recomputes sizes/hashes."""
    import hashlib

    entries = read_bundle(src)
    manifest = json.loads(entries[0][1])
    members = [[info.name, data] for info, data in entries[1:]]
    edit(manifest, members)
    if fix_hashes:
        manifest["members"] = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                               for name, data in members}
    out = [reg("manifest.json", json.dumps(manifest).encode())] + [reg(n, d) for n, d in members]
    return write_raw(dst, out)


def clone_inputs(ts) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in ts)


def build_bf16(source: str, root: Path, cache_dir: Path, topn: int):
    """Write ``source`` (a model file) under ``root``, build it with ``--precision bf16`` and a
    short PGO protocol; returns (the loaded model file, the bundle path, the BuildResult)."""
    from ascendc_pack.autotune.protocol import Protocol
    from ascendc_pack.frontend.loader import load_model_file
    from ascendc_pack.pipeline import build

    (root / "model.py").write_text(source)
    loaded = load_model_file(root / "model.py")
    out = root / "model.ascpack"
    res = build(loaded.module, loaded.example_inputs, output=out, cache_dir=cache_dir, jobs=2, topn=topn,
                precision="bf16", protocol=Protocol(warmup=1, min_rounds=3, max_rounds=5, time_cap_s=0.2))
    return loaded, out, res


def assert_within_budget(loaded: LoadedModel, out: Path, res) -> None:
    """The build met its precision budget and verified, and the bundle, loaded by the runtime,
    matches eager on the example input within that budget."""
    import ascendc_pack_runtime as rt
    from ascendc_pack_runtime.accuracy import relative_error

    assert res.precision.error <= res.precision.budget and all(c.ok for c in res.verification)
    x = loaded.example_inputs[0]
    with torch.no_grad():
        want = loaded.module(x)
    with rt.load(out) as model:
        assert relative_error(want, model(x)) <= res.precision.budget
