#!/usr/bin/env python
"""Serving an encoder to concurrent batch-1 clients: Triton and ``ascendc-pack serve``, with and
without batching, beside the in-process runtime.

    nice -n 10 .venv/bin/python bench/serve_batching.py --bundle ENC.ascpack [--clients 16] [--requests 25]
    nice -n 10 .venv/bin/python bench/serve_batching.py --bundle tb.ascpack --eager examples/transformer_block.py

``--bundle`` is a bundle with a batch dim (dynamic shapes: ``batch_spec`` of its manifest); the
contenders are

* ``triton batching``: ``export-triton`` (``dynamic_batching``, the buckets preferred) served by a
  real tritonserver (the ``triton`` extra); ``triton off``: ``--no-dynamic-batching``;
* ``serve batching``: ``ascendc-pack serve`` (its Batcher, ``--max-batch-delay-ms``);
  ``serve off``: ``--no-batching``;
* ``in-process``: ``rt.load`` in this process, one batch-1 call after another (median), and one
  call of the largest batch divided by its rows.

With ``--eager MODEL.py`` (before bundles have a batch dim) the server runs the model file's
eager module behind ``serve``'s Python API with a BatchSpec made from ``--bundle``'s shapes
(dim 0 is the rows; the model's rows must be independent), Triton is left out, and the
in-process row is the eager module.

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
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack_runtime as rt  # noqa: E402  (first: its OpenMP wait policy)
from ascendc_pack_runtime.batching import BatchedTensor, BatchSpec, batch_spec  # noqa: E402

from tests.serve_helpers import Server, concurrent_run  # noqa: E402
from tests.triton_helpers import TritonServer, triton_unavailable  # noqa: E402


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spec_from_shapes(model) -> BatchSpec:
    """A BatchSpec whose rows are dim 0 of the bundle's (static) shapes: for --eager."""
    rows = model.input_specs[0].shape[0]
    return BatchSpec(tuple(BatchedTensor(s.name, s.dtype, s.shape[1:]) for s in model.input_specs),
                     tuple(BatchedTensor(s.name, s.dtype, s.shape[1:]) for s in model.output_specs),
                     max_batch=rows, preferred=tuple(sorted({max(1, rows // 2), rows})))


def eager_script(bundle: Path, model_file: Path, spec: BatchSpec, batching: bool, delay_ms: float) -> str:
    items = [(b.name, b.item_shape) for b in spec.inputs], [(b.name, b.item_shape) for b in spec.outputs]
    return textwrap.dedent(f"""
        import ascendc_pack_runtime
        import torch
        from torch.utils import _pytree as pytree
        from ascendc_pack_runtime.batching import BatchedTensor, BatchSpec
        from ascendc_pack_runtime.eager import load_eager_module
        from ascendc_pack_runtime.server import ServeOptions, serve

        module = load_eager_module({str(model_file)!r})

        def factory():
            def run(*inputs):
                with torch.no_grad():
                    return pytree.tree_leaves(module(*inputs))
            return run

        ins, outs = {items!r}
        spec = BatchSpec(tuple(BatchedTensor(n, torch.float32, s) for n, s in ins),
                         tuple(BatchedTensor(n, torch.float32, s) for n, s in outs),
                         max_batch={spec.max_batch}, preferred={spec.preferred!r})
        serve({str(bundle)!r}, ServeOptions(port=PORT, access_log=False, batching={batching},
              max_batch_delay_s={delay_ms / 1e3}), runner_factory=factory, platform="pytorch_eager", batch=spec)
    """)


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
    p.add_argument("--eager", type=Path, default=None, help="serve this model file's eager module (see above)")
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
    spec = spec_from_shapes(model) if a.eager else batch_spec(model.manifest)
    if spec is None:
        raise SystemExit(f"{a.bundle} has no batch dim (static shapes); pass a dynamic-batch bundle, or --eager MODEL.py")
    if len(spec.inputs) != 1 or len(spec.outputs) != 1 or spec.inputs[0].dtype != torch.float32:
        raise SystemExit("this bench drives models with one FP32 input and one output")
    item = spec.inputs[0].item_shape
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn((1, *item), generator=g) for _ in range(8)]
    if a.eager:
        from ascendc_pack_runtime.eager import load_eager_module

        module = load_eager_module(a.eager)

        def call(*x):
            with torch.no_grad():
                return [module(*x)]
    else:
        call = model.run_flat
    expected = [call(x)[0].numpy().copy() for x in rows]
    big = torch.randn((spec.max_batch, *item), generator=g)
    name = model.name
    in_name, out_name = spec.inputs[0].name, spec.outputs[0].name
    if a.eager:
        model.close()

    contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    skip = {}
    if a.eager:
        skip.update({c: "needs a bundle with a batch dim" for c in contenders if c.startswith("triton")})
    elif any(c.startswith("triton") for c in contenders):
        reason = triton_unavailable(work / "backend")
        if reason:
            skip.update({c: reason for c in contenders if c.startswith("triton")})
    if not a.eager:
        from ascendc_pack.package.triton_export import export_triton

        export_triton(a.bundle, work / "repo_on", name=name, max_queue_delay_us=round(a.delay_ms * 1e3))
        export_triton(a.bundle, work / "repo_off", name=name, dynamic_batching=False)

    def server(contender: str):
        log = work / f"{contender.replace(' ', '_')}.log"
        batching = contender.endswith("batching")
        if contender.startswith("triton"):
            return TritonServer(work / ("repo_on" if batching else "repo_off"), work / "backend", log, work / "rt")
        if a.eager:
            return Server(a.bundle, log, work / "rt", script=eager_script(a.bundle, a.eager, spec, batching, a.delay_ms))
        return Server(a.bundle, log, work / "rt",
                      extra=["--max-batch-delay-ms", str(a.delay_ms)] if batching else ["--no-batching"])

    before = uptime()
    print(f"{a.bundle.name}{' (eager ' + a.eager.name + ')' if a.eager else ''}: item {list(item)}, max batch "
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
    if not a.eager:
        model.close()
    label = "eager" if a.eager else "runtime"
    inproc_1 = statistics.median(x[0] for x in inproc)
    inproc_max = statistics.median(x[1] for x in inproc)
    print(f"| in-process {label}, batch 1 | {1e3 / inproc_1:.1f} | {inproc_1:.2f} (one call) | | 1 | |")
    print(f"| in-process {label}, batch {spec.max_batch} | {1e3 * spec.max_batch / inproc_max:.1f} rows/s | "
          f"{inproc_max:.2f} (one call) | | {spec.max_batch} | |")
    for c in runs:
        on, off = c, c.replace("batching", "off")
        if c.endswith("batching") and off in results:
            ratio = statistics.median(x[0] for x in results[on]) / statistics.median(x[0] for x in results[off])
            print(f"{c.split()[0]}: batching gives {ratio:.2f}x the requests/s of the same server without")


if __name__ == "__main__":
    main()
