#!/usr/bin/env python
"""How long graph.so takes to compile, by approach (same-run A/B, interleaved rounds).

    .venv/bin/python bench/graph_compile.py [--rounds 3] [--layers 100] [--models add_sum,mlp,...]

For every example (and a generated stack of ``--layers`` Linear+GELU blocks, ~3 steps each) it
renders graph.cpp (kernel libraries are not needed to compile a graph, so every fused kernel
gets a placeholder KernelRef) and times, in interleaved rounds:

* ``data+link``    what ascendc-pack does: graph.cpp (data, no torch header) compiled and linked
                   with the interpreter object, which is built once per toolchain (its time is
                   reported separately, as ``interp object``);
* ``data+link O0`` the same at -O0;
* ``one TU``       graph.cpp and the interpreter in one translation unit (every graph pays the
                   torch headers, as every graph did before the interpreter);
* ``one TU + PCH`` the same with a precompiled header of the interpreter (built once; its size
                   and time are reported).

Prints wall seconds (median) and CPU seconds (user+sys of the compiler, median) per approach,
and ``uptime`` before and after: on a shared machine compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack.frontend.capture import capture  # noqa: E402
from ascendc_pack.passes.fuse import fuse  # noqa: E402
from ascendc_pack.graph.compile import graph_flags, interp_flags, link_flags  # noqa: E402
from ascendc_pack.graph.plan import KernelRef, kernel_io  # noqa: E402
from ascendc_pack.frontend.loader import load_model_file  # noqa: E402
from ascendc_pack.graph.render import render_graph  # noqa: E402
from ascendc_pack.toolchain.cxx import compiler_path  # noqa: E402

EXAMPLES = ["add_sum", "mlp", "cond_model", "conv_block", "inplace", "transformer_block"]
STACK = '''
import torch
from torch import nn

class Stack(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.gelu(layer(x)) * 0.5
        return x

def get_model():
    return Stack({n})

def get_example_inputs():
    return (torch.randn(8, 32),)
'''


def graph_source(path: Path) -> tuple[str, int]:
    loaded = load_model_file(path)
    model = fuse(capture(loaded.module, loaded.example_inputs, name=loaded.name).model)
    refs = {}
    for step in model.program.fused_steps():
        ins, outs = kernel_io(step)
        refs[step.name] = KernelRef(step.name, "0" * 32, f"kernels/{step.name}/{'0' * 32}/kernel.so", 0,
                                    len(ins), len(outs))
    return render_graph(model, refs).source, sum(1 for _ in model.program.walk())


def timed(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--models", default=",".join(EXAMPLES))
    args = ap.parse_args()
    cxx = compiler_path("g++")
    print("load before:", uptime(), flush=True)
    with tempfile.TemporaryDirectory(prefix="graph-compile-bench-") as tmp:
        tmp = Path(tmp)
        stack = tmp / f"stack{args.layers}.py"
        stack.write_text(STACK.format(n=args.layers))
        sources = {}
        for name in [m for m in args.models.split(",") if m]:
            sources[name] = graph_source(ROOT / "examples" / f"{name}.py")
        sources[f"stack{args.layers}"] = graph_source(stack)
        header = tmp / "interp.h"
        header.write_text('#include "ascendc_pack/graph_interp.h"\n')
        interp_cpp = tmp / "interp.cpp"
        interp_cpp.write_text(f'#include "{header}"\n')
        one_tu = [*interp_flags(), "-shared"]
        wall, cpu = timed([cxx, *interp_flags(), "-c", "-o", str(tmp / "interp.o"), str(interp_cpp)])
        print(f"interp object (once per toolchain): wall {wall:.2f} s, cpu {cpu:.2f} s, "
              f"{(tmp / 'interp.o').stat().st_size / 1e6:.1f} MB", flush=True)
        wall, cpu = timed([cxx, *interp_flags(), "-x", "c++-header", "-o", str(tmp / "interp.h.gch"), str(header)])
        print(f"precompiled header (once per toolchain): wall {wall:.2f} s, cpu {cpu:.2f} s, "
              f"{(tmp / 'interp.h.gch').stat().st_size / 1e6:.0f} MB", flush=True)
        variants = {
            "data+link": lambda cpp, so: [cxx, *graph_flags(), "-o", so, cpp, str(tmp / "interp.o"), *link_flags()],
            "data+link O0": lambda cpp, so: [cxx, *[f if f != "-O1" else "-O0" for f in graph_flags()], "-o", so,
                                             cpp, str(tmp / "interp.o"), *link_flags()],
            "one TU": lambda cpp, so: [cxx, *one_tu, "-include", str(tmp / "nopch" / "interp.h"), "-o", so, cpp,
                                       *link_flags()],
            "one TU + PCH": lambda cpp, so: [cxx, *one_tu, "-include", str(header), "-o", so, cpp, *link_flags()],
        }
        (tmp / "nopch").mkdir()
        (tmp / "nopch" / "interp.h").write_text(header.read_text())  # same header, no .gch beside it
        results: dict = {(m, v): [] for m in sources for v in variants}
        for r in range(args.rounds):
            for m, (src, _) in sources.items():
                cpp = tmp / f"{m}.cpp"
                cpp.write_text(src)
                for v, cmd in variants.items():
                    results[(m, v)].append(timed(cmd(str(cpp), str(tmp / f"{m}.so"))))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        print("load after:", uptime())
        print(f"\n| graph (steps, graph.cpp lines) | {' | '.join(variants)} |")
        print("|---|" + "---|" * len(variants))
        for m, (src, steps) in sources.items():
            cells = []
            for v in variants:
                walls = [w for w, _ in results[(m, v)]]
                cpus = [c for _, c in results[(m, v)]]
                cells.append(f"{statistics.median(walls):.2f} s (cpu {statistics.median(cpus):.2f})")
            print(f"| {m} ({steps}, {src.count(chr(10))}) | {' | '.join(cells)} |")
        print(f"\nmedian of {args.rounds} interleaved rounds; wall seconds (compiler CPU seconds); cwd {os.getcwd()}")


if __name__ == "__main__":
    main()
