"""Serve a bundle with KServe's model server: Open Inference Protocol (V2) over REST.

``ascendc-pack serve model.ascpack`` (or ``python -m ascendc_pack_runtime.kserve_model``) runs
:func:`serve`. Needs the ``serve`` extra (``kserve``); the rest of the runtime never imports this
module.

What KServe 0.21 gives as it is: the V2 routes (health, server and model metadata, model ready,
infer), JSON tensors, and the binary tensor extension's framing. What this module adds:

* :class:`AscpackModel`, a ``kserve.Model`` that loads the bundle ``workers`` times (a pool of
  runtime :class:`~ascendc_pack_runtime.Model` instances, each with its own planned buffers:
  one instance serializes its calls), warms every instance up with one call, and only then
  reports ready. Calls run in a thread pool of that size (the graph releases the GIL), so the
  event loop keeps answering health checks and decoding the next request meanwhile.
  Metadata (V2 datatypes and static shapes) comes from the manifest. Inputs are checked against
  it: a wrong name, count, shape, datatype or data length is HTTP 400 with a message that says
  what the model expects.
* A request decoder for the binary extension that checks the framing
  (``Inference-Header-Content-Length``, ``binary_data_size``) and keeps tensors as bytes (KServe
  turns every binary input into a Python list first). BF16 works in binary mode.
* :class:`V2Middleware` (ASGI), for ``tritonclient``: its JSON-mode requests carry no
  ``Content-Type``, and FastAPI's strict content type check then hands KServe the body as
  bytes, which KServe rejects with 400 because no ``Inference-Header-Content-Length`` is set.
  The middleware sets ``Content-Type: application/json`` on a POST that has neither header. It
  also answers ``/v2/models/<m>/versions/1/...`` (KServe answers 501 for any version),
  decompresses ``Content-Encoding: gzip/deflate`` request bodies (tritonclient's
  ``request_compression_algorithm``) and refuses bodies over a size limit with 413.
* Error bodies are ``{"error": "..."}`` (FastAPI's validation errors included, as 400), and
  malformed binary framing is 400, not KServe's 500.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import os
import queue
import re
import sys
import threading
import time
import warnings
import zlib
from math import prod
from pathlib import Path
from typing import Callable, Sequence

import torch


def _import_kserve():
    # kserve.model_server parses sys.argv when it is imported (parse_known_args): hide ours
    argv = sys.argv
    sys.argv = argv[:1]
    try:
        import kserve  # noqa: F401
        from kserve import model_server  # noqa: F401
    except ImportError as e:
        raise ImportError(f"serving needs KServe ({e}); install it with: pip install 'ascendc-pack[serve]'") from None
    finally:
        sys.argv = argv


_import_kserve()

import kserve  # noqa: E402
import orjson  # noqa: E402
from fastapi.exceptions import HTTPException, RequestValidationError  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from kserve.errors import InvalidInput, ModelNotFound, ModelNotReady  # noqa: E402
from kserve.protocol.dataplane import DataPlane  # noqa: E402
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402

from . import v2  # noqa: E402
from .bundle import open_bundle  # noqa: E402
from .model import TensorSpec, load  # noqa: E402

logger = logging.getLogger("kserve")

Runner = Callable[..., Sequence[torch.Tensor]]
"""One model instance: called with the input tensors, returns the flat outputs."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_VERSION_RE = re.compile(r"/v2/models/([^/]+)/versions/([^/]*)(/ready|/infer)?/?")
_IHCL = "inference-header-content-length"


def check_model_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"model name {name!r} is not usable in a URL path; use letters, digits, '_', '.' "
                         "and '-' (at most 128, starting with a letter or digit)")
    return name


def specs_of(manifest: dict) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ins = [TensorSpec.from_json(d, f"inputs[{i}]") for i, d in enumerate(manifest["inputs"])]
    outs = [TensorSpec.from_json(d, f"outputs[{i}]") for i, d in enumerate(manifest["outputs"])]
    return ins, outs


class _NotServed(ModelNotFound):
    def __init__(self, name: str, served: Sequence[str]):
        self.reason = f"model {name!r} is not served here; this server serves {sorted(served)}"


class _Pool:
    """K runners and a K-thread executor: every thread that calls takes a free runner."""

    def __init__(self, runners: list[Runner]):
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for r in runners:
            self._free.put(r)
        self.size = len(runners)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.size,
                                                              thread_name_prefix="ascpack-infer")

    def _call(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        runner = self._free.get()
        try:
            return list(runner(*tensors))
        finally:
            self._free.put(runner)

    async def run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._call, tensors)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        while True:
            try:
                r = self._free.get_nowait()
            except queue.Empty:
                break
            close = getattr(getattr(r, "__self__", None), "close", None)
            if close is not None:
                close()


