"""The HTTP edge of ``ascendc-pack serve``: limits that hold before a request reaches KServe.

* :class:`GuardedHttpToolsProtocol`, uvicorn's httptools protocol with a **header timeout** and a
  **header size cap**. uvicorn 0.54 has neither: its keep-alive timer is armed only after a
  response and cancelled by any byte, so a connection that never completes its headers (a
  trickled header, a half-open connection) is held forever. Here the headers of every request
  must be complete within ``header_timeout_s`` of the connection opening (or of the request's
  first byte on a kept-alive connection) and within ``max_header_bytes``; else 408 / 431 and the
  connection is closed. **Idle connections cannot starve the server**: uvicorn's
  ``limit_concurrency`` counts every open connection, so 64 sockets that never send a byte made
  every other client get 503 until the header timeout (and a client reconnecting every 10 s kept
  the model down). Here the two are separate limits: ``limit_concurrency`` bounds the *requests
  in progress* (beyond it: 503, JSON, at once), and ``max_connections`` bounds open connections:
  one arriving beyond it closes the connection that has been idle longest (no request in
  progress — one that has not completed its headers: a JSON 503 and close; a kept-alive one
  between requests: closed as its keep-alive timeout would), or is refused with 503 itself when
  every connection has a request in progress. Refusals at these limits are logged at most once
  per 10 s, with counts (a flood of connections must not flood the log). Given to uvicorn as
  ``Config(http=...)``.
* :class:`V2Middleware` (ASGI): reads every request body within ``body_timeout_s`` (408) and
  ``max_body_bytes`` (413), decompresses ``Content-Encoding: gzip|deflate`` as the bytes arrive
  against the same limit (an 87 KB gzip bomb is refused after at most ``max_body_bytes`` of
  output, never inflated whole), refuses trailing bytes after the compressed stream (400),
  answers ``/v2/models/<m>/versions/1/...`` (KServe answers 501 for any version) and refuses the
  model repository API (``/v2/repository/...``: load/unload would let any client unload the
  served model) and KServe's V1 routes (``/v1/...``: this server speaks V2 only).

Every refusal is ``{"error": "..."}`` and is logged as one line (:func:`log_refusal`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import zlib
from dataclasses import dataclass
from typing import Sequence

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .v2 import short

logger = logging.getLogger("kserve.ascendc_pack")

_VERSION_RE = re.compile(r"/v2/models/([^/]+)/versions/([^/]*)(/ready|/infer|/config|/stats)?/?")
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 408: "Request Timeout", 413: "Content Too Large",
            415: "Unsupported Media Type", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclass(frozen=True)
class EdgeLimits:
    """Limits of the HTTP edge (``ascendc-pack serve`` options)."""

    max_body_bytes: int
    """Largest request body, after decompression (413 beyond)."""
    header_timeout_s: float = 10.0
    """Request line and headers must arrive within this (408 and close)."""
    body_timeout_s: float = 60.0
    """The whole body must arrive within this after the headers (408 and close)."""
    max_header_bytes: int = 64 * 1024
    """Request line plus headers (431 and close)."""
    max_connections: int = 512
    """Open connections; one more closes the longest-idle connection (module doc)."""

    def __post_init__(self):
        for name in ("max_body_bytes", "header_timeout_s", "body_timeout_s", "max_header_bytes", "max_connections"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


def log_refusal(status: int, message: str, client: object = None, path: str = "") -> None:
    """One log line per refused request (no traceback; the message is bounded)."""
    who = f"{client[0]}:{client[1]} " if isinstance(client, (tuple, list)) and len(client) == 2 else ""
    where = f"{short(path)} " if path else ""
    text = message if len(message) <= 300 else message[:300] + f"... ({len(message)} characters)"
    logger.warning("%s%s%d: %s", who, where, status, text)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


async def send_error(send, status: int, message: str, close: bool = False) -> None:
    """Send a complete ``{"error": message}`` response through ASGI ``send``."""
    body = error_body(message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_REFUSAL = "ascendc_pack.refusal"  # scope key: why the protocol refuses this request


async def _too_large(scope, receive, send) -> None:
    log_refusal(431, scope[_REFUSAL], scope.get("client"))
    await send_error(send, 431, scope[_REFUSAL], close=True)


async def _busy(scope, receive, send) -> None:
    await send_error(send, 503, "the server has as many requests in progress as it takes (--limit-concurrency); "
                                "retry later", close=True)


class _PressureLog:
    """Counts refusals at the request and connection limits and logs them at most once per
    ``interval_s`` (one line with the counts since the last), so a flood does not flood the log."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self.counts: dict[str, int] = {}
        self.last = float("-inf")

    def note(self, what: str, now: float) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        if now - self.last >= self.interval_s:
            logger.warning("at the server's limits: %s (logged at most every %g s)",
                           ", ".join(f"{n} {w}" for w, n in self.counts.items()), self.interval_s)
            self.counts.clear()
            self.last = now


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a header timeout, a header size cap, a limit on the
    requests in progress and one on open connections that closes idle ones first (module doc).

    uvicorn builds one per connection as ``http_protocol_class(config=, server_state=,
    app_state=)``; :func:`protocol_factory` binds the limits.
    """

    def __init__(self, *args, limits: EdgeLimits, pressure: _PressureLog, **kwargs):
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._pressure = pressure
        self._header_timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = True
        self._header_bytes = 0
        self._idle_since = 0.0
        # uvicorn's check counts idle connections too; this class applies its own (_start_asgi_task)
        self._max_requests, self.limit_concurrency = self.limit_concurrency, None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._idle_since = self.loop.time()
        self._arm_header_timer()
        if len(self.connections) > self._limits.max_connections:
            self._make_room()

    def _idle(self) -> bool:
        """No request in progress: headers not complete yet, or between kept-alive requests."""
        return (not self.transport.is_closing() and not self.pipeline
                and (self.cycle is None or self.cycle.response_complete))

    def _make_room(self) -> None:
        """Close the longest-idle other connection; refuse this one if every other is busy."""
        idle = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol) and c._idle()]
        if not idle:
            self._pressure.note("connections refused (every connection busy; --max-connections)", self.loop.time())
            self._refuse(503, "the server is at its connection limit (--max-connections) and every connection has "
                              "a request in progress; retry later", log=False)
            return
        self._pressure.note("idle connections closed to make room (--max-connections)", self.loop.time())
        min(idle, key=lambda c: c._idle_since)._evict()

    def _evict(self) -> None:
        if self._awaiting_headers:    # nothing, or a request whose headers never came
            self._refuse(503, "the server is at its connection limit (--max-connections) and this connection had "
                              "sent no complete request for the longest; it was closed to serve others", log=False)
        else:                         # kept alive between requests: close as the keep-alive timeout would
            self._unset_keepalive_if_required()
            self.transport.close()
        self.connections.discard(self)   # its slot is free now (connection_lost follows on the next loop turn)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_since = self.loop.time()

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_headers and not self.transport.is_closing():
            # a chunk that did not complete the headers was all request line / header bytes
            self._header_bytes += len(data)
            if self._header_bytes > self._limits.max_header_bytes:
                self._refuse(431, f"the request line and headers are over {self._limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._header_bytes = 0
        if self._header_timer is None:  # a kept-alive connection: the clock starts at the first byte
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_timer()
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        if size > self._limits.max_header_bytes:  # arrived whole in one read: refused by the app below
            self.scope[_REFUSAL] = f"the request line and headers are {size} bytes, over {self._limits.max_header_bytes}"
        super().on_headers_complete()

    def _start_asgi_task(self, cycle, app) -> None:
        if _REFUSAL in cycle.scope:
            app = _too_large
        elif self._max_requests is not None and len(self.tasks) >= self._max_requests:
            self._pressure.note("requests refused (--limit-concurrency)", self.loop.time())
            app = _busy
        super()._start_asgi_task(cycle, app)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self._limits.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            self._refuse(408, f"the request headers did not arrive within {self._limits.header_timeout_s:g} s "
                              "(--header-timeout)")

    def send_400_response(self, msg: str) -> None:  # uvicorn's answer to bytes that are not HTTP
        self._refuse(400, f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})")

    def _refuse(self, status: int, message: str, log: bool = True) -> None:
        self._cancel_header_timer()
        self._awaiting_headers = False
        if log:
            log_refusal(status, message, self.client)
        if self.cycle is None or self.cycle.response_complete:  # nothing else is being written
            body = error_body(message)
            self.transport.write(b"".join([
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n".encode(),
                b"content-type: application/json\r\n",
                f"content-length: {len(body)}\r\n".encode(),
                b"connection: close\r\n\r\n", body]))
        self.transport.close()


def protocol_factory(limits: EdgeLimits):
    """The ``http`` setting of ``uvicorn.Config`` that applies ``limits``."""

    pressure = _PressureLog()   # one per server

    def make(*args, **kwargs):
        return GuardedHttpToolsProtocol(*args, limits=limits, pressure=pressure, **kwargs)

    return make


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Inflater:
    """Streaming gzip/deflate decompression bounded by ``limit`` bytes of output."""

    def __init__(self, encoding: str, limit: int):
        self.encoding = encoding
        self.limit = limit
        self.size = 0
        self._d = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)

    def feed(self, chunk: bytes) -> bytes:
        if self._d.eof:
            if chunk:
                self._trailing(len(chunk))
            return b""
        try:
            out = self._d.decompress(chunk, self.limit - self.size + 1)
        except zlib.error as e:
            raise _Refused(400, f"the body is not valid {self.encoding} data ({e})") from None
        self.size += len(out)
        if self.size > self.limit or self._d.unconsumed_tail:
            raise _Refused(413, f"the decompressed request body is more than this server's limit of "
                                f"{self.limit} bytes (--max-body-mb)")
        if self._d.eof and self._d.unused_data:
            self._trailing(len(self._d.unused_data))
        return out

    def finish(self) -> None:
        if not self._d.eof:
            raise _Refused(400, f"the body is not valid {self.encoding} data (the stream is truncated)")

    def _trailing(self, n: int) -> None:
        raise _Refused(400, f"the body has bytes after the end of its {self.encoding} stream (at least {n}); "
                            "send exactly one compressed stream")


class V2Middleware:
    """ASGI middleware: body limits, timeout and decompression, version routes (module doc)."""

    def __init__(self, app, limits: EdgeLimits, versions: Sequence[str] = ("1",)):
        self.app = app
        self.limits = limits
        self.versions = tuple(versions)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            scope = self._route(scope)
            if scope["method"] in ("POST", "PUT", "PATCH"):
                body = await self._read_body(scope, receive)
                if body is None:  # the client went away
                    return
                scope, receive = self._replay(scope, body, receive)
        except _Refused as e:
            log_refusal(e.status, str(e), scope.get("client"), scope.get("path", ""))
            return await send_error(send, e.status, str(e), close=e.status in (408, 413))
        return await self.app(scope, receive, send)

    def _route(self, scope) -> dict:
        path = scope["path"]
        if path.startswith("/v2/repository"):
            raise _Refused(403, "the model repository API (load/unload) is off on this server")
        if path.startswith("/v1/"):
            raise _Refused(404, "this server speaks the Open Inference Protocol V2 only: POST "
                                "/v2/models/<model>/infer with {\"inputs\": [...]}")
        m = _VERSION_RE.fullmatch(path)
        if not m:
            return scope
        if m.group(2) not in self.versions:
            raise _Refused(404, f"model {short(m.group(1))} has no version {short(m.group(2))}; its versions are "
                                f"{list(self.versions)}")
        path = f"/v2/models/{m.group(1)}{m.group(3) or ''}"
        return dict(scope, path=path, raw_path=path.encode())

    async def _read_body(self, scope, receive) -> bytes | None:
        limit = self.limits.max_body_bytes
        h = {k.lower(): v for k, v in scope["headers"]}
        length = h.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _Refused(413, f"the request body is {int(length)} bytes, more than this server's limit of "
                                f"{limit} bytes (--max-body-mb)")
        encoding = h.get(b"content-encoding", b"identity").strip().lower().decode("latin-1")
        if encoding not in ("identity", "gzip", "deflate"):
            raise _Refused(415, f"Content-Encoding {short(encoding)} is not supported; use gzip, deflate or none")
        inflater = _Inflater(encoding, limit) if encoding != "identity" else None
        chunks, total = [], 0
        deadline = asyncio.get_running_loop().time() + self.limits.body_timeout_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                msg = await asyncio.wait_for(receive(), max(remaining, 0.001))
            except asyncio.TimeoutError:
                raise _Refused(408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s "
                                    "(--body-timeout)") from None
            if msg["type"] != "http.request":
                return None
            chunk = msg.get("body", b"")
            total += len(chunk)
            if total > limit:  # compressed or not
                raise _Refused(413, f"the request body is more than this server's limit of {limit} bytes "
                                    "(--max-body-mb)")
            if inflater is not None:
                chunk = inflater.feed(chunk)
            if chunk:
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        if inflater is not None:
            inflater.finish()
        return b"".join(chunks)

    @staticmethod
    def _replay(scope, body: bytes, receive):
        headers = [(k, v) for k, v in scope["headers"]
                   if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return dict(scope, headers=headers), replay


__all__ = ["EdgeLimits", "GuardedHttpToolsProtocol", "V2Middleware", "protocol_factory", "log_refusal",
           "send_error", "error_body"]
