"""A real Triton Inference Server serving what `ascendc-pack export-triton` writes.

tritonserver 2.51 and its Python backend come from the nvidia-pytriton wheel (the `triton` extra,
which .ci/run installs); where it cannot be installed or run (another platform, no libpython
shared library) every test here is skipped with the reason. One server for the module: the
`add_sum` bundle (two inputs, a 0-d output: `dims: [1]` + `reshape`), two instances, loopback,
driven by tritonclient over HTTP (binary, JSON, mixed) and gRPC, its answers compared with the
runtime's own (bit for bit, under the same thread cap) and with eager.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.package.triton_export import export_triton
from ascendc_pack_runtime.triton_config import model_config

from .serve_helpers import build_bundles
from .triton_helpers import DYNAMIC_BUCKETS, DYNAMIC_RANGE, TritonServer, build_dynamic_bundle, skip_without_triton

INSTANCES = 2


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    work = tmp_path_factory.mktemp("triton")
    skip_without_triton(work / "backend")
    bundle, loaded = build_bundles(tmp_path_factory, ["add_sum"])["add_sum"]
    export = export_triton(bundle, work / "repo", instances=INSTANCES)
    with TritonServer(work / "repo", work / "backend", work / "triton.log", work / "rt_cache") as server:
        yield server, export, bundle, loaded


@functools.lru_cache(maxsize=None)
def _cores_torch_uses() -> int:
    """torch's default intra-op threads in a fresh process (what each Triton instance starts with)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip())


def _inputs(loaded, n):
    g = torch.Generator().manual_seed(7)
    return [tuple(torch.randn(t.shape, generator=g, dtype=t.dtype).numpy() for t in loaded.example_inputs)
            for _ in range(n)]


GRPC_CLIENT = """
import sys, numpy as np, tritonclient.grpc as grpcclient
url, model, out_name, path = sys.argv[1:5]
data = np.load(path)
names = [n for n in data.files if not n.startswith("#")]
sets = sorted({int(n.split("/")[0]) for n in names})
c = grpcclient.InferenceServerClient(url)
got = {}
for k in sets:
    ins = []
    for n in sorted((n for n in names if n.startswith(f"{k}/")), key=lambda n: int(data[f"#{n}"])):
        a = data[n]
        i = grpcclient.InferInput(n.split("/", 1)[1], list(a.shape), "FP32")
        i.set_data_from_numpy(a)
        ins.append(i)
    got[str(k)] = c.infer(model, ins).as_numpy(out_name)
c.close()
np.savez(path + ".out.npz", **got)
"""


