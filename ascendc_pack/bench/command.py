"""Command-line entry points: ``python -m ascendc_pack.bench kernels|model|build`` and the body
of ``ascendc-pack bench``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ascendc_pack.errors import PackError
from ascendc_pack.bench.contenders import MODEL_CONTENDERS
from ascendc_pack.bench.kernels import EXAMPLES, bench_kernels
from ascendc_pack.bench.model import bench_model
from ascendc_pack.bench.machine import load_line
from ascendc_pack.bench.report import BUILD_HEAD, build_row, format_report, text_table

#: the contenders of ``build``: the tuned bundle, AOTInductor, torch.compile's first call
BUILD_CONTENDERS = ("compile", "compile_freeze", "aoti", "bundleN")


def _contenders(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def bench_model_main(model_file: str, topn: int = 4, repeat: int = 20, cold_runs: int = 5,
                     sample_ms: float = 50.0, contenders: str | None = None, same_process: bool = False,
                     work_dir: str | None = None, json_path: str | None = None, contention: bool = False,
                     busy_core: int | None = None, rebuild: bool = False, idle_bursts: int = 5) -> dict:
    """CLI body shared by ``ascendc-pack bench`` and ``python -m ascendc_pack.bench model``:
    run :func:`bench_model`, print its report, optionally write the JSON.

    Raises:
        PackError: every contender failed, or a chosen contender's package is missing.
    """
    result = bench_model(model_file, topn=topn, repeat=repeat, cold_runs=cold_runs, sample_ms=sample_ms,
                         contenders=_contenders(contenders), same_process=same_process, work_dir=work_dir,
                         contention=contention, busy_core=busy_core, rebuild=rebuild, idle_bursts=idle_bursts)
    print(format_report(result))
    sys.stdout.flush()
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
    if not any(c["status"] == "ok" for c in result["contenders"].values()):
        raise PackError("every contender failed (reasons above)")
    return result


def bench_build_main(model_files: list[str], topn: int = 4, json_path: str | None = None) -> list[dict]:
    """The build-time benchmark (issue 13): per model a cold ``--topn N`` bundle build (fresh
    caches) with its stages and candidate compiles, a warm rebuild on the same cache, the
    AOTInductor compile and torch.compile's first call (default and freezing). Builds only: the
    artifacts are loaded and checked against eager once, not timed."""
    results = []
    for model_file in model_files:
        print(f"== {model_file}", file=sys.stderr, flush=True)
        results.append(bench_model(model_file, topn=topn, repeat=0, cold_runs=0, rebuild=True,
                                   contenders=list(BUILD_CONTENDERS)))
    if results:
        cfg = results[0]["config"]
        print(f"torch {cfg['torch']}, {cfg['cores']} cores; one cold build each (fresh caches), then a warm rebuild")
        print("at start: " + load_line(results[0].get("loadavg_start"), cfg["cores"]))
        print("at end:   " + load_line(results[-1].get("loadavg_end"), cfg["cores"]))
    print("\n".join(text_table(BUILD_HEAD, [build_row(r) for r in results])))
    for r in results:
        for c in r["contenders"].values():
            if c["status"] != "ok":
                print(f"{r['name']}: {c['label']}: {c['status']}: {c['reason']}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1, default=str))
    return results


def main(argv: list[str] | None = None) -> None:
    """``python -m ascendc_pack.bench``."""
    parser = argparse.ArgumentParser(prog="python -m ascendc_pack.bench",
                                     description="Benchmarks (never tests); protocol in docs/PERFORMANCE.md.")
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernels", help="every candidate of every fused kernel vs eager, torch.compile, memcpy")
    k.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated example names")
    k.add_argument("--topn", type=int, default=10)
    k.add_argument("--rounds", type=int, default=15)
    k.add_argument("--cache-dir", default=None)
    m = sub.add_parser("model", help="a model file: every contender side by side")
    m.add_argument("model_file")
    m.add_argument("--topn", type=int, default=4, help="candidates per kernel of the tuned bundle (default 4)")
    m.add_argument("--repeat", type=int, default=20, help="interleaved timing rounds (default 20)")
    m.add_argument("--cold-runs", type=int, default=5, help="cold-start processes per artifact (default 5)")
    m.add_argument("--sample-ms", type=float, default=50.0, help="target length of one sample (default 50)")
    m.add_argument("--contenders", default=None, help=f"comma-separated subset of {','.join(MODEL_CONTENDERS)}")
    m.add_argument("--same-process", action="store_true", help="time every contender in this process")
    m.add_argument("--contention", action="store_true",
                   help="every round also times each contender with one core kept busy by another process")
    m.add_argument("--busy-core", type=int, default=None, help="pin the busy process to this core (default: not pinned)")
    m.add_argument("--rebuild", action="store_true", help="also rebuild the tuned bundle on its warm cache")
    m.add_argument("--idle-bursts", type=int, default=5,
                   help="times per contender the first call after 0.3 s of idle is timed (default 5; 0: skip)")
    m.add_argument("--work-dir", default=None, help="keep artifacts and worker logs here (default: a temp dir)")
    m.add_argument("--json", dest="json_path", default=None, help="also write the raw results as JSON")
    b = sub.add_parser("build", help="build times: cold bundle (stages, compiles), warm rebuild, AOTI, torch.compile")
    b.add_argument("model_files", nargs="+")
    b.add_argument("--topn", type=int, default=4)
    b.add_argument("--json", dest="json_path", default=None)
    sub.add_parser("_serve", help="(internal) a contender worker process")
    args = parser.parse_args(argv)
    try:
        if args.what == "_serve":
            from ascendc_pack.bench.workers import serve

            serve()
        elif args.what == "model":
            bench_model_main(args.model_file, topn=args.topn, repeat=args.repeat, cold_runs=args.cold_runs,
                             sample_ms=args.sample_ms, contenders=args.contenders, same_process=args.same_process,
                             work_dir=args.work_dir, json_path=args.json_path, contention=args.contention,
                             busy_core=args.busy_core, rebuild=args.rebuild, idle_bursts=args.idle_bursts)
        elif args.what == "build":
            bench_build_main(args.model_files, topn=args.topn, json_path=args.json_path)
        elif args.what == "kernels":
            print(bench_kernels(args.examples.split(","), args.topn, args.cache_dir, args.rounds))
            sys.stdout.flush()
    except (PackError, ValueError) as exc:
        sys.exit(f"error: {exc}")