def bundle_runner(path: str | Path, cache_dir: str | Path | None = None) -> Runner:
    """A runner that is a freshly loaded runtime Model of ``path`` (its own buffers)."""
    return load(path, cache_dir=cache_dir).run_flat


class AscpackModel(kserve.Model):
    """A KServe model serving one ``.ascpack`` bundle (V2 protocol).

    Args:
        name: the model name in URLs (default: the manifest's model name).
        bundle: the ``.ascpack`` file; it is verified when the object is made (a typed
            :class:`~ascendc_pack_runtime.BundleError` if it is broken).
        workers: model instances that serve requests in parallel.
        runner_factory: makes one runner (default: loads the bundle); the eager comparison in
            ``ascendc-pack serve --eager`` passes one that runs the PyTorch module.
    """

    def __init__(self, bundle: str | Path, name: str | None = None, *, workers: int = 1,
                 runner_factory: Callable[[], Runner] | None = None,
                 cache_dir: str | Path | None = None, platform: str | None = None):
        extracted = open_bundle(bundle, cache_dir=cache_dir)
        manifest = extracted.manifest
        name = check_model_name(name or str(manifest.get("model", {}).get("name", "model")))
        super().__init__(name, return_response_headers=True)
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        self.bundle = Path(bundle)
        self.manifest = manifest
        self.workers = workers
        self.input_specs, self.output_specs = specs_of(manifest)
        self._inputs_meta = v2.metadata(self.input_specs)    # refuses dtypes V2 cannot carry
        self._outputs_meta = v2.metadata(self.output_specs)
        self._input_index = {s.name: i for i, s in enumerate(self.input_specs)}
        self._output_index = {s.name: i for i, s in enumerate(self.output_specs)}
        self._factory = runner_factory or (lambda: bundle_runner(self.bundle, cache_dir))
        self.platform = platform or f"ascendc-pack_{manifest.get('backend', 'cpu')}"
        self.input_bytes = sum(prod(s.shape) * s.dtype.itemsize for s in self.input_specs)
        self._pool: _Pool | None = None
        self._load_lock = threading.Lock()
        self.load_seconds: float | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def load(self) -> bool:
        """Load ``workers`` instances and warm each up with one call; then ready. Idempotent."""
        with self._load_lock:
            if self._pool is not None:
                return self.ready
            t0 = time.perf_counter()
            runners = []
            for _ in range(self.workers):
                runner = self._factory()
                self._warm_up(runner)
                runners.append(runner)
            self._pool = _Pool(runners)
            self.load_seconds = time.perf_counter() - t0
            self.ready = True
            logger.info("model %r ready: %d instance(s) loaded and warmed up in %.2f s", self.name,
                        self.workers, self.load_seconds)
        return self.ready

    def _warm_up(self, runner: Runner) -> None:
        inputs = [torch.zeros(s.shape, dtype=s.dtype) for s in self.input_specs]
        outs = list(runner(*inputs))
        if len(outs) != len(self.output_specs):
            raise RuntimeError(f"warm-up: the model returned {len(outs)} tensors, the bundle declares "
                               f"{len(self.output_specs)} ({v2.signature(self.output_specs)})")
        for t, s in zip(outs, self.output_specs):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != s.shape or t.dtype != s.dtype:
                got = f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise RuntimeError(f"warm-up: output {s.name!r} is {got}, the bundle declares {s}")

    def start(self) -> None:  # kserve's default marks the model ready; readiness is load()'s
        pass

    def stop(self) -> None:
        self.ready = False
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- metadata ---------------------------------------------------------------------------
    def get_input_types(self) -> list[dict]:
        return [dict(d) for d in self._inputs_meta]

    def get_output_types(self) -> list[dict]:
        return [dict(d) for d in self._outputs_meta]

    # -- inference --------------------------------------------------------------------------
    async def predict(self, payload, headers=None, response_headers=None):
        if not isinstance(payload, InferRequest):
            raise InvalidInput(f"model {self.name!r} speaks the Open Inference Protocol V2: POST "
                               f"/v2/models/{self.name}/infer with {{\"inputs\": [...]}}")
        try:
            wanted = self.requested_outputs(payload)
            tensors = self.decode_inputs(payload)
        except v2.RequestError as e:
            raise InvalidInput(str(e)) from None
        if self._pool is None:
            raise ModelNotReady(self.name)
        flat = await self._pool.run(tensors)
        return self.encode_outputs(payload, flat, wanted, response_headers)

    def decode_inputs(self, request: InferRequest) -> list[torch.Tensor]:
        """The request's tensors in the model's input order (``RequestError`` if they do not fit)."""
        given: list = [None] * len(self.input_specs)
        for inp in request.inputs:  # names, datatypes and shapes first, then the data
            i = self._input_index.get(inp.name)
            if i is None:
                raise v2.RequestError(f"model {self.name!r} has no input {inp.name!r}; its inputs are "
                                      f"{v2.signature(self.input_specs)}")
            if given[i] is not None:
                raise v2.RequestError(f"input {inp.name!r} is given twice")
            v2.check_header(self.input_specs[i], inp.datatype, inp.shape)
            given[i] = inp
        missing = [s for s, g in zip(self.input_specs, given) if g is None]
        if missing:
            raise v2.RequestError(f"missing input(s) {v2.signature(missing)}; model {self.name!r} takes "
                                  f"{v2.signature(self.input_specs)}")
        tensors = []
        for spec, inp in zip(self.input_specs, given):
            raw = getattr(inp, "_raw_data", None)
            tensors.append(v2.tensor_from_bytes(spec, raw) if raw is not None else v2.tensor_from_json(spec, inp.data))
        return tensors

    def requested_outputs(self, request: InferRequest) -> list[tuple[int, bool]]:
        """(output index, binary?) per output to return: the requested ones, else all."""
        params = request.parameters if isinstance(request.parameters, dict) else {}
        default_binary = _flag(params.get("binary_data_output", False), "parameters.binary_data_output")
        if not request.request_outputs:
            return [(i, default_binary) for i in range(len(self.output_specs))]
        out, seen = [], set()
        for ro in request.request_outputs:
            i = self._output_index.get(ro.name)
            if i is None:
                raise v2.RequestError(f"model {self.name!r} has no output {ro.name!r}; its outputs are "
                                      f"{v2.signature(self.output_specs)}")
            if i in seen:
                raise v2.RequestError(f"output {ro.name!r} is requested twice")
            seen.add(i)
            p = ro.parameters if isinstance(ro.parameters, dict) else {}
            binary = _flag(p["binary_data"], f"outputs[{ro.name!r}].parameters.binary_data") \
                if "binary_data" in p else default_binary
            out.append((i, binary))
        for i, binary in out:
            dt = self._outputs_meta[i]["datatype"]
            if not binary and dt in ("FP16", "BF16"):
                raise v2.RequestError(f"output {self.output_specs[i].name!r} is {dt}, which JSON cannot carry; "
                                      "request it with parameters.binary_data = true")
        return out

    def encode_outputs(self, request: InferRequest, flat: Sequence[torch.Tensor],
                       wanted: list[tuple[int, bool]], response_headers: dict | None):
        outputs, raws = [], []
        for i, binary in wanted:
            t, meta = flat[i], self._outputs_meta[i]
            entry = {"name": meta["name"], "datatype": meta["datatype"], "shape": list(t.shape)}
            if binary:
                raw = v2.tensor_bytes(t)
                entry["parameters"] = {"binary_data_size": len(raw)}
                raws.append(raw)
            else:
                entry["data"] = v2.tensor_json(t)
            outputs.append(entry)
        res = {"model_name": self.name, "model_version": "1", "id": request.id or "", "outputs": outputs}
        if not raws:
            return res
        head = orjson.dumps(res)
        if response_headers is not None:
            response_headers[_IHCL] = str(len(head))
        return b"".join([head, *raws])


