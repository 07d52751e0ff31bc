#!/usr/bin/env python
"""Generated GEMM kernels vs torch's GEMMs on shapes from real models.

    .venv/bin/python bench/gemm_bench.py [--topn 10] [--rounds 15] [--threads N] [--no-compile]
                                         [--clock wall|cpu] [--shapes bert_qkv,resnet18_fc,...]

Per shape: the GEMM's candidates are compiled (``ascendc_pack.kernels.gemm.generator``) and timed on the real
operands in interleaved rounds (a small PGO: the median picks the winner; a weight the winner
reads packed is packed once, before timing, as a bundle would at load). Then the winner and the
contenders run in interleaved rounds, each round timing a batch of calls per contender, and the
table prints medians:

* ``ours``: the winning candidate, launched through a pre-bound ctypes call (about 1 us of
  Python; a C++ graph calls it directly);
* ``aten``: what eager runs (``F.linear`` / ``torch.matmul`` + the epilogue ops; MKL sgemm);
* ``onednn``: oneDNN with the weight reordered once for the host and the epilogue fused as a
  post-op (``torch.ops.mkldnn._linear_pointwise``), where the shape is a linear;
* ``compile``: ``torch.compile`` of the eager function (default mode).

Every contender's output is checked against eager first. Load matters on a shared machine: the
script prints ``os.getloadavg()`` before and after; wall-clock numbers taken under load are noisy
(multi-threaded contenders wait for descheduled threads at their barriers). ``--threads 1
--clock cpu`` times the calling thread's CPU time instead, which other processes barely move
(every contender then runs in the calling thread).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack.config import BuildConfig  # noqa: E402
from ascendc_pack.kernels.gemm.generator import GemmSpec, compile_gemms  # noqa: E402
from ascendc_pack.kernels.gemm.launch import GemmKernel, eager_reference, random_operands  # noqa: E402

# name -> (spec, what it is)
SHAPES = {
    "bert_qkv": (GemmSpec.linear("bert_qkv", 128, 256, 256), "BERT h256 s128: Q/K/V/out projection"),
    "bert_ffn1": (GemmSpec.linear("bert_ffn1", 128, 1024, 256, epilogue=("gelu",)), "BERT FFN up + gelu"),
    "bert_ffn2": (GemmSpec.linear("bert_ffn2", 128, 256, 1024, epilogue=("add",)), "BERT FFN down + residual"),
    "llama_q": (GemmSpec.linear("llama_q", 128, 256, 256, bias=False), "Llama h256 s128: q/o projection"),
    "llama_gate": (GemmSpec.linear("llama_gate", 128, 704, 256, bias=False, epilogue=("silu",)),
                   "Llama gate proj + silu"),
    "llama_down": (GemmSpec.linear("llama_down", 128, 256, 704, bias=False, epilogue=("add",)),
                   "Llama down proj + residual"),
    "attn_qk": (GemmSpec.matmul("attn_qk", 128, 128, 64, batch=4, transpose_b=True), "attention Q.K^T, 4 heads"),
    "resnet18_fc": (GemmSpec.linear("resnet18_fc", 1, 1000, 512), "batch-1 linear: resnet18 fc"),
    "resnet18_fc_b8": (GemmSpec.linear("resnet18_fc_b8", 8, 1000, 512), "resnet18 fc, batch 8"),
    "tiny_mlp": (GemmSpec.linear("tiny_mlp", 1, 64, 32, epilogue=("relu",)), "batch-1 tiny MLP layer"),
}
_ONEDNN_ATTR = {(): ("none", None), ("relu",): ("relu", None), ("gelu",): ("gelu", "none"),
                ("gelu_tanh",): ("gelu", "tanh"), ("silu",): ("swish", None), ("sigmoid",): ("sigmoid", None)}


def bound_launch(kernel: GemmKernel, args: list[torch.Tensor], out: torch.Tensor, max_threads: int):
    """A zero-argument callable running the kernel with its pointers bound once."""
    return kernel.lib.bind(args, [out], kernel.workspace_buffer, max_threads)


CLOCK = time.perf_counter  # --clock cpu: time.thread_time (1 thread only: CPU time of this thread)


def per_call_us(fn, calls: int) -> float:
    t0 = CLOCK()
    for _ in range(calls):
        fn()
    return (CLOCK() - t0) / calls * 1e6


def interleaved(fns: dict, rounds: int, budget_us: float = 3e4) -> dict[str, float]:
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


def contenders(spec: GemmSpec, a, b, bias, res, threads: int, use_compile: bool) -> dict:
    """Torch's ways of computing the same GEMM + epilogue (each checked by the caller)."""
    eager = lambda: eager_reference(spec, a, b, bias, res)  # noqa: E731
    out = {"aten": eager}
    attr = _ONEDNN_ATTR.get(spec.epilogue)
    if spec.b_transposed and not spec.b_strides[0] and torch.backends.mkldnn.is_available():
        wp = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), spec.m * spec.batch)
        if attr is not None:
            out["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, wp, bias, attr[0], [], attr[1])
        elif spec.epilogue == ("add",):
            out["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise.binary(a, res[0], wp, bias, "add")
    if use_compile:
        torch._dynamo.reset()  # one compile per shape (the lambda's code object is shared)
        compiled = torch.compile(lambda a, b, bias, res: eager_reference(spec, a, b, bias, res))
        out["compile"] = lambda: compiled(a, b, bias, res)
    return out


def bench_shape(spec: GemmSpec, config: BuildConfig, rounds: int, threads: int, use_compile: bool) -> dict:
    a, b, bias, res = random_operands(spec)
    ref = eager_reference(spec, a, b, bias, res)
    [build] = compile_gemms([spec], config)
    fns, kernels, pack_ms = {}, {}, {}
    for i, (gc, cc) in enumerate(zip(build.candidates, build.compiled.candidates)):
        if not cc.ok:
            print(f"  candidate {i} failed to compile: {cc.error.splitlines()[0]}")
            continue
        kernel = GemmKernel(spec, cc.so_path, cc.candidate.kernel_key)
        t0 = time.perf_counter()
        b_in = kernel.prepare_b(b)
        pack_ms[i] = (time.perf_counter() - t0) * 1e3
        args = [a, getattr(b_in, "data", b_in)] + ([bias] if spec.bias else []) + list(res)
        out = torch.empty_like(ref)
        kernel(a, b_in, bias, res, out=out, max_threads=threads)
        torch.testing.assert_close(out, ref, atol=1e-4 * max(1, spec.k / 256), rtol=1e-4)
        fns[i] = bound_launch(kernel, args, out, threads)
        kernels[i] = (gc, out, args)
    times = interleaved(fns, max(5, rounds // 2))
    best = min(times, key=lambda i: (times[i], i))
    peers = contenders(spec, a, b, bias, res, threads, use_compile)
    for name, fn in peers.items():
        torch.testing.assert_close(fn(), ref, atol=1e-4 * max(1, spec.k / 256), rtol=1e-4)
    final = interleaved({"ours": fns[best], **peers}, rounds)
    return {"times": final, "best": best, "tiling": kernels[best][0].candidate.tiling_repr,
            "cand0_us": times[0], "best_pgo_us": times[best], "pack_ms": pack_ms.get(best, 0.0),
            "n_candidates": len(fns)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topn", type=int, default=10)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=0, help="threads for every contender (0: torch's default)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to build)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time, robust against other load (needs --threads 1)")
    args = p.parse_args(argv)
    threads = args.threads or torch.get_num_threads()
    if args.clock == "cpu":
        if threads != 1:
            p.error("--clock cpu measures the calling thread only: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    torch.set_num_threads(threads)
    cache = args.cache_dir or os.path.join(tempfile.gettempdir(), "ascendc_pack_gemm_bench")
    config = BuildConfig(topn=args.topn, cache_dir=cache, cores=threads)
    print(f"# GEMM benchmark: {threads} thread(s), {args.clock} clock, torch {torch.__version__}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, load before {os.getloadavg()[0]:.2f}")
    rows = []
    for name in args.shapes.split(","):
        spec, what = SHAPES[name]
        r = bench_shape(spec, config, args.rounds, threads, not args.no_compile)
        t = r["times"]
        peer = min(v for k, v in t.items() if k != "ours")
        rows.append((name, spec, what, r, peer))
        cells = "  ".join(f"{k} {v:8.1f}" for k, v in t.items())
        print(f"{name:15s} {cells}  ours/best-peer {t['ours'] / peer:5.2f}  [{r['tiling']}]", flush=True)
    print(f"\nload after {os.getloadavg()[0]:.2f} (1-min average; the machine has {os.cpu_count()} cores)\n")
    head = ["shape", "M×K·K×N (batch)", "ours µs", "GFLOP/s", "aten µs", "oneDNN µs", "compile µs",
            "ours ÷ best peer", "winner (of N)", "cand0 ÷ winner", "pack ms"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))
    for name, spec, what, r, peer in rows:
        t = r["times"]
        dims = f"{spec.m}×{spec.k}·{spec.k}×{spec.n}" + (f" ({spec.batch})" if spec.batch > 1 else "")
        epi = "+".join((["bias"] if spec.bias else []) + list(spec.epilogue))
        cell = lambda k: f"{t[k]:.1f}" if k in t else "–"  # noqa: E731
        print(f"| {name} ({what}{', ' + epi if epi else ''}) | {dims} | {t['ours']:.1f} | "
              f"{spec.flops / t['ours'] / 1e3:.1f} | {cell('aten')} | {cell('onednn')} | {cell('compile')} | "
              f"{t['ours'] / peer:.2f} | {r['best']} (of {r['n_candidates']}) | "
              f"{r['cand0_us'] / r['best_pgo_us']:.2f} | {r['pack_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
