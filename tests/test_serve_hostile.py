"""`ascendc-pack serve` against hostile clients: every case a fixture, a 4xx with
``{"error": ...}``, one log line, and the server still right afterwards.

One real server (KServe 0.21, `python -m ascendc_pack serve`) with short timeouts and a small
concurrency limit, driven over raw HTTP (http.client, sockets) and with tritonclient.
"""

from __future__ import annotations

import gzip
import json
import math
import socket
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("kserve")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from .serve_helpers import Server, build_bundles, eager, infer, io_names, raw_request  # noqa: E402

HEADER_TIMEOUT, BODY_TIMEOUT, CONCURRENCY, MAX_CONNECTIONS = 2, 3, 24, 100
N = 256 * 1024          # mlp's input x: FP32 [256, 1024]
NBYTES = 4 * N
JH = {"Content-Type": "application/json"}
X = {"name": "x", "shape": [256, 1024], "datatype": "FP32"}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return build_bundles(tmp_path_factory, ["mlp"])


@pytest.fixture(scope="module")
def srv(bundles, tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    s = Server(bundles["mlp"][0], d / "mlp.log", d / "rt_cache",
               extra=["--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
                      "--limit-concurrency", str(CONCURRENCY), "--max-connections", str(MAX_CONNECTIONS)])
    s.start()
    yield s
    s.stop()


def _still_right(srv: Server, bundles) -> None:
    bundle, loaded = bundles["mlp"]
    in_name, out_name = io_names(bundle)
    x = loaded.example_inputs[0].numpy()
    assert srv.alive(), srv.log_tail()
    c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
    try:
        assert c.is_server_live() and c.is_model_ready("mlp")
        for binary in (True, False):
            np.testing.assert_allclose(infer(c, "mlp", in_name, out_name, x, binary), eager(loaded, x),
                                       atol=1e-4, rtol=1e-4)
    finally:
        c.close()


def _json(inputs, **kw) -> bytes:
    return json.dumps({"inputs": inputs, **kw}).encode()


def _binary(header: dict | bytes, payload: bytes, length: str | None = None):
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return head + payload, {"Inference-Header-Content-Length": length if length is not None else str(len(head)),
                            "Content-Type": "application/octet-stream"}


def _with_length(header: dict, fmt: str):
    head = json.dumps(header).encode()
    return _binary(header, b"\0" * NBYTES, fmt.format(len(head)))


DEEP = b"[" * 1100 + b"]" * 1100
BIN_X = dict(X, parameters={"binary_data_size": NBYTES})
BIG = "Z" * (10 * 2**20)

# (kind, method, path, body, headers, expected status, words the error must contain)
BAD = [
    ("unknown model (infer)", "POST", "/v2/models/nope/infer", _json([dict(X, data=[0])]), JH, 404,
     ["'nope'", "serves ['mlp']"]),
    ("unknown model (metadata)", "GET", "/v2/models/nope", b"", {}, 404, ["'nope'", "mlp"]),
    ("unknown model version", "POST", "/v2/models/mlp/versions/2/infer", _json([dict(X, data=[0])]), JH, 404,
     ["version '2'", "['1']"]),
    ("unknown input name", "POST", "/v2/models/mlp/infer", _json([dict(X, name="y", data=[0])]), JH, 400,
     ["no input 'y'", "'x' (FP32 [256, 1024])"]),
    ("missing input", "POST", "/v2/models/mlp/infer", _json([]), JH, 400, ["missing input", "'x'"]),
    ("input given twice", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[0]), dict(X, data=[0])]), JH, 400,
     ["twice"]),
    ("wrong shape", "POST", "/v2/models/mlp/infer", _json([dict(X, shape=[2, 2], data=[1, 2, 3, 4])]), JH, 400,
     ["shape [2, 2]", "expected [256, 1024]"]),
    ("wrong datatype", "POST", "/v2/models/mlp/infer", _json([dict(X, datatype="FP64", data=[0])]), JH, 400,
     ["'FP64'", "expected 'FP32'"]),
    ("not a V2 datatype", "POST", "/v2/models/mlp/infer", _json([dict(X, datatype="FLOAT", data=[0])]), JH, 400,
     ["not a V2 datatype", "'FP32'"]),
    ("lower-case datatype", "POST", "/v2/models/mlp/infer", _json([dict(X, datatype="fp32", data=[0])]), JH, 400,
     ["'fp32', which is not a V2 datatype", "BOOL, UINT8", "FP32, FP64, BF16, BYTES"]),
    ("shape of strings", "POST", "/v2/models/mlp/infer", _json([dict(X, shape=["256", "1024"], data=[0])]), JH,
     400, ["shape ['256', '1024']", "list of integers"]),
    ("shape with a bool", "POST", "/v2/models/mlp/infer", _json([dict(X, shape=[True, 1024], data=[0])]), JH,
     400, ["shape [True, 1024]"]),
    ("shape is a string", "POST", "/v2/models/mlp/infer", _json([dict(X, shape="256x1024", data=[0])]), JH, 400,
     ["shape"]),
    ("too few values", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[1.0, 2.0, 3.0])]), JH, 400,
     ["3 values", "262144"]),
    ("non-numeric data", "POST", "/v2/models/mlp/infer", _json([dict(X, data=["a"] + [0.0] * (N - 1))]), JH, 400,
     ["str values such as 'a'", "expected numbers"]),
    ("more values than any request needs", "POST", "/v2/models/mlp/infer",
     b'{"inputs": [{"name": "x", "shape": [256, 1024], "datatype": "FP32", "data": [' + b"0," * (2 * N) + b"0]}]}",
     JH, 400, ["commas", "refused before parsing"]),
    ("1e999 in JSON data", "POST", "/v2/models/mlp/infer",
     _json([dict(X, data=[0.0] * N)]).replace(b"[0.0, ", b"[1e999, ", 1), JH, 400, ["too large for a double"]),
    ("FP32 overflow in JSON data", "POST", "/v2/models/mlp/infer",
     _json([dict(X, data=[0.0] * N)]).replace(b"[0.0, ", b"[1e39, ", 1), JH, 400, ["out of range for FP32"]),
    ("JSON nested 1100 deep", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[0])]).replace(b"[0]", DEEP),
     JH, 400, ["not valid JSON"]),
    ("JSON with NaN nested 1100 deep", "POST", "/v2/models/mlp/infer",
     _json([dict(X, data=[0])], parameters={"p": "@"}).replace(b'"@"', b"[NaN, " + DEEP + b"]"), JH, 400,
     ["not valid JSON"]),
    ("unknown requested output", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[0])], outputs=[{"name": "nope"}]),
     JH, 400, ["no output 'nope'"]),
    ("binary_data_output not a bool", "POST", "/v2/models/mlp/infer",
     _json([dict(X, data=[0])], parameters={"binary_data_output": "yes"}), JH, 400, ["true or false"]),
    ("malformed JSON", "POST", "/v2/models/mlp/infer", b'{"inputs": [', JH, 400, ["JSON"]),
    ("JSON that is not an object", "POST", "/v2/models/mlp/infer", b"[1, 2]", JH, 400, ["inputs"]),
    ("no 'inputs'", "POST", "/v2/models/mlp/infer", b"{}", JH, 400, ["needs 'inputs'"]),
    ("input without datatype", "POST", "/v2/models/mlp/infer", _json([{"name": "x", "shape": [256, 1024], "data": [0]}]),
     JH, 400, ["datatype"]),
    ("empty body", "POST", "/v2/models/mlp/infer", b"", JH, 400, ["body"]),
    ("garbage without Content-Type", "POST", "/v2/models/mlp/infer", b"\x00\x01garbage", {}, 400, ["JSON"]),
    ("text/plain body", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[0])]), {"Content-Type": "text/plain"},
     400, ["Inference-Header-Content-Length"]),
    ("10 MiB input name", "POST", "/v2/models/mlp/infer", _json([dict(X, name=BIG, data=[0])]), JH, 400,
     ["no input 'ZZZ", "(10485760 characters)"]),
    ("10 MiB datatype", "POST", "/v2/models/mlp/infer", _json([dict(X, datatype=BIG, data=[0])]), JH, 400,
     ["(10485760 characters)", "expected 'FP32'"]),
    ("10 MiB id", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[0])], id=BIG), JH, 400,
     ["'id' is 10485760 characters long"]),
    ("binary: header length not a number", "POST", "/v2/models/mlp/infer", *_binary({"inputs": [X]}, b"", "abc"),
     400, ["plain decimal digits", "'abc'"]),
    # (spaces around a header value are optional whitespace (RFC 9110 5.5), which the HTTP parser may
    # strip before the server sees it (httptools 0.9 does); a space inside the digits reaches the check)
    ("binary: header length with a space", "POST", "/v2/models/mlp/infer", *_with_length({"inputs": [BIN_X]}, "1 {}"),
     400, ["plain decimal digits"]),
    ("binary: header length with a sign", "POST", "/v2/models/mlp/infer", *_with_length({"inputs": [BIN_X]}, "+{}"),
     400, ["plain decimal digits", "'+"]),
    ("binary: header length with an underscore", "POST", "/v2/models/mlp/infer",
     *_binary({"inputs": [BIN_X]}, b"\0" * NBYTES, "1_0"), 400, ["plain decimal digits", "'1_0'"]),
    ("binary: header length past the body", "POST", "/v2/models/mlp/infer", *_binary({"inputs": [X]}, b"", "10000"),
     400, ["Inference-Header-Content-Length is 10000"]),
    ("binary: JSON part is not JSON", "POST", "/v2/models/mlp/infer", b"not json at all!",
     {"Inference-Header-Content-Length": "8"}, 400, ["not valid JSON"]),
    ("binary: JSON part nested 1100 deep", "POST", "/v2/models/mlp/infer",
     *_binary(json.dumps({"inputs": [BIN_X], "p": 0}).encode().replace(b'"p": 0', b'"p": ' + DEEP),
              b"\0" * NBYTES), 400, ["not valid JSON"]),
    ("binary: fewer bytes than declared", "POST", "/v2/models/mlp/infer", *_binary({"inputs": [BIN_X]}, b"\0" * 64),
     400, [f"declares {NBYTES} bytes", "only 64"]),
    ("binary: size does not fit the shape", "POST", "/v2/models/mlp/infer",
     *_binary({"inputs": [dict(X, parameters={"binary_data_size": 8})]}, b"\0" * 8), 400, ["8 bytes", f"expected {NBYTES}"]),
    ("binary: huge binary_data_size", "POST", "/v2/models/mlp/infer",
     *_binary({"inputs": [dict(X, parameters={"binary_data_size": 2**62})]}, b"\0" * 8), 400, [f"expected {NBYTES}"]),
    ("binary: trailing bytes", "POST", "/v2/models/mlp/infer", *_binary({"inputs": [BIN_X]}, b"\0" * (NBYTES + 8)),
     400, ["8 bytes after the last input"]),
    ("binary: negative binary_data_size", "POST", "/v2/models/mlp/infer",
     *_binary({"inputs": [dict(X, parameters={"binary_data_size": -4})]}, b""), 400, [">= 0"]),
    ("binary: input without name", "POST", "/v2/models/mlp/infer",
     *_binary({"inputs": [{"shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}, b"\0" * 4),
     400, ["name must be a string"]),
    ("FP16 as JSON", "POST", "/v2/models/mlp/infer", _json([dict(X, datatype="FP16", data=[0.5])]), JH, 400, ["FP16"]),
    ("unsupported Content-Encoding", "POST", "/v2/models/mlp/infer", _json([dict(X, data=[0])]),
     {"Content-Type": "application/json", "Content-Encoding": "br"}, 415, ["'br'", "gzip"]),
    ("truncated gzip body", "POST", "/v2/models/mlp/infer", gzip.compress(b'{"inputs": []}')[:-6],
     {"Content-Type": "application/json", "Content-Encoding": "gzip"}, 400, ["gzip", "truncated"]),
    ("gzip body with trailing garbage", "POST", "/v2/models/mlp/infer", gzip.compress(b'{"inputs": []}') + b"junk",
     {"Content-Type": "application/json", "Content-Encoding": "gzip"}, 400, ["after the end of its gzip stream"]),
    ("deflate body with trailing garbage", "POST", "/v2/models/mlp/infer", zlib.compress(b'{"inputs": []}') + b"junk",
     {"Content-Type": "application/json", "Content-Encoding": "deflate"}, 400, ["after the end of its deflate stream"]),
    ("body over the size limit", "POST", "/v2/models/mlp/infer", b"{}",
     {"Content-Type": "application/json", "Content-Length": str(2**40)}, 413, ["limit"]),
    ("request headers over the cap", "GET", "/v2/health/live", b"", {"X-Big": "a" * 100_000}, 431, ["headers"]),
    ("model repository unload", "POST", "/v2/repository/models/mlp/unload", b"", {}, 403, ["repository", "off"]),
    ("GET on infer", "GET", "/v2/models/mlp/infer", b"", {}, 405, ["Method Not Allowed"]),
    ("V1 protocol", "POST", "/v1/models/mlp:predict", json.dumps({"instances": [[1.0]]}).encode(), JH, 404,
     ["Open Inference Protocol V2 only"]),
    ("V1 explain", "POST", "/v1/models/mlp:explain", b"{}", JH, 404, ["Open Inference Protocol V2 only"]),
]


def test_bad_requests_get_4xx_with_a_json_error_and_the_server_keeps_serving(srv, bundles):
    log_before = srv.log.stat().st_size
    failures = []
    for kind, method, path, body, headers, want, words in BAD:
        try:
            status, res = raw_request(srv, method, path, body, headers)
        except OSError as e:
            failures.append(f"{kind}: no answer ({e})")
            continue
        try:
            err = json.loads(res)["error"]
        except (ValueError, KeyError, TypeError):
            failures.append(f"{kind}: {status}, body is not {{'error': ...}}: {res[:200]!r}")
            continue
        if status != want or not all(w in err for w in words):
            failures.append(f"{kind}: {status} (want {want}) {err[:300]!r} (want words {words})")
        if len(res) > 2000:
            failures.append(f"{kind}: a {len(res)}-byte error echoes too much")
        assert srv.alive(), f"server died after {kind!r}:\n{srv.log_tail()}"
    assert not failures, "\n".join(failures)
    _still_right(srv, bundles)
    c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
    try:
        x = bundles["mlp"][1].example_inputs[0].numpy().astype(np.float64)
        with pytest.raises(InferenceServerException, match="expected 'FP32'"):
            i = httpclient.InferInput("x", list(x.shape), "FP64")
            i.set_data_from_numpy(x)
            c.infer("mlp", [i])
    finally:
        c.close()
    # logs: one line per refusal, no traceback, no 10 MiB string
    log = srv.log.read_bytes()[log_before:]
    assert b"Traceback" not in log, log[-3000:].decode(errors="replace")
    refusals = [ln for ln in log.splitlines() if b"kserve.ascendc_pack:" in ln]
    assert len(refusals) >= len(BAD), log[-3000:].decode(errors="replace")
    assert len(log) < 200 * len(BAD) + 20_000 and max(map(len, refusals)) < 800


# ----------------------------------------------------------------------------- non-finite values


def test_non_finite_values_round_trip_in_json(srv, bundles):
    """NaN/Infinity in, the same literals out (tritonclient writes and reads them); never null."""
    bundle, loaded = bundles["mlp"]
    x = loaded.example_inputs[0].numpy().copy()
    x[0, :3] = [np.nan, np.inf, -np.inf]
    x[5, 7] = np.nan
    ref = eager(loaded, x)
    assert np.isnan(ref[0]).all() and np.isnan(ref[5]).all() and np.isfinite(ref[1]).all()
    c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
    try:
        for binary in (False, True):
            y = infer(c, "mlp", "x", io_names(bundle)[1], x, binary)
            np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)  # NaN where eager has NaN
    finally:
        c.close()
    body = json.dumps({"inputs": [dict(X, data=x.ravel().tolist())]}).encode()
    assert b"NaN" in body and b"Infinity" in body  # Python's json writes the literals too
    status, res = raw_request(srv, "POST", "/v2/models/mlp/infer", body, JH)
    assert status == 200 and b"NaN" in res and b"null" not in res
    data = json.loads(res)["outputs"][0]["data"]
    assert math.isnan(data[0]) and math.isnan(data[5 * 1024]) and not math.isnan(data[1024])


# ----------------------------------------------------------------------------- memory


def _proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def test_gzip_bomb_is_refused_while_decompressing(srv, bundles):
    """87 KB of gzip inflating to 90 MiB of JSON: 413 after at most the body limit of output.
    Before the bounded streaming decompression the server's peak RSS grew by ~1.1 GiB."""
    bomb = gzip.compress(b'{"inputs": [{"name": "x", "shape": [256, 1024], "datatype": "FP32", "data": ['
                         + b"0," * (45 * 2**20) + b"0]}]}", 9)
    assert len(bomb) < 100_000
    pid = srv.proc.pid
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    except OSError:
        pytest.skip("cannot reset the server's peak RSS here")
    rss = _proc_kib(pid, "VmRSS")
    status, res = raw_request(srv, "POST", "/v2/models/mlp/infer", bomb,
                              {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert status == 413 and "decompressed request body is more than" in json.loads(res)["error"]
    grown_mib = (_proc_kib(pid, "VmHWM") - rss) / 1024
    assert grown_mib < 128, f"peak RSS grew by {grown_mib:.0f} MiB"
    _still_right(srv, bundles)


# ----------------------------------------------------------------------------- slow and idle clients


def _read_until_closed(s: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or the deadline passes (False)."""
    got = b""
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, min(0.5, deadline - time.monotonic())))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:  # reset: closed
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False


def _trickle(srv: Server, head: bytes, drip: bytes, budget_s: float) -> tuple[bytes, bool]:
    """Send ``head``, then ``drip`` every 0.5 s until the server closes or ``budget_s`` passes."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(head)
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            got, closed = _read_until_closed(s, min(deadline, time.monotonic() + 0.5))
            if closed or got:
                return got + _read_until_closed(s, time.monotonic() + 5)[0], True
            try:
                s.sendall(drip)
            except OSError:
                return _read_until_closed(s, time.monotonic() + 5)[0], True
        return b"", False
    finally:
        s.close()


def test_bytes_that_are_not_http_get_a_json_400(srv):
    for junk in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello to the plain port
                 b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(junk)
            got, closed = _read_until_closed(s, time.monotonic() + 20)
        assert closed and got.startswith(b"HTTP/1.1 400"), got[:200]
        assert "not valid HTTP/1.1" in json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]


def test_trickled_header_and_body_are_cut_off(srv, bundles):
    got, closed = _trickle(srv, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\n", b"X-Slow: 1\r\n", 60)
    assert closed, "a trickled header was never cut off"
    assert got == b"" or (got.startswith(b"HTTP/1.1 408") and b"--header-timeout" in got), got[:300]
    got, closed = _trickle(srv, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 100000\r\n\r\n{", b" ", 60)
    assert closed, "a trickled body was never cut off"
    assert got.startswith(b"HTTP/1.1 408") and b"--body-timeout" in got, got[:300]
    _still_right(srv, bundles)


def test_half_open_connections_do_not_pin_the_server(srv, bundles):
    """200 connections that never finish their headers: a client still gets answers at once (the
    longest-idle connections make room: a JSON 503 and closed), and the rest are cut off after
    the header timeout."""
    socks = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")
            socks.append(s)
        statuses = [raw_request(srv, "GET", "/v2/health/live")[0] for _ in range(10)]
        assert statuses == [200] * 10, statuses
        deadline = time.monotonic() + HEADER_TIMEOUT + 30
        answers = []
        for s in socks:
            got, closed = _read_until_closed(s, deadline)
            assert closed, "a half-open connection outlived the header timeout"
            answers.append(got[:12])
            assert got == b"" or got.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")), got[:200]
            if got.startswith(b"HTTP/1.1 503"):
                assert b"connection limit" in got, got
        assert any(a.startswith(b"HTTP/1.1 503") for a in answers), "no idle connection made room"
    finally:
        for s in socks:
            s.close()
    _still_right(srv, bundles)


def _in_progress(srv: Server, body: bytes) -> socket.socket:
    """A connection with an infer request in progress: headers sent, the server reading its body
    (it answered ``100 Continue``), the first 1,000 bytes of ``body`` sent."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\nConnection: close\r\nExpect: 100-continue\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
    s.sendall(body[:1000])
    return s


def test_idle_sockets_do_not_starve_the_server(bundles, tmp_path):
    """Issue 37: 200 sockets held open without a byte (more than both limits, with a header
    timeout that outlasts the test) no longer make every other client get 503: the longest-idle
    ones are closed to make room (503), a request in progress never is, and the limit on
    requests in progress still holds."""
    bundle, loaded = bundles["mlp"]
    x = loaded.example_inputs[0].numpy()
    body = json.dumps({"inputs": [dict(X, data=x.ravel().tolist())]}).encode()
    with Server(bundle, tmp_path / "idle.log", tmp_path / "rt_cache",
                extra=["--header-timeout", "300", "--limit-concurrency", str(CONCURRENCY), "--max-connections",
                       "64"]) as srv:
        busy = [_in_progress(srv, body)]
        idle = []
        try:
            for _ in range(200):
                idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
            statuses = [raw_request(srv, "GET", "/v2/health/live")[0] for _ in range(20)]
            assert statuses == [200] * 20, statuses
            c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
            try:
                np.testing.assert_allclose(infer(c, "mlp", *io_names(bundle), x, True), eager(loaded, x),
                                           atol=1e-4, rtol=1e-4)
            finally:
                c.close()
            got, closed = _read_until_closed(idle[0], time.monotonic() + 10)
            assert closed and got.startswith(b"HTTP/1.1 503") and b"--max-connections" in got, got[:300]
            # as many requests in progress as the limit: the next request gets 503 at once
            busy += [_in_progress(srv, body) for _ in range(CONCURRENCY - 1)]
            status, res = raw_request(srv, "GET", "/v2/health/live")
            assert status == 503 and "--limit-concurrency" in json.loads(res)["error"], res
            for s in busy[1:]:
                s.close()
            busy[0].sendall(body[1000:])
            got, _ = _read_until_closed(busy[0], time.monotonic() + 60)
            assert got.startswith(b"HTTP/1.1 200"), got[:300]
            assert raw_request(srv, "GET", "/v2/health/live")[0] == 200
        finally:
            for s in busy + idle:
                s.close()
        log = srv.log.read_text()
        assert log.count("at the server's limits") <= 3, "refusals at the limits flooded the log"
