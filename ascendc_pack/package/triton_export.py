"""Export a bundle as a Triton Inference Server model repository (Python backend).

``ascendc-pack export-triton model.ascpack -o REPO/`` writes::

    REPO/<name>/config.pbtxt                 backend "python", inputs/outputs from the manifest
    REPO/<name>/1/model.py                   TritonPythonModel (ascendc_pack_runtime/triton_model.py)
    REPO/<name>/1/model.ascpack              the bundle, unchanged
    REPO/<name>/1/ascendc_pack_runtime/      the runtime's Python files (unless vendor_runtime=False)

and ``tritonserver --model-repository REPO`` serves it (HTTP/gRPC V2, with Triton's own
batching of requests across instances). Shapes are static, so ``max_batch_size`` is 0 and
``dims`` are the full shapes; a 0-d tensor is ``dims: [ 1 ]`` with ``reshape: { shape: [ ] }``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ascendc_pack_runtime
from ascendc_pack_runtime.bundle import open_bundle
from ascendc_pack_runtime.model import TensorSpec
from ascendc_pack_runtime.v2 import v2_datatype

from ascendc_pack.errors import PackError

MODEL_VERSION = "1"
BUNDLE_FILE = "model.ascpack"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class TritonExportError(PackError):
    """The repository cannot be written as asked (name, existing directory)."""


@dataclass(frozen=True)
class TritonExport:
    repo: Path
    model_dir: Path
    config: Path
    model_py: Path
    bundle: Path


def triton_type(spec: TensorSpec) -> str:
    """The config.pbtxt ``data_type`` of a tensor (``TYPE_FP32``, ...)."""
    dt = v2_datatype(spec)
    return "TYPE_STRING" if dt == "BYTES" else f"TYPE_{dt}"


def _tensor_block(spec: TensorSpec) -> str:
    lines = ["  {", f"    name: {json.dumps(spec.name)}", f"    data_type: {triton_type(spec)}"]
    if spec.shape:
        lines.append(f"    dims: [ {', '.join(str(d) for d in spec.shape)} ]")
    else:  # Triton needs at least one dim: carry a scalar as [1], reshaped to []
        lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    lines.append("  }")
    return "\n".join(lines)


def render_config(name: str, inputs: list[TensorSpec], outputs: list[TensorSpec], *, instances: int = 1,
                  bundle_file: str = BUNDLE_FILE, source: str = "") -> str:
    """config.pbtxt text of the model (protobuf text format)."""
    head = f"# written by ascendc-pack export-triton from {source}\n" if source else ""
    return (
        f"{head}name: {json.dumps(name)}\n"
        'backend: "python"\n'
        "max_batch_size: 0\n"
        "input [\n" + ",\n".join(_tensor_block(s) for s in inputs) + "\n]\n"
        "output [\n" + ",\n".join(_tensor_block(s) for s in outputs) + "\n]\n"
        "instance_group [\n  {\n"
        f"    count: {int(instances)}\n"
        "    kind: KIND_CPU\n  }\n]\n"
        "parameters: {\n"
        '  key: "ascpack_bundle"\n'
        f"  value: {{ string_value: {json.dumps(bundle_file)} }}\n"
        "}\n"
    )


def _runtime_dir() -> Path:
    return Path(ascendc_pack_runtime.__file__).resolve().parent


def export_triton(bundle: str | Path, repo: str | Path, *, name: str | None = None, instances: int = 1,
                  vendor_runtime: bool = True, force: bool = False) -> TritonExport:
    """Write ``repo/<name>/`` for Triton's Python backend; returns the paths written.

    The bundle is verified first (a typed :class:`ascendc_pack_runtime.BundleError` if it is
    broken). An existing ``repo/<name>`` is replaced only with ``force``; the new directory
    is assembled next to it and renamed into place.
    """
    bundle = Path(bundle)
    manifest = open_bundle(bundle).manifest
    if "dynamic" in manifest:
        raise TritonExportError(f"{bundle} has dynamic dims (format version 2); exporting them to Triton (dims -1 and "
                        "dynamic_batching on manifest dynamic.batch) is not built yet: export a bundle built with "
                        "static shapes")
    name = name or str(manifest.get("model", {}).get("name", "model"))
    if not _NAME_RE.fullmatch(name):
        raise TritonExportError(f"model name {name!r} cannot be a Triton model directory; use letters, digits, "
                                "'_', '.' and '-' (starting with a letter or digit)")
    if not isinstance(instances, int) or instances < 1:
        raise TritonExportError(f"instances must be an integer >= 1, got {instances!r}")
    inputs = [TensorSpec.from_json(d, f"inputs[{i}]") for i, d in enumerate(manifest["inputs"])]
    outputs = [TensorSpec.from_json(d, f"outputs[{i}]") for i, d in enumerate(manifest["outputs"])]
    for s in inputs + outputs:
        v2_datatype(s)  # UnservableBundleError (a ValueError) for complex tensors

    repo = Path(repo)
    if repo.exists() and not repo.is_dir():
        raise TritonExportError(f"{repo} is a file; pass a directory for the model repository")
    repo.mkdir(parents=True, exist_ok=True)
    final = repo / name
    if final.exists() and not force:
        raise TritonExportError(f"{final} already exists; pass --force to replace it, or another --name")

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=repo))
    try:
        version = tmp / MODEL_VERSION
        version.mkdir()
        (tmp / "config.pbtxt").write_text(render_config(name, inputs, outputs, instances=instances,
                                                        source=bundle.name))
        shutil.copyfile(_runtime_dir() / "triton_model.py", version / "model.py")
        shutil.copyfile(bundle, version / BUNDLE_FILE)
        if vendor_runtime:
            shutil.copytree(_runtime_dir(), version / "ascendc_pack_runtime",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "include"))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return TritonExport(repo=repo, model_dir=final, config=final / "config.pbtxt",
                        model_py=final / MODEL_VERSION / "model.py", bundle=final / MODEL_VERSION / BUNDLE_FILE)


__all__ = ["export_triton", "render_config", "triton_type", "TritonExport", "TritonExportError"]
