#!/usr/bin/env python
"""Run the whole benchmark suite (the examples and bench/models/) and write docs/PERFORMANCE.md.

    .venv/bin/python bench/run_all.py [--topn 4] [--repeat 20] [--cold-runs 5] [--models a,b]

For each model, ``ascendc_pack.bench.bench_model`` builds and times every contender (eager,
torch.compile default and freezing, AOTInductor, ONNX Runtime without spinning, OpenVINO in float32
and at its default precision (bfloat16 on an AVX512_BF16 / AMX host), the .ascpack
bundle with --topn 1 and --topn N) side by side, one process per contender, interleaved rounds,
each round with a quiet and a busy phase (one core kept busy by another process), plus a warm
rebuild of the tuned bundle. The report holds only numbers measured by this run: per model the
latency table with bundle ÷ best peer, the contention slowdowns, the build-time table, the
machine, its load, the torch version and the exact command; the chart is docs/performance.png.
Run it on a quiet machine (check ``uptime``): other load makes multi-threaded contenders wait at
their barriers, and the report flags every row whose rounds disagree. Each model's section says
how many cores work outside the benchmark took while it timed (``/proc``: the host's busy ticks
less those of the benchmark's process tree, plus the hypervisor's steal); under 0.1 the run was
quiet. The load average cannot say that on a small host: the benchmark's own workers are most of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack import bench  # noqa: E402
from ascendc_pack.bench import report  # noqa: E402
from ascendc_pack.bench.extras import require_chart  # noqa: E402
from ascendc_pack.errors import PackError  # noqa: E402

MODELS = {**{name: ROOT / "examples" / f"{name}.py" for name in bench.EXAMPLES},
          **{p.stem: p for p in sorted((ROOT / "bench" / "models").glob("*.py")) if not p.stem.startswith("_")}}
CHART_ORDER = ("eager", "compile", "compile_freeze", "aoti", "ort", "ov_f32", "ov", "bundle1", "compile_ascendc")
COLORS = {"eager": "#7f7f7f", "compile": "#1f77b4", "compile_freeze": "#17becf", "aoti": "#ff7f0e",
          "ort": "#2ca02c", "ov_f32": "#8c564b", "ov": "#e377c2", "bundle1": "#9467bd", "compile_ascendc": "#d62728"}


def git_state() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{' + uncommitted changes' if dirty else ''}" if rev else "unknown"


def command_line(argv: list[str]) -> str:
    """The command that reproduces this run, from the repository root (no absolute paths)."""
    exe = Path(sys.executable)
    python = os.path.relpath(exe, ROOT) if exe.absolute().is_relative_to(ROOT) else "python"
    return shlex.join([python, os.path.relpath(Path(__file__).absolute(), ROOT), *argv])


def chart(results: list[dict], path: Path, topn: int) -> None:
    """Horizontal bars per model: bundle (--topn N) ÷ contender (paired median), log scale;
    hatched bars are ratios the run flagged unstable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = [r["name"] for r in results]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 1.3 * len(names)))
    height = 0.8 / len(CHART_ORDER)
    for j, cid in enumerate(CHART_ORDER):
        ys, vals, hatches = [], [], []
        for i, r in enumerate(results):
            c = r["contenders"].get(cid)
            s = r.get("ratios", {}).get("bundleN", {}).get(cid)
            y = i + (j - (len(CHART_ORDER) - 1) / 2) * height
            if s:
                ys.append(y)
                vals.append(s["median"])
                hatches.append("" if s["stable"] else "///")
                ax.text(s["median"] * 1.03, y, report.fmt_ratio(s["median"]) + ("" if s["stable"] else " ?"),
                        va="center", fontsize=7)
            elif c is not None and c["status"] != "ok":
                ax.text(1.0, y, f"  {bench.label(cid, topn)}: {c['status']}", va="center", fontsize=7, color="red")
        bars = ax.barh(ys, vals, height=height, color=COLORS[cid])
        for bar, h in zip(bars, hatches):
            bar.set_hatch(h)
    # legend from plain patches: a hatched first bar must not make the whole entry look unstable
    ax.legend(handles=[Patch(color=COLORS[c], label=bench.label(c, topn)) for c in CHART_ORDER], fontsize=7,
              loc="best")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel(f".ascpack --topn {topn} latency ÷ contender latency (median over rounds; < 1: bundle faster; "
                  "hatched / ?: unstable)")
    ax.set_title("ascendc-pack bundle vs other runtimes (CPU, per-call latency ratio)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_rows(machine: dict, load_start, load_end, results: list[dict]) -> list[list[str]]:
    works = [r["other_work"] for r in results if r.get("other_work")]
    busiest = max(works, key=lambda w: w["cores"] + w["steal_cores"], default=None)
    return [["CPU", machine.get("cpu", "?")],
            ["usable cores (affinity)", str(machine["cores"])],
            ["CPU(s) / threads per core / sockets", f"{machine.get('CPU(s)', '?')} / "
             f"{machine.get('Thread(s) per core', '?')} / {machine.get('Socket(s)', '?')}"],
            ["caches", ", ".join(f"{k} {machine[k]}" for k in ("L1d cache", "L1i cache", "L2 cache", "L3 cache")
                                 if k in machine)],
            ["vector ISA flags", machine.get("isa") or "?"],
            ["hypervisor", machine.get("Hypervisor vendor", "none reported")],
            ["memory", f"{machine.get('memory_gib', '?')} GiB"],
            ["OS kernel / arch", f"{machine['kernel']} / {machine['machine']}"],
            ["Python / torch", f"{machine['python']} / {machine['torch']}"],
            ["onnxruntime / onnx / onnxscript", " / ".join(str(machine.get(m)) for m in ("onnxruntime", "onnx", "onnxscript"))],
            ["openvino", str(machine.get("openvino"))],
            ["torchvision / timm / transformers", " / ".join(str(machine.get(m)) for m in ("torchvision", "timm", "transformers"))],
            ["g++", str(machine.get("g++"))],
            ["load average at start (1/5/15 min)", " ".join(f"{v:.2f}" for v in load_start) if load_start else "?"],
            ["load average at end (1/5/15 min)", " ".join(f"{v:.2f}" for v in load_end) if load_end else "?"],
            ["other work while timing (the busiest model)", bench.describe_other_work(busiest)]]


def method_lines(cfg: dict, topn: int) -> list[str]:
    return [
        "## Method", "",
        "- Contenders: eager PyTorch (`torch.no_grad`); `torch.compile` (Inductor, default mode) and "
        "`torch.compile(options={\"freezing\": True})` (`torch._inductor.config.freezing`); AOTInductor "
        "(`torch.export` → `aoti_compile_and_package` → `.pt2` → `aoti_load_package`); ONNX Runtime CPU "
        f"(`torch.onnx.export(dynamo=True)`, intra-op threads = usable cores ({cfg.get('cores')}), "
        "`session.intra_op.allow_spinning=0`); OpenVINO CPU (`openvino.convert_model(module, example_input=...)`, "
        "weights kept float32, `PERFORMANCE_HINT` LATENCY, `INFERENCE_NUM_THREADS` = usable cores) twice: "
        "`OpenVINO f32` with `INFERENCE_PRECISION_HINT` f32 and `OpenVINO default` with OpenVINO's own default "
        "(bfloat16 on a CPU with AVX512_BF16 or AMX: its `precision` column says what it ran); "
        "the `.ascpack` bundle built with `--topn 1` and with "
        f"`--topn {topn}`, loaded by `ascendc_pack_runtime.load`.",
        "- Correctness first: eager's outputs on the example inputs (and a float64 run where the model "
        "allows) are the reference; every contender's first output is checked by the project's accuracy "
        "rule, and so are inputs the model updates in place. A contender whose outputs differ is reported "
        "WRONG and not timed; one that fails to build, load or run is reported FAILED with the reason.",
        "- Builds: every artifact is built in a fresh process with empty Inductor / kernel caches (cold); "
        "torch.compile's build time is its first call. Build times leave out loading the model file (the "
        "user's imports and model construction; the bundle's `load s`), as AOTInductor's compile does; "
        "`graph_runtime s` is the wait for the graph interpreter, compiled once per toolchain and cache "
        "(every cold build here starts from an empty cache). The tuned bundle is then rebuilt once on its own "
        "(warm) cache. One build each: build times carry the load of the moment (shown per model).",
        "- " + ("All contenders ran in this one process." if cfg.get("same_process") else
                "Every contender runs in its own worker process, so ONNX Runtime's thread pool, Inductor's and "
                "libgomp's threads and the allocator state of one contender cannot slow another (docs/DESIGN.md §8). "
                "Only one worker runs at a time; the others block on a pipe."),
        "- Quiet or busy: per model, the cores that work outside the benchmark took while it timed (the host's "
        "busy ticks in `/proc/stat` less those of the benchmark's own process tree, plus the hypervisor's "
        f"steal); under {bench.QUIET_OTHER_CORES:g} cores on average the model's timing was quiet. The load "
        "average is shown too, but on a small host the benchmark's own workers are most of it.",
        f"- {cfg.get('repeat')} interleaved rounds (order rotated each round, 20 ms pause between samples). A "
        f"sample is {cfg.get('lead_in_ms', 0):.0f} ms of untimed calls (the lead-in: a worker that sat idle while "
        "the others ran is timed in its steady state, docs/DESIGN.md §8), "
        f"then as many back-to-back calls as fill about {cfg.get('sample_ms'):.0f} ms, each call timed on "
        "its own with `perf_counter_ns`; median and p90 are over every timed call. Spread = interquartile "
        "range ÷ median of the per-round medians; a row with spread above 10% (or under 3 rounds) is flagged "
        "UNSTABLE. Ratios are paired by round: the median over rounds of (bundle round median ÷ contender "
        "round median), with its IQR; below 1 the bundle is faster. Best peer = the fastest correct "
        "non-bundle contender computing in the bundle's precision (float32: OpenVINO's bfloat16 default is not "
        "a float32 bundle's peer). A contender computing in a lower precision is checked only for a broken "
        "conversion (relative error above 0.25 is WRONG) and reported with its relative error "
        "||y - eager|| / ||eager|| (`rel error`).",
        "- Contention: " + ("every round also has a busy phase (order of the two phases alternating), in which "
                            "another process spins on one core: a Python `while True: pass` loop, "
                            + (f"pinned to core {cfg.get('busy_core')}" if cfg.get("busy_core") is not None
                               else "not pinned") + ", stopped (SIGSTOP) in the quiet phase. Slowdown = busy ÷ "
                            "quiet, paired by round; bundle slowdown ÷ ONNX Runtime slowdown < 1 means the "
                            "bundle degrades less; bundle busy ÷ ONNX Runtime busy (paired by round) < 1 means "
                            "the bundle is faster while the core is taken. The slowdown ratio favours a "
                            "contender that gains little from the second core (it has less to lose): both are "
                            "shown." if cfg.get("contention") else "not run."),
        "- After idle: " + (f"{cfg.get('idle_bursts')} times per contender (order rotated), every process sat "
                            f"idle for {cfg.get('idle_s'):g} s, then one call was timed with no lead-in: the latency "
                            "of a sporadic request. Bundle ÷ best peer after idle is paired by try."
                            if cfg.get("idle_bursts") else "not run."),
        f"- Cold start: {cfg.get('cold_runs')} new processes per artifact, alternating: import torch, load the "
        "artifact, return the first output (spawn to output). The runs share one Inductor cache dir (`.pt2`) and "
        "one runtime cache dir (`.ascpack`, extracted by the first run); the first run is shown separately.",
        "- Fused kernels: winner and candidate-0 times are the PGO measurements of the tuned build on the "
        "model's real arguments; GB/s = unique bytes read + written ÷ winner time; the copy is a same-size "
        "`Tensor.copy_` timed during the benchmark. GB/s and % of copy are printed only from stable timings.", ""]


def ov_cell(r: dict) -> str:
    """The tuned bundle ÷ OpenVINO at its default precision, with that precision and its error."""
    ov = r["contenders"].get("ov") or {}
    ratio = (r.get("ratios", {}).get("bundleN") or r.get("ratios", {}).get("bundle1") or {}).get("ov")
    if ov.get("status") != "ok" or not ratio:
        return "-" if not ov else ov.get("status", "-")
    return f"{report.fmt_spread(ratio)} ({ov.get('precision')}, {ov.get('rel_error', 0):.1e})"


def bf16_cell(r: dict) -> str:
    """The bfloat16 bundle ÷ the fastest peer computing in the precision it ended up in, with the
    relative errors of both."""
    b = r["contenders"].get("bundleN_bf16") or {}
    best = r.get("best_peer", {}).get("bundleN_bf16")
    if b.get("status") != "ok":
        return "-" if not b else b.get("status", "-")
    if not best:
        return f"no peer computes in {b.get('precision')}"
    peer = r["contenders"][best["peer"]]
    return (f"{report.fmt_spread(best)} vs {peer['label']} ({b.get('precision')}: {b.get('rel_error', 0):.1e} vs "
            f"{peer.get('rel_error', 0):.1e})")


def summary_rows(results: list[dict], topn: int) -> tuple[list[str], list[list[str]]]:
    head = ["model", f".ascpack --topn {topn} ÷ best peer", ".ascpack --topn 1 ÷ best peer", "best peer",
            f"--topn {topn} slowdown ÷ ORT slowdown", f"--topn {topn} busy ÷ ORT busy",
            f"--topn {topn} after idle ÷ best peer", f"--topn {topn} ÷ OpenVINO default (its precision, rel error)",
            f"--topn {topn} --precision bf16 ÷ best peer at its precision (both rel errors)",
            "bundle build ÷ AOTI compile"]
    rows = []
    for r in results:
        bp = r.get("best_peer", {})
        peer = next((s["peer"] for s in bp.values()), None)
        vs = (r.get("contention") or {}).get("vs_ort", {})
        busy = (r.get("contention") or {}).get("busy_vs_ort", {})
        idle = (r.get("after_idle") or {}).get("vs_best", {})
        build = report.build_row(r)
        rows.append([r["name"], report.fmt_spread(bp.get("bundleN")), report.fmt_spread(bp.get("bundle1")),
                     bench.label(peer, topn) if peer else "-", report.fmt_spread(vs.get("bundleN") or vs.get("bundle1")),
                     report.fmt_spread(busy.get("bundleN") or busy.get("bundle1")),
                     report.fmt_spread(idle.get("bundleN") or idle.get("bundle1")), ov_cell(r), bf16_cell(r),
                     build[report.BUILD_HEAD.index("bundle ÷ AOTI")]])
    return head, rows


def model_section(r: dict, topn: int) -> list[str]:
    rel = os.path.relpath(r["model"], ROOT)
    cfg = r["config"]
    L = [f"### {r['name']}", "", f"`{rel}`, inputs {', '.join(r.get('inputs', []))}; {r.get('seconds', 0):.0f} s.", "",
         *[f"- at {when}: " + bench.load_line(r.get(f"loadavg_{when}"), cfg["cores"], "other_work" not in r)
           for when in ("start", "end")],
         *(["- " + bench.other_work_line(r["other_work"])] if "other_work" in r else []), "",
         *report.md_table(*report.contender_rows(r)), ""]
    L += [f"{line}  " for line in report.best_peer_lines(r)] + [""] if r.get("ratios") else []
    if r.get("contention"):
        L += ["Contention:", "", *report.md_table(*report.contention_rows(r)), "",
              *[f"{line}  " for line in report.contention_lines(r)], ""]
    stages = {cid: c for cid, c in r["contenders"].items() if c.get("stages")}
    for cid, c in stages.items():
        rb = c.get("rebuild") or {}
        L.append(f"{c['label']} build stages (s): " + ", ".join(f"{k} {v:.2f}" for k, v in c["stages"].items())
                 + f"; {c.get('candidate_compiles', '?')} candidate compiles"
                 + (f"; warm rebuild {rb['build_s']:.2f} s" if rb.get("build_s") else "")
                 + (f" (load at build {c['load_at_build'][0]:.2f})" if c.get("load_at_build") else "") + ".")
    L += [""] if stages else []
    if r["cold_start"]:
        L += ["Cold start (new process → import torch → load → first output):", "",
              *report.md_table(*report.cold_rows(r)), ""]
    if r["kernels"]:
        L += [f"Fused kernels of {bench.label(r['kernels_of'], topn)}:", "", *report.md_table(*report.kernel_rows(r)), ""]
    return L


DYNAMIC_SECTION = "## Dynamic shapes"


def write_report(results: list[dict], machine: dict, args, started: str, seconds: float, out: Path,
                 chart_path: Path | None, load_end) -> None:
    topn = args.topn
    L = ["# Performance", "",
         f"Generated by `bench/run_all.py` on {started} in {seconds / 60:.1f} min; every number below comes "
         "from that one run. Regenerate with the command below on a quiet machine; rows whose rounds "
         "disagree are flagged UNSTABLE and ratios carry their interquartile range.", "",
         *([f"> **Note:** {args.note}", ""] if args.note else []),
         "```", command_line(args.argv), "```", "",
         f"Source: commit {machine['source']}; torch {machine['torch']}.", "", "## Machine", ""]
    L += report.md_table(["", ""], machine_rows(machine, machine.get("loadavg"), load_end, results))
    cfg = results[0]["config"] if results else {}
    L += ["", *method_lines(cfg, topn), "## Summary", ""]
    if chart_path is not None:
        L += [f"![latency ratios]({chart_path.name})", ""]
    L += [*report.md_table(*summary_rows(results, topn), text_last=False), ""]
    L += ["## Build times", "", "One cold build each (fresh caches), then a warm rebuild of the tuned bundle; "
          "torch.compile's time is its first call.", "",
          *report.md_table(report.BUILD_HEAD, [report.build_row(r) for r in results], text_last=False), ""]
    L += ["## Models", ""]
    for r in results:
        L += model_section(r, topn)
    # bench/dynamic_bench.py's section (its own runs) is kept as it is
    kept = out.read_text() if out.exists() else ""
    tail = kept[kept.index(DYNAMIC_SECTION):] if DYNAMIC_SECTION in kept else ""
    out.write_text("\n".join(L).rstrip() + "\n" + ("\n" + tail if tail else ""))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS)
                   + ", or .py paths")
    p.add_argument("--topn", type=int, default=4)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--cold-runs", type=int, default=5)
    p.add_argument("--sample-ms", type=float, default=50.0)
    p.add_argument("--contenders", default=None, help="comma-separated subset of " + ",".join(bench.MODEL_CONTENDERS))
    p.add_argument("--same-process", action="store_true")
    p.add_argument("--no-contention", action="store_true", help="skip the busy phase of every round")
    p.add_argument("--busy-core", type=int, default=None, help="pin the busy process to this core")
    p.add_argument("--idle-bursts", type=int, default=5,
                   help="times per contender the first call after 0.3 s of idle is timed (0: skip)")
    p.add_argument("--no-rebuild", action="store_true", help="skip the warm rebuild of the tuned bundle")
    p.add_argument("--out", default=str(ROOT / "docs" / "PERFORMANCE.md"))
    p.add_argument("--chart", default=None, help="PNG path (default: performance.png next to --out)")
    p.add_argument("--no-chart", action="store_true")
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--note", default=None, help="a sentence printed at the top of the report (e.g. why it was run)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS and not n.endswith(".py")]
    if unknown:
        p.error(f"unknown models {unknown}; choose from {', '.join(MODELS)} or pass .py paths")
    try:
        if not args.no_chart:
            require_chart()
    except PackError as exc:
        p.error(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    chart_path = Path(args.chart) if args.chart else out.with_name("performance.png")
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t0 = time.perf_counter()
    machine = bench.machine_info()
    machine["source"] = git_state()  # before this run writes its report and chart into docs/
    results = []
    for name in names:
        path = MODELS.get(name, Path(name))
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            r = bench.bench_model(path, topn=args.topn, repeat=args.repeat, cold_runs=args.cold_runs,
                                  sample_ms=args.sample_ms, same_process=args.same_process,
                                  contenders=args.contenders.split(",") if args.contenders else None,
                                  contention=not args.no_contention, busy_core=args.busy_core,
                                  rebuild=not args.no_rebuild, idle_bursts=args.idle_bursts)
        except (PackError, ValueError) as exc:
            sys.exit(f"error: {exc}")
        print(bench.format_report(r), flush=True)
        results.append(r)
    seconds = time.perf_counter() - t0
    if not args.no_chart and any(r.get("ratios", {}).get("bundleN") for r in results):
        chart(results, chart_path, args.topn)
    else:
        chart_path = None
    write_report(results, machine, args, started, seconds, out, chart_path, bench.loadavg())
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "results": results}, indent=1, default=str))
    print(f"wrote {out}" + (f" and {chart_path}" if chart_path else "") + f" in {seconds / 60:.1f} min",
          file=sys.stderr)


if __name__ == "__main__":
    main()
