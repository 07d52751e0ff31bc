"""`ascendc-pack serve`: KServe's model server on a loopback port, driven by tritonclient.

Every server here is a real subprocess (`python -m ascendc_pack serve ... --host 127.0.0.1`)
on a free port; loops are bounded by deadlines. Needs the `serve` extra (kserve, tritonclient).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("kserve")
httpclient = pytest.importorskip("tritonclient.http")

from .conftest import EXAMPLES  # noqa: E402
from .serve_helpers import (Server, build_bundles, concurrent_run, eager, example_inputs, infer,  # noqa: E402
                            io_names, raw_request)

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


_eager, _io_names, _request = eager, io_names, raw_request


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
        from ascendc_pack_runtime import read_manifest

        manifest = read_manifest(bundles[name][0])
        mm = c.get_model_metadata(name)
        assert mm["name"] == name and mm["versions"] == ["1"] and mm["platform"] == "ascendc-pack_cpu"
        assert mm["inputs"] == [{"name": d.name, "datatype": "FP32", "shape": list(d.shape)} for d in manifest.inputs]
        assert mm["outputs"] == [{"name": d.name, "datatype": "FP32", "shape": list(d.shape)} for d in manifest.outputs]
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


def test_readiness_waits_for_load_and_warm_up(bundles, tmp_path):
    from ascendc_pack_runtime.kserve_model import AscpackModel, bundle_runner

    bundle, _ = bundles["mlp"]
    calls = []

    def factory():
        run = bundle_runner(bundle, tmp_path)

        def counted(*xs):
            calls.append([tuple(x.shape) for x in xs])
            return run(*xs)
        return counted

    m = AscpackModel(bundle, workers=2, runner_factory=factory, cache_dir=tmp_path)
    assert not m.ready and calls == []
    assert m.load() and m.ready
    assert calls == [[(256, 1024)], [(256, 1024)]]  # one warm-up call per instance
    m.stop()
    assert not m.ready

    def broken():
        return lambda *xs: [torch.zeros(3)]

    bad = AscpackModel(bundle, runner_factory=broken, cache_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"warm-up: output .* is torch.float32\[3\]"):
        bad.load()
    assert not bad.ready


def test_kserve_infer_request_goes_through_the_strict_decoder(bundles, tmp_path):
    """AscpackModel in KServe's own REST path (InferRequest objects), not just `ascendc-pack serve`'s."""
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

    from ascendc_pack_runtime.kserve_model import AscpackModel

    bundle, loaded = bundles["mlp"]
    in_name, out_name = _io_names(bundle)
    x = loaded.example_inputs[0].numpy()
    m = AscpackModel(bundle, cache_dir=tmp_path)
    try:
        m.load()
        req = InferRequest(model_name="mlp", request_id="r1", request_outputs=[RequestedOutput(out_name)],
                           infer_inputs=[InferInput(in_name, list(x.shape), "FP32", data=x.ravel().tolist())])
        headers: dict = {}
        res = json.loads(asyncio.run(m.predict(req, None, headers)))
        assert res["id"] == "r1" and headers == {}
        np.testing.assert_allclose(np.asarray(res["outputs"][0]["data"], np.float32).reshape(x.shape), _eager(loaded, x),
                                   atol=1e-4, rtol=1e-4)
        bad = InferRequest(model_name="mlp", infer_inputs=[InferInput(in_name, ["256", 1024], "FP32", data=[0.0])])
        with pytest.raises(InvalidInput, match=r"shape \['256', 1024\]"):
            asyncio.run(m.predict(bad, None, {}))
    finally:
        m.stop()


def test_serve_cli_defaults_are_the_serve_options():
    from ascendc_pack.cli.main import main
    from ascendc_pack_runtime.server import ServeOptions

    d = ServeOptions()
    cli = {p.name: p.default for p in main.commands["serve"].params}
    assert cli["host"] == d.host == "127.0.0.1"  # loopback unless told otherwise (README Serving)
    assert (cli["port"], cli["workers"], cli["access_log"]) == (d.port, d.workers, d.access_log)
    assert (cli["header_timeout"], cli["body_timeout"], cli["keep_alive"], cli["limit_concurrency"],
            cli["max_connections"]) == \
        (d.header_timeout_s, d.body_timeout_s, d.keep_alive_s, d.limit_concurrency, d.max_connections)
    with pytest.raises(ValueError, match="header_timeout_s must be > 0"):
        ServeOptions(header_timeout_s=0)


def test_serving_modules_change_no_global_state_at_import():
    """Importing the launcher imports no KServe; starting it hides sys.argv from KServe's parser
    (which would exit on these arguments) and builds its own app, not KServe's global one."""
    code = """
import sys
sys.argv = ["prog", "--workers", "abc", "--http_port", "x"]
import ascendc_pack_runtime.server as server
import ascendc_pack_runtime.v2_request, ascendc_pack_runtime.http_edge
assert "kserve" not in sys.modules, "importing the launcher imported kserve"
kserve_app, kserve_model = server._import_serving()
assert sys.argv == ["prog", "--workers", "abc", "--http_port", "x"], sys.argv
import kserve.model_server as ms
from kserve import ModelServer
from ascendc_pack_runtime.http_edge import EdgeLimits
routes, middleware = len(ms.app.routes), len(ms.app.user_middleware)
s = ModelServer(enable_grpc=False)
rest = kserve_app.AscpackRESTServer(kserve_app.AscpackDataPlane(model_registry=s.registered_models),
                                    s.model_repository_extension, host="127.0.0.1", port=0,
                                    limits=EdgeLimits(max_body_bytes=1000), access_log=False,
                                    timeout_keep_alive_s=5, limit_concurrency=8)
rest.create_application()
assert (len(ms.app.routes), len(ms.app.user_middleware)) == (routes, middleware), "KServe's global app changed"
first = [r for r in rest.app.routes if getattr(r, "path", "").endswith("/infer")][0]
assert first.endpoint.__qualname__.startswith("infer_route"), first.endpoint
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_serve_cli_errors(tmp_path, bundles):
    from click.testing import CliRunner

    from ascendc_pack.cli.main import main

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
