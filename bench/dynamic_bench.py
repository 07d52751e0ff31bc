"""Dynamic shapes: one dynamic bundle against a static bundle per shape, ONNX Runtime with dynamic
axes, eager and torch.compile(dynamic=True), at the buckets and off them (docs/PERFORMANCE.md).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/dynamic_bench.py bench/models/dyn_bert.py \\
        [--topn 4] [--shapes 1x128,8x128,32x256,4x96,16x200,1x8] [--work-dir DIR]

The model file declares its dynamic dims and its buckets (example + calibration inputs). The
script builds the dynamic bundle once and a static bundle for each measured shape (the same
kernel cache: a bucket's static bundle is the bucket's plan built again, an off-bucket one is
tuned for that shape), exports the model to ONNX with dynamic axes once, and then, per shape,
times every contender in interleaved rounds (``--rounds`` rounds of ``--calls`` calls after a
100 ms lead-in each). Reported: median ms per call, the dynamic bundle ÷ static bundle and ÷
ONNX Runtime (medians of the per-round ratios, so a shared host's slow phases cancel), the plan
each call took, and the host tiling's cost per jit-kernel launch (a C++ loop over
``ap_kernel_tiling`` of every jit kernel at every measured shape) and the arenas (the generic
plan's, placed at the declared maxima, against each static plan's, placed for its shape).
The load average (``uptime``) is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ascendc_pack_runtime as rt  # noqa: E402  (before torch: the threading policy)
import torch  # noqa: E402

from ascendc_pack.frontend.loader import load_model_file  # noqa: E402

LEAD_IN_S = 0.1

TILING_TIMER = r"""
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "ascendc_pack/kernel_abi.h"
// argv: kernel.so dims... (n_dims values per shape, shapes back to back); prints ns per call
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { std::printf("-1\n"); return 1; }
  auto info = reinterpret_cast<const ap_jit_info* (*)()>(dlsym(h, "ap_kernel_jit_describe"))();
  auto tiling = reinterpret_cast<int (*)(const int64_t*, int32_t, ap_jit_tiling*)>(dlsym(h, "ap_kernel_tiling"));
  std::vector<int64_t> dims;
  for (int i = 2; i < argc; ++i) dims.push_back(std::atoll(argv[i]));
  size_t shapes = dims.size() / info->n_dims, n = 200000;
  ap_jit_tiling t{};
  int64_t sink = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    tiling(dims.data() + (i % shapes) * info->n_dims, 0, &t);
    sink += t.block_dim + t.rows_per_task;
  }
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  std::printf("%.1f %lld\n", ns, (long long)(sink & 1));
  return 0;
}
"""


def uptime() -> str:
    """The load averages (1, 5, 15 minutes) and the host's cores."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) + f" on {os.cpu_count()} cores"


def shapes_arg(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]


def make_inputs(mod, loaded, batch: int, seq: int, seed: int):
    """Inputs at (batch, seq): the model file's make_inputs, else its example resized."""
    if hasattr(mod, "make_inputs"):
        return tuple(mod.make_inputs(batch, seq, seed))
    raise SystemExit(f"{loaded.path} needs a make_inputs(batch, seq, seed) function for this bench")


def build(loaded, work: Path, topn: int, shapes, cache: Path) -> tuple[Path, dict]:
    """The dynamic bundle and a static bundle per shape (built once; reused from ``work``)."""
    import ascendc_pack
    from ascendc_pack.dynamic import build_dynamic

    dyn = work / f"{loaded.name}.dynamic.ascpack"
    if not dyn.exists():
        t0 = time.perf_counter()
        build_dynamic(loaded.module, loaded.all_input_sets, loaded.dynamic, topn=topn, output=dyn, cache_dir=cache,
                      name=loaded.name, progress=True)
        print(f"built {dyn.name} in {time.perf_counter() - t0:.0f} s", flush=True)
    mod = sys.modules[type(loaded.module).__module__]
    static = {}
    for b, s in shapes:
        out = work / f"{loaded.name}.{b}x{s}.ascpack"
        if not out.exists():
            t0 = time.perf_counter()
            ascendc_pack.build(loaded.module, make_inputs(mod, loaded, b, s, 7), topn=topn, output=out,
                               cache_dir=cache, name=f"{loaded.name}_{b}x{s}", progress=True)
            print(f"built {out.name} in {time.perf_counter() - t0:.0f} s", flush=True)
        static[(b, s)] = out
    return dyn, static


