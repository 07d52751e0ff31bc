"""Reports of the model benchmark: rows shared by the text report and docs/PERFORMANCE.md.

Every table is a ``(head, rows)`` pair of strings; :func:`text_table` and :func:`md_table`
render it. Nothing here prints a number that the run flagged unstable without saying so.
"""

from __future__ import annotations

from ascendc_pack.bench.contenders import BUNDLES, label
from ascendc_pack.bench.kernels import fmt_gbs
from ascendc_pack.bench.machine import load_line, other_work_line
from ascendc_pack.bench.stats import UNSTABLE_REL_IQR

#: build stages in pipeline order (graph_compile is part of bundle)
STAGES = ("load", "capture", "fuse", "tactics", "compile", "graph_runtime", "tune", "graph_compile", "bundle", "threads",
          "verify")


def fmt_us(v) -> str:
    """Microseconds, scaled: ``97755.8`` prints as ``97.8 ms``."""
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e4:
        return f"{v / 1e3:.1f} ms"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} us" if v >= 10 else f"{v:.2f} us"


def fmt_s(v) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def fmt_mb(v) -> str:
    return "-" if v is None else f"{v / 1e6:.2f}"


def fmt_ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}" if v >= 0.1 else f"{v:.2g}"


def fmt_pct(v) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def fmt_spread(s: dict | None) -> str:
    """A paired ratio with its interquartile range and the unstable flag."""
    if not s:
        return "-"
    text = f"{fmt_ratio(s['median'])} [{fmt_ratio(s['q1'])}-{fmt_ratio(s['q3'])}]"
    return text if s["stable"] else text + " unstable"


def _status(r: dict) -> str:
    if r["status"] == "failed":
        return f"FAILED: {r['reason']}"
    if r["status"] == "wrong":
        return f"WRONG (not timed): {r['reason']}"
    if r.get("spread") and not r["stable"]:
        return f"ok, UNSTABLE (spread {fmt_pct(r['spread']['rel_iqr'])} > {fmt_pct(UNSTABLE_REL_IQR)})"
    return "ok"


def contender_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The latency table: per contender its latency, spread, bundle ÷ contender ratios (paired
    by round), build seconds, size, max error against eager and status."""
    topn = result["config"]["topn"]
    bundles = [b for b in BUNDLES if b in result["ratios"]]
    head = ["contender", "median", "p90", "spread", "calls"]
    if result.get("after_idle"):
        head.append(f"after {result['after_idle']['idle_s']:g} s idle")
    head += [f"{label(b, topn)} ÷ x" for b in bundles]
    head += ["build s", "size MB", "precision", "max error", "rel error", "status"]
    rows = []
    for cid, r in result["contenders"].items():
        row = [r["label"], fmt_us(r.get("median_us")), fmt_us(r.get("p90_us")),
               fmt_pct(r["spread"]["rel_iqr"]) if r.get("spread") else "-", str(r.get("calls", "-"))]
        if result.get("after_idle"):
            row.append(fmt_us(r.get("after_idle", {}).get("median_us")))
        row += [fmt_spread(result["ratios"][b].get(cid)) for b in bundles]
        row += [fmt_s(r.get("build_s")), fmt_mb(r.get("size")), r.get("precision", "-"),
                "-" if r.get("max_error") is None else f"{r['max_error']:.1e}",
                "-" if r.get("rel_error") is None else f"{r['rel_error']:.1e}", _status(r)]
        rows.append(row)
    return head, rows


def best_peer_lines(result: dict) -> list[str]:
    """``bundle ÷ best peer`` per bundle: the fastest correct non-bundle contender computing in the
    bundle's precision; then every contender computing in another precision, with its error."""
    topn = result["config"]["topn"]
    out = []
    for b, s in result["best_peer"].items():
        prec = result["contenders"][b].get("precision", "fp32")
        out.append(f"{label(b, topn)} ÷ best {prec} peer ({label(s['peer'], topn)}): {fmt_spread(s)}"
                   "  (median over rounds [IQR]; < 1: the bundle is faster)")
    for cid, r in result["contenders"].items():
        if r.get("precision", "fp32") != "fp32" and r["status"] == "ok" and r.get("rel_error") is not None:
            out.append(f"{r['label']} computes in {r['precision']}: relative error {r['rel_error']:.2e} of its "
                       "outputs against eager (||y - eager|| / ||eager||); a peer only of bundles in that precision")
    if not out and result["ratios"]:
        out.append("bundle ÷ best peer: no peer was timed")
    idle = result.get("after_idle") or {}
    for b, s in idle.get("vs_best", {}).items():
        out.append(f"{label(b, topn)} ÷ best peer after {idle['idle_s']:g} s idle ({label(s['peer'], topn)}): "
                   f"{fmt_spread(s)}  (first call after the host sat idle, median over {s['n']} tries [IQR])")
    return out


