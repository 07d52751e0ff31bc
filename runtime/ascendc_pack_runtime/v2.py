"""Open Inference Protocol (V2) names and tensor codecs for a bundle's tensors.

Shared by the serving adapters: :mod:`ascendc_pack_runtime.v2_request` (the strict request
decoder of ``ascendc-pack serve``) and :mod:`ascendc_pack_runtime.triton_model` (Triton's Python
backend, which copies this package: so this module needs torch and numpy only).

A request error is a :class:`RequestError` (a ``ValueError``) whose message names the tensor,
what was sent and what the model expects; the adapters turn it into HTTP 400 / ``INVALID_ARG``.
Values a client sent are quoted through :func:`short`, so a 10 MiB name is never echoed whole.
"""

from __future__ import annotations

import reprlib
import warnings
from itertools import chain
from math import prod
from typing import Sequence

import numpy as np
import torch

from .model import TensorSpec

# torch dtype -> V2 datatype (triton-inference-server/common, kserve required_api.md). complex
# has no V2 datatype: such a bundle cannot be served.
V2_DATATYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL", torch.uint8: "UINT8", torch.int8: "INT8", torch.int16: "INT16",
    torch.int32: "INT32", torch.int64: "INT64", torch.float16: "FP16", torch.bfloat16: "BF16",
    torch.float32: "FP32", torch.float64: "FP64",
}
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in V2_DATATYPES.items()}
# numpy dtype used for JSON data (BF16 has none: parsed as float32, then rounded)
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
ALL_V2_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                    "FP16", "FP32", "FP64", "BF16", "BYTES")
"""Every datatype name of the V2 protocol, spelled exactly (upper case)."""

# Python types a JSON value of each datatype may have (bool is not a number here, nor int a bool)
_JSON_KINDS: dict[str, frozenset] = {"BOOL": frozenset({bool})}
_JSON_KINDS.update({d: frozenset({int}) for d in ("UINT8", "INT8", "INT16", "INT32", "INT64")})
_JSON_KINDS.update({d: frozenset({int, float}) for d in ("FP16", "FP32", "FP64", "BF16")})

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 8
_REPR.maxlevel = 3


def short(value: object) -> str:
    """A bounded ``repr`` of a value a client sent (strings, lists and depth truncated)."""
    text = _REPR.repr(value)
    if isinstance(value, str) and len(value) > _REPR.maxstring:
        text += f" ({len(value)} characters)"
    return text


class RequestError(ValueError):
    """A request does not fit the model's signature (an HTTP 400 / Triton INVALID_ARG)."""


class UnservableBundleError(ValueError):
    """The bundle has a tensor no V2 datatype can carry (e.g. complex)."""


def v2_datatype(spec: TensorSpec) -> str:
    try:
        return V2_DATATYPES[spec.dtype]
    except KeyError:
        raise UnservableBundleError(
            f"tensor {spec.name!r} has dtype {spec.dtype}, which the Open Inference Protocol cannot "
            f"carry (datatypes: {', '.join(sorted(set(V2_DATATYPES.values())))}); change the model to "
            "return real tensors (e.g. torch.view_as_real) and rebuild") from None


def metadata(specs: Sequence[TensorSpec]) -> list[dict]:
    """``[{"name", "datatype", "shape"}]`` of model metadata (shapes are static)."""
    return [{"name": s.name, "datatype": v2_datatype(s), "shape": list(s.shape)} for s in specs]


def describe(spec: TensorSpec) -> str:
    return f"{spec.name!r} ({v2_datatype(spec)} {list(spec.shape)})"