def _flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise v2.RequestError(f"{where} must be true or false, got {value!r}")
    return value


# ----------------------------------------------------------------------------- data plane


def decode_binary_request(body: bytes, headers: dict, model_name: str) -> InferRequest:
    """Parse a V2 request in the binary tensor extension's framing, checking every field.

    Binary inputs stay bytes (views of the body) until the model converts them once.
    """
    hl = headers.get(_IHCL)
    if hl is None:
        raise v2.RequestError(
            "the body is neither JSON (send 'Content-Type: application/json') nor a binary-extension request "
            f"(send the header 'Inference-Header-Content-Length: <bytes of the JSON part>'); got "
            f"Content-Type {headers.get('content-type')!r}")
    try:
        json_len = int(hl)
    except ValueError:
        raise v2.RequestError(f"Inference-Header-Content-Length must be an integer, got {hl!r}") from None
    if not 0 < json_len <= len(body):
        raise v2.RequestError(f"Inference-Header-Content-Length is {json_len}, but the body has {len(body)} "
                              "bytes; it must be the length of the JSON part (> 0, <= body)")
    try:
        req = json.loads(body[:json_len])
    except (ValueError, UnicodeDecodeError) as e:
        raise v2.RequestError(f"the first {json_len} bytes (Inference-Header-Content-Length) are not valid "
                              f"JSON: {e}") from None
    if not isinstance(req, dict):
        raise v2.RequestError(f"the inference request must be a JSON object, got {type(req).__name__}")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise v2.RequestError("the inference request needs 'inputs': a non-empty array of "
                              "{name, shape, datatype, data | parameters.binary_data_size}")
    view = memoryview(body)
    offset = json_len
    infer_inputs = []
    for k, d in enumerate(inputs):
        where = f"inputs[{k}]"
        if not isinstance(d, dict):
            raise v2.RequestError(f"{where} must be an object, got {type(d).__name__}")
        name, shape, datatype = d.get("name"), d.get("shape"), d.get("datatype")
        if not isinstance(name, str):
            raise v2.RequestError(f"{where}.name must be a string, got {name!r}")
        if not isinstance(shape, list) or any(type(s) is not int or s < 0 for s in shape):
            raise v2.RequestError(f"{where} ({name!r}).shape must be an array of integers >= 0, got {shape!r}")
        if not isinstance(datatype, str):
            raise v2.RequestError(f"{where} ({name!r}).datatype must be a string, got {datatype!r}")
        params = d.get("parameters") or {}
        if not isinstance(params, dict):
            raise v2.RequestError(f"{where} ({name!r}).parameters must be an object")
        inp = InferInput(name=name, shape=shape, datatype=datatype, parameters=params)
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if type(size) is not int or size < 0:
                raise v2.RequestError(f"{where} ({name!r}).parameters.binary_data_size must be an integer "
                                      f">= 0, got {size!r}")
            if offset + size > len(body):
                raise v2.RequestError(f"{where} ({name!r}) declares {size} bytes of binary data but only "
                                      f"{len(body) - offset} bytes follow")
            inp._raw_data = view[offset:offset + size]
            offset += size
        elif "data" in d:
            inp.data = d["data"]
        else:
            raise v2.RequestError(f"{where} ({name!r}) has neither 'data' nor parameters.binary_data_size")
        infer_inputs.append(inp)
    if offset != len(body):
        raise v2.RequestError(f"the body has {len(body) - offset} bytes after the last input's binary data; "
                              "binary_data_size of the inputs must add up to the bytes after the JSON part")
    outputs = req.get("outputs")
    requested = None
    if outputs is not None:
        if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                    for o in outputs):
            raise v2.RequestError("'outputs' must be an array of {name, parameters?}")
        requested = [RequestedOutput(name=o["name"], parameters=o.get("parameters") or {}) for o in outputs]
    params = req.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise v2.RequestError("'parameters' must be an object")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise v2.RequestError(f"'id' must be a string, got {rid!r}")
    return InferRequest(model_name=model_name, infer_inputs=infer_inputs, request_id=rid,
                        parameters=params, request_outputs=requested)


