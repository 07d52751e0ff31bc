"""`ascendc-pack serve`: batching concurrent requests, what it prints, and the Triton extensions it
answers (`/v2` lists only what it serves; `get_model_config`, `get_inference_statistics`).

The batching server is the eager mlp (each of its rows is an item of 1024; it takes any number
of rows) behind `ascendc_pack_runtime.server.serve` with a BatchSpec built here, since no bundle
has a batch dim before dynamic shapes; 16 client threads send 1-row requests and every answer is
checked against eager on that request's rows. The static server is the mlp bundle itself.
"""

from __future__ import annotations

import json
import textwrap
import threading

import numpy as np
import pytest
import torch

from .conftest import EXAMPLES
from .serve_helpers import Server, build_bundles, raw_request

MAX_BATCH = 32


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return build_bundles(tmp_path_factory, ["mlp"])["mlp"]


@pytest.fixture(scope="module")
def static_server(mlp, tmp_path_factory):
    work = tmp_path_factory.mktemp("static")
    with Server(mlp[0], work / "serve.log", work / "rt", extra=["--access-log"]) as srv:
        yield srv


def _eager_batch_server(mlp, work, batching):
    script = textwrap.dedent(f"""
        import ascendc_pack_runtime
        import torch
        from ascendc_pack_runtime.batching import BatchedTensor, BatchSpec
        from ascendc_pack_runtime.eager import load_eager_module
        from ascendc_pack_runtime.server import ServeOptions, serve

        module = load_eager_module({str(EXAMPLES / 'mlp.py')!r})

        def factory():
            def run(x):
                with torch.no_grad():
                    return [module(x)]
            return run

        spec = BatchSpec((BatchedTensor("x", torch.float32, (1024,)),),
                         (BatchedTensor("output_0", torch.float32, (1024,)),), max_batch={MAX_BATCH}, preferred=(8, 16))
        serve({str(mlp[0])!r}, ServeOptions(port=PORT, access_log=False, max_batch_delay_s=0.02, batching={batching}),
              runner_factory=factory, platform="pytorch_eager", batch=spec)
    """)
    return Server(mlp[0], work / "serve.log", work / "rt", script=script)


@pytest.fixture(scope="module")
def batch_server(mlp, tmp_path_factory):
    with _eager_batch_server(mlp, tmp_path_factory.mktemp("batch"), True) as srv:
        yield srv


def _infer(client, x, binary=True):
    import tritonclient.http as httpclient

    i = httpclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    return client.infer("mlp", [i], outputs=[httpclient.InferRequestedOutput("output_0", binary_data=binary)]) \
        .as_numpy("output_0")


def test_serve_batches_concurrent_requests_and_answers_each_with_its_rows(batch_server, mlp):
    import tritonclient.http as httpclient

    loaded = mlp[1]
    rng = np.random.default_rng(3)
    threads, per_thread = 16, 4
    xs = [[rng.standard_normal((1 if (t + k) % 4 else 3, 1024), dtype=np.float32) for k in range(per_thread)]
          for t in range(threads)]
    answers: dict = {}
    errors: list = []
    start = threading.Barrier(threads)

    def client(t):
        c = httpclient.InferenceServerClient(batch_server.url, network_timeout=300)
        try:
            start.wait()
            for k, x in enumerate(xs[t]):
                answers[t, k] = _infer(c, x, binary=k % 2 == 0)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {t}: {e}")
        finally:
            c.close()

    pool = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(300)
    assert not errors, errors[:3]
    for t in range(threads):
        for k, x in enumerate(xs[t]):
            with torch.no_grad():
                want = loaded.module(torch.from_numpy(x.copy())).numpy()
            assert answers[t, k].shape == x.shape
            np.testing.assert_allclose(answers[t, k], want, rtol=1e-4, atol=1e-5)
    c = httpclient.InferenceServerClient(batch_server.url)
    try:
        (stats,) = c.get_inference_statistics("mlp")["model_stats"]
        rows = sum(x.shape[0] for per in xs for x in per)
        assert stats["inference_count"] == rows
        assert stats["execution_count"] < threads * per_thread   # requests shared calls
        meta = c.get_model_metadata("mlp")
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1024]}]
        config = c.get_model_config("mlp")
        assert config["max_batch_size"] == MAX_BATCH and config["input"][0]["dims"] == [1024]
        assert config["dynamic_batching"] == {"preferred_batch_size": [8, 16], "max_queue_delay_microseconds": 20000}
    finally:
        c.close()


