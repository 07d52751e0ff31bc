#!/usr/bin/env python
"""Swin-style mask rebuilt by slice assignment on every call: bundle vs eager (interleaved medians).

    .venv/bin/python bench/scatter_mask.py [--rounds 30] [--cores 1] [--model bench/models/swin_mask.py]

Builds the model's bundle twice (topn 1): as captured, and after constant folding
(ascendc_pack.passes.fold, the mask becomes a weight), then times eager PyTorch and both bundles in
interleaved rounds and prints each one's median, its ratio to eager and what one call allocates
(torch profiler). ``--cores 1`` keeps the fused kernels single-threaded, so a busy machine does
not turn their OpenMP barriers into the measurement. Prints ``uptime`` with the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack_runtime as rt  # noqa: E402
from ascendc_pack.package.bundle import build_bundle, choices_from_candidate0  # noqa: E402
from ascendc_pack.config import BuildConfig  # noqa: E402
from ascendc_pack.passes.fold import fold_constants  # noqa: E402
from ascendc_pack.passes.fuse import fuse  # noqa: E402
from ascendc_pack.kernels.fused.build import prepare_kernels  # noqa: E402
from ascendc_pack.pipeline import capture_file  # noqa: E402


def build(path: Path, out: Path, config: BuildConfig, fold: bool):
    loaded, captured = capture_file(path)
    model, weights = captured.model, captured.weights
    if fold:
        r = fold_constants(model, weights)
        model, weights = r.model, r.weights
    fused = fuse(model)
    kernels = prepare_kernels(fused.program, config)
    return loaded, build_bundle(fused, weights, choices_from_candidate0(fused, kernels), out, config)


def allocations(fn) -> tuple[int, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0]
    return len(sizes), sum(sizes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "bench" / "models" / "swin_mask.py"))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--cores", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.cores)
    with tempfile.TemporaryDirectory(prefix="scatter-mask-") as tmp:
        tmp = Path(tmp)
        config = BuildConfig.resolve(topn=1, cache_dir=tmp / "cache", cores=args.cores)
        runs = {}
        for label, fold in (("bundle", False), ("bundle, folded", True)):
            loaded, report = build(Path(args.model), tmp / f"{int(fold)}.ascpack", config, fold)
            runs[label] = (rt.load(report.path, cache_dir=tmp / "rt"), report.graph_source.stats)
        module, x = loaded.module.eval(), loaded.example_inputs
        with torch.no_grad():
            expected = module(*x)
        fns = {"eager": lambda: module(*x), **{k: (lambda m=m: m(*x)) for k, (m, _) in runs.items()}}
        for k, (m, stats) in runs.items():
            err = (m(*x) - expected).abs().max().item()
            n, nbytes = allocations(fns[k])
            print(f"{k}: max |diff| vs eager {err:.2e}; arena {stats['arena_bytes']} B; one call allocates "
                  f"{n} tensors, {nbytes} B; steps {stats['steps']}")
        with torch.no_grad():
            n, nbytes = allocations(fns["eager"])
            print(f"eager: one call allocates {n} tensors, {nbytes} B")
            times = {k: [] for k in fns}
            for f in fns.values():
                f()
            for r in range(args.rounds):
                order = list(fns.items())
                for k, f in order if r % 2 else reversed(order):
                    t0 = time.perf_counter()
                    for _ in range(10):
                        f()
                    times[k].append((time.perf_counter() - t0) / 10)
        print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        eager = statistics.median(times["eager"])
        for k, v in times.items():
            print(f"{k:>16}: median {statistics.median(v) * 1e3:.3f} ms, {statistics.median(v) / eager:.2f}x eager")


if __name__ == "__main__":
    main()