def onnx_session(loaded, work: Path, example):
    import onnxruntime as ort

    from ascendc_pack.config import host_cores

    path = work / f"{loaded.name}.dynamic.onnx"
    if not path.exists():
        torch.onnx.export(loaded.module, example, str(path), dynamo=True,
                          dynamic_shapes=loaded.dynamic.torch_spec())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = host_cores()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda ins: (lambda feed=dict(zip(names, (t.numpy() for t in ins))): sess.run(None, feed))


def time_round(fn, calls: int) -> float:
    end = time.perf_counter() + LEAD_IN_S
    while time.perf_counter() < end:
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def tiling_cost(model, shapes, work: Path) -> dict:
    """ns per ap_kernel_tiling call of every jit kernel of the generic plan, cycling the shapes."""
    from ascendc_pack.toolchain.cxx import runtime_include_dir

    src, exe = work / "tiling_timer.cpp", work / "tiling_timer"
    if not exe.exists():
        src.write_text(TILING_TIMER)
        subprocess.run(["g++", "-O2", f"-I{runtime_include_dir()}", str(src), "-o", str(exe), "-ldl"], check=True)
    m = model.contract
    generic = m.dynamic.generic
    kernels = {(k.name, k.kernel_key): k for k in m.kernels}
    out = {}
    for key in generic.kernels:
        k = kernels[key]
        if not k.tiling_repr.endswith("sched=jit"):
            continue
        lib = model.directory / k.file
        dims = [str(v) for b, s in shapes for v in _kernel_dims(lib, {"batch": b, "seq": s})]
        res = subprocess.run([str(exe), str(lib), *dims], capture_output=True, text=True, check=True)
        out[k.name] = float(res.stdout.split()[0])
    return out


def _kernel_dims(lib: Path, sizes: dict) -> list[int]:
    import ctypes

    h = ctypes.CDLL(str(lib))

    class Info(ctypes.Structure):
        _fields_ = [("abi", ctypes.c_uint32), ("n_dims", ctypes.c_int32), ("dims", ctypes.c_char_p)]

    f = h.ap_kernel_jit_describe
    f.restype = ctypes.POINTER(Info)
    names = f().contents.dims.decode().split(",")
    return [sizes[n] for n in names]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("--topn", type=int, default=4)
    p.add_argument("--shapes", default="1x128,8x128,32x256,4x96,16x200,1x8",
                   help="batch x seq to time, comma separated (the buckets and off-bucket shapes)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--work-dir", default=None)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile(dynamic=True) out")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="write the table into FILE's '## Dynamic shapes' section (docs/PERFORMANCE.md), replacing "
                        "this model's subsection")
    args = p.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = uptime()
    print(f"load before: {load_before}", flush=True)
    loaded = load_model_file(args.model_file)
    mod = sys.modules[type(loaded.module).__module__]
    shapes = shapes_arg(args.shapes)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="dynbench-"))
    work.mkdir(parents=True, exist_ok=True)
    dyn_path, static_paths = build(loaded, work, args.topn, shapes, work / "cache")
    dyn = rt.load(dyn_path)
    statics = {k: rt.load(v) for k, v in static_paths.items()}
    ort_bind = onnx_session(loaded, work, next(i for i in loaded.all_input_sets if min(i[0].shape[:2]) >= 2))
    eager = loaded.module
    compiled = None if args.no_compile else torch.compile(loaded.module, dynamic=True)
    rows = []
    for b, s in shapes:
        ins = make_inputs(mod, loaded, b, s, 11)
        with torch.no_grad():
            ref = eager(*ins)
            contenders = {"dynamic": lambda: dyn(*ins), "static": lambda: statics[(b, s)](*ins),
                          "ort": ort_bind(ins), "eager": lambda: eager(*ins)}
            if compiled is not None:
                compiled(*ins)  # compile (or reuse) outside the timing
                contenders["compile"] = lambda: compiled(*ins)
            for name, fn in contenders.items():
                out = fn()
                out = torch.from_numpy(out[0]) if name == "ort" else out
                err = (out - ref).abs().max().item()
                assert err < 1e-3, f"{name} at {b}x{s}: max error {err}"
            times = {n: [] for n in contenders}
            for r in range(args.rounds):
                order = list(contenders)[r % len(contenders):] + list(contenders)[:r % len(contenders)]
                for name in order:
                    times[name].append(time_round(contenders[name], args.calls))
        ratio = lambda a, c: statistics.median(x / y for x, y in zip(times[a], times[c]))  # noqa: E731
        row = {"shape": f"{b}x{s}", "plan": dyn.plan_for(*ins),
               **{n: statistics.median(t) for n, t in times.items()},
               "dyn/static": ratio("dynamic", "static"), "dyn/ort": ratio("dynamic", "ort"),
               "static/ort": ratio("static", "ort")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    tiling = tiling_cost(dyn, shapes, work)
    arenas = {"generic (declared maxima)": dyn.contract.dynamic.generic.graph.memory.get("arena_bytes")}
    arenas.update({f"static {b}x{s}": m.contract.graph.memory.get("arena_bytes") for (b, s), m in statics.items()})
    load_after = uptime()
    print(f"load after: {load_after}")
    table = table_lines(loaded.name, rows, tiling, arenas, compiled is not None)
    print("\n".join(table))
    if args.markdown:
        head = [f"### {loaded.name}", "", f"Run on {started}; load average (1/5/15 min) {load_before} before, "
                f"{load_after} after; `--topn {args.topn}`, {args.rounds} rounds of {args.calls} calls per shape.", "",
                "```", "OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/dynamic_bench.py " + " ".join(sys.argv[1:]),
                "```", ""]
        update_section(Path(args.markdown), loaded.name, head + table + [""])
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "tiling_ns": tiling, "arenas": arenas}, indent=1))


