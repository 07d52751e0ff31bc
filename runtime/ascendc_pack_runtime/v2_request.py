"""Strict decoding and encoding of Open Inference Protocol (V2) inference requests.

One decoder for both framings: a JSON body, and the binary tensor extension (a JSON part of
``Inference-Header-Content-Length`` bytes followed by the tensors' bytes). It checks the
request against the model's :class:`Signature` before anything large is built: the number of
JSON values (commas) before parsing, names, exact V2 datatype names, integer shapes and
``binary_data_size`` against the static shapes before any list, array or tensor exists. Every
problem is a :class:`~ascendc_pack_runtime.v2.RequestError` (HTTP 400) that names what was sent
(quoted through :func:`~ascendc_pack_runtime.v2.short`) and what the model expects.

Non-finite floats (one behaviour in both directions): JSON ``data`` of a floating input may
hold the literals ``NaN``, ``Infinity`` and ``-Infinity`` (what Python's ``json`` and
tritonclient's rapidjson write for them), and a JSON output that holds non-finite values is
written with the same literals, never as ``null``. A number too large for a double (``1e999``)
is refused. Binary tensors carry every IEEE value as it is.

Needs torch, numpy and orjson; imports no server.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from math import prod
from typing import Sequence

import orjson
import torch

from . import v2
from .batching import BatchError, BatchSpec
from .model import TensorSpec
from .v2 import RequestError, short

IHCL = "inference-header-content-length"
"""The binary extension's header (lower case, as ASGI servers hand headers over)."""
MAX_ID_CHARS = 1024
"""Longest request ``id`` accepted (it is echoed in the response)."""
_DECIMAL = re.compile(r"[0-9]{1,15}")
_NONFINITE = re.compile(rb"NaN|Infinity")
_JSON_TYPES = ("application/json", "text/json")


@dataclass(frozen=True, eq=False)
class Signature:
    """What a request to one model is checked against (from the bundle's manifest)."""

    model: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch: BatchSpec | None = None
    """How the model batches (:func:`ascendc_pack_runtime.batching.batch_spec`): requests carry
    ``[rows, *item]`` per input; None: the static shapes exactly."""
    input_index: dict[str, int] = field(init=False)
    output_index: dict[str, int] = field(init=False)
    output_datatypes: tuple[str, ...] = field(init=False)
    max_values: int = field(init=False)
    """Most JSON values (commas) a request can need: every input's elements plus slack."""

    def __post_init__(self):
        for s in (*self.inputs, *self.outputs):
            v2.v2_datatype(s)  # refuses dtypes V2 cannot carry
        object.__setattr__(self, "input_index", {s.name: i for i, s in enumerate(self.inputs)})
        object.__setattr__(self, "output_index", {s.name: i for i, s in enumerate(self.outputs)})
        object.__setattr__(self, "output_datatypes", tuple(v2.v2_datatype(s) for s in self.outputs))
        if self.batch is None:
            numel = sum(prod(s.shape) for s in self.inputs)
        else:   # the largest batch; an item dim of any size counts 1 (the body size limit bounds it)
            numel = sum(self.batch.max_batch * prod(max(d, 1) for d in b.item_shape) for b in self.batch.inputs)
        object.__setattr__(self, "max_values", numel + 1024 + 64 * (len(self.inputs) + len(self.outputs)))


@dataclass(frozen=True)
class DecodedRequest:
    """A request that fits the model: its tensors in input order and the outputs to return."""

    id: str
    tensors: tuple[torch.Tensor, ...]
    outputs: tuple[tuple[int, bool], ...]
    """(output index, binary?) per output to return, in the order asked for."""


@dataclass(frozen=True)
class EncodedResponse:
    """Response bytes; ``json_length`` is the binary extension's header value, None for pure JSON."""

    body: bytes
    json_length: int | None


# ----------------------------------------------------------------------------- framing


def json_length(content_type: str | None, header_length: str | None) -> int | None:
    """How the body is framed: the JSON part's length for the binary extension, None for a JSON
    body. ``Inference-Header-Content-Length`` must be plain decimal digits (not ``" 183 "``,
    ``"+183"`` or ``"18_3"``)."""
    if header_length is not None:
        if not _DECIMAL.fullmatch(header_length):
            raise RequestError("Inference-Header-Content-Length must be an integer written as plain decimal "
                               f"digits, got {short(header_length)}")
        return int(header_length)
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media not in _JSON_TYPES and not media.endswith("+json"):
        raise RequestError(
            "the body is neither JSON (send 'Content-Type: application/json') nor a binary-extension request "
            f"(send the header 'Inference-Header-Content-Length: <bytes of the JSON part>'); got Content-Type "
            f"{short(content_type)}")
    return None


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range of a 64-bit float; write Infinity or -Infinity "
                         "if you mean it")
    return value