def test_serve_without_batching_runs_each_request_as_its_own_call(mlp, tmp_path):
    import tritonclient.http as httpclient

    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1 + k % 2, 1024), dtype=np.float32) for k in range(8)]
    answers = {}

    def send(k):
        c = httpclient.InferenceServerClient(srv.url, network_timeout=300)
        try:
            answers[k] = _infer(c, xs[k])
        finally:
            c.close()

    with _eager_batch_server(mlp, tmp_path, False) as srv:
        pool = [threading.Thread(target=send, args=(k,)) for k in range(len(xs))]
        for th in pool:
            th.start()
        for th in pool:
            th.join(300)
        c = httpclient.InferenceServerClient(srv.url)
        (stats,) = c.get_inference_statistics("mlp")["model_stats"]
        config = c.get_model_config("mlp")
        c.close()
        log = srv.log_tail()
    assert stats["execution_count"] == len(xs) and stats["inference_count"] == sum(x.shape[0] for x in xs)
    assert config["max_batch_size"] == MAX_BATCH and "dynamic_batching" not in config
    assert "batching off (requests of up to 32 rows, each its own call)" in log
    for k, x in enumerate(xs):
        with torch.no_grad():
            np.testing.assert_allclose(answers[k], mlp[1].module(torch.from_numpy(x.copy())).numpy(), rtol=1e-4,
                                       atol=1e-5)


def test_serve_batching_refuses_requests_that_do_not_fit(batch_server):
    for shape, words in (([1, 512], "expected [rows, 1024] with 1 <= rows <= 32"),
                         ([MAX_BATCH + 1, 1024], "expected [rows, 1024] with 1 <= rows <= 32"),
                         ([1024], "expected [rows, 1024]")):
        n = int(np.prod(shape))
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": [0.0] * n}]})
        status, out = raw_request(batch_server, "POST", "/v2/models/mlp/infer", body.encode(),
                                  {"Content-Type": "application/json"})
        assert status == 400 and words in json.loads(out)["error"], (shape, out[:300])


def test_serve_prints_its_start_ready_and_access_lines(static_server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(static_server.url)
    try:
        _infer(c, np.zeros((256, 1024), np.float32))
    finally:
        c.close()
    log = static_server.log_tail(20000)
    url = f"http://127.0.0.1:{static_server.port}"
    assert f"as 'mlp' on {url} (V2 REST, 1 instance(s)" in log and "no batching (the bundle has static shapes)" in log
    assert f"model 'mlp' ready (1 instance(s) loaded and warmed up in " in log
    assert f"): POST {url}/v2/models/mlp/infer" in log
    assert '"POST /v2/models/mlp/infer HTTP/1.1" 200' in log   # an access line, without -v


def test_serve_advertises_what_it_serves_and_answers_config_and_stats(static_server, mlp):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(static_server.url)
    try:
        ext = c.get_server_metadata()["extensions"]
        assert sorted(ext) == ["binary_tensor_data", "model_configuration", "statistics"]
        status, _ = raw_request(static_server, "POST", "/v2/repository/index")
        assert status == 403   # hence not advertised
        config = c.get_model_config("mlp")
        assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
        assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [256, 1024]}]
        assert config["output"] == [{"name": "output_0", "data_type": "TYPE_FP32", "dims": [256, 1024]}]
        assert c.get_model_config("mlp", "1") == config
        before = c.get_inference_statistics("mlp")["model_stats"][0]
        for _ in range(3):
            _infer(c, np.ones((256, 1024), np.float32))
        after = c.get_inference_statistics("mlp")["model_stats"][0]
        assert after["inference_count"] - before["inference_count"] == 3
        assert after["execution_count"] - before["execution_count"] == 3
    finally:
        c.close()
    status, out = raw_request(static_server, "GET", "/v2/models/nope/config")
    assert status == 404 and "not served here" in json.loads(out)["error"]


