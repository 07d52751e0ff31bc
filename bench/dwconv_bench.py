#!/usr/bin/env python
"""Generated depthwise convolutions vs ATen and oneDNN on the depthwise layers of real convnets.

    .venv/bin/python bench/dwconv_bench.py [--models mobilenet_v3_small,efficientnet_b0] [--topn 10]
                                           [--rounds 15] [--threads N] [--clock wall|cpu]
                                           [--shapes-python /work/benchvenv/bin/python]

The shapes are the depthwise convolutions (``groups == in_channels``) of torchvision's
``mobilenet_v3_small`` and ``efficientnet_b0`` at batch 1 (224x224), each with the activation
that follows its BatchNorm (ReLU / Hardswish / SiLU), traced by running the model under
``--shapes-python`` (an interpreter with torchvision, imported as bench/models/_bench_deps.py
does); without one a representative list is used. Per distinct shape, with the BatchNorm folded
into weight and bias (``fold_affine``), channels_last input:

* ``aten_cl``: ``F.conv2d`` on channels_last input and weight, the activation in place (the
  ``aten_cl`` conv tactic);
* ``onednn``: ``torch.ops.mkldnn._convolution_pointwise`` on a weight prepacked once by
  ``mkldnn._reorder_convolution_weight``, the activation fused (the ``onednn_cl`` tactic);
* ``ours``: the PGO winner of the generated kernel's candidates (all timed on the real operands
  in interleaved rounds first), launched through a pre-bound ctypes call; ``cand0``: the cost
  model's first candidate.

Every contender's output is checked against eager first. Timing: interleaved rounds, each a batch
of calls per contender, medians. ``--threads 1 --clock cpu`` times this thread's CPU time, which
other processes on a shared machine barely move. The script prints ``os.getloadavg()`` before and
after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack.config import BuildConfig  # noqa: E402
from ascendc_pack.kernels.conv.depthwise import DwConvSpec, compile_dwconvs, fold_affine, pack_weight  # noqa: E402
from ascendc_pack.kernels.conv.depthwise_launch import DwConvKernel, eager_reference, random_operands  # noqa: E402

# (model, C, H=W, k, stride, padding, activation, uses): used when torchvision is not available
FALLBACK = [
    ("mobilenet_v3_small", 16, 112, 3, 2, 1, "relu", 1), ("mobilenet_v3_small", 72, 56, 3, 2, 1, "relu", 1),
    ("mobilenet_v3_small", 96, 28, 5, 2, 2, "hardswish", 1), ("mobilenet_v3_small", 240, 14, 5, 1, 2, "hardswish", 2),
    ("mobilenet_v3_small", 576, 7, 5, 1, 2, "hardswish", 2), ("efficientnet_b0", 32, 112, 3, 1, 1, "silu", 1),
    ("efficientnet_b0", 96, 112, 3, 2, 1, "silu", 1), ("efficientnet_b0", 240, 28, 5, 1, 2, "silu", 1),
    ("efficientnet_b0", 480, 14, 3, 1, 1, "silu", 2), ("efficientnet_b0", 1152, 7, 5, 1, 2, "silu", 3),
]
ACTIVATIONS = {"ReLU": "relu", "Hardswish": "hardswish", "SiLU": "silu"}
ONEDNN_ATTR = {"relu": "relu", "hardswish": "hardswish", "silu": "swish", None: "none"}
INPLACE = {"relu": torch.relu_, "hardswish": lambda t: F.hardswish(t, inplace=True),
           "silu": lambda t: F.silu(t, inplace=True), None: lambda t: t}

_TRACE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from _bench_deps import import_torchvision
tv = import_torchvision()
acts = %r
out = []
for name in sys.argv[2].split(","):
    model = getattr(tv.models, name)().eval()
    act = {}  # Conv2dNormActivation: conv, BatchNorm, activation
    for block in model.modules():
        kids = list(block.children())
        if kids and isinstance(kids[0], torch.nn.Conv2d):
            act[id(kids[0])] = next((acts[type(k).__name__] for k in kids[1:] if type(k).__name__ in acts), None)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.groups == m.in_channels > 1]
    shapes = {}
    def hook(mod, inp, _out):  # returns None: the output stays
        shapes.setdefault(id(mod), tuple(inp[0].shape))
    for m in convs:
        m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    out += [[name, m.in_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.bias is not None,
             act.get(id(m)), shapes[id(m)]] for m in convs]
print(json.dumps(out))
""" % (ACTIVATIONS,)