def signature(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(describe(s) for s in specs)


def check_datatype(spec: TensorSpec, datatype: object) -> None:
    """The request's datatype of input ``spec`` must be the model's V2 datatype name, spelled
    exactly (``"FP32"``, not ``"fp32"``)."""
    want = v2_datatype(spec)
    if datatype != want:
        hint = "" if datatype in ALL_V2_DATATYPES else \
            f", which is not a V2 datatype (they are {', '.join(ALL_V2_DATATYPES)}, spelled so)"
        raise RequestError(f"input {spec.name!r} has datatype {short(datatype)}{hint}; expected {want!r}")


def _int_dims(shape: object) -> bool:
    return isinstance(shape, (list, tuple)) and all(type(d) is int for d in shape)


def check_header(spec: TensorSpec, datatype: object, shape: object) -> None:
    """The request's datatype and shape of input ``spec`` must be the model's, spelled exactly:
    a V2 datatype name and a list of JSON integers (not ``"256"``, not ``true``)."""
    check_datatype(spec, datatype)
    if not _int_dims(shape) or list(shape) != list(spec.shape):
        raise RequestError(f"input {spec.name!r} has shape {short(shape)}, expected {list(spec.shape)} "
                           "(a list of integers; the bundle was built for static shapes)")


def check_batched_header(spec: TensorSpec, item_shape: Sequence[int], max_rows: int, datatype: object,
                         shape: object) -> TensorSpec:
    """Like :func:`check_header` for an input that batches along dim 0: the shape is ``[rows,
    *item_shape]`` with 1 <= rows <= ``max_rows`` (an item dim of -1 takes any size >= 1);
    returns ``spec`` with the request's shape."""
    check_datatype(spec, datatype)
    want = "[rows, " + ", ".join("*" if d < 0 else str(d) for d in item_shape) + "]" if item_shape else "[rows]"
    if not _int_dims(shape) or len(shape) != 1 + len(item_shape) or not 1 <= shape[0] <= max_rows or any(
            (d < 1) if w < 0 else (d != w) for w, d in zip(item_shape, shape[1:])):
        raise RequestError(f"input {spec.name!r} has shape {short(shape)}, expected {want} with 1 <= rows <= "
                           f"{max_rows} (a list of integers)")
    return TensorSpec(spec.name, tuple(shape), spec.dtype)


def metadata_of(specs: Sequence[TensorSpec], item_shapes: Sequence[Sequence[int]] | None = None) -> list[dict]:
    """Model metadata entries; with ``item_shapes`` (a batching model) each shape is ``[-1, *item]``
    (V2 writes a variable dim as -1)."""
    if item_shapes is None:
        return metadata(specs)
    return [{"name": s.name, "datatype": v2_datatype(s), "shape": [-1, *[int(d) for d in item]]}
            for s, item in zip(specs, item_shapes)]


def tensor_from_bytes(spec: TensorSpec, raw) -> torch.Tensor:
    """A fresh, writable tensor from little-endian row-major bytes (the binary extension)."""
    numel = prod(spec.shape)
    nbytes = numel * spec.dtype.itemsize
    if len(raw) != nbytes:
        raise RequestError(f"input {spec.name!r} has {len(raw)} bytes of binary data, expected {nbytes} "
                           f"({numel} x {v2_datatype(spec)} for shape {list(spec.shape)})")
    if nbytes == 0:
        return torch.empty(spec.shape, dtype=spec.dtype)
    with warnings.catch_warnings():  # a read-only buffer: cloned right away
        warnings.simplefilter("ignore")
        flat = torch.frombuffer(raw, dtype=torch.uint8)
    if spec.dtype == torch.bool and bool((flat > 1).any()):
        raise RequestError(f"input {spec.name!r} is BOOL but holds bytes other than 0 and 1")
    return flat.clone().view(spec.dtype).reshape(spec.shape)


def _flat_values(spec: TensorSpec, data: object) -> list:
    """``data`` as one flat list, checked against the static shape before anything is built:
    either flat with exactly numel values, or nested exactly as the shape (row-major)."""
    if not isinstance(data, list):
        raise RequestError(f"input {spec.name!r}: 'data' must be a JSON array, got {type(data).__name__}")
    numel = prod(spec.shape)
    if not data or not isinstance(data[0], list):
        if len(data) != numel:
            raise RequestError(f"input {spec.name!r} has {len(data)} values in 'data', expected {numel} "
                               f"for shape {list(spec.shape)}")
        return data
    level = [data]
    for depth, dim in enumerate(spec.shape):
        for item in level:
            if not isinstance(item, list) or len(item) != dim:
                got = f"an array of {len(item)}" if isinstance(item, list) else type(item).__name__
                raise RequestError(f"input {spec.name!r}: 'data' is nested but not as shape {list(spec.shape)} "
                                   f"(at depth {depth}: {got}, expected an array of {dim}); send a flat array of "
                                   f"{numel} values or arrays nested exactly as the shape")
        level = list(chain.from_iterable(level))
    return level


def tensor_from_json(spec: TensorSpec, data: object) -> torch.Tensor:
    """A tensor from JSON ``data`` (flat or nested, row-major), strictly typed.

    BOOL takes ``true``/``false`` only, integer datatypes JSON integers in range, floating
    datatypes numbers, including the non-finite values ``NaN``, ``Infinity`` and ``-Infinity``
    (which the decoder accepts as literals); a finite number the datatype cannot hold (``1e39``
    for FP32) is refused, not rounded to infinity.
    """
    dt = v2_datatype(spec)
    flat = _flat_values(spec, data)
    kinds = set(map(type, flat))
    wrong = kinds - _JSON_KINDS[dt]
    if wrong:
        bad = next(v for v in flat if type(v) in wrong)
        want = {"BOOL": "true or false", "FP16": "numbers", "FP32": "numbers", "FP64": "numbers",
                "BF16": "numbers"}.get(dt, "integers")
        raise RequestError(f"input {spec.name!r} ({dt}): 'data' holds {type(bad).__name__} values such as "
                           f"{short(bad)}; expected {want}")
    np_dtype = NUMPY_DTYPES.get(dt, np.dtype(np.float32))
    info = np.iinfo(np_dtype) if np_dtype.kind in "iu" else None
    rng = f" ({info.min}..{info.max})" if info is not None else ""
    try:
        with np.errstate(over="ignore"):
            if info is None:
                arr = np.array(flat, dtype=np_dtype)
            else:   # range-checked here: numpy 1.x wraps an out-of-range Python int silently
                wide = np.array(flat, dtype=np.int64)
                if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
                    bad = int(wide[(wide < info.min) | (wide > info.max)][0])
                    raise OverflowError(f"{bad} does not fit")
                arr = wide.astype(np_dtype)
    except (OverflowError, ValueError) as e:
        raise RequestError(f"input {spec.name!r}: a value in 'data' is out of range for {dt}{rng} ({e})") from None
    if np_dtype.kind == "f" and np_dtype != np.float64 and np.isinf(arr).any():
        wide = np.array(flat, dtype=np.float64)
        overflow = np.isinf(arr) & np.isfinite(wide)
        if overflow.any():
            raise RequestError(f"input {spec.name!r}: value {float(wide[overflow][0])!r} in 'data' is out of range "
                               f"for {dt} (write Infinity if you mean it)")
    t = torch.from_numpy(arr.reshape(spec.shape))
    return t.to(spec.dtype) if t.dtype != spec.dtype else t


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Row-major little-endian bytes of ``t`` (the binary extension's layout)."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def tensor_json(t: torch.Tensor) -> list:
    """Flat JSON data of ``t`` (callers refuse FP16/BF16, which JSON cannot carry exactly)."""
    return t.detach().contiguous().reshape(-1).numpy().tolist()


def all_finite(t: torch.Tensor) -> bool:
    """False when a floating tensor holds NaN or +-Infinity."""
    return not t.is_floating_point() or bool(torch.isfinite(t).all())


__all__ = ["V2_DATATYPES", "TORCH_DTYPES", "ALL_V2_DATATYPES", "RequestError", "UnservableBundleError",
           "v2_datatype", "metadata", "metadata_of", "describe", "signature", "check_datatype", "check_header",
           "check_batched_header", "tensor_from_bytes",
           "tensor_from_json", "tensor_bytes", "tensor_json", "all_finite", "short"]