class AscpackDataPlane(DataPlane):
    """KServe's DataPlane with the checks and names this server adds (see the module doc)."""

    def _check_served(self, name: str) -> None:
        if self._model_registry.get_model(name) is None:
            raise _NotServed(name, list(self._model_registry.get_models()))

    def get_model_from_registry(self, name: str):
        self._check_served(name)
        return super().get_model_from_registry(name)

    async def get_model(self, name: str):
        self._check_served(name)
        return await super().get_model(name)

    async def model_ready(self, model_name: str, disable_predictor_health_check: bool = False) -> bool:
        self._check_served(model_name)
        return await super().model_ready(model_name, disable_predictor_health_check)

    def metadata(self) -> dict:
        d = super().metadata()
        d["extensions"] = list(d.get("extensions", [])) + ["binary_tensor_data"]
        return d

    async def ready(self) -> bool:
        models = self._model_registry.get_models()
        return bool(models) and all([await m.healthy() for m in models.values()])

    async def model_metadata(self, model_name: str) -> dict:
        d = await super().model_metadata(model_name)
        model = self.get_model_from_registry(model_name)
        d["versions"] = ["1"]
        d["platform"] = getattr(model, "platform", "")
        return d

    def decode(self, body, headers, protocol_version: str = "v1", model_name: str | None = None):
        try:
            if isinstance(body, (bytes, bytearray)) and protocol_version.lower() == "v2":
                return decode_binary_request(bytes(body), headers or {}, model_name), {}
            return super().decode(body, headers, protocol_version=protocol_version, model_name=model_name)
        except v2.RequestError as e:
            raise InvalidInput(str(e)) from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            if isinstance(e, InvalidInput):
                raise
            raise InvalidInput(f"malformed inference request ({type(e).__name__}: {e})") from None


