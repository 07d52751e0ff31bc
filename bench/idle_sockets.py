#!/usr/bin/env python
"""Does a client of ``ascendc-pack serve`` keep getting answers while idle sockets are held open?

    nice -n 10 .venv/bin/python bench/idle_sockets.py BUNDLE.ascpack [--idle 200] [--requests 200]

Starts ``ascendc-pack serve BUNDLE`` with its defaults (concurrency limit 64, header timeout
10 s) on a free loopback port, then, in rounds whose order rotates, runs one live client that
sends ``--requests`` requests one after another, each on a fresh connection
(``GET /v2/models/<model>/ready``, an answer that needs the server but not the model's compute),
and ``--infers`` binary inference calls through one kept-alive tritonclient, while:

* ``none``: nothing else is connected;
* ``held``: ``--idle`` sockets were opened before the client started and are held, never sending
  a byte (those the server closes stay closed);
* ``churn``: an attacker keeps ``--idle`` sockets open the whole time, reopening every socket the
  server closes at once.

Prints, per scenario, the answers that were 200 and the p50 / p99 latency of every request (a
refused request's latency included), with ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import http.client
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serve_helpers import Server, io_names  # noqa: E402


class Attacker:
    """``n`` idle sockets to ``port``; with ``churn`` every socket the server closes is reopened."""

    def __init__(self, port: int, n: int, churn: bool):
        self.port, self.n, self.churn = port, n, churn
        self.stop = threading.Event()
        self.opened = 0
        self.sel = selectors.DefaultSelector()
        for _ in range(n):
            self._open()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self) -> None:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.05):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if data:
                    continue            # a 503 being written: its close follows
                self.sel.unregister(s)
                s.close()
                if self.churn and not self.stop.is_set():
                    try:
                        self._open()
                    except OSError:
                        pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def _live(srv: Server, model: str, requests: int) -> tuple[list[int], list[float]]:
    statuses, ms = [], []
    for _ in range(requests):
        t = time.perf_counter()
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            c.request("GET", f"/v2/models/{model}/ready")
            r = c.getresponse()
            r.read()
            statuses.append(r.status)
            c.close()
        except OSError:
            statuses.append(0)
        ms.append((time.perf_counter() - t) * 1e3)
    return statuses, ms


def _infers(srv: Server, bundle: Path, model: str, n: int) -> tuple[int, list[float]]:
    import tritonclient.http as httpclient

    from ascendc_pack_runtime import read_manifest

    name_in, name_out = io_names(bundle)
    spec = read_manifest(bundle).inputs[0]
    x = np.random.default_rng(0).standard_normal(spec.shape).astype(np.float32)
    ok, ms = 0, []
    client = httpclient.InferenceServerClient(srv.url, network_timeout=60)
    try:
        for _ in range(n):
            t = time.perf_counter()
            try:
                i = httpclient.InferInput(name_in, list(x.shape), "FP32")
                i.set_data_from_numpy(x, binary_data=True)
                client.infer(model, [i], outputs=[httpclient.InferRequestedOutput(name_out, binary_data=True)])
                ok += 1
            except Exception:  # noqa: BLE001 - counted
                pass
            ms.append((time.perf_counter() - t) * 1e3)
    finally:
        client.close()
    return ok, ms


def _pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q)) if v else float("nan")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", type=Path)
    p.add_argument("--idle", type=int, default=200)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--infers", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path("/tmp/ascpack_idle_sockets"))
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    from ascendc_pack_runtime import read_manifest

    model = read_manifest(a.bundle).model_name
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    results: dict[str, dict[str, list]] = {}
    with Server(a.bundle, a.work / "server.log", a.work / "rt_cache", name=model) as srv:
        scenarios = ["none", "held", "churn"]
        for r in range(a.rounds):
            for sc in scenarios[r % 3:] + scenarios[:r % 3]:
                attacker = Attacker(srv.port, a.idle, churn=sc == "churn") if sc != "none" else None
                time.sleep(0.5)     # the server has accepted them
                try:
                    statuses, ms = _live(srv, model, a.requests)
                    ok, ims = _infers(srv, a.bundle, model, a.infers)
                finally:
                    opened = attacker.opened if attacker else 0
                    if attacker:
                        attacker.close()
                res = results.setdefault(sc, {"ok": [], "ms": [], "iok": [], "ims": [], "opened": []})
                res["ok"].append(statuses.count(200))
                res["ms"] += ms
                res["iok"].append(ok)
                res["ims"] += ims
                res["opened"].append(opened)
                time.sleep(1.0)
        log = (a.work / "server.log").read_text(errors="replace")
    print("uptime after: ", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{a.rounds} rounds; per round {a.requests} fresh-connection requests and {a.infers} kept-alive binary "
          f"infers by one live client; {a.idle} idle sockets")
    for sc, res in results.items():
        print(f"  {sc:6s} ready: {sum(res['ok'])}/{a.requests * a.rounds} answered 200, p50 {_pct(res['ms'], 50):.2f} "
              f"ms, p99 {_pct(res['ms'], 99):.2f} ms | infer: {sum(res['iok'])}/{a.infers * a.rounds} ok, p50 "
              f"{_pct(res['ims'], 50):.2f} ms, p99 {_pct(res['ims'], 99):.2f} ms | attacker sockets opened per round: "
              f"{statistics.median(res['opened']):.0f}")
    lines = log.count("at the server's limits")
    print(f"server log: {lines} lines about refusals at the limits (at most one per 10 s)")


if __name__ == "__main__":
    main()
