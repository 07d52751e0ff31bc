"""A bundle's Triton model configuration: written once, checked where it is read.

One description of the configuration, a dict in the JSON form Triton itself reports at
``GET /v2/models/<m>/config`` and hands the Python backend as ``args["model_config"]``
(:func:`model_config`), and three uses of it:

* ``ascendc-pack export-triton`` writes it as ``config.pbtxt`` (:func:`to_pbtxt`);
* the Triton model (:mod:`.triton_model`) refuses, at ``initialize``, a configuration that
  contradicts the bundle (:func:`check_config`, a :class:`ConfigMismatch` naming the field);
* ``ascendc-pack serve`` answers ``GET /v2/models/<m>/config`` with it (what tritonclient's
  ``get_model_config`` asks for).

Batching comes from :func:`ascendc_pack_runtime.batching.batch_spec` only: a bundle without a
batch dim has ``max_batch_size: 0`` and full static ``dims``; one with a batch dim has
``max_batch_size`` = its largest batch, ``dims`` without the batch dim (-1 where another dim
varies) and ``dynamic_batching`` with its tuned sizes as ``preferred_batch_size``. A 0-d tensor
is ``dims: [ 1 ]`` (model.py reshapes it; a batched one with no dims after the batch dim adds
``reshape: { shape: [ ] }``, which Triton refuses without batching).
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from .batching import ANY, BatchSpec
from .model import TensorSpec
from .v2 import v2_datatype

BUNDLE_PARAMETER = "ascpack_bundle"
"""``parameters`` key: the bundle's file name next to model.py."""
THREADS_PARAMETER = "ascpack_threads"
"""``parameters`` key: thread cap of each instance's calls (absent: cores // instances)."""
DEFAULT_BUNDLE = "model.ascpack"
DEFAULT_QUEUE_DELAY_US = 2000
"""``dynamic_batching.max_queue_delay_microseconds`` written by default: how long Triton holds a
request for others to batch with."""


class ConfigMismatch(ValueError):
    """A Triton configuration that contradicts the bundle (the message names the field)."""


def triton_type(spec: TensorSpec) -> str:
    """The config's ``data_type`` of a tensor (``TYPE_FP32``, ...)."""
    dt = v2_datatype(spec)
    return "TYPE_STRING" if dt == "BYTES" else f"TYPE_{dt}"


def _tensor(spec: TensorSpec, dims: Sequence[int], batching: bool) -> dict:
    """One ``input``/``output`` entry. Triton needs at least one dim: a 0-d tensor is ``[1]``
    (model.py reshapes it); a batched one with no dims after the batch dim is ``[1]`` reshaped to
    ``[]`` (Triton refuses an empty reshape without batching: "scalar tensors are not supported")."""
    d = {"name": spec.name, "data_type": triton_type(spec), "dims": [int(x) for x in dims] or [1]}
    if not dims and batching:
        d["reshape"] = {"shape": []}
    return d


def config_dims(spec: TensorSpec, batch: BatchSpec | None, index: int, kind: str) -> list[int]:
    """The ``dims`` a tensor has in the config (before the [1]-for-scalars rule): -1 for a dynamic
    dim (a bundle of plans names it instead of giving a size)."""
    if batch is None:
        return [-1 if isinstance(d, str) else d for d in spec.shape]
    item = (batch.inputs if kind == "input" else batch.outputs)[index].item_shape
    return [-1 if d == ANY else d for d in item]


def model_config(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                 batch: BatchSpec | None = None, instances: int = 1, bundle_file: str = DEFAULT_BUNDLE,
                 max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US, threads: int | None = None,
                 dynamic_batching: bool = True) -> dict:
    """The configuration of the model (Triton's JSON form). ``dynamic_batching`` False (with a
    batch spec): Triton passes each request as it came, with its batch dim, one per call."""
    config: dict = {
        "name": name, "backend": "python", "max_batch_size": batch.max_batch if batch else 0,
        "input": [_tensor(s, config_dims(s, batch, i, "input"), batch is not None) for i, s in enumerate(inputs)],
        "output": [_tensor(s, config_dims(s, batch, i, "output"), batch is not None) for i, s in enumerate(outputs)],
    }
    if batch is not None and dynamic_batching:
        config["dynamic_batching"] = {"preferred_batch_size": list(batch.preferred),
                                      "max_queue_delay_microseconds": int(max_queue_delay_us)}
    config["instance_group"] = [{"count": int(instances), "kind": "KIND_CPU"}]
    params = {BUNDLE_PARAMETER: {"string_value": bundle_file}}
    if threads is not None:
        params[THREADS_PARAMETER] = {"string_value": str(int(threads))}
    config["parameters"] = params
    return config


def _pb_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value.startswith(("TYPE_", "KIND_")) else json.dumps(value)
    return str(value)


