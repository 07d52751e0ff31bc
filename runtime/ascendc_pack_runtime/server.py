"""Serve a bundle with KServe's model server: Open Inference Protocol (V2) over REST.

``ascendc-pack serve model.ascpack`` (or ``python -m ascendc_pack_runtime.server``) runs
:func:`serve`. Needs the ``serve`` extra (``kserve``); the rest of the runtime never imports the
serving modules. Importing this module has no side effect: KServe is imported when a server
starts, with the process's ``sys.argv`` hidden from it (``kserve.model_server`` parses
``sys.argv`` at import).

The parts: :mod:`~ascendc_pack_runtime.v2_request` (strict request decoding, response encoding),
:mod:`~ascendc_pack_runtime.kserve_model` (the ``kserve.Model``),
:mod:`~ascendc_pack_runtime.kserve_app` (KServe's REST server on a fresh app, the infer route),
:mod:`~ascendc_pack_runtime.http_edge` (timeouts, size limits, decompression).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .threads import check_threads, per_instance_threads

logger = logging.getLogger("kserve.ascendc_pack")


@dataclass(frozen=True)
class ServeOptions:
    """Settings of :func:`serve` (the ``ascendc-pack serve`` options)."""

    host: str = "127.0.0.1"
    """Loopback by default: the server has no authentication or TLS and runs native code on what
    clients send; listening on other interfaces (``0.0.0.0`` in a container) is a choice."""
    port: int = 8080
    workers: int = 1
    """Model instances serving requests in parallel (not uvicorn processes)."""
    threads: int | None = None
    """Thread cap of each instance's calls (fused kernels and torch's intra-op threads); None:
    none for one instance, torch's thread count // ``workers`` for several (:mod:`.threads`)."""
    access_log: bool = True
    max_body_bytes: int | None = None
    """Largest request body after decompression; None: :func:`default_max_body_bytes`."""
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 15.0
    """An idle kept-alive connection is closed after this (behind a proxy: above its idle timeout)."""
    limit_concurrency: int = 64
    """Requests in progress; beyond it a request gets 503 at once. Idle connections do not count
    (:mod:`.http_edge`)."""
    max_connections: int = 512
    """Open connections; one more closes the connection that has been idle longest (no request in
    progress), so idle sockets cannot starve the server (:mod:`.http_edge`)."""
    max_header_bytes: int = 64 * 1024
    batching: bool = True
    """Batch concurrent requests when the bundle has a batch dim (:mod:`.batching`)."""
    max_batch_delay_s: float = 0.002
    """How long a request waits for others to batch with (requests that queue while every
    instance is busy batch anyway)."""

    def __post_init__(self):
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {self.workers!r}")
        check_threads(self.threads)
        for name in ("limit_concurrency", "max_connections"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes!r}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if not self.max_batch_delay_s >= 0:
            raise ValueError(f"max_batch_delay_s must be >= 0 seconds, got {self.max_batch_delay_s!r}")


def default_max_body_bytes(input_bytes: int) -> int:
    """1 MiB + 16 x the model's input bytes: room for JSON (up to ~7 characters per byte of
    tensor, pretty-printed) and the binary extension, and no more."""
    return 2**20 + 16 * input_bytes


def _import_serving():
    argv = sys.argv
    sys.argv = argv[:1]  # kserve.model_server parses sys.argv when first imported; ours are not its
    try:
        from . import kserve_app, kserve_model
    except ImportError as e:
        raise ImportError(f"serving needs KServe ({e}); install it with: pip install 'ascendc-pack[serve]'") from None
    finally:
        sys.argv = argv
    return kserve_app, kserve_model