# ----------------------------------------------------------------------------- ASGI middleware


async def _send_json(send, status: int, error: str) -> None:
    body = orjson.dumps({"error": error})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class V2Middleware:
    """See the module doc: Content-Type for tritonclient's JSON mode, version 1 routes,
    request decompression and a body size limit."""

    def __init__(self, app, max_body_bytes: int, versions: Sequence[str] = ("1",)):
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.versions = tuple(versions)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        m = _VERSION_RE.fullmatch(scope["path"])
        if m:
            if m.group(2) not in self.versions:
                return await _send_json(send, 404, f"model {m.group(1)!r} has no version {m.group(2)!r}; "
                                                   f"its versions are {list(self.versions)}")
            path = f"/v2/models/{m.group(1)}{m.group(3) or ''}"
            scope = dict(scope, path=path, raw_path=path.encode())
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)

        headers = [(k.lower(), v) for k, v in scope["headers"]]
        h = dict(headers)
        if b"content-type" not in h and b"inference-header-content-length" not in h:
            # tritonclient's JSON mode: no Content-Type at all (KServe would read the body as binary)
            headers.append((b"content-type", b"application/json"))
        elif b"inference-header-content-length" in h and b"json" in h.get(b"content-type", b""):
            # a binary-extension body is not JSON whatever its Content-Type says
            headers = [(k, v) for k, v in headers if k != b"content-type"]
            headers.append((b"content-type", b"application/octet-stream"))
        length = h.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await _send_json(send, 400, f"Content-Length {length.decode(errors='replace')!r} is not an integer")
            if n > self.max_body_bytes:
                return await _send_json(send, 413, f"the request body is {n} bytes, more than this server's limit "
                                                   f"of {self.max_body_bytes} bytes (--max-body-mb)")
        encoding = h.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"identity", b"gzip", b"deflate"):
            return await _send_json(send, 415, f"Content-Encoding {encoding.decode(errors='replace')!r} is not "
                                               "supported; use gzip, deflate or none")
        if encoding == b"identity":
            scope = dict(scope, headers=headers)
            return await self.app(scope, self._limited(receive), send)

        # compressed: read it all (bounded), inflate (bounded), pass on as plain bytes
        chunks, total = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunk = msg.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                return await _send_json(send, 413, f"the request body is more than this server's limit of "
                                                   f"{self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        try:
            d = zlib.decompressobj(wbits=31 if encoding == b"gzip" else 15)
            body = d.decompress(b"".join(chunks), self.max_body_bytes + 1)
            if d.unconsumed_tail or len(body) > self.max_body_bytes:
                return await _send_json(send, 413, f"the decompressed request body is more than this server's "
                                                   f"limit of {self.max_body_bytes} bytes")
            body += d.flush()
            if not d.eof:
                raise zlib.error("truncated stream")
        except zlib.error as e:
            return await _send_json(send, 400, f"the body is not valid {encoding.decode()} data ({e})")
        headers = [(k, v) for k, v in headers if k not in (b"content-encoding", b"content-length")]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(dict(scope, headers=headers), replay, send)

    def _limited(self, receive):
        total = 0
        limit = self.max_body_bytes

        async def wrapped():
            nonlocal total
            msg = await receive()
            if msg["type"] == "http.request":
                total += len(msg.get("body", b""))
                if total > limit:
                    raise HTTPException(413, f"the request body is more than this server's limit of "
                                                      f"{limit} bytes")
            return msg

        return wrapped


async def _validation_error(_request, exc: RequestValidationError):
    parts = []
    errors = list(exc.errors())
    # the endpoint's body is Union[InferenceRequest, bytes]: the bytes branch's error is noise
    useful = [e for e in errors if tuple(e.get("loc", ()))[1:2] != ("bytes",)] or errors
    for e in useful[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "InferenceRequest")]
        ctx = e.get("ctx") or {}
        if e.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON (at character {loc[0] if loc else '?'}: {ctx.get('error')})")
        else:
            parts.append(f"{'.'.join(loc) or 'body'}: {e.get('msg')}")
    more = f" (+{len(useful) - 5} more)" if len(useful) > 5 else ""
    return JSONResponse(status_code=400, content={
        "error": "invalid inference request: " + "; ".join(parts) + more
                 + '. Expected {"inputs": [{"name", "shape", "datatype", "data"}], "outputs"?: [{"name"}]}'})


