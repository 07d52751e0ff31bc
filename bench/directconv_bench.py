#!/usr/bin/env python
"""Generated direct convolution kernels vs torch's convolutions on resnet18's shapes.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/directconv_bench.py [--topn 10] [--rounds 15]
                                       [--shapes stem,l1_3x3,...] [--phases cpu1,wall1,wall2]

Per shape (resnet18 at batch 1, 224x224, BatchNorm folded into a bias; conv_block is
examples/conv_block.py at batch 8) the convolution's candidates are compiled
(``ascendc_pack.kernels.conv.direct``) and every contender's output is checked against eager. Then, per
phase, a small PGO times every candidate in interleaved rounds (the median picks ``best``) and the
final interleaved rounds time, medians printed:

* ``cand0``: the cost model's first candidate; ``best``: the PGO winner. Both launch through a
  pre-bound ctypes call (about 1 us of Python; a C++ graph calls it directly), the weight packed
  once before timing (``pack_weight``, as a bundle would at load);
* ``aten``: eager ``F.conv2d`` on the channels_last input (oneDNN behind ATen, the weight
  reordered per call) plus the epilogue as ATen ops;
* ``onednn``: ``torch.ops.mkldnn._convolution_pointwise`` (``.binary`` for the residual add) on a
  weight reordered once with ``torch.ops.mkldnn._reorder_convolution_weight``, the epilogue fused
  as post-ops (ascendc_pack/tactics/conv.py's ``onednn_cl`` tactic).

Phases: ``cpu1`` - one thread (torch.set_num_threads(1), our kernels max_threads=1), the calling
thread's CPU time (``time.thread_time``), which other processes on the shared machine barely move;
``wall1`` / ``wall2`` - one / two threads, wall clock (noisy under load: a descheduled thread stalls
its team); ``wall2`` also times the best 2-thread candidate (``best2t``), and the scaling line
compares it with ``wall1``'s best. The script prints ``os.getloadavg()`` around every phase.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gemm_bench  # noqa: E402  (bound_launch, interleaved and their clock)

from ascendc_pack.config import BuildConfig  # noqa: E402
from ascendc_pack.kernels.conv.direct import ConvSpec, compile_convs  # noqa: E402
from ascendc_pack.kernels.conv.direct_launch import ConvKernel, eager_reference, random_operands  # noqa: E402


def _spec(name, n, c, o, hw, k, s, p, epilogue):
    return ConvSpec(name, n, c, o, hw, hw, k, k, s, p, bias=True, epilogue=epilogue)


RA = ("add", "relu")  # the second convolution of a BasicBlock: + identity, relu
SHAPES = {
    "stem": (_spec("stem", 1, 3, 64, 224, 7, 2, 3, ("relu",)), "7x7/2 3->64 @224"),
    "l1_3x3": (_spec("l1_3x3", 1, 64, 64, 56, 3, 1, 1, RA), "3x3 64@56"),
    "l2_3x3s2": (_spec("l2_3x3s2", 1, 64, 128, 56, 3, 2, 1, ("relu",)), "3x3/2 64->128 @56"),
    "l2_down": (_spec("l2_down", 1, 64, 128, 56, 1, 2, 0, ()), "1x1/2 64->128 @56"),
    "l2_3x3": (_spec("l2_3x3", 1, 128, 128, 28, 3, 1, 1, RA), "3x3 128@28"),
    "l3_3x3s2": (_spec("l3_3x3s2", 1, 128, 256, 28, 3, 2, 1, ("relu",)), "3x3/2 128->256 @28"),
    "l3_3x3": (_spec("l3_3x3", 1, 256, 256, 14, 3, 1, 1, RA), "3x3 256@14"),
    "l4_3x3s2": (_spec("l4_3x3s2", 1, 256, 512, 14, 3, 2, 1, ("relu",)), "3x3/2 256->512 @14"),
    "l4_3x3": (_spec("l4_3x3", 1, 512, 512, 7, 3, 1, 1, RA), "3x3 512@7"),
    "conv_block": (_spec("conv_block", 8, 32, 32, 56, 3, 1, 1, RA), "conv_block 8x32x56x56 3x3"),
    "stem_nchw": (ConvSpec("stem_nchw", 1, 3, 64, 224, 224, 7, 7, 2, 3, bias=True, epilogue=("relu",),
                           x_layout="nchw"), "7x7/2 3->64 @224, NCHW x"),
    "conv_block_nchw": (ConvSpec("conv_block_nchw", 8, 32, 32, 56, 56, 3, 3, 1, 1, bias=True, epilogue=RA,
                                 x_layout="nchw", residual_layout="nchw"), "conv_block, NCHW x and residual"),
}
PHASES = {"cpu1": (1, time.thread_time), "wall1": (1, time.perf_counter), "wall2": (2, time.perf_counter)}


def contenders(spec: ConvSpec, x, w, bias, res) -> dict:
    """ATen and prepacked oneDNN computing the same convolution + epilogue."""
    geo = ([spec.padding[0], spec.padding[1]], [spec.stride[0], spec.stride[1]],
           [spec.dilation[0], spec.dilation[1]], 1)
    out = {"aten": lambda: eager_reference(spec, x, w, bias, res)}
    if torch.backends.mkldnn.is_available():
        wp = torch.ops.mkldnn._reorder_convolution_weight(w, *geo, list(x.shape))
        unary = "relu" if "relu" in spec.epilogue else "none"
        if spec.residual:
            out["onednn"] = lambda: torch.ops.mkldnn._convolution_pointwise.binary(
                x, res, wp, bias, *geo, "add", None, unary if unary != "none" else None, [], None)
        else:
            out["onednn"] = lambda: torch.ops.mkldnn._convolution_pointwise(x, wp, bias, *geo, unary, [], "")
    return out


def bench_shape(spec: ConvSpec, config: BuildConfig, rounds: int, phases: list[str]) -> dict:
    x, w, bias, res = random_operands(spec)
    ref = eager_reference(spec, x, w, bias, res)
    tol = 1e-4 * max(1.0, (spec.c_in * spec.kh * spec.kw / 16) ** 0.5)
    [build] = compile_convs([spec], config)
    kernels = {}
    for i, (cand, cc) in enumerate(zip(build.candidates, build.compiled.candidates)):
        if not cc.ok:
            print(f"  candidate {i} failed to compile: {cc.error.splitlines()[0]}")
            continue
        kernel = ConvKernel(spec, cc.so_path, cc.candidate.kernel_key)
        wp = kernel.prepare_weight(w)
        out = torch.empty_like(ref, memory_format=torch.channels_last)
        kernel(x, wp, bias, res, out=out)
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
        args = [x, wp] + ([bias] if spec.bias else []) + ([res] if spec.residual else [])
        kernels[i] = (cand, kernel, args, out)
    result = {"n_candidates": len(kernels), "tilings": {i: k[0].candidate.tiling_repr for i, k in kernels.items()}}
    for phase in phases:
        threads, clock = PHASES[phase]
        torch.set_num_threads(threads)
        gemm_bench.CLOCK = clock
        # oneDNN's weight is reordered under the phase's thread count, as a bundle would at load:
        # a weight prepacked with 2 threads and run with 1 was 5x slower on one shape (reordered
        # per call)
        peers = contenders(spec, x, w, bias, res)
        for name, fn in peers.items():
            torch.testing.assert_close(fn(), ref, atol=tol, rtol=tol)
        load = os.getloadavg()[0]
        fns = {i: gemm_bench.bound_launch(k, a, o, threads) for i, (_, k, a, o) in kernels.items()}
        pgo = gemm_bench.interleaved(fns, max(5, rounds // 2))
        best = min(pgo, key=lambda i: (pgo[i], i))
        timed = {"cand0": fns[min(fns)], "best": fns[best]}
        multi = [i for i in pgo if kernels[i][0].tiling.bd > 1]
        best2t = min(multi, key=lambda i: (pgo[i], i)) if threads > 1 and multi else None
        if best2t is not None:
            timed["best2t"] = fns[best2t]
        final = gemm_bench.interleaved({**timed, **peers}, rounds)
        result[phase] = {"times": final, "best": best, "best2t": best2t, "pgo": pgo,
                         "load": (load, os.getloadavg()[0])}
    return result


def table(rows: list, phase: str) -> list[str]:
    threads, clock = PHASES[phase]
    what = "CPU time of the calling thread" if clock is time.thread_time else "wall clock"
    head = ["shape", "MFLOP", "cand0 µs", "best µs", "best GFLOP/s", "aten µs", "oneDNN µs",
            "best ÷ oneDNN", "cand0 ÷ oneDNN", "best ÷ aten", "winner (of N)"] + \
        (["best 2-thread µs (#)"] if threads > 1 else []) + ["load"]
    lines = [f"\n{threads} thread(s), {what}:\n", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, spec, what_, r in rows:
        p = r[phase]
        t = p["times"]
        one = t.get("onednn", float("nan"))
        lines.append(f"| {name} ({what_}, {'+'.join(['bias', *spec.epilogue])}) | {spec.flops / 1e6:.0f} | "
                     f"{t['cand0']:.0f} | {t['best']:.0f} | {spec.flops / t['best'] / 1e3:.1f} | {t['aten']:.0f} | "
                     f"{one:.0f} | {t['best'] / one:.2f} | {t['cand0'] / one:.2f} | {t['best'] / t['aten']:.2f} | "
                     f"{p['best']} (of {r['n_candidates']}) | "
                     + (f"{t['best2t']:.0f} ({p['best2t']}) | " if "best2t" in t else ("– | " if threads > 1 else ""))
                     + f"{p['load'][0]:.1f}-{p['load'][1]:.1f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topn", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--phases", default="cpu1,wall1,wall2")
    ap.add_argument("--cores", type=int, default=2, help="the core limit the candidates are built for")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    phases = args.phases.split(",")
    cache = args.cache_dir or os.path.join(tempfile.gettempdir(), "ascendc_pack_directconv_bench")
    config = BuildConfig(topn=args.topn, cache_dir=cache, cores=args.cores)
    print(f"# direct convolution benchmark: torch {torch.__version__}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, {os.cpu_count()} cores, load before "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for name in args.shapes.split(","):
        spec, what = SHAPES[name]
        r = bench_shape(spec, config, args.rounds, phases)
        rows.append((name, spec, what, r))
        for phase in phases:
            p = r[phase]
            cells = "  ".join(f"{k} {v:8.1f}" for k, v in p["times"].items())
            print(f"{name:11s} {phase}: {cells}  [best {p['best']}: {r['tilings'][p['best']]}]", flush=True)
    print(f"\nload after {os.getloadavg()[0]:.2f} (1-minute average)")
    for phase in phases:
        print("\n".join(table(rows, phase)))
    if {"wall1", "wall2"} <= set(phases):
        print("\n2-thread scaling (wall1 best µs / wall2 best 2-thread candidate µs): " + ", ".join(
            f"{name} {r['wall1']['times']['best'] / r['wall2']['times']['best2t']:.2f}x"
            for name, _, _, r in rows if "best2t" in r["wall2"]["times"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
