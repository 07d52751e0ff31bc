#!/usr/bin/env python
"""What one OpenMP parallel region and one barrier cost, per wait policy, idle and with a core busy.

    .venv/bin/python bench/omp_wakeup.py [--rounds 5] [--calls 400] [--policies default,passive,spin0]

The numbers behind the cost model's ``Target.parallel_overhead_us`` / ``barrier_us``
(:mod:`ascendc_pack.kernels.fused.tiling`): a fused kernel is one ``#pragma omp parallel`` region per call, and
between two calls the model runs other steps, so the team has gone idle (spinning, or asleep
under ``OMP_WAIT_POLICY=PASSIVE``) when the next region starts. A tiny C library (g++ -fopenmp,
bound to the ``libgomp`` torch loads) times:

* ``region``: a parallel region over ~1 µs of work, with ``--gap-us`` of other work on the calling
  thread before each one (the time between kernels), 2 threads minus 1 thread;
* ``barrier``: ``#pragma omp barrier`` inside one region (what a ``split`` schedule pays per row),
  per barrier;
* ``pool 2t``: the same ~1 µs of work as a 2-task job of the graph's task pool
  (``runtime/include/ascendc_pack/task_pool.h``, what generated GEMM and convolution kernels run
  on in a bundle): the caller never waits for the worker to wake up.

Each policy runs in a fresh process (libgomp reads its environment once, when it is loaded);
``--contention`` repeats every policy with one more process spinning on a core. Rounds rotate the
order; the table shows the median over rounds of each run's median (µs). Print ``uptime`` beside
the numbers: on a shared machine they are noisy; the differences of an order of magnitude are the
signal.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin0": {"GOMP_SPINCOUNT": "0"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
}
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")

SOURCE = r"""
#include <omp.h>
#include <stdint.h>
#include <time.h>
#include "ascendc_pack/task_pool.h"
extern "C" {
static double now_us(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static volatile double sink;
static void work_us(double us) { double end = now_us() + us; double x = 0; while (now_us() < end) x += 1; sink = x; }
/* per call: gap of other work, then one region of ~1 us total work split over nt threads */
void regions(int nt, int calls, double gap_us, double *out) {
  for (int c = 0; c < calls; ++c) {
    work_us(gap_us);
    double t0 = now_us();
#pragma omp parallel num_threads(nt) if (nt > 1)
    { work_us(1.0 / omp_get_num_threads()); }
    out[c] = now_us() - t0;
  }
}
/* per barrier inside one region of nt threads */
double barriers(int nt, int n) {
  double t0 = now_us();
#pragma omp parallel num_threads(nt)
  { for (int i = 0; i < n; ++i) {
#pragma omp barrier
  } }
  return (now_us() - t0) / n;
}
static void half_us(void *, int64_t, int32_t) { work_us(0.5); }
/* per call: gap, then one job of 2 tasks (~0.5 us each) on the task pool, nt threads */
void pool_jobs(int nt, int calls, double gap_us, double *out) {
  ascendc_pack::TaskPool &pool = ascendc_pack::TaskPool::instance();
  for (int c = 0; c < calls; ++c) {
    work_us(gap_us);
    double t0 = now_us();
    pool.run(2, nt, half_us, nullptr);
    out[c] = now_us() - t0;
  }
}
}
"""


def _library(tmp: Path) -> ctypes.CDLL:
    import ascendc_pack_runtime as rt

    src, lib = tmp / "wake.cpp", tmp / "wake.so"
    src.write_text(SOURCE)
    subprocess.run(["g++", "-O2", "-std=c++17", "-fopenmp", "-shared", "-fPIC", f"-I{rt.include_dir()}", str(src),
                    "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def child(calls: int, gap_us: float) -> None:
    """Time regions and barriers in this process; print one JSON line (µs)."""
    import torch  # noqa: F401  (load torch's libgomp first, as the runtime does)

    with tempfile.TemporaryDirectory() as d:
        lib = _library(Path(d))
        lib.regions.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.POINTER(ctypes.c_double)]
        lib.barriers.argtypes, lib.barriers.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_double
        out = {}
        for nt in (1, 2):
            buf = (ctypes.c_double * calls)()
            lib.regions(nt, 20, gap_us, buf)  # warm the team
            lib.regions(nt, calls, gap_us, buf)
            times = sorted(buf)
            out[f"region_{nt}t"] = statistics.median(times)
            out[f"region_{nt}t_p90"] = times[int(0.9 * len(times))]
        out["barrier_2t"] = statistics.median(lib.barriers(2, 2000) for _ in range(5))
        lib.pool_jobs.argtypes = lib.regions.argtypes
        buf = (ctypes.c_double * calls)()
        lib.pool_jobs(2, 20, gap_us, buf)  # start the worker
        lib.pool_jobs(2, calls, gap_us, buf)
        out["pool_2t"] = statistics.median(buf)
    print(json.dumps(out), flush=True)


def run_policy(policy: str, calls: int, gap_us: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(POLICIES[policy])
    proc = subprocess.run([sys.executable, __file__, "--child", "--calls", str(calls), "--gap-us", str(gap_us)],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{policy}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--gap-us", type=float, default=50.0, help="other work on the calling thread between regions")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--policies", default="default,passive,spin0")
    p.add_argument("--contention", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    if args.child:
        child(args.calls, args.gap_us)
        return
    policies = args.policies.split(",")
    rows: dict[tuple[str, bool], list[dict]] = {}
    for r in range(args.rounds):
        order = policies[r % len(policies):] + policies[:r % len(policies)]
        for busy in ([False, True] if args.contention else [False]):
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                for pol in order:
                    res = run_policy(pol, args.calls, args.gap_us)
                    rows.setdefault((pol, busy), []).append(res)
                    print(f"#{r} {'busy' if busy else 'host'} {pol:8} load {os.getloadavg()[0]:5.2f} "
                          + " ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    print(f"\nmedian over {args.rounds} rounds (µs; gap {args.gap_us:g} µs between regions); load {os.getloadavg()}")
    print(f"{'policy':10} {'core':5} {'region 1t':>10} {'region 2t':>10} {'2t - 1t':>9} {'2t p90':>9} {'barrier':>9} {'pool 2t':>9}")
    for (pol, busy), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{pol:10} {'busy' if busy else 'idle':5} {med['region_1t']:10.1f} {med['region_2t']:10.1f} "
              f"{med['region_2t'] - med['region_1t']:9.1f} {med['region_2t_p90']:9.1f} {med['barrier_2t']:9.2f} {med['pool_2t']:9.1f}")


if __name__ == "__main__":
    main()