def show_logs(access_log: bool) -> None:
    """Make the server's own lines visible whatever the process's logging level: the start and
    ready lines and refusals (``kserve.ascendc_pack``) and, with ``access_log``, one line per
    request (``uvicorn.access``). A root handler is added only where there is none."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if access_log else logging.WARNING)


def serve(bundle: str | Path, options: ServeOptions = ServeOptions(), *, name: str | None = None,
          runner_factory: Callable | None = None, platform: str | None = None,
          cache_dir: str | Path | None = None, batch="bundle") -> None:
    """Serve ``bundle`` over V2 REST with KServe's ModelServer until SIGINT/SIGTERM.

    The bundle is verified and loaded first (errors raise before anything listens). The server
    then starts at once: ``/v2/health/live`` answers 200 while the ``workers`` instances load and
    warm up, and ``/v2/health/ready`` and the model's ``ready`` turn 200 after that. It logs a
    start line (address, model, instances, limits), a ready line and, unless
    ``options.access_log`` is off, a line per request, at any logging level (:func:`show_logs`).
    ``batch``: as :class:`~ascendc_pack_runtime.kserve_model.AscpackModel` takes it (``"bundle"``:
    the bundle's batch dim, if any); ``options.batching`` False runs each request as its own call.
    """
    kserve_app, kserve_model = _import_serving()
    from kserve import ModelServer

    from .http_edge import EdgeLimits

    from . import WAIT_POLICY

    show_logs(options.access_log)
    threads = per_instance_threads(options.workers, options.threads)
    model = kserve_model.AscpackModel(bundle, name, workers=options.workers, runner_factory=runner_factory,
                                      platform=platform, cache_dir=cache_dir, threads=threads,
                                      batch=batch, batching=options.batching,
                                      max_batch_delay_s=options.max_batch_delay_s)
    limits = EdgeLimits(max_body_bytes=options.max_body_bytes or default_max_body_bytes(model.input_bytes),
                        header_timeout_s=options.header_timeout_s, body_timeout_s=options.body_timeout_s,
                        max_header_bytes=options.max_header_bytes, max_connections=options.max_connections)
    server = ModelServer(http_port=options.port, enable_grpc=False, workers=1, enable_latency_logging=False)
    server.dataplane = kserve_app.AscpackDataPlane(model_registry=server.registered_models)
    server.register_model(model)
    rest = kserve_app.AscpackRESTServer(
        server.dataplane, server.model_repository_extension, host=options.host, port=options.port, limits=limits,
        access_log=options.access_log, timeout_keep_alive_s=options.keep_alive_s,
        limit_concurrency=options.limit_concurrency)

    url = f"http://{options.host}:{options.port}"

    def load_in_background():
        try:
            model.load()
        except BaseException as e:  # noqa: BLE001 - a server that can never get ready must not linger
            logger.error("model %r failed to load: %s", model.name, e)
            sys.stderr.flush()
            os._exit(1)
        logger.info("model %r ready (%d instance(s) loaded and warmed up in %.2f s): POST %s/v2/models/%s/infer",
                    model.name, model.workers, model.load_seconds, url, model.name)

    server._rest_server = rest
    server.servers.append(rest.start())
    threading.Thread(target=load_in_background, name="ascpack-load", daemon=True).start()
    server.register_signal_handler()
    if model.batching:
        batching = f"batches up to {model.batch.max_batch} rows within {options.max_batch_delay_s * 1e3:g} ms"
    elif model.batch is not None:
        batching = f"batching off (requests of up to {model.batch.max_batch} rows, each its own call)"
    else:
        batching = "no batching (the bundle has static shapes)"
    logger.info("serving %s as %r on %s (V2 REST, %d instance(s), %s, %s, body limit %d bytes, "
                "header/body timeouts %g/%g s, at most %d requests in progress and %d connections); %s; loading",
                bundle, model.name, url, options.workers,
                f"at most {model.threads} thread(s) each" if model.threads else
                "no thread cap" + (f" ({model.threads_note})" if model.threads_note else ""), batching,
                limits.max_body_bytes, limits.header_timeout_s, limits.body_timeout_s, options.limit_concurrency,
                options.max_connections, WAIT_POLICY.describe())
    try:
        asyncio.run(server._serve())
    finally:
        model.stop()


def main(argv: Sequence[str] | None = None) -> None:
    d = ServeOptions()
    p = argparse.ArgumentParser(prog="python -m ascendc_pack_runtime.server",
                                description="Serve an .ascpack bundle over the Open Inference Protocol (V2) with KServe.")
    p.add_argument("bundle")
    p.add_argument("--name", default=None)
    p.add_argument("--host", default=d.host, help="default %(default)s (this machine only)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--threads", type=int, default=None,
                   help="thread cap per instance (default: none for one instance, torch's threads // workers)")
    p.add_argument("--no-access-log", action="store_true")
    p.add_argument("--max-body-mb", type=float, default=None)
    p.add_argument("--header-timeout", type=float, default=d.header_timeout_s)
    p.add_argument("--body-timeout", type=float, default=d.body_timeout_s)
    p.add_argument("--keep-alive", type=float, default=d.keep_alive_s)
    p.add_argument("--limit-concurrency", type=int, default=d.limit_concurrency)
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    p.add_argument("--no-batching", action="store_true", help="never batch requests (bundles with a batch dim)")
    p.add_argument("--max-batch-delay-ms", type=float, default=d.max_batch_delay_s * 1e3)
    a = p.parse_args(argv)
    options = ServeOptions(host=a.host, port=a.port, workers=a.workers, threads=a.threads, access_log=not a.no_access_log,
                           max_body_bytes=None if a.max_body_mb is None else int(a.max_body_mb * 2**20),
                           header_timeout_s=a.header_timeout, body_timeout_s=a.body_timeout,
                           keep_alive_s=a.keep_alive, limit_concurrency=a.limit_concurrency,
                           max_connections=a.max_connections, batching=not a.no_batching,
                           max_batch_delay_s=a.max_batch_delay_ms / 1e3)
    serve(a.bundle, options, name=a.name)


if __name__ == "__main__":
    main()


__all__ = ["ServeOptions", "serve", "show_logs", "main", "default_max_body_bytes"]