async def _http_error(_request, exc: StarletteHTTPException):
    detail = str(exc.detail)
    if detail == "There was an error parsing the body":  # FastAPI's words when JSON is not even text
        detail = ("the body could not be parsed as JSON; send a V2 JSON request (Content-Type: application/json) "
                  "or binary tensors with an Inference-Header-Content-Length header")
    return JSONResponse(status_code=exc.status_code, content={"error": detail},
                          headers=getattr(exc, "headers", None))


# ----------------------------------------------------------------------------- server


def default_max_body_bytes(model: AscpackModel) -> int:
    # JSON spends up to ~20 characters per value: leave room for that, and for small models 64 MiB
    return 64 * 2**20 + 32 * model.input_bytes


def serve(bundle: str | Path, *, name: str | None = None, host: str = "0.0.0.0", port: int = 8080,
          workers: int = 1, runner_factory: Callable[[], Runner] | None = None,
          access_log: bool = True, max_body_bytes: int | None = None, platform: str | None = None,
          cache_dir: str | Path | None = None) -> None:
    """Serve ``bundle`` over V2 REST with KServe's ModelServer until SIGINT/SIGTERM.

    The bundle is verified first (errors raise before anything listens). The server then
    starts at once: ``/v2/health/live`` answers 200 while the ``workers`` instances load and
    warm up, and ``/v2/health/ready`` and the model's ``ready`` turn 200 after that.
    """
    from kserve import ModelServer
    from kserve import model_server as ms
    from kserve.protocol.rest.server import RESTServer

    # KServe 0.21's app uses ORJSONResponse, which FastAPI deprecates: not the user's business
    warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")
    model = AscpackModel(bundle, name, workers=workers, runner_factory=runner_factory, platform=platform,
                         cache_dir=cache_dir)
    limit = max_body_bytes if max_body_bytes is not None else default_max_body_bytes(model)

    server = ModelServer(http_port=port, enable_grpc=False, workers=1, enable_latency_logging=False)
    server.dataplane = AscpackDataPlane(model_registry=server.registered_models)
    server.register_model(model)

    app = ms.app
    app.add_middleware(V2Middleware, max_body_bytes=limit)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)

    def load_in_background():
        try:
            model.load()
        except BaseException as e:  # noqa: BLE001 - a server that can never get ready must not linger
            logger.error("model %r failed to load: %s", model.name, e)
            sys.stderr.flush()
            os._exit(1)

    # what ModelServer.start does for one process, with our host and access-log settings
    rest = RESTServer(ms.FASTAPI_APP_IMPORT_STRING, server.dataplane, server.model_repository_extension,
                      port, workers=1, grace_period=5, event_loop=server.event_loop,
                      timeout_keep_alive=server.timeout_keep_alive)
    rest.config.host = host
    rest.config.access_log = access_log
    server._rest_server = rest
    server.servers.append(rest.start())
    threading.Thread(target=load_in_background, name="ascpack-load", daemon=True).start()
    server.register_signal_handler()
    logger.info("serving %s as %r on http://%s:%d (V2 REST, %d instance(s), body limit %d bytes)",
                bundle, model.name, host, port, workers, limit)
    try:
        asyncio.run(server._serve())
    finally:
        model.stop()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ascendc_pack_runtime.kserve_model",
                                description="Serve an .ascpack bundle over the Open Inference Protocol (V2) with KServe.")
    p.add_argument("bundle")
    p.add_argument("--name", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--no-access-log", action="store_true")
    a = p.parse_args(argv)
    serve(a.bundle, name=a.name, host=a.host, port=a.port, workers=a.workers, access_log=not a.no_access_log)


if __name__ == "__main__":
    main()


__all__ = ["AscpackModel", "AscpackDataPlane", "V2Middleware", "serve", "bundle_runner", "decode_binary_request",
           "check_model_name", "specs_of"]
