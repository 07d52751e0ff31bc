#!/usr/bin/env python
"""Build every real-architecture bench model with the current pipeline and check it against eager.

    .venv/bin/python bench/check_models.py [--models resnet18,bert_4l] [--topn 1] [--out DIR]

Per model (bench/models/*.py, the `bench` extra installed): capture+build an .ascpack (own kernel
cache under --out, so build times are cold), load it with the runtime, compare its outputs with
eager PyTorch on the example inputs (atol = rtol = 1e-3, and the max abs diff relative to the
output's scale), and time eager vs the bundle in interleaved rounds (medians; one process, so
only a sanity check; `ascendc-pack bench` is the real benchmark). Failures are recorded with
their reason and the run goes on. Prints one table and writes DIR/check_models.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack import bench  # noqa: E402
from ascendc_pack.frontend.loader import load_model_file  # noqa: E402
from ascendc_pack.pipeline import compare_outputs  # noqa: E402

MODELS = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_s16", "bert_4l", "llama_gqa_4l"]


def check_one(name: str, topn: int, out: Path, rounds: int) -> dict:
    """Build, load, compare and time one bench model; never raises (failures are recorded)."""
    import ascendc_pack_runtime as rt

    path = ROOT / "bench" / "models" / f"{name}.py"
    row: dict = {"model": name, "status": "ok"}
    try:
        t0 = time.perf_counter()
        loaded = load_model_file(path)
        row["load_s"] = time.perf_counter() - t0
        built = bench.build_artifact("bundle1" if topn == 1 else "bundleN", str(path), str(out / name), topn=topn)
        row.update(build_s=built["build_s"], size=built["size"], stages=built.get("stages", {}),
                   kernels=len(built.get("kernels", {})))
        model = rt.load(built["artifact"])
        inputs = loaded.example_inputs
        with torch.no_grad():
            expected = loaded.module(*[t.clone() for t in inputs])
            actual = model(*[t.clone() for t in inputs])
        actual = actual[0] if isinstance(actual, (list, tuple)) and len(actual) == 1 else actual
        diff = (actual.double() - expected.double()).abs().max().item()
        row["max_abs_diff"] = diff
        row["rel_diff"] = diff / max(expected.abs().max().item(), 1e-30)
        problem = compare_outputs(expected, actual, atol=1e-3, rtol=1e-3)
        if problem:
            row["status"] = f"mismatch: {problem}"
        with torch.no_grad():
            med = bench.interleaved_medians({"eager": lambda: loaded.module(*inputs),
                                             "bundle": lambda: model(*inputs)}, rounds=rounds, target_us=20000)
        row.update(eager_ms=med["eager"] / 1e3, bundle_ms=med["bundle"] / 1e3)
    except Exception as exc:  # record and go on: the table is the point
        row["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        row["traceback"] = traceback.format_exc(limit=6)
    return row


def _fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--topn", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "bench_out" / "check_models"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        rows.append(check_one(name, args.topn, out, args.rounds))
        print(f"   {rows[-1]['status']}", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, --topn {args.topn}")
    head = f"{'model':20} {'build s':>8} {'kernels':>7} {'MB':>6} {'max|diff|':>9} {'rel':>8} {'eager ms':>9} {'bundle ms':>9}  status"
    print(head + "\n" + "-" * len(head))
    for r in rows:
        print(f"{r['model']:20} {_fmt(r.get('build_s'), '8.1f')} {_fmt(r.get('kernels'), '7d')} "
              f"{_fmt(r.get('size', 0) / 1e6 if 'size' in r else None, '6.1f')} {_fmt(r.get('max_abs_diff'), '9.2e')} "
              f"{_fmt(r.get('rel_diff'), '8.1e')} {_fmt(r.get('eager_ms'), '9.2f')} {_fmt(r.get('bundle_ms'), '9.2f')}  {r['status']}")
    (out / "check_models.json").write_text(json.dumps({"loadavg": os.getloadavg(), "topn": args.topn, "rows": rows},
                                                      indent=1, default=str))
    if any(r["status"] != "ok" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
