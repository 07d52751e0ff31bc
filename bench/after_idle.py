#!/usr/bin/env python
"""Calls right after an idle pause, per OpenMP policy: the wake-up a sporadic request pays.

    .venv/bin/python bench/after_idle.py MODEL.py BUNDLE.ascpack [--ort DIR] [--repeats 2] [--bursts 12]

One fresh process per policy and repeat (libgomp reads its environment once), in rotated order.
Each process loads the bundle (or, for ``ort``, ONNX Runtime with spinning off, exported to DIR
on first use), warms up, then ``--bursts`` times: sleeps 0.3 s, times 8 back-to-back calls
(``first3`` = median of the first 3, ``steady`` = median of the other 5), then switches on another
process spinning on one core (``while True: pass``) and times 6 calls (``busy``). Prints the
median over bursts per process, and the median over repeats per policy.

Why: on this project's 2-vCPU VMs, a 2-thread bundle that sat idle for 0.1 s or more runs its
next ~40 ms at one-thread speed (the guest scheduler packs its threads onto one vCPU and spreads
them again only once they have been busy for a while; pinning them, ``GOMP_CPU_AFFINITY``, or a
short spin removes it). docs/DESIGN.md §8 and README "Threading" give the numbers and the choice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # the runtime's default
    "pool_sleeps": {"OMP_WAIT_POLICY": "PASSIVE", "ASCENDC_PACK_POOL_SPIN_US": "0"},  # task pool without its short wait
    "spin3000": {"GOMP_SPINCOUNT": "3000"},  # a short spin: the team stays awake within a call
    "spin10000": {"GOMP_SPINCOUNT": "10000"},
    "omp_spin": {"GOMP_SPINCOUNT": "10000", "ASCENDC_PACK_TASK_POOL": "0"},  # one team: kernels on OpenMP too
    "pinned": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_CPU_AFFINITY": "0-1"},  # one thread per vCPU
    "ort": {"OMP_WAIT_POLICY": "PASSIVE"},  # ONNX Runtime, spinning off, as in the bench
    "ov_f32": {"OMP_WAIT_POLICY": "PASSIVE"},  # OpenVINO float32 (its own TBB threads), as in the bench
}


def child(model_file: str, bundle: str, ort_dir: str | None, policy: str, bursts: int) -> dict:
    import signal
    import time

    import ascendc_pack_runtime as rt  # before torch: the threading policy
    import torch  # noqa: F401

    from ascendc_pack.bench.stats import time_calls
    from ascendc_pack.frontend.loader import load_model_file

    loaded = load_model_file(model_file)
    ins = list(loaded.example_inputs)
    if policy == "ort":
        from bundle_ab import _ort_runner

        fn = _ort_runner(model_file, ort_dir, loaded.module, ins)
    elif policy == "ov_f32":
        from bundle_ab import _ov_runner

        fn = _ov_runner(model_file, ort_dir, ins)
    else:
        model = rt.load(bundle)
        fn = lambda: model(*ins)  # noqa: E731
    for _ in range(10):
        fn()

    def timed(n: int) -> list[float]:  # milliseconds per call
        return [us / 1e3 for us in time_calls(fn, n)]

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.kill(spin.pid, signal.SIGSTOP)
    res = {"first3": [], "steady": [], "busy": []}
    try:
        for _ in range(bursts):
            time.sleep(0.3)
            ts = timed(8)
            res["first3"].append(statistics.median(ts[:3]))
            res["steady"].append(statistics.median(ts[3:]))
            os.kill(spin.pid, signal.SIGCONT)
            time.sleep(0.05)
            res["busy"].append(statistics.median(timed(6)))
            os.kill(spin.pid, signal.SIGSTOP)
    finally:
        spin.kill()
    return {k: statistics.median(v) for k, v in res.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("bundle")
    p.add_argument("--ort", default=None, help="also time ONNX Runtime and OpenVINO f32; their models are exported to this directory")
    p.add_argument("--policies", default="passive,spin3000,pinned", help="comma-separated: " + ",".join(POLICIES))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--bursts", type=int, default=12)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.model_file, args.bundle, args.ort, args.child, args.bursts)))
        return
    policies = [x for x in args.policies.split(",") if x] + (["ort", "ov_f32"] if args.ort else [])
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        p.error(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    runs: dict[str, list[dict]] = {x: [] for x in policies}
    for r in range(args.repeats):
        for policy in policies[r % len(policies):] + policies[:r % len(policies)]:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env.update(POLICIES[policy], PYTHONPATH=str(Path(__file__).parent))
            cmd = [sys.executable, __file__, args.model_file, args.bundle, "--child", policy,
                   "--bursts", str(args.bursts)] + (["--ort", args.ort] if args.ort else [])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            runs[policy].append(json.loads(out.strip().splitlines()[-1]))
            print(policy, " ".join(f"{k} {v:.2f} ms" for k, v in runs[policy][-1].items()), flush=True)
    print("\nmedian over repeats (ms):")
    print(f"{'policy':10} {'first3':>8} {'steady':>8} {'busy':>8}")
    for policy, rs in runs.items():
        print(f"{policy:10} " + " ".join(f"{statistics.median(x[k] for x in rs):8.2f}" for k in ("first3", "steady", "busy")))


if __name__ == "__main__":
    main()
