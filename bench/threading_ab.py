#!/usr/bin/env python
"""Busy-host A/B of the threading policy on the example bundles (issue 12.3).

    .venv/bin/python bench/threading_ab.py [--rounds 5] [--seconds 1] [--models add_sum,mlp,transformer_block]

Builds each example twice at ``--topn 1`` (the cost model's choice, no PGO noise): with the cost
model from before the threading change (``--old-tiling-rev``: kernels get every core whenever
the model's 2 µs region overhead allows) and with the current one (PASSIVE wake-up costs,
multi-thread only where it pays off). Then times the bundles, one fresh process per
configuration (libgomp reads its environment once, at load), in interleaved rounds with one
more process spinning on a core (``while True: pass``) on top of whatever else the host runs:

* ``old``: old bundles, libgomp's default spinning (``GOMP_SPINCOUNT=300000``, its default value,
  which also keeps the runtime from setting its policy);
* ``old+passive`` / ``new+spin``: one change at a time;
* ``new+spin10k``: a short spin (``GOMP_SPINCOUNT=10000``) instead of none;
* ``new+threads1``: PASSIVE and ``rt.load(..., threads=1)`` (one thread for kernels and ATen);
* ``new``: new bundles under the runtime's default policy (``OMP_WAIT_POLICY=PASSIVE``).

Prints per model and configuration the median over rounds of each run's median latency, and
the ratios old ÷ new. ``--no-busy`` times without the extra spinning process. Print ``uptime``
beside the numbers: a shared host is noisy, the order of magnitude is the signal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
CONFIGS = {  # name: (bundle set, environment, thread cap of rt.load)
    "old": ("old", {"GOMP_SPINCOUNT": "300000"}, None),
    "old+passive": ("old", {}, None),
    "new+spin": ("new", {"GOMP_SPINCOUNT": "300000"}, None),
    "new+spin10k": ("new", {"GOMP_SPINCOUNT": "10000"}, None),
    "new+threads1": ("new", {}, 1),
    "new": ("new", {}, None),
}


def build(out: Path, models: list[str], old_rev: str | None) -> None:
    """Build ``out/<name>.ascpack`` of each example at topn 1, with the tiling of ``old_rev``."""
    import ascendc_pack_runtime  # noqa: F401  (the wait policy before torch)
    import ascendc_pack.backends.cpu as backend_cpu
    import ascendc_pack.kernels.fused.build as kernels
    import ascendc_pack.kernels.fused.tiling as tiling
    from ascendc_pack.pipeline import build_file

    if old_rev is not None:  # the old cost model, swapped in where the pipeline looks it up
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{old_rev}:ascendc_pack/tiling.py"],
                             capture_output=True, text=True, check=True).stdout
        old = dict(tiling.__dict__)
        exec(compile(src, f"{old_rev}:ascendc_pack/tiling.py", "exec"), old)  # noqa: S102 - our own file
        kernels.propose, kernels.Target, backend_cpu.Target = old["propose"], old["Target"], old["Target"]
    out.mkdir(parents=True, exist_ok=True)
    for name in models:
        res = build_file(ROOT / "examples" / f"{name}.py", topn=1, output=out / f"{name}.ascpack",
                         cache_dir=out / "cache")
        m = ascendc_pack_runtime.read_manifest(res.output)
        print(f"built {res.output}: kernel block_dims {[k.block_dim for k in m.kernels]}", flush=True)


def child(bundles: list[str], seconds: float, threads: int | None) -> None:
    """Time each bundle in this process; print one JSON line {name: median µs}."""
    import ascendc_pack_runtime as rt
    import torch

    from ascendc_pack_runtime.tools import _load_inputs

    out = {}
    for path in bundles:
        model = rt.load(path, cache_dir=str(Path(path).parent / "rtcache"), threads=threads)
        inputs = _load_inputs(model, None, 0)
        with torch.no_grad():
            for _ in range(3):
                model(*inputs)
            lat, end = [], time.perf_counter() + seconds
            while time.perf_counter() < end or len(lat) < 5:
                t0 = time.perf_counter()
                model(*inputs)
                lat.append(time.perf_counter() - t0)
        out[Path(path).stem] = statistics.median(lat) * 1e6
        model.close()
    print(json.dumps(out), flush=True)


def run_config(work: Path, config: str, models: list[str], seconds: float) -> dict:
    which, extra, threads = CONFIGS[config]
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(extra)
    bundles = [str(work / which / f"{m}.ascpack") for m in models]
    cap = [] if threads is None else ["--threads", str(threads)]
    proc = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(seconds), *cap, *bundles], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{config}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--models", default="add_sum,mlp,transformer_block")
    p.add_argument("--work-dir", default=str(ROOT / "bench_out" / "threading_ab"))
    p.add_argument("--old-tiling-rev", default="df0258d", help="commit whose ascendc_pack/tiling.py is the old model")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0, help="timing per model per run")
    p.add_argument("--busy", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--skip-build", action="store_true")
    p.add_argument("--configs", default=",".join(CONFIGS))
    args = p.parse_args(argv)
    if args.child:
        child(args.bundles, args.seconds, args.threads)
        return
    work, models = Path(args.work_dir), args.models.split(",")
    if not args.skip_build:
        for which, rev in (("old", args.old_tiling_rev), ("new", None)):
            cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import threading_ab as t; "
                   f"t.build(t.Path({str(work / which)!r}), {models!r}, {rev!r})"]
            subprocess.run(cmd, check=True, timeout=1800)
    configs = args.configs.split(",")
    results: dict[str, list[dict]] = {c: [] for c in configs}
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        for r in range(args.rounds):
            for c in configs[r % len(configs):] + configs[:r % len(configs)]:
                res = run_config(work, c, models, args.seconds)
                results[c].append(res)
                print(f"#{r} {c:12} load {os.getloadavg()[0]:5.2f}  "
                      + "  ".join(f"{m} {v:10.1f} µs" for m, v in res.items()), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    print(f"\nmedian over {args.rounds} rounds of each run's median (µs), {'one core kept busy' if args.busy else 'no extra load'}; "
          f"load average {os.getloadavg()}")
    print("(p25-p75 of the rounds below each median)")
    print(f"{'model':18}" + "".join(f"{c:>16}" for c in configs) + "   ratios to new")
    for m in models:
        runs = {c: sorted(r[m] for r in results[c]) for c in configs}
        med = {c: statistics.median(v) for c, v in runs.items()}
        ratios = ", ".join(f"{c} {med[c] / med['new']:.2f}" for c in configs if c != "new" and "new" in med)
        print(f"{m:18}" + "".join(f"{_us(med[c]):>16}" for c in configs) + f"   {ratios}")
        print(f"{'':18}" + "".join(f"{_us(v[len(v) // 4]) + '-' + _us(v[(3 * len(v)) // 4]):>16}" for v in runs.values()))
    (work / "results.json").write_text(json.dumps({"busy": args.busy, "rounds": results}, indent=1))


def _us(v: float) -> str:
    return f"{v / 1e3:.1f}ms" if v >= 1e3 else f"{v:.1f}us"


if __name__ == "__main__":
    main()