def model_shapes(models: list[str], python: str | None) -> tuple[list[tuple], str]:
    """[(model, C, H, W, kh, kw, stride, padding, dilation, activation, uses)] and where they came from."""
    if python and Path(python).exists():
        try:
            text = subprocess.run([python, "-c", _TRACE, str(ROOT / "bench" / "models"), ",".join(models)],
                                  capture_output=True, text=True, timeout=600, check=True).stdout
            counts: dict[tuple, int] = {}
            for name, c, k, s, p, d, _bias, act, shape in json.loads(text.strip().splitlines()[-1]):
                key = (name, c, shape[2], shape[3], *k, tuple(s), tuple(p), tuple(d), act)
                counts[key] = counts.get(key, 0) + 1
            return [(*k, n) for k, n in counts.items()], f"traced with {python}"
        except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
            print(f"# tracing under {python} failed ({e}); using the built-in list")
    rows = [(m, c, hw, hw, k, k, (s, s), (p, p), (1, 1), act, n) for m, c, hw, k, s, p, act, n in FALLBACK
            if m in models]
    return rows, "built-in list"


def bound_launch(kernel: DwConvKernel, args: list[torch.Tensor], out: torch.Tensor, max_threads: int):
    """A zero-argument callable running the kernel with its pointers bound once."""
    lib = kernel.lib
    ins, outs, fn = lib._ptr_in(*[t.data_ptr() for t in args]), lib._ptr_out(out.data_ptr()), lib._launch
    keep = (kernel, args, out)  # the pointers stay valid as long as the callable lives

    def launch():
        return fn(ins, outs, None, max_threads) if keep else None

    return launch


CLOCK = time.perf_counter  # --clock cpu: time.thread_time


def per_call_us(fn, calls: int) -> float:
    t0 = CLOCK()
    for _ in range(calls):
        fn()
    return (CLOCK() - t0) / calls * 1e6


