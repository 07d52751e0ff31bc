#!/usr/bin/env python
"""Generated attention kernels vs torch's CPU flash attention and the unfused chain.

    .venv/bin/python bench/attention_bench.py [--topn 4] [--rounds 15] [--cache-dir DIR]

Shapes: the attention steps of the bench models at batch 1 (vit_s16, bert_4l with its padding
mask, llama_gqa_4l causal with grouped-query heads, swin_mask's shifted windows), q/k/v as the
views of one ``qkv`` projection where the model makes them so. Contenders, every output checked
against eager's math first:

* ``unfused``: ``softmax(q @ kᵀ * s + mask) @ v`` (ATen, K/V heads repeated for GQA);
* ``flash``: ``aten::_scaled_dot_product_flash_attention_for_cpu``;
* ``ours``: the fastest of the generated kernel's ``--topn`` candidates, on the graph's task pool
  (what graph.so runs); ``ours omp``: the same library through ``ap_kernel_launch`` (OpenMP).

Interleaved rounds, each a batch of calls per contender; medians; the script prints
``os.getloadavg()`` before and after. Threads: 2 (torch.set_num_threads) for ATen.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack.kernels.attention.generator import AttnKernel, AttnSpec, plan  # noqa: E402
from ascendc_pack.toolchain.compiler import compile_kernels  # noqa: E402
from ascendc_pack.config import BuildConfig  # noqa: E402
from ascendc_pack.tactics.dispatch import AttentionStep, attention_reference  # noqa: E402
from ascendc_pack.autotune.timing_pool import timing_pool  # noqa: E402

# name, batch, heads, kv_heads, len, head_dim, mask, mask_shape, causal, windows, qkv views
SHAPES = [("vit_s16", 1, 6, 6, 197, 64, None, None, False, None, True),
          ("bert_4l", 1, 4, 4, 128, 64, "float", (1, 1, 1, 128), False, None, True),
          ("llama_gqa_4l", 1, 8, 2, 128, 32, None, None, True, None, False),
          ("swin_mask", 8, 2, 2, 64, 16, "float", (4, 1, 64, 64), False, 4, True)]


def _case(name, b, h, hk, n, e, mask, mask_shape, causal, windows, views):
    g = torch.Generator().manual_seed(0)
    if views:  # [B, L, 3, H, E] projection, heads permuted out: strided views
        q, k, v = torch.randn(b, n, 3, h, e, generator=g).permute(2, 0, 3, 1, 4)
    else:
        q = torch.randn(b, h, n, e, generator=g)
        k, v = torch.randn(b, hk, n, e, generator=g), torch.randn(b, hk, n, e, generator=g)
    named = {"q": q, "k": k, "v": v}
    if mask:
        named["mask"] = torch.randn(mask_shape, generator=g)
    spec = AttnSpec(f"bench_{name}", b, h, hk, n, n, e, e, 1 / math.sqrt(e), q.stride()[:3], k.stride()[:3],
                    v.stride()[:3], mask, mask_shape, causal, True, windows)
    step = AttentionStep(b, h, n, n, e, hk, None, None, mask, mask_shape, causal, True, mask_windows=windows)
    return spec, step, named


def _time(fns: dict, rounds: int, calls: int) -> dict:
    out = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter_ns()
            for _ in range(calls):
                f()
            out[k].append((time.perf_counter_ns() - t) / calls / 1e3)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--topn", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"load average at start: {os.getloadavg()}")
    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="attn-bench-"))
    config = BuildConfig.resolve(topn=args.topn, cache_dir=cache, jobs=2)
    pool = timing_pool(config)
    print(f"{'shape':<14} {'unfused us':>10} {'flash us':>9} {'ours us':>8} {'ours omp':>9} {'ours/flash':>10}  tiling")
    for row in SHAPES:
        spec, step, named = _case(*row)
        b = plan(spec, config)
        ck = compile_kernels([b.build], config)[0]
        want = attention_reference(step, named)
        kernels = []
        for cand, cc in zip(b.candidates, ck.candidates):
            kern = AttnKernel(spec, cc.so_path)
            ins, out = kern.operands(named), kern.new_output()
            run_pool = kern.lib.bind(ins, [out], kern.workspace_buffer, pool=pool)
            run_omp = kern.lib.bind(ins, [out], kern.workspace_buffer)
            run_pool()
            assert torch.allclose(out, want, atol=2e-5, rtol=2e-5), (row[0], cand.tiling)
            kernels.append((cand, run_pool, run_omp))
        hk = step.heads // step.hkv
        kr, vr = named["k"].repeat_interleave(hk, 1), named["v"].repeat_interleave(hk, 1)
        mask4 = None
        if spec.mask and spec.mask_windows:
            w = spec.mask_windows
            mask4 = named["mask"].expand(spec.batch // w, *named["mask"].shape).reshape(spec.batch, *spec.mask_shape[1:])
        elif spec.mask:
            mask4 = named["mask"]

        def unfused():
            s = torch.matmul(named["q"], kr.transpose(-2, -1)) * spec.scale
            if spec.causal:
                s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
            if mask4 is not None:
                s = s + mask4
            return torch.matmul(torch.softmax(s, -1), vr)

        def flash():
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                named["q"], named["k"], named["v"], 0.0, spec.causal, attn_mask=mask4, scale=spec.scale)[0]

        assert torch.allclose(flash(), want, atol=2e-5, rtol=2e-5) and torch.allclose(unfused(), want, atol=2e-5)
        calls = max(3, int(2e4 // max(1.0, spec.flops / 1e5)))
        fns = {"unfused": unfused, "flash": flash}
        fns.update({f"k{i}": r for i, (_, r, _) in enumerate(kernels)})
        med = _time(fns, args.rounds, calls)
        best = min(range(len(kernels)), key=lambda i: med[f"k{i}"])
        omp = _time({"omp": kernels[best][2]}, args.rounds, calls)["omp"]
        ours = med[f"k{best}"]
        print(f"{row[0]:<14} {med['unfused']:>10.1f} {med['flash']:>9.1f} {ours:>8.1f} {omp:>9.1f} "
              f"{ours / med['flash']:>10.2f}  {kernels[best][0].candidate.tiling_repr}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