def _pb_fields(d: Mapping, indent: str) -> list[str]:
    lines = []
    for key, value in d.items():
        if key == "parameters":
            for k, v in value.items():
                lines.append(f"{indent}parameters: {{\n{indent}  key: {json.dumps(k)}\n"
                             f"{indent}  value: {{ string_value: {json.dumps(v['string_value'])} }}\n{indent}}}")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            blocks = [f"{indent}  {{\n" + "\n".join(_pb_fields(v, indent + "    ")) + f"\n{indent}  }}" for v in value]
            lines.append(f"{indent}{key} [\n" + ",\n".join(blocks) + f"\n{indent}]")
        elif isinstance(value, list):
            items = ", ".join(_pb_value(v) for v in value)
            lines.append(f"{indent}{key}: [ {items} ]" if items else f"{indent}{key}: [ ]")
        elif isinstance(value, dict):
            inner = _pb_fields(value, "")
            lines.append(f"{indent}{key}: {{ {' '.join(inner)} }}" if all("\n" not in x for x in inner)
                         else f"{indent}{key} {{\n" + "\n".join(_pb_fields(value, indent + '  ')) + f"\n{indent}}}")
        else:
            lines.append(f"{indent}{key}: {_pb_value(value)}")
    return lines


def to_pbtxt(config: Mapping, source: str = "") -> str:
    """``config.pbtxt`` text (protobuf text format) of a :func:`model_config` dict."""
    head = f"# written by ascendc-pack export-triton from {source}\n" if source else ""
    return head + "\n".join(_pb_fields(config, "")) + "\n"


def _dims(value) -> list[int]:
    return [int(d) for d in (value or [])]


def check_config(config: Mapping, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 batch: BatchSpec | None) -> None:
    """Refuse a configuration (Triton's JSON form) that contradicts the bundle.

    Checked: ``max_batch_size`` (0 for a bundle without a batch dim; at most its largest batch
    otherwise), ``dynamic_batching`` (only with a batch dim; preferred sizes within
    ``max_batch_size``), and per listed input/output its name, ``data_type`` and ``dims``.

    Raises:
        ConfigMismatch: naming the field, what the bundle has and the fix.
    """
    fix = "re-export the repository with ascendc-pack export-triton (or correct config.pbtxt)"
    mbs = int(config.get("max_batch_size") or 0)
    if batch is None and mbs != 0:
        raise ConfigMismatch(f"config.pbtxt: max_batch_size is {mbs}, but the bundle has static shapes (no batch "
                             f"dim), so Triton must pass whole tensors: set max_batch_size: 0, or {fix}")
    if batch is not None and mbs > batch.max_batch:
        raise ConfigMismatch(f"config.pbtxt: max_batch_size is {mbs}, more than the bundle's largest batch "
                             f"{batch.max_batch}: set max_batch_size <= {batch.max_batch}, or {fix}")
    dyn = config.get("dynamic_batching")
    if dyn is not None and mbs == 0:
        raise ConfigMismatch("config.pbtxt: dynamic_batching is set but max_batch_size is 0 (the bundle "
                             f"{'has no batch dim' if batch is None else 'batches only with max_batch_size > 0'}): "
                             f"remove dynamic_batching, or {fix}")
    for p in _dims((dyn or {}).get("preferred_batch_size")):
        if not 1 <= p <= mbs:
            raise ConfigMismatch(f"config.pbtxt: dynamic_batching.preferred_batch_size has {p}, outside 1.."
                                 f"max_batch_size ({mbs}); {fix}")
    for kind, specs in (("input", inputs), ("output", outputs)):
        listed = list(config.get(kind) or [])
        if not listed:   # Triton fills in nothing, but a hand-written config may leave them out
            continue
        names = [e.get("name") for e in listed]
        if sorted(names) != sorted(s.name for s in specs):
            raise ConfigMismatch(f"config.pbtxt lists {kind}s {names}, the bundle has "
                                 f"{[s.name for s in specs]}; {fix}")
        by_name = {e.get("name"): e for e in listed}
        for i, s in enumerate(specs):
            e = by_name[s.name]
            if e.get("data_type") and e["data_type"] != triton_type(s):
                raise ConfigMismatch(f"config.pbtxt: {kind} {s.name!r} data_type is {e['data_type']}, the bundle's "
                                     f"is {triton_type(s)}; {fix}")
            want = config_dims(s, batch if mbs > 0 else None, i, kind)
            have = _dims(e.get("dims"))
            scalar = want == [] and have == [1]   # a 0-d tensor travels as [1] (reshaped to [] with batching)
            if batch is not None and mbs == 0:   # no Triton batching: full shapes, the batch dim first
                item = config_dims(s, batch, i, kind)
                ok = len(have) == 1 + len(item) and all(w in (-1, h) for w, h in zip([-1, *item], have))
            else:
                ok = have == want or scalar
            if not ok:
                shown = want if batch is None or mbs > 0 else ["rows", *config_dims(s, batch, i, kind)]
                raise ConfigMismatch(f"config.pbtxt: {kind} {s.name!r} dims are {have}, the bundle's are {shown}"
                                     f"{' (dims after the batch dim)' if batch is not None and mbs > 0 else ''}; {fix}")


__all__ = ["BUNDLE_PARAMETER", "THREADS_PARAMETER", "DEFAULT_BUNDLE", "DEFAULT_QUEUE_DELAY_US", "ConfigMismatch",
           "triton_type", "config_dims", "model_config", "to_pbtxt", "check_config"]
