#!/usr/bin/env python
"""Time every tactic candidate against ATen-as-captured on shapes taken from the bench models.

    .venv/bin/python bench/tactics_bench.py [--only conv,linear,attention] [--rounds 9] [--threads N]

Per step (a resnet18 / mobilenet_v3_small / efficientnet_b0 convolution with its BatchNorm and
activation/residual epilogue, a BERT / Llama / ViT / classifier linear, attention at sequence
128 / 197): every candidate of ``ascendc_pack.tactics.dispatch.candidates`` is first checked against eager,
its derived weights are made (build stage, then load stage: the load stage is timed, it is cold
start), then all candidates are timed (a convolution also as it runs inside a chain planned in
channels_last: ``cl-in:`` rows, input already channels_last) in interleaved rounds (median of per-round means). Prints
median µs, ratio to candidate 0 (< 1 is faster), load-time packing ms and the extra bytes of
load-time derived weights, then the winner ÷ ATen geomean per kind. The per-call Python
interpreter overhead (a few µs per op) is included for every candidate alike. Writes
bench_out/tactics_bench.json. Numbers taken on a busy machine are noisy: the load average is
printed before and after. With ``--threads 1`` the default clock is the calling thread's CPU
time (all the work runs on it), which a busy host's descheduling does not inflate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack.tactics.dispatch as T  # noqa: E402
from ascendc_pack.tactics.dispatch import AttentionStep, ConvStep, Epilogue, LinearStep  # noqa: E402

E = Epilogue
BN_RELU, BN_ADD_RELU = E(affine=True, unary="relu"), E(affine=True, binary="add", unary="relu")


def conv(x, o, k, s=1, p=0, g=1, epi=BN_RELU):
    return ConvStep(x, o, (k, k), (s, s), (p, p), groups=g, bias=False, epilogue=epi)


STEPS: list[tuple[str, object]] = [
    ("resnet18 conv1 7x7/2 3->64 @224", conv((1, 3, 224, 224), 64, 7, 2, 3)),
    ("resnet18 layer1 3x3 64 @56 +res", conv((1, 64, 56, 56), 64, 3, 1, 1, epi=BN_ADD_RELU)),
    ("resnet18 layer2 3x3/2 64->128", conv((1, 64, 56, 56), 128, 3, 2, 1)),
    ("resnet18 layer2 downsample 1x1/2", conv((1, 64, 56, 56), 128, 1, 2, 0, epi=E(affine=True))),
    ("resnet18 layer3 3x3 256 @14 +res", conv((1, 256, 14, 14), 256, 3, 1, 1, epi=BN_ADD_RELU)),
    ("resnet18 layer4 3x3 512 @7 +res", conv((1, 512, 7, 7), 512, 3, 1, 1, epi=BN_ADD_RELU)),
    ("mobilenet_v3 dw 3x3/2 16 @112", conv((1, 16, 112, 112), 16, 3, 2, 1, g=16)),
    ("mobilenet_v3 dw 5x5 96 @14 hswish", conv((1, 96, 14, 14), 96, 5, 1, 2, g=96, epi=E(affine=True, unary="hardswish"))),
    ("mobilenet_v3 1x1 40->240 hswish", conv((1, 40, 14, 14), 240, 1, epi=E(affine=True, unary="hardswish"))),
    ("efficientnet 1x1 24->144 silu @56", conv((1, 24, 56, 56), 144, 1, epi=E(affine=True, unary="silu"))),
    ("efficientnet dw 5x5 240 @28 silu", conv((1, 240, 28, 28), 240, 5, 1, 2, g=240, epi=E(affine=True, unary="silu"))),
    ("bert q/k/v 128x256->256", LinearStep(128, 256, 256)),
    ("bert attn-out 256->256 +res", LinearStep(128, 256, 256, epilogue=E(binary="add"))),
    ("bert ffn1 256->1024 gelu", LinearStep(128, 256, 1024, epilogue=E(unary="gelu"))),
    ("bert ffn2 1024->256 +res", LinearStep(128, 1024, 256, epilogue=E(binary="add"))),
    ("llama k/v 256->64 (GQA)", LinearStep(128, 256, 64, bias=False)),
    ("llama gate 256->688 silu", LinearStep(128, 256, 688, bias=False, epilogue=E(unary="silu"))),
    ("llama up 256->688 *gate", LinearStep(128, 256, 688, bias=False, epilogue=E(binary="mul"))),
    ("llama down 688->256 +res", LinearStep(128, 688, 256, bias=False, epilogue=E(binary="add"))),
    ("vit qkv 197x384->1152", LinearStep(197, 384, 1152)),
    ("vit mlp1 384->1536 gelu", LinearStep(197, 384, 1536, epilogue=E(unary="gelu"))),
    ("resnet18 fc 1x512->1000", LinearStep(1, 512, 1000)),
    ("bert attention L128 H4 pad-mask", AttentionStep(1, 4, 128, 128, 64, mask="bool", mask_shape=(1, 1, 1, 128))),
    ("llama attention L128 H8/2 causal", AttentionStep(1, 8, 128, 128, 32, kv_heads=2, causal=True)),
    ("vit attention L197 H6", AttentionStep(1, 6, 197, 197, 64)),
]


def _nbytes(t: torch.Tensor) -> int:
    return int(torch.ops.mkldnn._nbytes(t)) if t.is_mkldnn else t.numel() * t.element_size()


def interleaved(fns: dict, rounds: int, target_s: float, clock) -> dict[str, float]:
    """Median µs per call of each function over ``rounds`` interleaved rounds (rotated order),
    each sample ~``target_s`` of calls, timed with ``clock``."""
    number = {}
    for name, fn in fns.items():
        fn()
        t0 = clock()
        fn()
        number[name] = max(1, min(1000, int(target_s / max(clock() - t0, 1e-6))))
    names, samples = list(fns), {n: [] for n in fns}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = clock()
            for _ in range(number[name]):
                fns[name]()
            samples[name].append((clock() - t0) / number[name] * 1e6)
    return {n: statistics.median(v) for n, v in samples.items()}


def _variants(step) -> list[tuple[str, object]]:
    """The step as captured today (NCHW input) and, for a convolution, the same step inside a
    chain planned in channels_last (its input arrives channels_last: no per-step relayout)."""
    if step.kind == "conv":
        return [("", step), ("cl-in:", dataclasses.replace(step, layout="channels_last"))]
    return [("", step)]


def bench_step(label: str, step, rounds: int, clock) -> dict:
    """Check, prepare and time every candidate of one step (all variants in one interleaved
    group; ratios are to candidate 0 of the first variant: ATen as captured today)."""
    row: dict = {"step": label, "kind": step.kind, "spec": step.to_json(), "candidates": {}}
    fns = {}
    base_name = None
    for prefix, variant in _variants(step):
        env = T.random_env(variant)
        weights, acts = T.split(env)
        for t in T.candidates(variant):
            name = prefix + t.name
            base_name = base_name or name
            info: dict = {"key": t.key, "ops": list(t.ops)}
            row["candidates"][name] = info
            problem = T.check(variant, t, env)
            if problem:
                info["problem"] = problem
                continue
            built = T.prepare(t, weights, "build")
            t0 = time.perf_counter()
            loaded = T.prepare(t, built, "load")
            info["load_pack_ms"] = (time.perf_counter() - t0) * 1e3
            info["load_extra_bytes"] = sum(_nbytes(v) for k, v in loaded.items() if k not in built)
            bound = T.bind(t.calls)
            fns[name] = (lambda b=bound, e={**loaded, **acts}, o=t.output: T.execute(b, e)[o])
    with torch.no_grad():
        med = interleaved(fns, rounds, 0.02, clock)
    base = med.get(base_name)
    for name, us in med.items():
        row["candidates"][name].update(us=us, ratio=us / base if base else None)
    alone = {n: us for n, us in med.items() if ":" not in n}
    row["winner"] = min(alone, key=alone.get) if alone else None  # the step on its own, NCHW input
    row["winner_in_chain"] = min(med, key=med.get) if med else None  # any variant
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="conv,linear,attention", help="comma-separated kinds")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--clock", choices=["cpu", "wall"], default=None,
                   help="cpu: this thread's CPU time (time.thread_time), immune to being descheduled on a "
                        "busy host; only meaningful with --threads 1 (the default then); wall: perf_counter")
    p.add_argument("--out", default=str(ROOT / "bench_out" / "tactics_bench.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock_name = args.clock or ("cpu" if torch.get_num_threads() == 1 else "wall")
    if clock_name == "cpu" and torch.get_num_threads() != 1:
        p.error("--clock cpu measures the calling thread only: use it with --threads 1")
    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    kinds = set(args.only.split(","))
    load0 = os.getloadavg()
    print(f"torch {torch.__version__}, ISA {T.host_isa()}, {torch.get_num_threads()} threads, {clock_name} clock, "
          f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    rows = []
    head = f"{'step':36} {'candidate':16} {'median us':>10} {'÷ aten':>7} {'pack ms':>8} {'+MB':>6}"
    print(head + "\n" + "-" * len(head), flush=True)
    for label, step in STEPS:
        if step.kind not in kinds:
            continue
        row = bench_step(label, step, args.rounds, clock)
        rows.append(row)
        for name, c in row["candidates"].items():
            if "problem" in c:
                print(f"{label:36} {name:16} MISMATCH {c['problem']}")
                continue
            mark = (" *" if name == row["winner"] else "") + (" (chain)" if name == row["winner_in_chain"] != row["winner"] else "")
            print(f"{label:36} {name:16} {c['us']:10.1f} {c['ratio']:7.3f} {c['load_pack_ms']:8.2f} "
                  f"{c['load_extra_bytes'] / 1e6:6.2f}{mark}", flush=True)
            label = ""
    print("\nwinner ÷ ATen-as-captured, geomean per kind (and per candidate, over the steps it ran):")
    for kind in sorted({r["kind"] for r in rows}):
        sel = [r for r in rows if r["kind"] == kind]
        win = [r["candidates"][r["winner"]]["ratio"] for r in sel]
        chain = [r["candidates"][r["winner_in_chain"]]["ratio"] for r in sel]
        per: dict[str, list[float]] = {}
        wins: dict[str, int] = {}
        for r in sel:
            wins[r["winner"]] = wins.get(r["winner"], 0) + 1
            for n, c in r["candidates"].items():
                if "ratio" in c:
                    per.setdefault(n, []).append(c["ratio"])
        geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"  {kind:10} winner {geo(win):.3f}" + (f" (in a channels_last chain {geo(chain):.3f})" if kind == "conv" else "")
              + "   " + "  ".join(f"{n} {geo(v):.3f}" for n, v in per.items())
              + "   wins: " + ", ".join(f"{n} {k}" for n, k in sorted(wins.items())))
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"torch": torch.__version__, "isa": T.host_isa(), "threads": torch.get_num_threads(),
                               "clock": clock_name,
                               "loadavg_before": load0, "loadavg_after": load1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
