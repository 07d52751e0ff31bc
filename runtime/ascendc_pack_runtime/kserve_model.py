"""The ``kserve.Model`` adapter of a bundle: :class:`AscpackModel`.

Importing this module imports KServe (the ``serve`` extra), whose ``kserve.model_server`` parses
``sys.argv`` with ``parse_known_args`` when first imported; :func:`ascendc_pack_runtime.server.serve`
hides the process's arguments from it. This module itself changes no global state.

:class:`AscpackModel` loads the bundle ``workers`` times (a pool of runtime
:class:`~ascendc_pack_runtime.Model` instances, each with its own planned buffers: one instance
serializes its calls), warms every instance up with one call, and only then reports ready.
Calls run in a thread pool of that size (the graph releases the GIL), so the event loop keeps
answering health checks and decoding the next request meanwhile. Metadata (V2 datatypes and
static shapes) comes from the bundle. Requests are decoded strictly by
:mod:`ascendc_pack_runtime.v2_request` against the model's :class:`~.v2_request.Signature`;
a request that does not fit is ``kserve.errors.InvalidInput`` (HTTP 400).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import re
import threading
import time
from math import prod
from pathlib import Path
from typing import Callable, Mapping, Sequence

import kserve
import torch
from kserve.errors import InvalidInput, ModelNotReady
from kserve.protocol.infer_type import InferRequest

from . import v2
from .model import load
from .v2_request import IHCL, DecodedRequest, EncodedResponse, Signature, decode_fields, decode_request, \
    encode_response, json_length

logger = logging.getLogger("kserve.ascendc_pack")

Runner = Callable[..., Sequence[torch.Tensor]]
"""One model instance: called with the input tensors, returns the flat outputs."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_model_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"model name {v2.short(name)} is not usable in a URL path; use letters, digits, '_', '.' "
                         "and '-' (at most 128, starting with a letter or digit)")
    return name


class _Pool:
    """K runners and a K-thread executor: every thread that calls takes a free runner."""

    def __init__(self, runners: list[Runner]):
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for r in runners:
            self._free.put(r)
        self.size = len(runners)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.size,
                                                              thread_name_prefix="ascpack-infer")

    def _call(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        runner = self._free.get()
        try:
            return list(runner(*tensors))
        finally:
            self._free.put(runner)

    async def run(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
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


def bundle_runner(path: str | Path, cache_dir: str | Path | None = None, threads: int | None = None) -> Runner:
    """A runner that is a freshly loaded runtime Model of ``path`` (its own buffers)."""
    return load(path, cache_dir=cache_dir, threads=threads).run_flat


class AscpackModel(kserve.Model):
    """A KServe model serving one ``.ascpack`` bundle (V2 protocol).

    Args:
        bundle: the ``.ascpack`` file; it is verified and loaded once when the object is made (a
            typed :class:`~ascendc_pack_runtime.BundleError` if it is broken).
        name: the model name in URLs (default: the bundle's model name).
        workers: model instances that serve requests in parallel.
        runner_factory: makes one runner (default: loads the bundle); the eager comparison in
            ``ascendc-pack serve --eager`` passes one that runs the PyTorch module.
        threads: thread cap of each instance's calls (``load(..., threads=)``; None: the
            build's cap where it applies, else none); afterwards the cap in force.
    """

    def __init__(self, bundle: str | Path, name: str | None = None, *, workers: int = 1,
                 runner_factory: Callable[[], Runner] | None = None,
                 cache_dir: str | Path | None = None, platform: str | None = None, threads: int | None = None):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        first = load(bundle, cache_dir=cache_dir, threads=threads)
        try:
            if getattr(first, "dims", None):  # a DynamicModel (format version 2)
                raise ValueError(f"{bundle} has dynamic dims ({', '.join(first.dims)}); serving them (batching on "
                                 "manifest dynamic.batch) is not built yet: serve a bundle built with static shapes")
            name = check_model_name(name or first.name)
            self.signature = Signature(name, tuple(first.input_specs), tuple(first.output_specs))
        except BaseException:
            first.close()
            raise
        super().__init__(name, return_response_headers=True)
        self.bundle = Path(bundle)
        self.workers = workers
        self.threads = first.threads             # the cap in force: the caller's, or the build's
        self.threads_note = first.threads_note   # why the build's cap was not applied (None: it was, or none)
        self.input_specs, self.output_specs = list(first.input_specs), list(first.output_specs)
        self._inputs_meta = v2.metadata(self.input_specs)
        self._outputs_meta = v2.metadata(self.output_specs)
        self.platform = platform or f"ascendc-pack_{first.manifest.get('backend', 'cpu')}"
        self.input_bytes = sum(prod(s.shape) * s.dtype.itemsize for s in self.input_specs)
        if runner_factory is None:  # the instance loaded for the metadata is the first runner
            spare: list[Runner] = [first.run_flat]
            self._factory = lambda: spare.pop() if spare else bundle_runner(self.bundle, cache_dir, threads)
        else:
            first.close()
            self._factory = runner_factory
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
    def decode(self, body: bytes, headers: Mapping[str, str]) -> DecodedRequest:
        """Decode a raw V2 request body (JSON or binary extension; ``headers`` lower-case keyed)."""
        try:
            return decode_request(self.signature, body,
                                  json_length(headers.get("content-type"), headers.get(IHCL)))
        except v2.RequestError as e:
            raise InvalidInput(str(e)) from None

    def validate(self, payload):  # requests are checked by decode(); KServe's dict checks do not apply
        return payload

    async def predict(self, payload, headers=None, response_headers=None) -> bytes:
        """Run a request; returns the response body (``Inference-Header-Content-Length`` goes into
        ``response_headers`` when it has binary tensors)."""
        try:
            if isinstance(payload, InferRequest):  # KServe's own REST decoding (not ascendc-pack serve)
                payload = decode_fields(self.signature, *_from_infer_request(payload))
            elif not isinstance(payload, DecodedRequest):
                raise v2.RequestError(f"model {self.name!r} speaks the Open Inference Protocol V2: POST "
                                      f"/v2/models/{self.name}/infer with {{\"inputs\": [...]}}")
        except v2.RequestError as e:
            raise InvalidInput(str(e)) from None
        if self._pool is None:
            raise ModelNotReady(self.name)
        flat = await self._pool.run(payload.tensors)
        encoded: EncodedResponse = encode_response(self.signature, payload.id, flat, payload.outputs)
        if encoded.json_length is not None and response_headers is not None:
            response_headers[IHCL] = str(encoded.json_length)
        return encoded.body


def _from_infer_request(req: InferRequest) -> tuple[dict, memoryview]:
    """A KServe ``InferRequest`` as the JSON object and binary tail the strict decoder reads."""
    inputs, raws = [], []
    for inp in req.inputs:
        d = {"name": inp.name, "datatype": inp.datatype, "shape": list(inp.shape) if inp.shape is not None else None}
        raw = getattr(inp, "_raw_data", None)
        if raw is not None:
            d["parameters"] = {"binary_data_size": len(raw)}
            raws.append(bytes(raw))
        else:
            d["data"] = inp.data
        inputs.append(d)
    outputs = None
    if req.request_outputs:
        outputs = [{"name": o.name, "parameters": dict(o.parameters or {})} for o in req.request_outputs]
    obj = {"id": req.id or "", "inputs": inputs, "outputs": outputs,
           "parameters": dict(req.parameters) if isinstance(req.parameters, dict) else None}
    return obj, memoryview(b"".join(raws))


__all__ = ["AscpackModel", "bundle_runner", "check_model_name", "Runner"]
