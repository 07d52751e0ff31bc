#!/usr/bin/env python
"""torch.compile(model, backend="ascendc_pack") on model files, checked against eager.

    .venv/bin/python bench/torch_compile_check.py [examples/mlp.py bench/models/bert_4l.py ...]
        [--topn N] [--cache-dir D] [--rounds R]

Per model file (default: every example): compile by the backend's registered name (no import of
ascendc_pack: the entry point finds it), run the example and calibration inputs through the
compiled module under torch.no_grad() and compare with eager by the accuracy rule
(``check.check_against_eager``); then time eager and the compiled module in interleaved rounds
(medians; one process, a sanity check - ``ascendc-pack bench`` with the ``compile_ascendc``
contender is the real benchmark). Prints one line per model: the check, the first call's
seconds (compile + PGO), the backend's counts (graphs, fallbacks, compiles, cache hits, kernels
and tactic steps profiled), eager and compiled medians, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def check(path: Path, topn: int, cache_dir: str | None, rounds: int) -> str:
    from ascendc_pack.dynamo import backend
    from ascendc_pack.frontend.check import check_against_eager
    from ascendc_pack.frontend.loader import load_model_file

    torch._dynamo.reset()
    loaded = load_model_file(path)
    options = {"topn": topn, **({"cache_dir": cache_dir} if cache_dir else {})}
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(loaded.module, backend="ascendc_pack", options=options)
        t0 = time.perf_counter()
        compiled(*(t.clone() for t in loaded.example_inputs))
        first_s = time.perf_counter() - t0
        checks = check_against_eager(loaded.module, loaded.all_input_sets, compiled)
        ins = tuple(t.clone() for t in loaded.example_inputs)
        meds = {"eager": [], "compiled": []}
        for _ in range(rounds):
            for name, fn in (("eager", loaded.module), ("compiled", compiled)):
                fn(*ins)
                t0 = time.perf_counter()
                n = 0
                while time.perf_counter() - t0 < 0.2 or n < 3:
                    fn(*ins)
                    n += 1
                meds[name].append((time.perf_counter() - t0) / n * 1e6)
    fallbacks = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    bad = [c.problem for c in checks if not c.ok]
    c = backend.counts()
    eager_us, ours_us = (statistics.median(meds[k]) for k in ("eager", "compiled"))
    return (f"{loaded.name}: {'matches eager' if not bad else 'MISMATCH ' + bad[0]} on {len(checks)} input set(s); "
            f"first call {first_s:.1f} s; graphs {c.graphs}, fallbacks {c.fallbacks}, compiled {c.kernels_compiled}, "
            f"cache hits {c.cache_hits}, kernels profiled {c.kernels_profiled}, tactics profiled "
            f"{c.tactics_profiled}; eager {eager_us:.0f} us, torch.compile ascendc_pack {ours_us:.0f} us "
            f"({eager_us / ours_us:.2f}x); load {os.getloadavg()[0]:.1f}"
            + "".join(f"\n  warning: {f}" for f in fallbacks))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=None)
    p.add_argument("--topn", type=int, default=1)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    models = [Path(m) for m in args.models] or sorted((ROOT / "examples").glob("*.py"))
    for path in models:
        if path.name == "client.py":
            continue
        print(check(path, args.topn, args.cache_dir, args.rounds), flush=True)


if __name__ == "__main__":
    main()
