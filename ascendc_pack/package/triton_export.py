"""Export a bundle as a Triton Inference Server model repository (Python backend).

``ascendc-pack export-triton model.ascpack -o REPO/`` writes::

    REPO/<name>/config.pbtxt                 backend "python", inputs/outputs from the manifest
    REPO/<name>/1/model.py                   TritonPythonModel (ascendc_pack_runtime/triton_model.py)
    REPO/<name>/1/model.ascpack              the bundle, unchanged
    REPO/<name>/1/ascendc_pack_runtime/      the runtime's Python files (unless vendor_runtime=False)

and tritonserver serves it (HTTP/gRPC V2; :mod:`ascendc_pack.package.triton_setup` prepares the
Python backend directory and prints the command). The configuration is
:func:`ascendc_pack_runtime.triton_config.model_config`: a bundle with static shapes has
``max_batch_size: 0`` and full ``dims`` (every request is one call); one whose manifest declares
a batch dim (:func:`ascendc_pack_runtime.batching.batch_spec`) gets ``max_batch_size`` and
``dynamic_batching`` with its tuned batch sizes preferred, and model.py runs each batch Triton
forms as one call.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ascendc_pack_runtime
from ascendc_pack_runtime.batching import batch_spec
from ascendc_pack_runtime.bundle import open_bundle
from ascendc_pack_runtime.model import TensorSpec
from ascendc_pack_runtime.tensor_meta import DTYPES
from ascendc_pack_runtime.triton_config import (DEFAULT_BUNDLE, DEFAULT_QUEUE_DELAY_US, model_config, to_pbtxt,
                                                triton_type)
from ascendc_pack_runtime.v2 import v2_datatype

from ascendc_pack.errors import PackError

MODEL_VERSION = "1"
BUNDLE_FILE = DEFAULT_BUNDLE
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
    max_batch_size: int = 0
    """0: static shapes; else the bundle's largest batch."""
    batching: bool = False
    """Whether Triton's dynamic batcher groups requests (a batch dim, dynamic_batching on)."""


def render_config(name: str, inputs: list[TensorSpec], outputs: list[TensorSpec], *, instances: int = 1,
                  bundle_file: str = BUNDLE_FILE, source: str = "", batch=None, threads: int | None = None,
                  max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US, dynamic_batching: bool = True) -> str:
    """config.pbtxt text of the model (protobuf text format)."""
    return to_pbtxt(model_config(name, inputs, outputs, batch=batch, instances=instances, bundle_file=bundle_file,
                                 threads=threads, max_queue_delay_us=max_queue_delay_us,
                                 dynamic_batching=dynamic_batching), source)


def _io_spec(d: dict, where: str) -> TensorSpec:
    """A manifest input/output; in a bundle of plans (format version 2, verified when it was
    opened) a dynamic dim is named instead of sized, and stays that name."""
    if any(isinstance(n, str) for n in d["shape"]):
        return TensorSpec(d["name"], tuple(d["shape"]), DTYPES[d["dtype"]])
    return TensorSpec.from_json(d, where)


def _runtime_dir() -> Path:
    return Path(ascendc_pack_runtime.__file__).resolve().parent


def export_triton(bundle: str | Path, repo: str | Path, *, name: str | None = None, instances: int = 1,
                  vendor_runtime: bool = True, force: bool = False, threads: int | None = None,
                  max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US, dynamic_batching: bool = True) -> TritonExport:
    """Write ``repo/<name>/`` for Triton's Python backend; returns the paths written.

    ``threads``: thread cap of each instance's calls (default: torch's threads // ``instances``,
    decided in each instance); ``max_queue_delay_us``: how long Triton's dynamic batcher holds a
    request for others; ``dynamic_batching`` False: no dynamic batcher, each request one call
    (bundles with a batch dim only; the comparison without batching).

    The bundle is verified first (a typed :class:`ascendc_pack_runtime.BundleError` if it is
    broken). An existing ``repo/<name>`` is replaced only with ``force``; the new directory
    is assembled next to it and renamed into place.
    """
    bundle = Path(bundle)
    manifest = open_bundle(bundle).manifest
    name = name or str(manifest.get("model", {}).get("name", "model"))
    if not _NAME_RE.fullmatch(name):
        raise TritonExportError(f"model name {name!r} cannot be a Triton model directory; use letters, digits, "
                                "'_', '.' and '-' (starting with a letter or digit)")
    if not isinstance(instances, int) or instances < 1:
        raise TritonExportError(f"instances must be an integer >= 1, got {instances!r}")
    inputs = [_io_spec(d, f"inputs[{i}]") for i, d in enumerate(manifest["inputs"])]
    outputs = [_io_spec(d, f"outputs[{i}]") for i, d in enumerate(manifest["outputs"])]
    for s in inputs + outputs:
        v2_datatype(s)  # UnservableBundleError (a ValueError) for complex tensors
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise TritonExportError(f"threads must be an integer >= 1, got {threads!r}")
    if not isinstance(max_queue_delay_us, int) or max_queue_delay_us < 0:
        raise TritonExportError(f"max_queue_delay_us must be an integer >= 0, got {max_queue_delay_us!r}")
    batch = batch_spec(manifest)

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
                                                        source=bundle.name, batch=batch, threads=threads,
                                                        max_queue_delay_us=max_queue_delay_us,
                                                        dynamic_batching=dynamic_batching))
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
                        model_py=final / MODEL_VERSION / "model.py", bundle=final / MODEL_VERSION / BUNDLE_FILE,
                        max_batch_size=batch.max_batch if batch else 0, batching=batch is not None and dynamic_batching)


__all__ = ["export_triton", "render_config", "triton_type", "TritonExport", "TritonExportError"]
