"""Open Inference Protocol (V2) names for a bundle's tensors, shared by the serving adapters.

Used by :mod:`ascendc_pack_runtime.kserve_model` (KServe) and
:mod:`ascendc_pack_runtime.triton_model` (Triton's Python backend). Needs torch and numpy only:
it imports neither server.

A request error is a :class:`RequestError` (a ``ValueError``) whose message names the tensor,
what was sent and what the model expects; the adapters turn it into HTTP 400 / ``INVALID_ARG``.
"""

from __future__ import annotations

import warnings
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


def check_header(spec: TensorSpec, datatype: object, shape: object) -> None:
    """The request's datatype and shape of input ``spec`` must be the model's."""
    want = v2_datatype(spec)
    if datatype != want:
        hint = "" if datatype in ALL_V2_DATATYPES else f" ({datatype!r} is not a V2 datatype)"
        raise RequestError(f"input {spec.name!r} has datatype {datatype!r}{hint}, expected {want!r}")
    if not isinstance(shape, (list, tuple)) or any(type(d) is not int for d in shape) \
            or list(shape) != list(spec.shape):
        raise RequestError(f"input {spec.name!r} has shape {shape!r}, expected {list(spec.shape)} "
                           "(the bundle was built for static shapes)")


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


def tensor_from_json(spec: TensorSpec, data: object) -> torch.Tensor:
    """A tensor from JSON ``data`` (flat or nested, row-major)."""
    dt = v2_datatype(spec)
    if not isinstance(data, list):
        raise RequestError(f"input {spec.name!r}: 'data' must be a JSON array, got {type(data).__name__}")
    np_dtype = NUMPY_DTYPES.get(dt, np.dtype(np.float32))
    try:
        arr = np.asarray(data, dtype=np_dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise RequestError(f"input {spec.name!r}: 'data' is not an array of {dt} values ({e})") from None
    numel = prod(spec.shape)
    if arr.size != numel:
        raise RequestError(f"input {spec.name!r} has {arr.size} values in 'data', expected {numel} "
                           f"for shape {list(spec.shape)}")
    t = torch.from_numpy(np.ascontiguousarray(arr).reshape(spec.shape))
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


__all__ = ["V2_DATATYPES", "TORCH_DTYPES", "RequestError", "UnservableBundleError", "v2_datatype",
           "metadata", "describe", "signature", "check_header", "tensor_from_bytes",
           "tensor_from_json", "tensor_bytes", "tensor_json"]
