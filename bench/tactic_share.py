#!/usr/bin/env python
"""What the tactics buy, per model: tactic winner ÷ ATen-as-captured per heavy step and the share
of the bundle's latency spent in tuned steps (tactic steps and fused kernels).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/tactic_share.py [--models resnet18,mlp] [--topn 4]

Models are names of ``bench/models/*.py`` or ``examples/*.py``. Per model: build a bundle with
``--topn`` (own cache under ``--out``, so cold), then from the build's PGO record:

* per use of a tactic step (a heavy GEMM / convolution / attention step of the graph): the chosen
  candidate's median ÷ candidate 0's (ATen as captured, its epilogue as the fused kernel); the
  geomean over uses, per kind and overall;
* the bundle's latency (median of ``--calls`` calls after a warm-up) and the share of it the PGO
  medians of the tuned steps account for: every use of a tactic step (its chosen median) and of
  a fused kernel with timed candidates (its winner's median), divided by the latency;
* cold start: ``ascendc_pack_runtime.load`` of the extracted bundle (median of 3), and the time
  of the load-stage derivations (oneDNN/MKL weight packing) of the chosen tactics run in Python;
* with ``--against-topn1``: a ``--topn 1`` bundle too (no tactics, no PGO; same cache), then eager,
  that bundle and the tuned one called in interleaved rounds (median of ``--calls``), and both
  bundles' load times: the end-to-end effect and the cold-start cost of packing at load.

Timings on a busy host are noisy: the script prints ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack.tactics.dispatch as T  # noqa: E402
from ascendc_pack.autotune.protocol import Protocol  # noqa: E402
from ascendc_pack.frontend.loader import load_model_file  # noqa: E402
from ascendc_pack.pipeline import build  # noqa: E402


def _path(name: str) -> Path:
    for d in ("bench/models", "examples"):
        p = ROOT / d / f"{name}.py"
        if p.exists():
            return p
    raise SystemExit(f"no model file {name}.py in bench/models or examples")


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def measure(name: str, topn: int, out: Path, calls: int, against: bool = False) -> dict:
    import ascendc_pack_runtime as rt

    loaded = load_model_file(_path(name))
    t0 = time.perf_counter()
    res = build(loaded.module, loaded.example_inputs, calibration_inputs=loaded.calibration_inputs, topn=topn,
                output=out / f"{name}.ascpack", cache_dir=out / f"cache_{name}", name=loaded.name,
                output_names=loaded.output_names, protocol=Protocol())
    build_s = time.perf_counter() - t0
    ratios: dict[str, list] = {}
    tactic_us = 0.0
    generated = set()  # the libraries of generated GEMM / convolution winners: timed as tactic steps
    for ch in res.tactics.values():
        c0 = ch.results[0].median_us
        for u in ch.uses:
            chosen = ch.candidates[u["chosen_index"]]
            if hasattr(chosen, "spec"):
                generated.add(chosen.spec.name)
            r = ch.results[u["chosen_index"]].median_us
            if r is not None and c0:
                ratios.setdefault(ch.kind, []).append(r / c0)
                tactic_us += r
    manifest = rt.read_manifest(res.output)
    kernel_us = sum(c.median_us * len(k.uses or [None]) for k in manifest.kernels if k.name not in generated
                    for c in [k.candidates[k.chosen_index]] if c.median_us is not None)
    model = rt.load(res.output)
    inputs = [t.clone() for t in loaded.example_inputs]
    for _ in range(3):
        model(*inputs)
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        model(*inputs)
        samples.append((time.perf_counter() - t) * 1e6)
    model.close()
    latency = statistics.median(samples)
    loads = []
    for _ in range(3):
        t = time.perf_counter()
        rt.load(res.output).close()
        loads.append(time.perf_counter() - t)
    pack_s = _pack_seconds(res)
    row = {"model": name, "build_s": round(build_s, 1), "latency_ms": latency / 1e3,
           "tactic_ms": tactic_us / 1e3, "kernel_ms": kernel_us / 1e3,
           "tuned_share": (tactic_us + kernel_us) / latency, "load_ms": statistics.median(loads) * 1e3,
           "pack_ms": pack_s * 1e3, "steps": sum(len(v) for v in ratios.values()),
           "geomean": _geomean([r for v in ratios.values() for r in v]),
           "by_kind": {k: (_geomean(v), len(v)) for k, v in ratios.items()}}
    counts: dict = {}
    for ch in res.tactics.values():
        for u in ch.uses:
            key = f"{ch.kind}:{ch.candidates[u['chosen_index']].name}"
            counts[key] = counts.get(key, 0) + 1
    row["chosen"] = counts
    if against:
        row.update(_against_topn1(loaded, res.output, out, name, calls))
    return row


def _against_topn1(loaded, tuned: Path, out: Path, name: str, calls: int) -> dict:
    import ascendc_pack_runtime as rt

    base = out / f"{name}.topn1.ascpack"
    build(loaded.module, loaded.example_inputs, topn=1, output=base, cache_dir=out / f"cache_{name}", name=loaded.name,
          output_names=loaded.output_names)
    loads: dict[str, list] = {"topn1": [], "tuned": []}
    for _ in range(3):
        for k, p in (("topn1", base), ("tuned", tuned)):
            t = time.perf_counter()
            rt.load(p).close()
            loads[k].append(time.perf_counter() - t)
    m1, m4 = rt.load(base), rt.load(tuned)
    x = [t.clone() for t in loaded.example_inputs]
    runs = {"eager": loaded.module, "topn1": m1, "tuned": m4}
    samples: dict[str, list] = {k: [] for k in runs}
    with torch.no_grad():
        for f in runs.values():
            f(*x)
        for _ in range(calls):
            for k, f in runs.items():
                t = time.perf_counter()
                f(*x)
                samples[k].append(time.perf_counter() - t)
    m1.close()
    m4.close()
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    return {"eager_ms": med["eager"], "topn1_ms": med["topn1"], "tuned_ms": med["tuned"],
            "tuned_vs_topn1": med["tuned"] / med["topn1"], "load_topn1_ms": statistics.median(loads["topn1"]) * 1e3,
            "load_tuned_ms": statistics.median(loads["tuned"]) * 1e3}


def _pack_seconds(res) -> float:
    """Load-stage derivations of the chosen tactics, run in Python once each (what graph init does)."""
    total = 0.0
    for ch in res.tactics.values():
        for u in ch.uses:
            t = ch.candidates[u["chosen_index"]]
            if u["chosen_index"] == 0 or not isinstance(t, T.Tactic) or not t.load_time:
                continue
            shapes = T.step_from_json(ch.desc).shapes()
            weights = {n: torch.randn(s) for n, s in shapes.items() if n in T.WEIGHTS}
            built = T.prepare(t, weights, stage="build")
            t0 = time.perf_counter()
            T.prepare(t, built, stage="load")
            total += time.perf_counter() - t0
    return total


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="add_sum,mlp,transformer_block,conv_block,resnet18,mobilenet_v3_small,"
                                        "efficientnet_b0,vit_s16,bert_4l,llama_gqa_4l")
    p.add_argument("--topn", type=int, default=4)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default=str(ROOT / "bench_out" / "tactic_share"))
    p.add_argument("--against-topn1", action="store_true", help="also time a --topn 1 bundle and eager")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    rows = []
    for name in args.models.split(","):
        try:
            row = measure(name, args.topn, out, args.calls, args.against_topn1)
        except Exception as e:  # noqa: BLE001 - record and go on
            row = {"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "tactic_share.json").write_text(json.dumps(rows, indent=1))
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    head = f"{'model':<20} {'steps':>5} {'winner/aten':>11} {'latency ms':>10} {'tuned share':>11} {'load ms':>8} " \
           f"{'pack ms':>8}  chosen"
    print(head)
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<20} error: {r['error']}")
            continue
        gm = f"{r['geomean']:.2f}" if r["geomean"] else "-"
        print(f"{r['model']:<20} {r['steps']:>5} {gm:>11} {r['latency_ms']:>10.2f} {r['tuned_share']:>11.0%} "
              f"{r['load_ms']:>8.1f} {r['pack_ms']:>8.1f}  "
              + ", ".join(f"{k} x{n}" for k, n in sorted(r["chosen"].items())))
        if "tuned_ms" in r:
            print(f"{'':<20} eager {r['eager_ms']:.2f} ms, --topn 1 {r['topn1_ms']:.2f} ms, tuned {r['tuned_ms']:.2f} ms "
                  f"({r['tuned_vs_topn1']:.2f}x); load {r['load_topn1_ms']:.1f} -> {r['load_tuned_ms']:.1f} ms")


if __name__ == "__main__":
    main()