def interleaved(fns: dict, rounds: int, budget_us: float = 2e4) -> dict:
    """Median microseconds per call of each callable, timed in interleaved rounds."""
    calls = {}
    for name, fn in fns.items():
        fn()
        calls[name] = max(1, min(2000, int(budget_us / max(per_call_us(fn, 3), 0.5))))
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(per_call_us(fns[name], calls[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_shape(spec: DwConvSpec, build, act: str | None, rounds: int, threads: int) -> dict:
    x, w, _, _ = random_operands(spec)
    g = torch.Generator().manual_seed(2)
    scale, shift = torch.rand(spec.c, generator=g) + 0.5, torch.randn(spec.c, generator=g) * 0.2
    wf, bf = fold_affine(w, None, scale, shift)  # conv -> BatchNorm (eval), folded
    ref = eager_reference(spec, x, wf, bf)
    tol = dict(atol=1e-4, rtol=1e-4)
    wp = pack_weight(wf)
    fns = {}
    for i, cc in enumerate(build.compiled.candidates):
        if not cc.ok:
            print(f"  candidate {i} failed to compile: {cc.error.splitlines()[0]}")
            continue
        kernel = DwConvKernel(spec, cc.so_path, cc.candidate.kernel_key)
        out = kernel(x, wp, bf, max_threads=threads)
        torch.testing.assert_close(out, ref, **tol)
        fns[i] = bound_launch(kernel, [x, wp, bf], out, threads)
    pgo = interleaved(fns, max(5, rounds // 2))
    best = min(pgo, key=lambda i: (pgo[i], i))
    st, pd, dl = spec.stride, spec.padding, spec.dilation
    w_cl = wf.contiguous(memory_format=torch.channels_last)
    w_dnn = torch.ops.mkldnn._reorder_convolution_weight(wf, pd, st, dl, spec.c, tuple(x.shape))
    peers = {
        "aten_cl": lambda: INPLACE[act](F.conv2d(x, w_cl, bf, st, pd, dl, spec.c)),
        "onednn": lambda: torch.ops.mkldnn._convolution_pointwise(x, w_dnn, bf, pd, st, dl, spec.c,
                                                                    ONEDNN_ATTR[act], [], None),
    }
    for name, fn in peers.items():
        torch.testing.assert_close(fn(), ref, **tol, msg=lambda m: f"{name}: {m}")
    final = interleaved({**peers, "ours": fns[best], **({"cand0": fns[0]} if best else {})}, rounds)
    final.setdefault("cand0", final["ours"])  # the winner is candidate 0: one kernel, timed once
    return {"times": final, "best": best, "tiling": build.candidates[best].candidate.tiling_repr,
            "cand0_tiling": build.candidates[0].candidate.tiling_repr, "n": len(fns)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mobilenet_v3_small,efficientnet_b0")
    p.add_argument("--topn", type=int, default=10)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=0, help="threads for every contender (0: torch's default)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time, robust against other load (needs --threads 1)")
    p.add_argument("--shapes-python", default="/work/benchvenv/bin/python",
                   help="an interpreter with torchvision to trace the models' shapes with")
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args(argv)
    threads = args.threads or torch.get_num_threads()
    if args.clock == "cpu":
        if threads != 1:
            p.error("--clock cpu measures the calling thread only: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    torch.set_num_threads(threads)
    rows, source = model_shapes(args.models.split(","), args.shapes_python)
    specs = [DwConvSpec(f"dw_{i}_{c}x{h}_k{kh}s{st[0]}", 1, c, h, w, kh, kw, st, pd, dl, bias=True,
                        epilogue=(act,) if act else ()) for i, (_, c, h, w, kh, kw, st, pd, dl, act, _) in enumerate(rows)]
    cache = args.cache_dir or os.path.join(tempfile.gettempdir(), "ascendc_pack_dwconv_bench")
    config = BuildConfig(topn=args.topn, cache_dir=cache, cores=threads)
    t0 = time.perf_counter()
    builds = compile_dwconvs(specs, config)
    print(f"# depthwise conv benchmark: {threads} thread(s), {args.clock} clock, torch {torch.__version__}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, shapes {source}; "
          f"{sum(len(b.candidates) for b in builds)} candidates compiled in {time.perf_counter() - t0:.0f} s; "
          f"load before {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for row, spec, build in zip(rows, specs, builds):
        r = bench_shape(spec, build, row[9], args.rounds, threads)
        results.append((row, spec, r))
        t = r["times"]
        print(f"{spec.name:22s} " + "  ".join(f"{k} {v:7.1f}" for k, v in t.items()) +
              f"  [{r['tiling']}]", flush=True)
    print(f"\nload after {os.getloadavg()[0]:.2f} (1-min average; {os.cpu_count()} cores)\n")
    head = ["model", "layer (C@HxW, k/s, act)", "uses", "aten_cl µs", "oneDNN µs", "ours µs", "cand0 µs",
            "ours ÷ oneDNN", "ours ÷ aten_cl", "cand0 ÷ ours", "winner (of N)"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))
    totals: dict[str, dict[str, float]] = {}
    for (model, c, h, w, kh, kw, st, pd, dl, act, uses), spec, r in results:
        t = r["times"]
        tot = totals.setdefault(model, {k: 0.0 for k in t})
        for k, v in t.items():
            tot[k] += v * uses
        print(f"| {model} | {c}@{h}x{w}, {kh}x{kw}/{st[0]}, {act or '-'} | {uses} | {t['aten_cl']:.1f} | "
              f"{t['onednn']:.1f} | {t['ours']:.1f} | {t['cand0']:.1f} | {t['ours'] / t['onednn']:.2f} | "
              f"{t['ours'] / t['aten_cl']:.2f} | {t['cand0'] / t['ours']:.2f} | {r['best']} (of {r['n']}) |")
    for model, t in totals.items():
        print(f"| **{model} total** | every depthwise layer × uses | | {t['aten_cl']:.1f} | {t['onednn']:.1f} | "
              f"{t['ours']:.1f} | {t['cand0']:.1f} | {t['ours'] / t['onednn']:.2f} | {t['ours'] / t['aten_cl']:.2f} | "
              f"{t['cand0'] / t['ours']:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
