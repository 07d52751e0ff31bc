"""Fused kernels: the ``kernels`` benchmark (every candidate of every fused kernel of the examples
vs eager, ``torch.compile`` and a same-size memory copy) and the kernel table of the model
benchmark (PGO times of the tuned bundle vs a memory copy timed now).

Bandwidth and "% of copy" are derived only from stable rows (:mod:`.stats`): a row timed while
the host was busy gets ``unstable`` there instead of a number.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ascendc_pack.bench.machine import load_line
from ascendc_pack.bench.stats import Spread, interleaved_stats

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["add_sum", "mlp", "transformer_block", "cond_model", "inplace", "conv_block"]


# ---- the kernel-spec reads (kept together: the spec's type is changing) ------------------------

def kernel_bytes(spec) -> int:
    """Unique bytes a kernel moves; ``spec`` is a KernelSpec or its JSON (from a build worker)."""
    from ascendc_pack.ir.fusion import KernelSpec
    from ascendc_pack.kernels.fused.tiling import kernel_bytes as spec_bytes

    return spec_bytes(spec if isinstance(spec, KernelSpec) else KernelSpec.from_json(spec))


def choices_json(choices: dict) -> dict:
    """A build's kernel choices as JSON (spec included), keyed by kernel name."""
    return {name: {"spec": ch.spec.to_json(), **ch.to_json()} for name, ch in choices.items()}


def candidate_runner(step, compiled_candidate, args: list):
    """A no-argument callable running one compiled candidate of ``step`` on ``args``."""
    from ascendc_pack_runtime.kernels import KernelLibrary

    from ascendc_pack.kernels.fused.build import FusedKernel

    k = FusedKernel(step.kernel, KernelLibrary(compiled_candidate.so_path, compiled_candidate.candidate.kernel_key))
    ins, outs = k.prepare_inputs(list(args)), k.allocate_outputs()
    return lambda: k(ins, outs)


# ---- shared arithmetic -------------------------------------------------------------------------

def gbs(nbytes: int, us: float | None) -> float | None:
    """Effective GB/s of moving ``nbytes`` in ``us`` microseconds."""
    return nbytes / us / 1e3 if us else None


def fmt_gbs(v: float | None) -> str:
    """GB/s with 3 significant digits (never a bare ``0.0``)."""
    return "-" if v is None else f"{v:.3g}"


def _copy_fn(nbytes: int):
    src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_stats(sizes, rounds: int) -> dict[int, dict]:
    """Interleaved timing of a same-size memory copy per byte count (read + write = ``nbytes``)."""
    sizes = sorted(set(sizes))
    if not sizes:
        return {}
    return dict(zip(sizes, interleaved_stats({n: _copy_fn(n) for n in sizes}, rounds=max(3, rounds)).values()))


def model_kernel_rows(choices: dict, rounds: int) -> list[dict]:
    """Rows of the model benchmark's kernel table: per fused kernel of the tuned bundle, its PGO
    winner and candidate 0 (build-time samples, with their spread) and a same-size copy timed now.
    ``pct_of_copy`` only when both the winner's and the copy's timings are stable."""
    rows = []
    for name, ch in choices.items():
        results = ch["results"]
        win = results[ch["chosen_index"]] if results else None
        samples = (win or {}).get("samples_us") or []
        spread = Spread.of(samples) if samples else None
        rows.append({"kernel": name, "bytes": kernel_bytes(ch["spec"]), "candidates": len(results),
                     "chosen_index": ch["chosen_index"], "visited": ch["visited"],
                     "tiling": ch["candidate"]["tiling_repr"],
                     "winner_us": (win or {}).get("median_us"), "cand0_us": results[0].get("median_us") if results else None,
                     "winner_spread": spread.to_json() if spread else None,
                     "winner_stable": bool(spread and spread.stable)})
    copies = copy_stats([r["bytes"] for r in rows], rounds)
    for row in rows:
        c = copies.get(row["bytes"])
        row["copy_us"], row["copy_stable"] = (c["median_us"], c["stable"]) if c else (None, False)
        row["gbs"] = gbs(row["bytes"], row["winner_us"]) if row["winner_stable"] else None
        row["copy_gbs"] = gbs(row["bytes"], row["copy_us"]) if row["copy_stable"] else None
        if row["gbs"] and row["copy_gbs"]:
            row["pct_of_copy"] = 100.0 * row["copy_us"] / row["winner_us"]
    return rows