def table_lines(name, rows, tiling, arenas, with_compile: bool) -> list[str]:
    cols = ["dynamic", "static", "ort", "eager"] + (["compile"] if with_compile else [])
    head = f"| {name} shape | plan | " + " | ".join(f"{c} ms" for c in cols) + " | dyn ÷ static | dyn ÷ ORT | static ÷ ORT |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        out.append(f"| {r['shape']} | {r['plan']} | " + " | ".join(f"{r[c]:.2f}" for c in cols)
                   + f" | {r['dyn/static']:.2f} | {r['dyn/ort']:.2f} | {r['static/ort']:.2f} |")
    out.append("")
    if tiling:
        out.append(f"Host tiling (`ap_kernel_tiling`) per jit-kernel launch: {min(tiling.values()):.0f}-"
                   f"{max(tiling.values()):.0f} ns over the generic plan's {len(tiling)} jit kernels.")
    out.append("Arenas: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in arenas.items() if v is not None) + ".")
    return out


def update_section(path: Path, model: str, lines: list[str]) -> None:
    """Replace (or add) ``### <model>`` in the ``## Dynamic shapes`` section of ``path``."""
    text = path.read_text() if path.exists() else ""
    marker = "\n## Dynamic shapes\n"
    if marker not in text:
        text = text.rstrip() + "\n" + marker + "\n" + INTRO + "\n"
    head, _, section = text.partition(marker)
    parts = section.split("\n### ")
    intro, subs = parts[0], {p.split("\n", 1)[0]: "### " + p for p in parts[1:]}
    subs[model] = "\n".join(lines)
    body = intro.rstrip() + "\n\n" + "\n".join(s.rstrip() + "\n" for _, s in sorted(subs.items()))
    path.write_text(head + marker + body)


INTRO = """One dynamic bundle (a tuned static plan per bucket + the generic plan: jit kernels, oneDNN linear,
ATen attention) against, per shape, a static bundle built and tuned for exactly that shape, ONNX Runtime
with dynamic axes (one model for every shape, spinning off), eager and `torch.compile(dynamic=True)`.
Medians of interleaved rounds; the ratios are medians of per-round ratios. Written by
`bench/dynamic_bench.py --markdown docs/PERFORMANCE.md` (`bench/run_all.py` keeps this section)."""


if __name__ == "__main__":
    main()
