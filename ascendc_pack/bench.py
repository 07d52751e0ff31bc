"""Benchmarks (never tests): ``python -m ascendc_pack.bench kernels [--examples ...]``.

``kernels``: for every fused kernel of the examples, on the arguments it gets in a real run,
the median microseconds of each candidate, of eager PyTorch running the same ATen ops, of
``torch.compile`` (Inductor, default mode) on the same ops, and of a memory copy of the same
number of bytes; plus effective GB/s. Contenders are timed in interleaved rounds in one
process; every number is a median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["add_sum", "mlp", "transformer_block", "cond_model", "inplace", "conv_block"]


def _time(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e6


def interleaved_medians(contenders: dict, rounds: int = 15, target_us: float = 2000.0) -> dict[str, float]:
    """Median microseconds per call of each contender, timed in interleaved rounds."""
    numbers = {}
    for name, fn in contenders.items():
        fn()
        fn()
        once = max(_time(fn, 1), 1.0)
        numbers[name] = max(1, min(2000, int(target_us / once)))
    samples = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            samples[name].append(_time(contenders[name], numbers[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def _kernel_bytes(spec: dict) -> int:
    from .tiling import _bytes

    return _bytes(spec)


def _compiled_reference(step):
    """torch.compile of the kernel's ATen steps (Inductor, default mode)."""
    from .executor import run_reference_fused

    def fn(*args):
        return run_reference_fused(step, list(args))

    return torch.compile(fn, dynamic=False)


def bench_kernels(examples: list[str], topn: int, cache_dir: str | None, rounds: int) -> str:
    from .config import BuildConfig
    from .executor import run_model, run_reference_fused
    from .kernels import prepare_kernels
    from .fuse import fuse
    from .pipeline import capture_file
    from ascendc_pack_runtime.kernels import FusedKernel, KernelLibrary

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; median us over {rounds} "
             "interleaved rounds; GB/s = (unique bytes read + written) / time",
             f"{'kernel':<46} {'contender':<44} {'us':>9} {'GB/s':>7} {'vs compile':>10}"]
    for ex in examples:
        loaded, captured = capture_file(ROOT / "examples" / f"{ex}.py")
        fused = fuse(captured.model)
        kernels = prepare_kernels(fused.program, config)
        args_of: dict[str, list] = {}

        def record(step, args):
            args_of.setdefault(step.name, [a.clone() for a in args])
            return run_reference_fused(step, args)

        for inputs in loaded.all_input_sets:
            run_model(fused, captured.weights, [t.clone() for t in inputs], run_fused=record)
        lines.append(f"== {ex}")
        for name, kc in kernels.items():
            if name not in args_of:
                continue
            args = args_of[name]
            nbytes = _kernel_bytes(kc.step.kernel)
            contenders = {}
            for i, cc in enumerate(kc.compiled.candidates):
                if not cc.ok:
                    continue
                k = FusedKernel(kc.step.kernel, KernelLibrary(cc.so_path, cc.candidate.kernel_key))
                ins, outs = k.prepare_inputs(list(args)), k.allocate_outputs()
                contenders[f"#{i} {cc.candidate.tiling_repr}"] = (lambda k=k, ins=ins, outs=outs: k(ins, outs))
            step = kc.step
            contenders["eager"] = lambda step=step: run_reference_fused(step, list(args))
            compiled = _compiled_reference(step)
            contenders["torch.compile"] = lambda: compiled(*args)
            src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8)
            dst = torch.empty_like(src)
            contenders["memcpy (same bytes)"] = lambda: dst.copy_(src)
            med = interleaved_medians(contenders, rounds=rounds)
            best = min((v, k) for k, v in med.items() if k.startswith("#"))
            for label, us in med.items():
                gbs = nbytes / us / 1e3
                ratio = med["torch.compile"] / us
                mark = " <- best" if label == best[1] else ""
                lines.append(f"{name[:46]:<46} {label[:44]:<44} {us:9.1f} {gbs:7.1f} {ratio:9.2f}x{mark}")
            lines.append(f"{'':<46} {'best / copy bandwidth':<44} {med['memcpy (same bytes)'] / best[0] * 100:8.0f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ascendc_pack.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernels", help="every candidate of every fused kernel vs eager, torch.compile, memcpy")
    k.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated example names")
    k.add_argument("--topn", type=int, default=10)
    k.add_argument("--rounds", type=int, default=15)
    k.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    if args.what == "kernels":
        print(bench_kernels(args.examples.split(","), args.topn, args.cache_dir, args.rounds))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
