#!/usr/bin/env python
"""Threading policy on a busy host: OpenMP wait policy x spin count x thread count x contention.

    .venv/bin/python bench/threading_study.py [--seconds 2] [--threads 1,2] [--policies default,passive,...]

Each configuration runs in a fresh process (libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once,
at start) and times three eager workloads, each for ``--seconds``:

* ``convnet``: 4 x (3x3 conv 64 channels @56x56 + ReLU), ~1.9 GFLOP: resnet18's layer1 shape;
* ``ffn``: 4 x BERT FFN (128x256 -> 1024, GELU -> 256), ~1.1 GFLOP;
* ``small``: ``(x + y).sum()`` on 256x1024 (the add_sum example), a few µs of work: all
  overhead, the case that collapses when a spinning team waits for a descheduled thread.

``--contention`` runs every configuration a second time with one more process spinning on a
core (``while True: pass``; the host's own load comes on top). Prints per configuration and
workload the median, p90 and p99 latency, and the CPU time used per call (user+sys of the
process: what spinning costs the neighbours); ``--repeats`` rounds over all configurations
(rotated order, so drift in the host's own load spreads over them), then per configuration the
median over the rounds and the slowdown under contention. Writes
bench_out/threading_study.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin0": {"GOMP_SPINCOUNT": "0"},
}
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "KMP_BLOCKTIME")


def _workloads():
    import torch

    g = torch.Generator().manual_seed(0)
    convs = [torch.nn.Conv2d(64, 64, 3, padding=1, bias=False) for _ in range(4)]
    xc = torch.randn(1, 64, 56, 56, generator=g)
    ffn = [(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)) for _ in range(4)]
    xf = torch.randn(128, 256, generator=g)
    a, b = torch.randn(256, 1024, generator=g), torch.randn(256, 1024, generator=g)

    def convnet():
        h = xc
        for c in convs:
            h = torch.relu(c(h))
        return h

    def ffn_fn():
        h = xf
        for l1, l2 in ffn:
            h = h + l2(torch.nn.functional.gelu(l1(h)))
        return h

    return {"convnet": convnet, "ffn": ffn_fn, "small": lambda: (a + b).sum()}


def child(threads: int, seconds: float) -> None:
    """Time every workload in this process; print one JSON line."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    with torch.no_grad():
        for name, fn in _workloads().items():
            for _ in range(3):
                fn()
            lat = []
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end or len(lat) < 5:
                t0 = time.perf_counter()
                fn()
                lat.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            lat.sort()
            q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1e6
            out[name] = {"n": len(lat), "median_us": statistics.median(lat) * 1e6, "p90_us": q(0.9),
                         "p99_us": q(0.99), "cpu_us_per_call": cpu / len(lat) * 1e6}
    print(json.dumps(out), flush=True)


def run_config(policy: str, threads: int, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(POLICIES[policy])
    proc = subprocess.run([sys.executable, __file__, "--child", str(threads), "--seconds", str(seconds)],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{policy}/{threads}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _med(results, pol, t, busy, workload, key) -> float:
    return statistics.median(r["workloads"][workload][key] for r in results
                             if (r["policy"], r["threads"], r["busy_core"]) == (pol, t, busy))


def _summary(results: list[dict], configs, contention: bool) -> None:
    """Per configuration, the median over repeats of each run's median / p99 / CPU per call."""
    workloads = list(results[0]["workloads"])
    print(f"\nmedian over {1 + max(r['rep'] for r in results)} repeats: median ms / p99 ms / CPU ms per call"
          + ("; with one core busy; slowdown = busy median ÷ host median" if contention else ""))
    for pol, t in configs:
        cells = []
        for w in workloads:
            cell = " / ".join(f"{_med(results, pol, t, False, w, k) / 1e3:.3g}" for k in ("median_us", "p99_us", "cpu_us_per_call"))
            if contention:
                busy = " / ".join(f"{_med(results, pol, t, True, w, k) / 1e3:.3g}" for k in ("median_us", "p99_us", "cpu_us_per_call"))
                slow = _med(results, pol, t, True, w, "median_us") / _med(results, pol, t, False, w, "median_us")
                cell += f" | busy {busy} | {slow:.2f}x"
            cells.append(f"{w}: {cell}")
        print(f"  {pol:8} {t}t  " + "   ".join(cells))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--repeats", type=int, default=3, help="rounds over all configurations (rotated order)")
    p.add_argument("--contention", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", default=str(ROOT / "bench_out" / "threading_study.json"))
    args = p.parse_args(argv)
    if args.child is not None:
        child(args.child, args.seconds)
        return
    configs = [(pol, int(t)) for pol in args.policies.split(",") for t in args.threads.split(",")]
    results = []
    for rep in range(args.repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]  # rotate: spread drift
        for busy in ([False, True] if args.contention else [False]):
            spinner = _spinner() if busy else None
            try:
                for pol, t in order:
                    load = os.getloadavg()[0]
                    res = run_config(pol, t, args.seconds)
                    results.append({"rep": rep, "policy": pol, "threads": t, "busy_core": busy, "load1": load,
                                    "workloads": res})
                    print(f"#{rep} {'busy' if busy else 'host':4} {pol:8} {t}t load {load:5.2f}  " + "  ".join(
                        f"{w} {r['median_us'] / 1e3:8.3f}ms p99 {r['p99_us'] / 1e3:8.3f} cpu "
                        f"{r['cpu_us_per_call'] / 1e3:7.3f}" for w, r in res.items()), flush=True)
            finally:
                if spinner:
                    spinner.kill()
                    spinner.wait()
    _summary(results, configs, args.contention)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cores": os.cpu_count(), "seconds": args.seconds, "repeats": args.repeats,
                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