def _grpc_infer(url: str, model: str, names: list[str], sets: list, out_name: str, tmp: Path) -> list:
    """Each input set through tritonclient's gRPC client, in its own process: its generated protos
    and kserve's (imported by other tests in this process) define the same `inference.*` messages,
    which protobuf refuses to load twice into one process."""
    arrays = {}
    for k, set_ in enumerate(sets):
        for j, (name, a) in enumerate(zip(names, set_)):
            arrays[f"{k}/{name}"] = a
            arrays[f"#{k}/{name}"] = np.array(j)
    path = tmp / "grpc_inputs.npz"
    np.savez(path, **arrays)
    run = subprocess.run([sys.executable, "-c", GRPC_CLIENT, url, model, out_name, str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = np.load(str(path) + ".out.npz")
    return [out[str(k)] for k in range(len(sets))]


def test_triton_serves_the_bundle_over_http_and_grpc(triton, tmp_path):
    import tritonclient.http as httpclient

    server, export, bundle, loaded = triton
    cap = max(1, _cores_torch_uses() // INSTANCES)
    runtime = rt.load(bundle, threads=cap, cache_dir=server.cache_dir)
    names = [s.name for s in runtime.input_specs]
    out_name = runtime.output_specs[0].name
    sets = _inputs(loaded, 3)
    http = httpclient.InferenceServerClient(server.url)
    by_grpc = _grpc_infer(server.grpc_url, export.model_dir.name, names, sets, out_name, tmp_path)
    try:
        for k, arrays in enumerate(sets):
            want = runtime.run_flat(*[torch.from_numpy(a.copy()) for a in arrays])[0].numpy()
            with torch.no_grad():
                eager = loaded.module(*[torch.from_numpy(a.copy()) for a in arrays]).numpy()
            got = {}
            for mode, (binary_in, binary_out) in {"binary": (True, True), "json": (False, False),
                                                  "mixed": (False, True)}.items():
                ins = []
                for name, a in zip(names, arrays):
                    i = httpclient.InferInput(name, list(a.shape), "FP32")
                    i.set_data_from_numpy(a, binary_data=binary_in)
                    ins.append(i)
                r = http.infer(export.model_dir.name, ins, request_id=f"{mode}-{k}",
                               outputs=[httpclient.InferRequestedOutput(out_name, binary_data=binary_out)])
                got[mode] = r.as_numpy(out_name)
            got["grpc"] = by_grpc[k]
            for mode, y in got.items():
                assert y.dtype == np.float32 and y.shape == (1,), (mode, y.shape)   # 0-d: dims [1] + reshape
                # the same bundle under the same thread cap: the same bits
                np.testing.assert_array_equal(y.reshape(()), want, err_msg=mode)
                np.testing.assert_allclose(y.reshape(()), eager, rtol=1e-5, atol=1e-3, err_msg=mode)
    finally:
        http.close()
        runtime.close()


def test_triton_reports_the_exported_config_and_one_execution_per_request(triton):
    import tritonclient.http as httpclient

    server, export, bundle, loaded = triton
    name = export.model_dir.name
    client = httpclient.InferenceServerClient(server.url)
    try:
        config = client.get_model_config(name)
        model = rt.load(bundle, cache_dir=server.cache_dir)
        # what export wrote (and `ascendc-pack serve` reports at /config) is what Triton reports
        want = model_config(name, model.input_specs, model.output_specs, instances=INSTANCES)
        model.close()
        assert config["max_batch_size"] == want["max_batch_size"] == 0 and "dynamic_batching" not in config
        for kind in ("input", "output"):
            assert [{k: e[k] for k in ("name", "data_type", "dims")} for e in config[kind]] == want[kind]
        assert [(i["name"], i["dims"]) for i in config["input"]] == [("x", [32, 1024]), ("y", [1, 1024])]
        assert config["output"][0]["dims"] == [1] and "reshape" not in config["output"][0]   # 0-d: [1]
        assert config["instance_group"][0]["count"] == INSTANCES
        assert config["parameters"] == want["parameters"]
        before = client.get_inference_statistics(name)["model_stats"][0]
        x, y = _inputs(loaded, 1)[0]
        n = 4
        for _ in range(n):
            ins = [httpclient.InferInput("x", list(x.shape), "FP32"), httpclient.InferInput("y", list(y.shape), "FP32")]
            ins[0].set_data_from_numpy(x)
            ins[1].set_data_from_numpy(y)
            client.infer(name, ins)
        after = client.get_inference_statistics(name)["model_stats"][0]
        inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
        executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
        assert inferences == n and executions == n   # a static bundle: Triton never batches
    finally:
        client.close()


def test_triton_bad_requests_get_clear_errors(triton):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    server, export, bundle, loaded = triton
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = np.zeros((2, 2), np.float32)
        i = httpclient.InferInput("x", [2, 2], "FP32")
        i.set_data_from_numpy(x)
        j = httpclient.InferInput("y", [1, 1024], "FP32")
        j.set_data_from_numpy(np.zeros((1, 1024), np.float32))
        with pytest.raises(InferenceServerException, match=r"(?s)'x'.*\[32,1024\]"):
            client.infer(export.model_dir.name, [i, j])
        with pytest.raises(InferenceServerException, match="y"):   # an input missing
            client.infer(export.model_dir.name, [i])
        assert client.is_model_ready(export.model_dir.name)   # and the model still serves
    finally:
        client.close()


def test_triton_model_logs_its_wait_policy_and_thread_cap(triton):
    server, export, bundle, loaded = triton
    lines = [line for line in server.log_text().splitlines() if "ascendc-pack: " in line]
    assert len(lines) == INSTANCES, server.log_text()[-3000:]
    cap = max(1, _cores_torch_uses() // INSTANCES)
    for line in lines:
        # the runtime was imported before torch in the stub's process, so its policy applied
        assert "OMP_WAIT_POLICY=PASSIVE (set by ascendc_pack_runtime" in line, line
        assert re.search(rf"at most {cap} thread\(s\) per call, no batching", line), line


def test_triton_setup_cli_prepares_the_backend_and_prints_the_command(triton, tmp_path):
    """What a user pastes: `ascendc-pack triton-setup DIR --repo REPO` (the fixture's server ran this command)."""
    from click.testing import CliRunner

    from ascendc_pack.cli.main import main

    server, export, bundle, loaded = triton
    r = CliRunner().invoke(main, ["triton-setup", str(tmp_path / "tb"), "--repo", str(export.repo), "--http-port",
                                  "18000", "--grpc-port", "18001"])
    assert r.exit_code == 0, r.output
    backend = tmp_path / "tb" / "python"
    assert (backend / "libtriton_python.so").is_file() and (backend / "triton_python_backend_utils.py").is_file()
    stub = backend / "triton_python_backend_stub"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert stub.is_symlink() and stub.resolve().parent.name == ver   # a link: the stub's $ORIGIN RPATH holds
    command = r.output.strip().splitlines()[-1].strip()
    assert command.startswith(f"PATH={Path(sys.executable).parent}:$PATH ")   # the stub runs this Python
    assert f"--model-repository {export.repo.resolve()} --backend-directory {tmp_path / 'tb'}" in command
    assert "--http-address 127.0.0.1 --http-port 18000 --grpc-address 127.0.0.1 --grpc-port 18001" in command


@pytest.fixture(scope="module")
def dynamic_triton(tmp_path_factory):
    work = tmp_path_factory.mktemp("triton_dynamic")
    skip_without_triton(work / "backend")
    bundle, loaded = build_dynamic_bundle(tmp_path_factory)
    export = export_triton(bundle, work / "repo", name="encoder", max_queue_delay_us=20000)
    with TritonServer(work / "repo", work / "backend", work / "triton.log", work / "rt_cache") as server:
        yield server, export, loaded


def test_triton_batches_the_requests_of_a_dynamic_batch_bundle(dynamic_triton):
    """16 clients send 1- and 2-row requests; Triton's dynamic batcher groups them, model.py runs
    each group as one call: fewer executions than inferences, every answer is eager's."""
    import threading

    import tritonclient.http as httpclient

    server, export, loaded = dynamic_triton
    assert export.batching and export.max_batch_size == DYNAMIC_RANGE[1]
    g = torch.Generator().manual_seed(11)
    item = tuple(loaded.example_inputs[0].shape[1:])
    xs = [[torch.randn((1 + (t + k) % 2, *item), generator=g).numpy() for k in range(3)] for t in range(16)]
    answers, errors = {}, []

    def client(t):
        c = httpclient.InferenceServerClient(server.url, network_timeout=300)
        try:
            for k, x in enumerate(xs[t]):
                i = httpclient.InferInput("x", list(x.shape), "FP32")
                i.set_data_from_numpy(x)
                answers[t, k] = c.infer("encoder", [i]).as_numpy(export_output_name(export))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {t}: {e}")
        finally:
            c.close()

    pool = [threading.Thread(target=client, args=(t,)) for t in range(16)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(300)
    assert not errors, errors[:3]
    for t in range(16):
        for k, x in enumerate(xs[t]):
            with torch.no_grad():
                want = loaded.module(torch.from_numpy(x.copy())).numpy()
            np.testing.assert_allclose(answers[t, k], want, rtol=1e-4, atol=1e-4)
    c = httpclient.InferenceServerClient(server.url)
    try:
        stats = c.get_inference_statistics("encoder")["model_stats"][0]
        config = c.get_model_config("encoder")
    finally:
        c.close()
    rows = sum(x.shape[0] for per in xs for x in per)
    assert int(stats["inference_count"]) == rows
    assert int(stats["execution_count"]) < 48   # requests shared calls
    assert config["dynamic_batching"]["preferred_batch_size"] == [b for b in DYNAMIC_BUCKETS if b > 1]


def export_output_name(export) -> str:
    return rt.read_manifest(export.bundle).outputs[0].name