def _client():
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_client", EXAMPLES / "client.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_client_checks_against_eager_and_fails_on_a_mismatch(static_server, tmp_path, capsys):
    client = _client()
    url = f"http://{static_server.url}"   # a scheme is accepted
    assert client.main(["--url", url, "--model", "mlp", "--repeat", "1", "--check", str(EXAMPLES / "mlp.py")]) == 0
    assert "outputs match" in capsys.readouterr().out
    off = tmp_path / "mlp_off.py"   # the same model, one weight changed: the server's answers no longer match
    off.write_text((EXAMPLES / "mlp.py").read_text() + textwrap.dedent("""

        _get_model = get_model

        def get_model():
            m = _get_model()
            with torch.no_grad():
                next(m.parameters()).view(-1)[0] += 1.0
            return m
    """))
    assert client.main(["--url", static_server.url, "--model", "mlp", "--repeat", "1", "--check", str(off)]) == 2
    assert "error: the server's outputs differ from" in capsys.readouterr().err


def test_example_client_reports_a_bad_url_and_an_absent_server_in_one_line(capsys):
    from .serve_helpers import free_port

    client = _client()
    port = free_port()   # nothing listens there
    assert client.main(["--url", f"127.0.0.1:{port}", "--model", "mlp"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach 127.0.0.1:{port} (") and "is the server running?" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for url in ("https://127.0.0.1:8080", "127.0.0.1:8080/v2", "localhost"):
        with pytest.raises(SystemExit, match=r"^error: --url .*host:port"):
            client.main(["--url", url, "--model", "mlp"])


def test_serve_batches_a_dynamic_batch_bundle(tmp_path_factory, tmp_path):
    """The bundle itself with a batch dim (dynamic shapes): 16 clients of 1-row requests."""
    import tritonclient.http as httpclient

    from .triton_helpers import build_dynamic_bundle

    bundle, loaded = build_dynamic_bundle(tmp_path_factory)
    item = tuple(loaded.example_inputs[0].shape[1:])
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn((1, *item), generator=g).numpy() for _ in range(32)]
    answers, errors = {}, []

    def send(k):
        c = httpclient.InferenceServerClient(srv.url, network_timeout=300)
        try:
            for j in range(k, len(xs), 16):
                i = httpclient.InferInput("x", list(xs[j].shape), "FP32")
                i.set_data_from_numpy(xs[j])
                answers[j] = c.infer(name, [i]).as_numpy(out)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))
        finally:
            c.close()

    import ascendc_pack_runtime as rt

    manifest = rt.read_manifest(bundle)
    name, out = manifest.model_name, manifest.outputs[0].name
    with Server(bundle, tmp_path / "serve.log", tmp_path / "rt", extra=["--max-batch-delay-ms", "20"]) as srv:
        pool = [threading.Thread(target=send, args=(k,)) for k in range(16)]
        for th in pool:
            th.start()
        for th in pool:
            th.join(300)
        c = httpclient.InferenceServerClient(srv.url)
        (stats,) = c.get_inference_statistics(name)["model_stats"]
        c.close()
    assert not errors, errors[:3]
    assert stats["inference_count"] == len(xs) and stats["execution_count"] < len(xs)
    for j, x in enumerate(xs):
        with torch.no_grad():
            np.testing.assert_allclose(answers[j], loaded.module(torch.from_numpy(x.copy())).numpy(), rtol=1e-4,
                                       atol=1e-4)