def contention_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """Per contender: quiet and busy median, slowdown (busy ÷ quiet, paired by round)."""
    c = result["contention"] or {}
    head = ["contender", "quiet median", "busy median", "slowdown busy ÷ quiet"]
    rows = []
    for cid, s in c.get("slowdown", {}).items():
        r = result["contenders"][cid]
        rows.append([r["label"], fmt_us(r.get("median_us")), fmt_us(r.get("busy", {}).get("median_us")),
                     fmt_spread(s)])
    return head, rows


def contention_lines(result: dict) -> list[str]:
    """Per bundle ``slowdown ÷ ONNX Runtime slowdown`` (< 1: the bundle degrades less) and
    ``busy ÷ ONNX Runtime busy`` (< 1: the bundle is faster while the core is taken)."""
    c = result["contention"] or {}
    topn = result["config"]["topn"]
    busy = c.get("busy_vs_ort", {})
    lines = [f"{label(b, topn)} slowdown ÷ ONNX Runtime slowdown: {fmt_spread(s)}"
             + (f"; busy latency ÷ ONNX Runtime busy latency: {fmt_spread(busy[b])}" if b in busy else "")
             for b, s in c.get("vs_ort", {}).items()]
    return lines or ["bundle slowdown ÷ ONNX Runtime slowdown: - (needs a bundle and ONNX Runtime timed)"]


BUILD_HEAD = ["model", "bundle cold s", *[f"{s} s" for s in STAGES], "candidate compiles", "warm rebuild s",
              "rebuild ÷ cold", "rebuild compiles", "AOTI compile s", "torch.compile 1st call s", "freezing 1st call s", "bundle ÷ AOTI",
              "load at builds"]


def build_row(result: dict) -> list[str]:
    """One row of the build-time table (issue 13): the tuned bundle's cold build with its stages
    and candidate compiles, its warm rebuild, AOTInductor's compile and torch.compile's first call."""
    res = result["contenders"]
    b = res.get("bundleN") if res.get("bundleN", {}).get("build_s") else res.get("bundle1", {})
    cold, stages = b.get("build_s"), b.get("stages") or {}
    rb = b.get("rebuild") or {}
    aoti = res.get("aoti", {}).get("build_s")
    return [result["name"], fmt_s(cold), *[fmt_s(stages.get(s)) for s in STAGES],
            str(b.get("candidate_compiles", "-")),
            fmt_s(rb.get("build_s")) if not rb.get("error") else "FAILED",
            fmt_pct(rb["build_s"] / cold) if rb.get("build_s") and cold else "-",
            str(rb.get("candidate_compiles", "-")), fmt_s(aoti),
            fmt_s(res.get("compile", {}).get("first_call_s")), fmt_s(res.get("compile_freeze", {}).get("first_call_s")),
            fmt_ratio(cold / aoti) if cold and aoti else "-", _build_load(res)]


def _build_load(res: dict) -> str:
    """The 1-minute load average when the bundle and AOTI builds started (builds are timed once)."""
    loads = [res[c]["load_at_build"][0] for c in ("aoti", "bundleN", "bundle1") if res.get(c, {}).get("load_at_build")]
    return "-" if not loads else " / ".join(f"{v:.1f}" for v in loads)


def cold_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    head = ["artifact", "runs", "median total s", "first run s", "import torch s", "load s", "first call s", "note"]
    rows = []
    for kind, e in result["cold_start"].items():
        note = e["error"] if e.get("error", "").startswith("not run") else \
            f"FAILED: {e['error']}" if e.get("error") else ""
        rows.append([f".{kind} ({e['label']})", str(len(e["runs"])), fmt_s(e.get("median_total_s")),
                     fmt_s(e.get("first_total_s")), fmt_s(e.get("median_import_s")),
                     fmt_s(e.get("median_load_s")), fmt_s(e.get("median_first_call_s")), note])
    return head, rows


