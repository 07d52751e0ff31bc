#!/usr/bin/env python
"""Serving an encoder to concurrent batch-1 clients: Triton and ``ascendc-pack serve``, with and
without batching, beside the in-process runtime.

    ascendc-pack build bench/models/serve_encoder.py --topn 2 -o serve_encoder.ascpack
    nice -n 10 .venv/bin/python bench/serve_batching.py --bundle serve_encoder.ascpack [--clients 16] [--requests 25]

``--bundle`` is a bundle with a batch dim (dynamic shapes: ``batch_spec`` of its manifest); the
contenders are

* ``triton batching``: ``export-triton`` (``dynamic_batching``, the buckets preferred) served by a
  real tritonserver (the ``triton`` extra); ``triton off``: ``--no-dynamic-batching``;
* ``serve batching``: ``ascendc-pack serve`` (its Batcher, ``--max-batch-delay-ms``);
  ``serve off``: ``--no-batching``;
* ``in-process``: ``rt.load`` in this process, one batch-1 call after another (median), and one
  call of the largest batch divided by its rows.

Every contender is its own server process, started and stopped in turn (the in-process calls
run in the same rounds, while no server runs); ``--clients`` threads
(one tritonclient each) send ``--requests`` one-row binary requests each, cycling over 8 inputs,
and every answer is compared with the in-process result for the same row. Rounds rotate the
order of the contenders (interleaved); the table gives the median of the rounds for requests/s,
p50 and p99, the rows per model call (the servers' statistics: inferences / executions), and
``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack_runtime as rt  # noqa: E402  (first: its OpenMP wait policy)
from ascendc_pack_runtime.batching import batch_spec  # noqa: E402

from tests.serve_helpers import Server, concurrent_run  # noqa: E402
from tests.triton_helpers import TritonServer, triton_unavailable  # noqa: E402


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def stats_of(url: str, model: str) -> tuple[int, int]:
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(url)
    try:
        s = c.get_inference_statistics(model)["model_stats"][0]
        return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))
    finally:
        c.close()


def median_ms(fn, arg, n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(*arg)
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts[2:])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True, type=Path)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=25, help="per client and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--delay-ms", type=float, default=2.0, help="batching delay of both servers")
    p.add_argument("--contenders", default="triton batching,triton off,serve batching,serve off")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.clients < 1 or a.requests < 1:
        raise SystemExit("--rounds, --clients and --requests must be >= 1")

    work = Path(tempfile.mkdtemp(prefix="ascpack_serve_batching_"))
    model = rt.load(a.bundle, cache_dir=work / "rt")
    spec = batch_spec(model.manifest)
    if spec is None:
        raise SystemExit(f"{a.bundle} has no batch dim (static shapes): build it with --dynamic-batch MIN:MAX "
                         "(or get_dynamic_shapes()), e.g. bench/models/serve_encoder.py")
    if len(spec.inputs) != 1 or len(spec.outputs) != 1 or spec.inputs[0].dtype != torch.float32:
        raise SystemExit("this bench drives models with one FP32 input and one output")
    item = spec.inputs[0].item_shape
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn((1, *item), generator=g) for _ in range(8)]
    call = model.run_flat
    expected = [call(x)[0].numpy().copy() for x in rows]
    big = torch.randn((spec.max_batch, *item), generator=g)
    name = model.name
    in_name, out_name = spec.inputs[0].name, spec.outputs[0].name

    contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    skip = {}
    if any(c.startswith("triton") for c in contenders):
        reason = triton_unavailable(work / "backend")
        if reason:
            skip.update({c: reason for c in contenders if c.startswith("triton")})
    from ascendc_pack.package.triton_export import export_triton

    export_triton(a.bundle, work / "repo_on", name=name, max_queue_delay_us=round(a.delay_ms * 1e3))
    export_triton(a.bundle, work / "repo_off", name=name, dynamic_batching=False)

    def server(contender: str):
        log = work / f"{contender.replace(' ', '_')}.log"
        batching = contender.endswith("batching")
        if contender.startswith("triton"):
            return TritonServer(work / ("repo_on" if batching else "repo_off"), work / "backend", log, work / "rt")
        return Server(a.bundle, log, work / "rt",
                      extra=["--max-batch-delay-ms", str(a.delay_ms)] if batching else ["--no-batching"])

    before = uptime()
    print(f"{a.bundle.name}: item {list(item)}, max batch "
          f"{spec.max_batch}, preferred {list(spec.preferred)}; {a.clients} clients x {a.requests} batch-1 requests "
          f"x {a.rounds} rounds; torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    print(f"uptime before: {before}", flush=True)
    for c, why in skip.items():
        print(f"  {c}: skipped ({why})", flush=True)
    runs = [c for c in contenders if c not in skip]
    results: dict[str, list] = {c: [] for c in runs}
    inproc: list[tuple[float, float]] = []
    for r in range(a.rounds):
        order = runs[r % len(runs):] + runs[:r % len(runs)]
        for c in order + ["in-process"]:
            if c == "in-process":   # in the same rounds as the servers, none of which runs meanwhile
                inproc.append((median_ms(call, (rows[0],), 40), median_ms(call, (big,), 10)))
                print(f"  round {r + 1} in-process     batch 1 {inproc[-1][0]:.2f} ms, batch {spec.max_batch} "
                      f"{inproc[-1][1]:.2f} ms per call", flush=True)
                continue
            with server(c) as srv:
                inf0, ex0 = stats_of(srv.url, name)
                st = concurrent_run(srv.url, name, in_name, out_name, [x.numpy() for x in rows], expected,
                                    a.clients, a.requests, atol=1e-4)
                inf1, ex1 = stats_of(srv.url, name)
            per_call = (inf1 - inf0) / max(1, ex1 - ex0)
            results[c].append((st.throughput, st.pct(50), st.pct(99), per_call, len(st.errors), st.wrong))
            print(f"  round {r + 1} {c:15s} {st.summary()}, {per_call:.1f} rows per call", flush=True)
            for e in st.errors[:3]:
                print("     ", e, flush=True)
    print(f"uptime after: {uptime()}")
    print()
    print("| contender | requests/s | p50 ms | p99 ms | rows per call | errors / wrong |")
    print("|---|---|---|---|---|---|")
    for c in runs:
        rs = results[c]
        med = [statistics.median(x[i] for x in rs) for i in range(4)]
        print(f"| {c} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} | "
              f"{sum(x[4] for x in rs)} / {sum(x[5] for x in rs)} |")
    model.close()
    inproc_1 = statistics.median(x[0] for x in inproc)
    inproc_max = statistics.median(x[1] for x in inproc)
    print(f"| in-process runtime, batch 1 | {1e3 / inproc_1:.1f} | {inproc_1:.2f} (one call) | | 1 | |")
    print(f"| in-process runtime, batch {spec.max_batch} | {1e3 * spec.max_batch / inproc_max:.1f} rows/s | "
          f"{inproc_max:.2f} (one call) | | {spec.max_batch} | |")
    for c in runs:
        on, off = c, c.replace("batching", "off")
        if c.endswith("batching") and off in results:
            ratio = statistics.median(x[0] for x in results[on]) / statistics.median(x[0] for x in results[off])
            print(f"{c.split()[0]}: batching gives {ratio:.2f}x the requests/s of the same server without")


if __name__ == "__main__":
    main()
