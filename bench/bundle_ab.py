"""A/B of bundles of one model (and optionally ONNX Runtime) in one process, interleaved.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/bundle_ab.py MODEL.py A.ascpack [B.ascpack ...] [--ort DIR]

Every contender runs ``--calls`` back-to-back calls per round, rounds interleaved; the report is
the median per-call wall time and process CPU time, and each contender's ratio to the first one
(the median over rounds of the per-round ratio, so slow phases of a shared host cancel out).
``--ort DIR`` adds ONNX Runtime (spinning off, intra-op threads = usable cores, as in the
bench), exporting the model to DIR on first use; ratios are then to ONNX Runtime.
``--one-thread`` also times every contender on one thread and prints what the other cores buy
each (1-thread wall ÷ all-cores wall): a contender that gains little from the second core loses
little when another process takes it, which is what the bench's contention ratio (slowdown ÷
ONNX Runtime's) rewards. For a quick check of a change, not a benchmark: ``ascendc-pack bench`` /
``bench/run_all.py`` run each contender in its own process.

To compare with another commit, build its bundle from a worktree of that commit *as the current
directory* (``cd ../old && PYTHONPATH=.:runtime python -m ascendc_pack build ...``): Python puts
the current directory ahead of ``PYTHONPATH``, so running from this checkout builds with this
checkout's code whatever ``PYTHONPATH`` says.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ascendc_pack_runtime as rt  # noqa: E402  (before torch: the threading policy)
import torch  # noqa: E402,F401

from ascendc_pack.frontend.loader import load_model_file  # noqa: E402


def _artifact(kind: str, suffix: str, model_file: str, out_dir: str) -> str:
    """The ``*.<suffix>`` model file in ``out_dir``, exported there (``build_artifact(kind)``) on
    first use."""
    from ascendc_pack.bench.contenders import build_artifact

    found = sorted(Path(out_dir).glob(f"*.{suffix}")) if Path(out_dir).is_dir() else []
    if not found:
        build_artifact(kind, model_file, out_dir)
        found = sorted(Path(out_dir).glob(f"*.{suffix}"))
    return str(found[0])


def _ort_runner(model_file: str, out_dir: str, module, inputs, threads: int | None = None):
    from ascendc_pack.bench.contenders import _ort_binder

    return _ort_binder(_artifact("onnx", "onnx", model_file, out_dir), module, len(inputs), threads)(list(inputs))


def _ov_runner(model_file: str, out_dir: str, inputs):
    """OpenVINO float32, as the bench's ``ov_f32`` contender runs it (the .xml is made in
    ``out_dir`` on first use)."""
    from ascendc_pack.bench.contenders import _openvino_binder

    bind, _ = _openvino_binder(_artifact("openvino", "xml", model_file, out_dir), f32=True)
    return bind(list(inputs))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("bundles", nargs="+")
    p.add_argument("--ort", metavar="DIR", help="also time ONNX Runtime (the .onnx is exported to DIR once)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--one-thread", action="store_true", help="also time every contender on one thread")
    args = p.parse_args(argv)
    loaded = load_model_file(args.model_file)
    inputs = loaded.example_inputs
    runs = {}
    for threads in (None, 1) if args.one_thread else (None,):
        tag = " (1 thread)" if threads else ""
        if args.ort:
            runs["onnxruntime" + tag] = _ort_runner(args.model_file, args.ort, loaded.module, inputs, threads)
        for b in args.bundles:
            m = rt.load(b, threads=threads)
            runs[b + tag] = lambda m=m: m(*inputs)
    for run in runs.values():
        for _ in range(5):
            run()
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    for _ in range(args.rounds):
        for k, run in runs.items():
            ts = []
            c0 = time.process_time()
            for _ in range(args.calls):
                t0 = time.perf_counter()
                run()
                ts.append(time.perf_counter() - t0)
            cpu[k].append((time.process_time() - c0) / args.calls)
            wall[k].append(statistics.median(ts))
    first = next(iter(runs))
    print(f"load average {os.getloadavg()[0]:.2f}; ratios to {first}")
    for k in runs:
        rw = statistics.median(a / b for a, b in zip(wall[k], wall[first]))
        rc = statistics.median(a / b for a, b in zip(cpu[k], cpu[first]))
        print(f"{k:40s} wall {statistics.median(wall[k]) * 1e3:9.3f} ms  x{rw:5.2f}   "
              f"cpu {statistics.median(cpu[k]) * 1e3:9.3f} ms  x{rc:5.2f}")
    for k in runs:
        if k + " (1 thread)" in runs:
            gain = statistics.median(a / b for a, b in zip(wall[k + " (1 thread)"], wall[k]))
            print(f"{k:40s} 1 thread ÷ all cores: {gain:.2f}")


if __name__ == "__main__":
    sys.exit(main())
