"""Helpers of the serving tests: build the example bundles once, run `ascendc-pack serve` as a
subprocess on a free loopback port, and drive it with tritonclient from many threads.

Run as a script, it measures instead of testing (not part of the test suite):

    python -m tests.serve_helpers [--models mlp,transformer_block] [--threads 16] [--requests 50]

serves each bundle and, for comparison, the same model's eager PyTorch module through the same
server (``serve --eager``), and prints throughput and p50/p99 latency of the concurrent run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .conftest import EXAMPLES, ROOT

_BUNDLES: dict[str, tuple[Path, object]] = {}


def build_bundles(tmp_path_factory, names) -> dict[str, tuple[Path, object]]:
    """``{name: (bundle path, LoadedModel)}``: reuses bundles another test module built in this
    process, else builds only the ones asked for (candidate 0 of every kernel, no PGO)."""
    from ascendc_pack.config import BuildConfig

    from . import bundle_fixtures as bf

    root = bf.build_root(tmp_path_factory)
    config = None
    for name in names:
        if name in _BUNDLES:
            continue
        if name in bf._BUILT:
            b = bf._BUILT[name]
        else:
            config = config or BuildConfig.resolve(topn=1, cache_dir=root / "build_cache", jobs=2)
            b = bf.build_model_file(EXAMPLES / f"{name}.py", root / "serve" / f"{name}.ascpack", config)
        _BUNDLES[name] = (b.bundle, b.loaded)
    return {n: _BUNDLES[n] for n in names}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    pass


def wait_http_ready(proc: subprocess.Popen, port: int, timeout: float, log_tail, stop, what: str) -> None:
    """Poll ``GET /v2/health/ready`` on 127.0.0.1:``port`` until 200; a ServerError with the log's
    tail when ``proc`` exits or ``timeout`` passes (then ``stop()`` first)."""
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with {proc.returncode}:\n{log_tail()}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v2/health/ready")
            status = c.getresponse().status
            c.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    stop()
    raise ServerError(f"{what} not ready after {timeout} s:\n{log_tail()}")


@dataclass
class Server:
    """``ascendc-pack serve`` in a subprocess on 127.0.0.1 (a context manager)."""

    bundle: Path
    log: Path
    cache_dir: Path
    workers: int = 1
    name: str | None = None
    eager: Path | None = None
    extra: list[str] = field(default_factory=list)
    ready_timeout: float = 120.0
    command: list[str] | None = None
    """What runs the server before the bundle argument (default: this Python's ``ascendc-pack serve``)."""
    cwd: Path = ROOT
    port: int = 0
    proc: subprocess.Popen | None = None
    script: str | None = None
    """Python source run instead of the CLI (``PORT`` is defined in it): a server made with the
    Python API (``ascendc_pack_runtime.server.serve``)."""

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.port = free_port()
        prefix = self.command or [sys.executable, "-m", "ascendc_pack", "serve"]
        cmd = [*prefix, str(self.bundle), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", str(self.workers), "--no-access-log", *self.extra]
        if self.name:
            cmd += ["--name", self.name]
        if self.eager:
            cmd += ["--eager", str(self.eager)]
        if self.script is not None:
            cmd = [sys.executable, "-c", f"PORT = {self.port}\n{self.script}"]
        env = dict(os.environ, ASCENDC_PACK_RUNTIME_CACHE=str(self.cache_dir), PYTHONUNBUFFERED="1")
        self._log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, cwd=self.cwd, env=env)
        self.wait_ready()
        return self

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_ready(self) -> None:
        wait_http_ready(self.proc, self.port, self.ready_timeout, self.log_tail, self.stop, "server")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        stop_process(self.proc, signal.SIGTERM, timeout=20)
        self._log_file.close()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """Send ``sig`` to a running server process and wait up to ``timeout`` s; then kill it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def raw_request(srv: Server, method: str, path: str, body: bytes = b"", headers: dict | None = None,
                timeout: float = 60) -> tuple[int, bytes]:
    """One request over a fresh http.client connection: (status, body)."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def eager(loaded, x: np.ndarray) -> np.ndarray:
    """The example module's output for ``x`` (a copy: the module may not write into it)."""
    with torch.no_grad():
        return loaded.module(torch.from_numpy(x.copy())).numpy()


def io_names(bundle: Path) -> tuple[str, str]:
    """(first input name, first output name) of a bundle."""
    from ascendc_pack_runtime import read_manifest

    m = read_manifest(bundle)
    return m.inputs[0].name, m.outputs[0].name


def infer(client, model: str, name_in: str, name_out: str, x: np.ndarray, binary: bool, version: str = ""):
    import tritonclient.http as httpclient

    datatype = {np.float32: "FP32"}[x.dtype.type]
    i = httpclient.InferInput(name_in, list(x.shape), datatype)
    i.set_data_from_numpy(x, binary_data=binary)
    o = httpclient.InferRequestedOutput(name_out, binary_data=binary)
    return client.infer(model, [i], outputs=[o], model_version=version).as_numpy(name_out)


@dataclass
class RunStats:
    requests: int
    errors: list[str]
    wrong: int
    wall_s: float
    latencies_ms: list[float]

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def summary(self) -> str:
        return (f"{self.requests} requests, {len(self.errors)} errors, {self.wrong} wrong, {self.wall_s:.1f} s: "
                f"{self.throughput:.2f} req/s, p50 {self.pct(50):.1f} ms, p99 {self.pct(99):.1f} ms")


def concurrent_run(url: str, model: str, name_in: str, name_out: str, inputs: list[np.ndarray],
                   expected: list[np.ndarray], threads: int = 16, per_thread: int = 50,
                   atol: float = 1e-5, binary: bool = True, timeout_s: float = 600.0) -> RunStats:
    """``threads`` client threads (one tritonclient each: it is not thread safe) send
    ``per_thread`` requests each, cycling through ``inputs``; every output is checked."""
    import tritonclient.http as httpclient

    errors: list[str] = []
    latencies: list[float] = []
    wrong = [0]
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)
    deadline = time.monotonic() + timeout_s

    def worker(t: int) -> None:
        client = httpclient.InferenceServerClient(url, connection_timeout=120, network_timeout=300)
        try:
            start.wait()
            for k in range(per_thread):
                if time.monotonic() > deadline:
                    with lock:
                        errors.append(f"thread {t}: out of time after {k} requests")
                    return
                j = (t + k) % len(inputs)
                t0 = time.perf_counter()
                try:
                    y = infer(client, model, name_in, name_out, inputs[j], binary)
                except Exception as e:  # noqa: BLE001 - counted, reported by the caller
                    with lock:
                        errors.append(f"thread {t} request {k}: {e}")
                    continue
                dt = (time.perf_counter() - t0) * 1e3
                ok = y.shape == expected[j].shape and np.allclose(y, expected[j], atol=atol, rtol=atol)
                with lock:
                    latencies.append(dt)
                    wrong[0] += 0 if ok else 1
        finally:
            client.close()

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join(max(1.0, deadline - time.monotonic() + 30))
    wall = time.perf_counter() - t0
    return RunStats(threads * per_thread, errors, wrong[0], wall, latencies)


