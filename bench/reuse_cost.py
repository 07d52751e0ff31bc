#!/usr/bin/env python
"""What reusing an extraction costs with and without a trust policy, for a ~100 MB bundle.

    nice -n 10 .venv/bin/python bench/reuse_cost.py WORKDIR [--rounds 7]

Builds this file's model (two Linear layers, 2048 x 6144: 100.7 MB of float32 weights) into
WORKDIR once, signs it with a fresh key, builds examples/cpp/run_bundle, extracts the bundle, and
then times, in rounds whose order rotates (medians over rounds; ``uptime`` before and after):

* ``py reuse``: ``open_bundle`` of the extracted bundle, no policy (hashes the bundle file,
  reads the manifest from it, checks the cache rules, member sizes, the libraries' sha256);
* ``py reuse, policy``: the same with ``trusted_keys`` (also the signature and the sha256 of
  *every* member, weights.bin included: docs/FORMAT.md, "Trust");
* ``py extract``: a fresh extraction into an empty cache (for scale);
* ``C++ load``, ``C++ load, policy`` (every member hashed with libcrypto's sha256) and
  ``C++ load, verify_hashes`` (every member hashed with the portable rt/sha256.hpp): the whole
  ``Model::load`` as ``run_bundle`` prints it, one fresh process each.

The model file contract (get_model / get_example_inputs) is this module's too, so
``ascendc-pack build bench/reuse_cost.py`` builds the same bundle.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

D, HIDDEN, BATCH = 2048, 6144, 8
ROOT = Path(__file__).resolve().parents[1]


class WideMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, D)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + x


def get_model():
    torch.manual_seed(0)
    return WideMLP()


def get_example_inputs():
    return (torch.randn(BATCH, D, generator=torch.Generator().manual_seed(1)),)


# ----------------------------------------------------------------------------- the measurement


def _prepare(work: Path) -> tuple[Path, Path, Path]:
    """(signed bundle, public key, run_bundle binary), built once into ``work``."""
    bundle, signed, key, binary = work / "wide.ascpack", work / "wide.signed.ascpack", work / "key", work / "run_bundle"
    if not bundle.exists():
        subprocess.run([sys.executable, "-m", "ascendc_pack", "build", __file__, "-o", str(bundle), "--topn", "1",
                        "--cache-dir", str(work / "build_cache")], check=True)
    if not key.exists():
        subprocess.run([sys.executable, "-m", "ascendc_pack", "keygen", "-o", str(key)], check=True)
    if not signed.exists():
        subprocess.run([sys.executable, "-m", "ascendc_pack", "sign", str(bundle), "--key", str(key), "-o",
                        str(signed)], check=True)
    if not binary.exists():
        subprocess.run(["sh", str(ROOT / "examples" / "cpp" / "build.sh"), str(binary)], check=True,
                       env=dict(os.environ, PYTHON=sys.executable))
    return signed, Path(f"{key}.pub"), binary


def _cpp_load_ms(binary: Path, directory: Path, *args: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    proc = subprocess.run([str(binary), str(directory), *args], capture_output=True, text=True, env=env, check=True)
    return float(re.search(r"loaded in ([0-9.]+) ms", proc.stdout).group(1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    os.chmod(a.work, 0o700)
    signed, pub, binary = _prepare(a.work)

    from ascendc_pack_runtime.extract import open_bundle, remove_tree

    cache = a.work / "cache"
    ex = open_bundle(signed, cache_dir=cache, trusted_keys=[pub])
    size_mb = sum(f.stat().st_size for f in ex.directory.rglob("*") if f.is_file()) / 1e6

    def py(**kw) -> float:
        t = time.perf_counter()
        assert not open_bundle(signed, cache_dir=cache, **kw).extracted
        return (time.perf_counter() - t) * 1e3

    def fresh() -> float:
        c = a.work / "fresh_cache"
        remove_tree(c)
        t = time.perf_counter()
        assert open_bundle(signed, cache_dir=c).extracted
        ms = (time.perf_counter() - t) * 1e3
        remove_tree(c)
        return ms

    variants = {
        "py reuse": lambda: py(),
        "py reuse, policy": lambda: py(trusted_keys=[pub]),
        "py extract": fresh,
        "C++ load": lambda: _cpp_load_ms(binary, ex.directory),
        "C++ load, policy": lambda: _cpp_load_ms(binary, ex.directory, "--trusted-key", str(pub)),
        "C++ load, verify_hashes": lambda: _cpp_load_ms(binary, ex.directory, "--verify-hashes"),
    }
    for f in variants.values():   # warm the page cache and the code paths
        f()
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for r in range(a.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(variants[k]())
    print("uptime after: ", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"bundle {signed.stat().st_size / 1e6:.1f} MB, extraction {size_mb:.1f} MB; medians of {a.rounds} "
          "interleaved rounds:")
    for k in names:
        v = times[k]
        print(f"  {k:26s} {statistics.median(v):8.1f} ms   (min {min(v):.1f}, max {max(v):.1f})")
    shutil.rmtree(a.work / "fresh_cache", ignore_errors=True)


if __name__ == "__main__":
    main()
