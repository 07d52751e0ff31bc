#!/usr/bin/env python
"""What the capture cache's proof costs on a warm rebuild (README "Warm rebuilds").

    .venv/bin/python bench/capture_check_cost.py [--models mlp,transformer_block,resnet18,bert_4l] [--rounds 7]

Per model (examples/<name>.py or bench/models/<name>.py): a cold ``build --topn 1`` fills a fresh
cache, then one warm rebuild is timed whole, and in interleaved rounds a capture-cache hit is
timed three ways: the key alone (fingerprinting the model), a hit without the eager check, and a
hit with it (what builds do). Prints medians in ms and the check's share of the warm rebuild;
``uptime``'s load is printed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack.frontend.capture_cache as cc  # noqa: E402
from ascendc_pack.frontend.loader import load_model_file  # noqa: E402
from ascendc_pack.pipeline import build  # noqa: E402


def _path(name: str) -> Path:
    for d in (ROOT / "examples", ROOT / "bench" / "models"):
        if (d / f"{name}.py").is_file():
            return d / f"{name}.py"
    raise SystemExit(f"no model file {name}.py in examples/ or bench/models/")


def measure(name: str, rounds: int) -> dict:
    loaded = load_model_file(_path(name))
    m, x = loaded.module, loaded.example_inputs
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "m.ascpack"
        build(m, x, topn=1, cache_dir=cache, output=out, name=loaded.name)
        t0 = time.perf_counter()
        build(m, x, topn=1, cache_dir=cache, output=out, name=loaded.name)
        warm_s = time.perf_counter() - t0
        real_check = cc._differs_from_eager
        samples = {"key": [], "hit, no check": [], "hit + check": []}
        for _ in range(rounds):
            t0 = time.perf_counter()
            cc.capture_key(m, x, loaded.name, loaded.output_names)
            samples["key"].append(time.perf_counter() - t0)
            for label, check in (("hit, no check", lambda *a: None), ("hit + check", real_check)):
                cc._differs_from_eager = check
                try:
                    t0 = time.perf_counter()
                    _, hit = cc.capture_cached(m, tuple(t.clone() for t in x), name=loaded.name, cache_dir=cache,
                                               output_names=loaded.output_names)
                    samples[label].append(time.perf_counter() - t0)
                finally:
                    cc._differs_from_eager = real_check
                assert hit, f"{name}: the warm capture missed the cache"
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    return {"model": name, "warm_s": warm_s, **med, "check_ms": med["hit + check"] - med["hit, no check"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,transformer_block,conv_block,resnet18,bert_4l")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'model':<20} {'warm rebuild s':>14} {'key ms':>8} {'hit ms':>8} {'hit+check ms':>13} {'check ms':>9} "
          f"{'check/warm':>10}")
    for name in a.models.split(","):
        r = measure(name, a.rounds)
        print(f"{r['model']:<20} {r['warm_s']:>14.2f} {r['key']:>8.1f} {r['hit, no check']:>8.1f} "
              f"{r['hit + check']:>13.1f} {r['check_ms']:>9.1f} {r['check_ms'] / 1e3 / r['warm_s']:>9.1%}", flush=True)


if __name__ == "__main__":
    main()