def example_inputs(loaded, n: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` input arrays shaped like the example's single input."""
    (x,) = loaded.example_inputs
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(x.shape, generator=g, dtype=x.dtype).numpy() for _ in range(n)]


# ----------------------------------------------------------------------------- measurement


def _measure(argv: list[str]) -> None:
    import argparse
    import tempfile

    import ascendc_pack_runtime as rt

    p = argparse.ArgumentParser(prog="python -m tests.serve_helpers")
    p.add_argument("--models", default="mlp,transformer_block")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--requests", type=int, default=50, help="per thread")
    p.add_argument("--workers", default="1,2", help="instance counts to try")
    p.add_argument("--bundle-dir", default=None, help="reuse <dir>/<model>.ascpack if present")
    a = p.parse_args(argv)

    class _Factory:  # the bits of pytest's tmp_path_factory that build_bundles uses
        def __init__(self, base):
            self.base = Path(base)

        def getbasetemp(self):
            return self.base

    work = Path(tempfile.mkdtemp(prefix="ascpack_serve_bench_"))
    names = a.models.split(",")
    bundles = {}
    for n in names:
        pre = Path(a.bundle_dir) / f"{n}.ascpack" if a.bundle_dir else None
        if pre is not None and pre.is_file():
            from ascendc_pack.frontend.loader import load_model_file
            bundles[n] = (pre, load_model_file(EXAMPLES / f"{n}.py"))
        else:
            bundles.update(build_bundles(_Factory(work), [n]))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}; torch {torch.__version__}; "
          f"{a.threads} threads x {a.requests} requests, binary tensors")
    for n in names:
        bundle, loaded = bundles[n]
        model = rt.load(bundle, cache_dir=work / "rt")
        ins = example_inputs(loaded, 4)
        expected = [model.run_flat(torch.from_numpy(x.copy()))[0].numpy() for x in ins]
        in_name, out_name = model.input_specs[0].name, model.output_specs[0].name
        # in-process reference: one call after another, no server
        for label, fn in (("bundle", model.run_flat), ("eager", loaded.module)):
            ts = []
            with torch.no_grad():
                for k in range(20):
                    x = torch.from_numpy(ins[k % 4].copy())
                    t0 = time.perf_counter()
                    fn(x)
                    ts.append((time.perf_counter() - t0) * 1e3)
            print(f"{n:18s} {label:6s} in-process, sequential: median {np.median(ts[2:]):.1f} ms per call", flush=True)
        model.close()
        for workers in [int(w) for w in a.workers.split(",")]:
            for variant in ("bundle", "eager"):
                srv = Server(bundle, work / f"{n}-{variant}-{workers}.log", work / "rt", workers=workers,
                             eager=EXAMPLES / f"{n}.py" if variant == "eager" else None)
                with srv:
                    # eager differs from the bundle by float rounding only
                    st = concurrent_run(srv.url, n, in_name, out_name, ins, expected, a.threads, a.requests,
                                        atol=1e-5 if variant == "bundle" else 1e-3)
                print(f"{n:18s} {variant:6s} workers={workers}: {st.summary()}", flush=True)
                for e in st.errors[:3]:
                    print("   ", e)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    _measure(sys.argv[1:])