def parse_json(data: bytes | memoryview, what: str) -> object:
    """Parse ``data`` (UTF-8 JSON); ``NaN``/``Infinity``/``-Infinity`` literals are accepted,
    numbers that overflow a double and nesting deeper than the parser's limit are refused."""
    try:
        return orjson.loads(data)  # strict RFC 8259, nesting limit 1024
    except orjson.JSONDecodeError as e:
        error = e
    raw = bytes(data)
    if _NONFINITE.search(raw) is None:
        hint = "; a number too large for a double is refused: write Infinity or -Infinity if you mean it" \
            if "infinity" in str(error) else ""
        raise RequestError(f"{what} is not valid JSON ({error}{hint})")
    try:  # json accepts the three non-finite literals; numbers are checked by _finite_float
        return json.loads(raw.decode("utf-8"), parse_float=_finite_float)
    except RecursionError:
        raise RequestError(f"{what} is not valid JSON (it nests deeper than this server parses)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, _finite_float, huge integers
        raise RequestError(f"{what} is not valid JSON ({str(e)[:200]})") from None


# ----------------------------------------------------------------------------- requests


def decode_request(sig: Signature, body: bytes, length: int | None) -> DecodedRequest:
    """Decode ``body`` (framed as :func:`json_length` says) against ``sig``."""
    if length is None:
        if not body:
            raise RequestError('the request body is empty; send a V2 inference request {"inputs": [...]}')
        n, what = len(body), "the body"
    else:
        if not 0 < length <= len(body):
            raise RequestError(f"Inference-Header-Content-Length is {length}, but the body has {len(body)} "
                               "bytes; it must be the length of the JSON part (> 0, <= body)")
        n, what = length, f"the JSON part (the first {length} bytes, per Inference-Header-Content-Length)"
    commas = body.count(b",", 0, n)
    if commas > sig.max_values:
        raise RequestError(f"{what} holds {commas} commas, more JSON values than a request to model "
                           f"{sig.model!r} can need ({sig.max_values}); refused before parsing")
    view = memoryview(body)
    return decode_fields(sig, parse_json(view[:n], what), view, n)


def _object(value: object, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{where} must be true or false, got {short(value)}")
    return value


def decode_fields(sig: Signature, req: object, body: memoryview = memoryview(b""), offset: int = 0) -> DecodedRequest:
    """Check a parsed request (``req``) and build its tensors; binary data is ``body[offset:]``."""
    if not isinstance(req, dict):
        raise RequestError(f"the inference request must be a JSON object with 'inputs', got {type(req).__name__}")
    rid = req.get("id", "")
    if not isinstance(rid, str):
        raise RequestError(f"'id' must be a string, got {short(rid)}")
    if len(rid) > MAX_ID_CHARS:
        raise RequestError(f"'id' is {len(rid)} characters long; at most {MAX_ID_CHARS} (it is echoed)")
    try:
        rid.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"'id' {short(rid)} is not valid Unicode text (a lone surrogate)") from None
    params = _object(req.get("parameters"), "'parameters'")
    inputs = req.get("inputs")
    if not isinstance(inputs, list):
        raise RequestError("the inference request needs 'inputs': an array of "
                           "{name, shape, datatype, data | parameters.binary_data_size}")
    given: list = [None] * len(sig.inputs)
    for k, d in enumerate(inputs):  # names, datatypes, shapes and sizes first; no data is converted
        where = f"inputs[{k}]"
        if not isinstance(d, dict):
            raise RequestError(f"{where} must be an object, got {type(d).__name__}")
        name = d.get("name")
        if not isinstance(name, str):
            raise RequestError(f"{where}.name must be a string, got {short(name)}")
        i = sig.input_index.get(name)
        if i is None:
            raise RequestError(f"model {sig.model!r} has no input {short(name)}; its inputs are "
                               f"{v2.signature(sig.inputs)}")
        if given[i] is not None:
            raise RequestError(f"input {name!r} is given twice")
        spec = sig.inputs[i]
        if "datatype" not in d or "shape" not in d:
            raise RequestError(f"{where} ({name!r}) needs 'datatype' and 'shape'; expected {v2.describe(spec)}")
        if sig.batch is None:
            v2.check_header(spec, d["datatype"], d["shape"])
        else:   # this request's shape, checked against [rows, *item]
            spec = v2.check_batched_header(spec, sig.batch.inputs[i].item_shape, sig.batch.max_batch, d["datatype"],
                                           d["shape"])
        p = _object(d.get("parameters"), f"{where} ({name!r}).parameters")
        if "binary_data_size" in p:
            size, want = p["binary_data_size"], prod(spec.shape) * spec.dtype.itemsize
            if type(size) is not int or size < 0:
                raise RequestError(f"{where} ({name!r}).parameters.binary_data_size must be an integer >= 0, "
                                   f"got {short(size)}")
            if "data" in d:
                raise RequestError(f"{where} ({name!r}) has both 'data' and parameters.binary_data_size")
            if size != want:
                raise RequestError(f"input {name!r} has {size} bytes of binary data, expected {want} "
                                   f"({prod(spec.shape)} x {v2.v2_datatype(spec)} for shape {list(spec.shape)})")
            if offset + size > len(body):
                raise RequestError(f"{where} ({name!r}) declares {size} bytes of binary data but only "
                                   f"{len(body) - offset} bytes follow")
            given[i] = ("binary", body[offset:offset + size], spec)
            offset += size
        elif "data" in d:
            given[i] = ("json", d["data"], spec)
        else:
            raise RequestError(f"{where} ({name!r}) has neither 'data' nor parameters.binary_data_size")
    if offset != len(body):
        raise RequestError(f"the body has {len(body) - offset} bytes after the last input's binary data; "
                           "binary_data_size of the inputs must add up to the bytes after the JSON part")
    missing = [s for s, g in zip(sig.inputs, given) if g is None]
    if missing:
        raise RequestError(f"missing input(s) {v2.signature(missing)}; model {sig.model!r} takes "
                           f"{v2.signature(sig.inputs)}")
    wanted = requested_outputs(sig, req.get("outputs"), params)
    tensors = tuple(v2.tensor_from_bytes(spec, value) if kind == "binary" else v2.tensor_from_json(spec, value)
                    for kind, value, spec in given)
    if sig.batch is not None:
        try:
            sig.batch.rows(tensors)   # one number of rows for every input
        except BatchError as e:
            raise RequestError(str(e)) from None
    return DecodedRequest(rid, tensors, wanted)


def requested_outputs(sig: Signature, outputs: object, params: dict) -> tuple[tuple[int, bool], ...]:
    """(output index, binary?) per output to return: the requested ones, else all."""
    default_binary = _flag(params.get("binary_data_output", False), "parameters.binary_data_output")
    if not outputs:
        if outputs is not None and not isinstance(outputs, list):
            raise RequestError("'outputs' must be an array of {name, parameters?}")
        wanted = [(i, default_binary) for i in range(len(sig.outputs))]
    else:
        if not isinstance(outputs, list):
            raise RequestError("'outputs' must be an array of {name, parameters?}")
        wanted, seen = [], set()
        for k, o in enumerate(outputs):
            name = o.get("name") if isinstance(o, dict) else None
            if not isinstance(name, str):
                raise RequestError(f"outputs[{k}] must be an object with a string 'name', got {short(o)}")
            i = sig.output_index.get(name)
            if i is None:
                raise RequestError(f"model {sig.model!r} has no output {short(name)}; its outputs are "
                                   f"{v2.signature(sig.outputs)}")
            if i in seen:
                raise RequestError(f"output {name!r} is requested twice")
            seen.add(i)
            p = _object(o.get("parameters"), f"outputs[{k}] ({name!r}).parameters")
            binary = _flag(p["binary_data"], f"outputs[{name!r}].parameters.binary_data") \
                if "binary_data" in p else default_binary
            wanted.append((i, binary))
    for i, binary in wanted:
        dt = sig.output_datatypes[i]
        if not binary and dt in ("FP16", "BF16"):
            raise RequestError(f"output {sig.outputs[i].name!r} is {dt}, which JSON cannot carry; "
                               "request it with parameters.binary_data = true")
    return tuple(wanted)


# ----------------------------------------------------------------------------- responses


def encode_response(sig: Signature, request_id: str, flat: Sequence[torch.Tensor],
                    wanted: Sequence[tuple[int, bool]]) -> EncodedResponse:
    """The V2 response for the model's flat outputs: JSON, or JSON + binary tensors."""
    outputs, raws, finite = [], [], True
    for i, binary in wanted:
        t = flat[i]
        entry = {"name": sig.outputs[i].name, "datatype": sig.output_datatypes[i], "shape": list(t.shape)}
        if binary:
            raw = v2.tensor_bytes(t)
            entry["parameters"] = {"binary_data_size": len(raw)}
            raws.append(raw)
        else:
            finite = finite and v2.all_finite(t)
            entry["data"] = v2.tensor_json(t)
        outputs.append(entry)
    res = {"model_name": sig.model, "model_version": "1", "id": request_id, "outputs": outputs}
    # orjson writes NaN and Infinity as null: json writes the literals the decoder accepts
    head = orjson.dumps(res) if finite else json.dumps(res, separators=(",", ":")).encode()
    if not raws:
        return EncodedResponse(head, None)
    return EncodedResponse(b"".join([head, *raws]), len(head))


__all__ = ["IHCL", "MAX_ID_CHARS", "Signature", "DecodedRequest", "EncodedResponse", "json_length",
           "parse_json", "decode_request", "decode_fields", "requested_outputs", "encode_response"]
