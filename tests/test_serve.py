"""`ascendc-pack serve`: KServe's model server on a loopback port, driven by tritonclient.

Every server here is a real subprocess (`python -m ascendc_pack serve ... --host 127.0.0.1`)
on a free port; loops are bounded by deadlines. Needs the `serve` extra (kserve, tritonclient).
"""

from __future__ import annotations

import gzip
import http.client
import json

import numpy as np
import pytest
import torch

pytest.importorskip("kserve")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from .conftest import EXAMPLES  # noqa: E402
from .serve_helpers import Server, build_bundles, concurrent_run, example_inputs, infer  # noqa: E402

MODELS = ["mlp", "transformer_block"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return build_bundles(tmp_path_factory, MODELS)


@pytest.fixture(scope="module")
def servers(bundles, tmp_path_factory):
    """One server per bundle: mlp with a pool of 2 instances, transformer_block with 1."""
    d = tmp_path_factory.mktemp("serve")
    started = {}
    try:
        for name, workers in (("mlp", 2), ("transformer_block", 1)):
            started[name] = Server(bundles[name][0], d / f"{name}.log", d / "rt_cache", workers=workers).start()
        yield started
    finally:
        for s in started.values():
            s.stop()


def _eager(loaded, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return loaded.module(torch.from_numpy(x.copy())).numpy()


def _io_names(bundle):
    from ascendc_pack_runtime.bundle import open_bundle

    m = open_bundle(bundle).manifest
    return m["inputs"][0]["name"], m["outputs"][0]["name"]


# ----------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("name", MODELS)
def test_health_and_metadata(servers, bundles, name):
    srv = servers[name]
    c = httpclient.InferenceServerClient(srv.url)
    try:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(name)
        assert c.is_model_ready(name, model_version="1")
        assert not c.is_model_ready("no_such_model")
        meta = c.get_server_metadata()
        assert meta["name"] == "kserve" and "binary_tensor_data" in meta["extensions"]
        from ascendc_pack_runtime.bundle import open_bundle

        manifest = open_bundle(bundles[name][0]).manifest
        mm = c.get_model_metadata(name)
        assert mm["name"] == name and mm["versions"] == ["1"] and mm["platform"] == "ascendc-pack_cpu"
        assert mm["inputs"] == [{"name": d["name"], "datatype": "FP32", "shape": d["shape"]} for d in manifest["inputs"]]
        assert mm["outputs"] == [{"name": d["name"], "datatype": "FP32", "shape": d["shape"]} for d in manifest["outputs"]]
    finally:
        c.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("name", MODELS)
def test_tritonclient_infer_matches_eager(servers, bundles, name, binary):
    bundle, loaded = bundles[name]
    in_name, out_name = _io_names(bundle)
    (x,) = [t.numpy() for t in loaded.example_inputs]
    ref = _eager(loaded, x)
    c = httpclient.InferenceServerClient(servers[name].url, network_timeout=120)
    try:
        y = infer(c, name, in_name, out_name, x, binary)
        assert y.dtype == np.float32 and y.shape == ref.shape
        np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)
        # no requested outputs: tritonclient asks for binary outputs (binary_data_output)
        i = httpclient.InferInput(in_name, list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        r = c.infer(name, [i], model_version="1", request_id="req-7")
        assert r.get_response()["id"] == "req-7"
        np.testing.assert_allclose(r.as_numpy(out_name), y, atol=0, rtol=0)
    finally:
        c.close()


def test_compressed_requests(servers, bundles):
    bundle, loaded = bundles["transformer_block"]
    in_name, out_name = _io_names(bundle)
    (x,) = [t.numpy() for t in loaded.example_inputs]
    ref = _eager(loaded, x)
    c = httpclient.InferenceServerClient(servers["transformer_block"].url, network_timeout=120)
    try:
        for algo in ("gzip", "deflate"):
            i = httpclient.InferInput(in_name, list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            r = c.infer("transformer_block", [i], request_compression_algorithm=algo)
            np.testing.assert_allclose(r.as_numpy(out_name), ref, atol=1e-4, rtol=1e-4)
    finally:
        c.close()


def test_json_without_content_type_is_json(servers, bundles):
    """The KServe 0.21 gap: a V2 JSON body without Content-Type (as tritonclient sends it)."""
    bundle, loaded = bundles["mlp"]
    in_name, out_name = _io_names(bundle)
    x = loaded.example_inputs[0].numpy()
    body = json.dumps({"inputs": [{"name": in_name, "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    status, res = _request(servers["mlp"], "POST", "/v2/models/mlp/infer", body, {})
    assert status == 200, res
    out = json.loads(res)["outputs"][0]
    assert out["name"] == out_name and out["datatype"] == "FP32" and out["shape"] == list(x.shape)
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(x.shape), _eager(loaded, x),
                               atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- bad requests


def _request(srv, method, path, body=b"", headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _binary(header: dict, payload: bytes, json_len: int | None = None):
    head = json.dumps(header).encode()
    n = len(head) if json_len is None else json_len
    return head + payload, {"Inference-Header-Content-Length": str(n), "Content-Type": "application/octet-stream"}


def _bad_requests():
    """(kind, method, path, body, headers, expected status, words the error must contain)."""
    x = {"name": "x", "shape": [256, 1024], "datatype": "FP32"}
    ok_json = lambda inputs, **kw: json.dumps({"inputs": inputs, **kw}).encode()  # noqa: E731
    jh = {"Content-Type": "application/json"}
    nbytes = 256 * 1024 * 4
    cases = [
        ("unknown model (infer)", "POST", "/v2/models/nope/infer", ok_json([dict(x, data=[0])]), jh, 404,
         ["'nope'", "serves ['mlp']"]),
        ("unknown model (metadata)", "GET", "/v2/models/nope", b"", {}, 404, ["'nope'", "mlp"]),
        ("unknown model version", "POST", "/v2/models/mlp/versions/2/infer", ok_json([dict(x, data=[0])]), jh,
         404, ["version '2'", "['1']"]),
        ("unknown input name", "POST", "/v2/models/mlp/infer",
         ok_json([dict(x, name="y", data=[0])]), jh, 400, ["no input 'y'", "'x' (FP32 [256, 1024])"]),
        ("missing input", "POST", "/v2/models/mlp/infer", ok_json([]), jh, 400, ["missing input", "'x'"]),
        ("input given twice", "POST", "/v2/models/mlp/infer", ok_json([dict(x, data=[0]), dict(x, data=[0])]), jh,
         400, ["twice"]),
        ("wrong shape", "POST", "/v2/models/mlp/infer", ok_json([dict(x, shape=[2, 2], data=[1, 2, 3, 4])]), jh,
         400, ["shape [2, 2]", "expected [256, 1024]"]),
        ("wrong datatype", "POST", "/v2/models/mlp/infer", ok_json([dict(x, datatype="FP64", data=[0])]), jh, 400,
         ["'FP64'", "expected 'FP32'"]),
        ("not a V2 datatype", "POST", "/v2/models/mlp/infer", ok_json([dict(x, datatype="FLOAT", data=[0])]), jh,
         400, ["not a V2 datatype", "'FP32'"]),
        ("too few values", "POST", "/v2/models/mlp/infer", ok_json([dict(x, data=[1.0, 2.0, 3.0])]), jh, 400,
         ["3 values", "262144"]),
        ("non-numeric data", "POST", "/v2/models/mlp/infer", ok_json([dict(x, data=["a", "b"])]), jh, 400,
         ["not an array of FP32"]),
        ("unknown requested output", "POST", "/v2/models/mlp/infer",
         ok_json([dict(x, data=[0])], outputs=[{"name": "nope"}]), jh, 400, ["no output 'nope'"]),
        ("binary_data_output not a bool", "POST", "/v2/models/mlp/infer",
         ok_json([dict(x, data=[0])], parameters={"binary_data_output": "yes"}), jh, 400, ["true or false"]),
        ("malformed JSON", "POST", "/v2/models/mlp/infer", b'{"inputs": [', jh, 400, ["JSON"]),
        ("JSON that is not an object", "POST", "/v2/models/mlp/infer", b"[1, 2]", jh, 400, ["inputs"]),
        ("no 'inputs'", "POST", "/v2/models/mlp/infer", b"{}", jh, 400, ["inputs", "Field required"]),
        ("input without datatype", "POST", "/v2/models/mlp/infer",
         ok_json([{"name": "x", "shape": [256, 1024], "data": [0]}]), jh, 400, ["datatype"]),
        ("shape is a string", "POST", "/v2/models/mlp/infer", ok_json([dict(x, shape="256x1024", data=[0])]), jh,
         400, ["shape"]),
        ("empty body", "POST", "/v2/models/mlp/infer", b"", jh, 400, ["body"]),
        ("garbage without Content-Type", "POST", "/v2/models/mlp/infer", b"\x00\x01garbage", {}, 400, ["JSON"]),
        ("text/plain body", "POST", "/v2/models/mlp/infer", ok_json([dict(x, data=[0])]),
         {"Content-Type": "text/plain"}, 400, ["Inference-Header-Content-Length"]),
        ("binary: header length not a number", "POST", "/v2/models/mlp/infer",
         *(lambda b, h: (b, dict(h, **{"Inference-Header-Content-Length": "abc"})))(
             *_binary({"inputs": [x]}, b"")), 400, ["must be an integer", "'abc'"]),
        ("binary: header length past the body", "POST", "/v2/models/mlp/infer",
         *_binary({"inputs": [x]}, b"", json_len=10_000), 400, ["Inference-Header-Content-Length is 10000"]),
        ("binary: JSON part is not JSON", "POST", "/v2/models/mlp/infer",
         b"not json at all!", {"Inference-Header-Content-Length": "8"}, 400, ["not valid JSON"]),
        ("binary: fewer bytes than declared", "POST", "/v2/models/mlp/infer",
         *_binary({"inputs": [dict(x, parameters={"binary_data_size": nbytes})]}, b"\0" * 64), 400,
         [f"declares {nbytes} bytes", "only 64"]),
        ("binary: size does not fit the shape", "POST", "/v2/models/mlp/infer",
         *_binary({"inputs": [dict(x, parameters={"binary_data_size": 8})]}, b"\0" * 8), 400,
         ["8 bytes", f"expected {nbytes}"]),
        ("binary: trailing bytes", "POST", "/v2/models/mlp/infer",
         *_binary({"inputs": [dict(x, parameters={"binary_data_size": 8})]}, b"\0" * 16), 400,
         ["8 bytes after the last input"]),
        ("binary: negative binary_data_size", "POST", "/v2/models/mlp/infer",
         *_binary({"inputs": [dict(x, parameters={"binary_data_size": -4})]}, b""), 400, [">= 0"]),
        ("binary: input without name", "POST", "/v2/models/mlp/infer",
         *_binary({"inputs": [{"shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]},
                  b"\0" * 4), 400, ["name must be a string"]),
        ("FP16 as JSON", "POST", "/v2/models/mlp/infer", ok_json([dict(x, datatype="FP16", data=[0.5])]), jh, 400,
         ["FP16"]),
        ("unsupported Content-Encoding", "POST", "/v2/models/mlp/infer", ok_json([dict(x, data=[0])]),
         {"Content-Type": "application/json", "Content-Encoding": "br"}, 415, ["'br'", "gzip"]),
        ("corrupt gzip body", "POST", "/v2/models/mlp/infer", gzip.compress(b'{"inputs": []}')[:-6],
         {"Content-Type": "application/json", "Content-Encoding": "gzip"}, 400, ["gzip"]),
        ("body over the size limit", "POST", "/v2/models/mlp/infer", b"{}",
         {"Content-Type": "application/json", "Content-Length": str(2**40)}, 413, ["limit"]),
        ("GET on infer", "GET", "/v2/models/mlp/infer", b"", {}, 405, ["Method Not Allowed"]),
        ("V1 protocol", "POST", "/v1/models/mlp:predict", json.dumps({"instances": [[1.0]]}).encode(), jh, 400,
         ["Open Inference Protocol V2"]),
    ]
    return cases


BAD = _bad_requests()


def test_bad_requests_get_4xx_with_a_json_error_and_the_server_keeps_serving(servers, bundles):
    srv = servers["mlp"]
    failures = []
    for kind, method, path, body, headers, want, words in BAD:
        try:
            status, res = _request(srv, method, path, body, headers)
        except (OSError, http.client.HTTPException) as e:
            failures.append(f"{kind}: no answer ({e})")
            continue
        try:
            err = json.loads(res)["error"]
        except (ValueError, KeyError, TypeError):
            failures.append(f"{kind}: {status}, body is not {{'error': ...}}: {res[:200]!r}")
            continue
        if status != want or not all(w in err for w in words):
            failures.append(f"{kind}: {status} (want {want}) {err!r} (want words {words})")
        assert srv.alive(), f"server died after {kind!r}:\n{srv.log_tail()}"
    assert len(BAD) >= 20
    assert not failures, "\n".join(failures)
    # still serving, and still right
    bundle, loaded = bundles["mlp"]
    in_name, out_name = _io_names(bundle)
    x = loaded.example_inputs[0].numpy()
    c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
    try:
        assert c.is_server_live() and c.is_model_ready("mlp")
        np.testing.assert_allclose(infer(c, "mlp", in_name, out_name, x, True), _eager(loaded, x), atol=1e-4, rtol=1e-4)
        with pytest.raises(InferenceServerException, match="expected 'FP32'"):
            i = httpclient.InferInput(in_name, list(x.shape), "FP64")
            i.set_data_from_numpy(x.astype(np.float64))
            c.infer("mlp", [i])
    finally:
        c.close()


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_clients(servers, bundles):
    """16 client threads x 50 binary requests against a 2-instance pool: no errors, right answers."""
    bundle, loaded = bundles["mlp"]
    in_name, out_name = _io_names(bundle)
    import ascendc_pack_runtime as rt

    model = rt.load(bundle, cache_dir=servers["mlp"].cache_dir)
    ins = example_inputs(loaded, 4)
    expected = [model.run_flat(torch.from_numpy(x.copy()))[0].numpy() for x in ins]
    model.close()
    np.testing.assert_allclose(expected[0], _eager(loaded, ins[0]), atol=1e-4, rtol=1e-4)
    st = concurrent_run(servers["mlp"].url, "mlp", in_name, out_name, ins, expected, threads=16, per_thread=50,
                        timeout_s=400)
    assert not st.errors, st.errors[:5]
    assert st.wrong == 0 and len(st.latencies_ms) == 800, st.summary()
    assert servers["mlp"].alive()


# ----------------------------------------------------------------------------- variants, CLI


def test_eager_variant_serves_the_same_signature(bundles, tmp_path):
    bundle, loaded = bundles["mlp"]
    in_name, out_name = _io_names(bundle)
    x = loaded.example_inputs[0].numpy()
    with Server(bundle, tmp_path / "eager.log", tmp_path / "rt", eager=EXAMPLES / "mlp.py", name="mlp_eager") as srv:
        c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
        try:
            mm = c.get_model_metadata("mlp_eager")
            assert mm["platform"] == "pytorch_eager" and mm["inputs"][0]["name"] == in_name
            np.testing.assert_allclose(infer(c, "mlp_eager", in_name, out_name, x, True), _eager(loaded, x),
                                       atol=1e-6, rtol=1e-6)
        finally:
            c.close()
    assert srv.proc.returncode is not None


def test_a_model_that_fails_to_load_ends_the_server(bundles, tmp_path):
    """Warm-up fails (the eager module does not take the bundle's inputs): exit 1, error logged."""
    from .serve_helpers import ServerError

    srv = Server(bundles["mlp"][0], tmp_path / "bad.log", tmp_path / "rt", eager=EXAMPLES / "transformer_block.py",
                 ready_timeout=60)
    with pytest.raises(ServerError, match="server exited with 1"):
        srv.start()
    assert "model 'mlp' failed to load" in srv.log_tail()
    srv.stop()

def test_readiness_waits_for_load_and_warm_up(bundles):
    from ascendc_pack_runtime.kserve_model import AscpackModel, bundle_runner

    bundle, _ = bundles["mlp"]
    calls = []

    def factory():
        run = bundle_runner(bundle)

        def counted(*xs):
            calls.append([tuple(x.shape) for x in xs])
            return run(*xs)
        return counted

    m = AscpackModel(bundle, workers=2, runner_factory=factory)
    assert not m.ready and calls == []
    assert m.load() and m.ready
    assert calls == [[(256, 1024)], [(256, 1024)]]  # one warm-up call per instance
    m.stop()
    assert not m.ready

    def broken():
        return lambda *xs: [torch.zeros(3)]

    bad = AscpackModel(bundle, runner_factory=broken)
    with pytest.raises(RuntimeError, match=r"warm-up: output .* is torch.float32\[3\]"):
        bad.load()
    assert not bad.ready


def test_serve_cli_errors(tmp_path, bundles):
    from click.testing import CliRunner

    from ascendc_pack.cli import main

    r = CliRunner().invoke(main, ["serve", str(tmp_path / "missing.ascpack")])
    assert r.exit_code == 1 and "missing.ascpack" in r.output
    r = CliRunner().invoke(main, ["serve", str(bundles["mlp"][0]), "--name", "a b/c"])
    assert r.exit_code == 1 and "not usable in a URL path" in r.output
    r = CliRunner().invoke(main, ["serve", str(bundles["mlp"][0]), "--workers", "0"])
    assert r.exit_code == 2


def test_v2_tensor_codecs_round_trip():
    """Binary/JSON codecs for datatypes the examples do not use (BF16, BOOL, INT64, FP16)."""
    from ascendc_pack_runtime import v2
    from ascendc_pack_runtime.model import TensorSpec

    for dtype in (torch.bfloat16, torch.bool, torch.int64, torch.float16, torch.uint8):
        spec = TensorSpec("t", (2, 3), dtype)
        t = (torch.arange(6).reshape(2, 3) % 2 == 0) if dtype == torch.bool else \
            (torch.arange(6).reshape(2, 3) * 0.75 - 1).to(dtype) if dtype.is_floating_point else \
            torch.arange(6, dtype=dtype).reshape(2, 3)
        raw = v2.tensor_bytes(t)
        assert len(raw) == 6 * dtype.itemsize
        back = v2.tensor_from_bytes(spec, memoryview(raw))
        assert back.dtype == dtype and torch.equal(back, t)
        back[0, 0] = back[0, 1]  # writable, not a view of the request body
        if dtype not in (torch.float16, torch.bfloat16):
            assert torch.equal(v2.tensor_from_json(spec, v2.tensor_json(t)), t)
    assert v2.tensor_from_json(TensorSpec("h", (2,), torch.bfloat16), [0.5, 1.5]).dtype == torch.bfloat16
    with pytest.raises(v2.RequestError, match="bytes other than 0 and 1"):
        v2.tensor_from_bytes(TensorSpec("b", (2,), torch.bool), b"\x00\x02")
    with pytest.raises(v2.UnservableBundleError, match="complex64"):
        v2.v2_datatype(TensorSpec("z", (2,), torch.complex64))