# ---- the kernels benchmark ---------------------------------------------------------------------

def _compiled_reference(step):
    """torch.compile of the kernel's ATen steps (Inductor, default mode)."""
    from ascendc_pack.frontend.executor import run_reference_fused

    def fn(*args):
        return run_reference_fused(step, list(args))

    return torch.compile(fn, dynamic=False)


def _kernel_args(example: str, config) -> tuple[dict, dict]:
    """The prepared kernels of one example and the arguments each gets in a real run."""
    from ascendc_pack.frontend.executor import run_model, run_reference_fused
    from ascendc_pack.passes.fuse import fuse
    from ascendc_pack.kernels.fused.build import prepare_kernels
    from ascendc_pack.pipeline import capture_file

    loaded, captured = capture_file(ROOT / "examples" / f"{example}.py")
    fused = fuse(captured.model)
    kernels = prepare_kernels(fused.program, config)
    args_of: dict[str, list] = {}

    def record(step, args):
        args_of.setdefault(step.name, [a.clone() for a in args])
        return run_reference_fused(step, args)

    with torch.no_grad():
        for inputs in loaded.all_input_sets:
            run_model(fused, captured.weights, [t.clone() for t in inputs], run_fused=record)
    return kernels, args_of


def bench_kernels(examples: list[str], topn: int, cache_dir: str | None, rounds: int) -> str:
    """The ``kernels`` report: per fused kernel of each example, every candidate, eager, torch.compile
    and a same-size memory copy, timed in interleaved rounds in this process."""
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.frontend.executor import run_reference_fused

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; {load_line()}",
             f"median us over every call of {rounds} interleaved rounds; spread = IQR / median of the "
             "per-round medians (unstable: over 10% or under 3 rounds; no GB/s or % from it); "
             "GB/s = unique bytes read + written / time",
             f"{'kernel':<40} {'contender':<40} {'us':>9} {'spread':>7} {'GB/s':>7} {'vs compile':>10}"]
    for ex in examples:
        kernels, args_of = _kernel_args(ex, config)
        lines.append(f"== {ex}")
        for name, kc in kernels.items():
            if name not in args_of:
                continue
            args, step = args_of[name], kc.step
            nbytes = kernel_bytes(step.kernel)
            contenders = {f"#{i} {cc.candidate.tiling_repr}": candidate_runner(step, cc, args)
                          for i, cc in enumerate(kc.compiled.candidates) if cc.ok}
            contenders["eager"] = lambda step=step, args=args: run_reference_fused(step, list(args))
            compiled = _compiled_reference(step)
            contenders["torch.compile"] = lambda compiled=compiled, args=args: compiled(*args)
            contenders["memcpy (same bytes)"] = _copy_fn(nbytes)
            stats = interleaved_stats(contenders, rounds=rounds)
            lines += _kernel_lines(name, nbytes, stats)
    return "\n".join(lines)


def _kernel_lines(name: str, nbytes: int, stats: dict[str, dict]) -> list[str]:
    cands = {k: v for k, v in stats.items() if k.startswith("#")}
    best = min(cands, key=lambda k: cands[k]["median_us"]) if cands else None
    compile_us = stats["torch.compile"]["median_us"]
    out = []
    for label, s in stats.items():
        us, stable = s["median_us"], s["stable"]
        spread = f"{s['spread']['rel_iqr'] * 100:.0f}%"
        rate = fmt_gbs(gbs(nbytes, us)) if stable else "unstable"
        ratio = f"{compile_us / us:9.2f}x" if stable and stats["torch.compile"]["stable"] else "  unstable"
        mark = " <- best" if label == best else ""
        out.append(f"{name[:40]:<40} {label[:40]:<40} {us:9.1f} {spread:>7} {rate:>7} {ratio}{mark}")
    copy = stats["memcpy (same bytes)"]
    if best and copy["stable"] and stats[best]["stable"]:
        out.append(f"{'':<40} {'best / copy bandwidth':<40} {copy['median_us'] / stats[best]['median_us'] * 100:8.0f}%")
    else:
        out.append(f"{'':<40} {'best / copy bandwidth':<40} unstable (not derived from noisy rows)")
    return out