def kernel_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The tuned bundle's fused kernels; GB/s and % of copy only from stable timings."""
    head = ["kernel", "cands", "best", "winner", "spread", "cand0", "cand0 ÷ winner", "KiB", "GB/s",
            "copy GB/s", "% of copy", "visited"]
    rows = []
    for k in result["kernels"]:
        w, c0 = k["winner_us"], k["cand0_us"]
        sp = k.get("winner_spread")
        rows.append([k["kernel"], str(k["candidates"]), str(k["chosen_index"]), fmt_us(w),
                     fmt_pct(sp["rel_iqr"]) if sp else "-", fmt_us(c0),
                     fmt_ratio(c0 / w) if w and c0 else "-", f"{k['bytes'] / 1024:.0f}",
                     fmt_gbs(k.get("gbs")) if k.get("winner_stable") else "unstable" if w else "-",
                     fmt_gbs(k.get("copy_gbs")) if k.get("copy_stable") else "unstable",
                     f"{k['pct_of_copy']:.0f}%" if k.get("pct_of_copy") else "-",
                     "yes" if k["visited"] else "no"])
    return head, rows


def text_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned plain-text table; the first and last columns (names, free text) left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [fmt(head), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def md_table(head: list[str], rows: list[list[str]], text_last: bool = True) -> list[str]:
    """A Markdown table: the first column (and the last, free text, unless ``text_last`` is
    False) left-aligned, numbers right-aligned."""
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    left = {0, len(head) - 1} if text_last else {0}
    lines = ["| " + " | ".join(esc(h) for h in head) + " |",
             "|" + "|".join("---" if i in left else "---:" for i in range(len(head))) + "|"]
    return lines + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]


def header_lines(result: dict) -> list[str]:
    """Model, protocol, the load average at start and end of the run and the other work while
    it timed."""
    cfg = result["config"]
    mode = "all contenders in one process" if cfg["same_process"] else "one process per contender"
    lines = [f"model {result['model']}  inputs {', '.join(result.get('inputs', []))}",
             f"torch {cfg['torch']}, {cfg['cores']} cores, {cfg['torch_threads']} torch threads; {mode}; "
             f"{cfg['repeat']} interleaved rounds, ~{cfg['sample_ms']:.0f} ms per sample after "
             f"{cfg.get('lead_in_ms', 0):.0f} ms of untimed calls; median/p90 over all "
             f"timed calls; spread = IQR / median of the per-round medians (unstable above "
             f"{fmt_pct(UNSTABLE_REL_IQR)}); ratios paired by round, median [IQR]"]
    judged = "other_work" not in result  # else the other-work line judges the host
    lines.append("at start: " + load_line(result.get("loadavg_start"), cfg["cores"], judged))
    if result.get("loadavg_end"):
        lines.append("at end:   " + load_line(result["loadavg_end"], cfg["cores"], judged))
    if not judged:
        lines.append(other_work_line(result["other_work"]))
    return lines


def format_report(result: dict) -> str:
    """The text report of :func:`~ascendc_pack.bench.model.bench_model`."""
    topn = result["config"]["topn"]
    lines = [*header_lines(result), "", *text_table(*contender_rows(result))]
    lines += ["", *best_peer_lines(result)] if result["ratios"] else []
    if result["contention"]:
        lines += ["", f"contention: {result['contention']['busy']}", *text_table(*contention_rows(result)),
                  *contention_lines(result)]
    if any(result["contenders"].get(c, {}).get("build_s") for c in ("aoti", *BUNDLES)):
        lines += ["", "build times (s; one cold build each, fresh caches; compile = first call)",
                  *text_table(BUILD_HEAD, [build_row(result)])]
    if result["cold_start"]:
        lines += ["", "cold start: new process -> import torch -> load artifact -> first output",
                  *text_table(*cold_rows(result))]
    if result["kernels"]:
        lines += ["", f"fused kernels of {label(result['kernels_of'], topn)} (PGO samples at build time; GB/s = "
                      "unique bytes read + written / winner time; copy = same-size memory copy timed now)",
                  *text_table(*kernel_rows(result))]
    return "\n".join(lines)
