#!/usr/bin/env python
"""What a call of torch.compile(backend="ascendc_pack") costs beside the bundle's own call.

    .venv/bin/python bench/dynamo_dispatch.py [--rounds 15] [--cache-dir D]

A model whose compute is negligible (two ``examples/transformer_block.py`` blocks at d=32, one
sequence of 8 tokens: 75 program steps each, one thread) so that fixed costs dominate: eager,
the bundle (``--topn 1``, ``--cores 1``), torch.compile with our backend (graph mode) and with
``options={"graph": False}`` (Python mode), interleaved rounds of 0.1 s, medians. Prints the
load average beside the numbers; README "torch.compile" has a run.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    import ascendc_pack
    import ascendc_pack_runtime as rt
    from transformer_block import TransformerBlock

    torch.manual_seed(0)
    model = torch.nn.Sequential(TransformerBlock(32, 2, 64), TransformerBlock(32, 2, 64)).eval()
    x = torch.randn(1, 8, 32)
    work = Path(tempfile.mkdtemp(prefix="dynamo_dispatch-"))
    cache = args.cache_dir or str(work / "cache")
    ascendc_pack.build(model, (x,), topn=1, cores=1, cache_dir=cache, output=work / "m.ascpack")
    bundle = rt.load(work / "m.ascpack", threads=1)
    options = {"topn": 1, "cores": 1, "cache_dir": cache}
    with torch.no_grad():
        graph = torch.compile(model, backend="ascendc_pack", options=options)
        python = torch.compile(copy.deepcopy(model), backend="ascendc_pack", options={**options, "graph": False})
        fns = {"eager": lambda: model(x), "bundle": lambda: bundle(x), "torch.compile ascendc_pack": lambda: graph(x),
               "  options graph=False (Python mode)": lambda: python(x)}
        meds: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():  # compile, tune, build the graphs
            fn()
        for _ in range(args.rounds):
            for name, fn in fns.items():
                for _ in range(5):
                    fn()
                t0, n = time.perf_counter(), 0
                while time.perf_counter() - t0 < 0.1 or n < 5:
                    fn()
                    n += 1
                meds[name].append((time.perf_counter() - t0) / n * 1e6)
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.rounds} interleaved rounds, 1 thread")
    for name, v in meds.items():
        print(f"  {name:36s} {statistics.median(v):9.1f} us  (rounds {min(v):.1f} .. {max(v):.1f})")


if __name__ == "__main__":
    main()
