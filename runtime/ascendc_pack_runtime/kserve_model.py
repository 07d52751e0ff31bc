"""The ``kserve.Model`` adapter of a bundle: :class:`AscpackModel`.

Importing this module imports KServe (the ``serve`` extra), whose ``kserve.model_server`` parses
``sys.argv`` with ``parse_known_args`` when first imported; :func:`ascendc_pack_runtime.server.serve`
hides the process's arguments from it. This module itself changes no global state.

:class:`AscpackModel` loads the bundle ``workers`` times (a pool of runtime
:class:`~ascendc_pack_runtime.Model` instances, each with its own planned buffers: one instance
serializes its calls), warms every instance up with one call, and only then reports ready.
Calls run in a thread pool of that size (the graph releases the GIL), so the event loop keeps
answering health checks and decoding the next request meanwhile. A bundle with a batch dim
(:func:`ascendc_pack_runtime.batching.batch_spec`) batches concurrent requests: a
:class:`~ascendc_pack_runtime.batching.Batcher` merges those that arrive within
``max_batch_delay_s`` (and those that queue while every instance is busy) into one call and
cuts each request's rows back out. Metadata (V2 datatypes, shapes; ``-1`` for the batch dim)
and the Triton-style configuration (``GET /v2/models/<m>/config``) come from the bundle. Requests are decoded strictly by
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

from . import triton_config, v2
from .batching import Batcher, BatchError, BatchSpec, batch_spec
from .model import load
from .model_parts import concrete_shape, example_sizes
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
        self.executions = 0
        self._count = threading.Lock()
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.size,
                                                              thread_name_prefix="ascpack-infer")

    def _call(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        runner = self._free.get()
        try:
            out = list(runner(*tensors))
        finally:
            self._free.put(runner)
        with self._count:
            self.executions += 1
        return out

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
        batch: ``"bundle"`` (default): batch as the bundle says (:func:`.batching.batch_spec`;
            a static bundle does not batch); None: never batch; a :class:`.batching.BatchSpec`:
            batch so (the eager comparison of a model whose rows are independent).
        max_batch_delay_s: how long a request waits for others to batch with.
        batching: False: requests keep the batch dim's shapes (``[rows, ...]``) but each runs as
            its own call (``serve --no-batching``).
    """

    def __init__(self, bundle: str | Path, name: str | None = None, *, workers: int = 1,
                 runner_factory: Callable[[], Runner] | None = None,
                 cache_dir: str | Path | None = None, platform: str | None = None, threads: int | None = None,
                 batch: BatchSpec | str | None = "bundle", max_batch_delay_s: float = 0.002,
                 batching: bool = True):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        if not max_batch_delay_s >= 0:
            raise ValueError(f"max_batch_delay_s must be >= 0 seconds, got {max_batch_delay_s!r}")
        first = load(bundle, cache_dir=cache_dir, threads=threads)
        try:
            name = check_model_name(name or first.name)
            self.example_sizes = example_sizes(first)   # a bundle of plans warms up at its first bucket
            self.batch = batch_spec(first.manifest) if batch == "bundle" else batch
            self.signature = Signature(name, tuple(first.input_specs), tuple(first.output_specs), self.batch)
        except BaseException:
            first.close()
            raise
        super().__init__(name, return_response_headers=True)
        self.bundle = Path(bundle)
        self.workers = workers
        self.threads = first.threads             # the cap in force: the caller's, or the build's
        self.threads_note = first.threads_note   # why the build's cap was not applied (None: it was, or none)
        self.input_specs, self.output_specs = list(first.input_specs), list(first.output_specs)
        b = self.batch
        self._inputs_meta = v2.metadata_of(self.input_specs, b and [t.item_shape for t in b.inputs])
        self._outputs_meta = v2.metadata_of(self.output_specs, b and [t.item_shape for t in b.outputs])
        self.platform = platform or f"ascendc-pack_{first.manifest.get('backend', 'cpu')}"
        self.max_batch_delay_s = max_batch_delay_s
        self.batching = batching and b is not None
        self.input_bytes = sum(prod(s.shape) * s.dtype.itemsize for s in self.input_specs) if b is None else \
            sum(b.max_batch * prod(max(d, 1) for d in t.item_shape) * t.dtype.itemsize for t in b.inputs)
        if runner_factory is None:  # the instance loaded for the metadata is the first runner
            spare: list[Runner] = [first.run_flat]
            self._factory = lambda: spare.pop() if spare else bundle_runner(self.bundle, cache_dir, threads)
        else:
            first.close()
            self._factory = runner_factory
        self._pool: _Pool | None = None
        self.batcher: Batcher | None = None
        self.inference_count = 0
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
            if self.batching:
                self.batcher = Batcher(self.batch, self._pool.run, max_delay_s=self.max_batch_delay_s,
                                       slots=self.workers)
            self.load_seconds = time.perf_counter() - t0
            self.ready = True
            logger.debug("model %r ready: %d instance(s) loaded and warmed up in %.2f s", self.name,
                         self.workers, self.load_seconds)
        return self.ready

    def _warm_up(self, runner: Runner) -> None:
        sizes = self.example_sizes
        inputs = [torch.zeros(concrete_shape(s, sizes), dtype=s.dtype) for s in self.input_specs]
        outs = list(runner(*inputs))
        if len(outs) != len(self.output_specs):
            raise RuntimeError(f"warm-up: the model returned {len(outs)} tensors, the bundle declares "
                               f"{len(self.output_specs)} ({v2.signature(self.output_specs)})")
        for t, s in zip(outs, self.output_specs):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != concrete_shape(s, sizes) or t.dtype != s.dtype:
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

    def statistics(self) -> dict:
        """Triton's statistics extension, the counts it has (``GET /v2/models/<m>/stats``):
        ``inference_count`` (successful requests; rows of them for a batching model) and
        ``execution_count`` (model calls; fewer than the inferences when requests were batched)."""
        executions = self._pool.executions if self._pool is not None else 0
        return {"model_stats": [{"name": self.name, "version": "1", "inference_count": self.inference_count,
                                 "execution_count": executions}]}

    def triton_config(self) -> dict:
        """The model's configuration in Triton's JSON form (``GET /v2/models/<m>/config``)."""
        config = triton_config.model_config(self.name, self.input_specs, self.output_specs, batch=self.batch,
                                            instances=self.workers, bundle_file=self.bundle.name,
                                            max_queue_delay_us=round(self.max_batch_delay_s * 1e6),
                                            threads=self.threads, dynamic_batching=self.batching)
        config["backend"] = "ascendc-pack"
        config["platform"] = self.platform
        return config

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
        if self.batcher is None:
            flat = await self._pool.run(payload.tensors)
        else:
            try:
                flat = await self.batcher.submit(payload.tensors)
            except BatchError as e:
                raise InvalidInput(str(e)) from None
        # Triton's statistics count every row of a batching model's request as an inference
        self.inference_count += payload.tensors[0].shape[0] if self.batch is not None else 1
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
