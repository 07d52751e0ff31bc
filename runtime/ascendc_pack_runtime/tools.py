"""The runtime's command-line tools: inspect, verify, run and extract a bundle.

Used by ``ascendc-pack inspect|verify|run`` (click, in ``ascendc_pack.cli.main``) and by
``python -m ascendc_pack_runtime`` (argparse, for machines with the runtime only). Every
function returns text / data and an exit status instead of printing, so both front ends share
one implementation; only torch, zstandard and (for ``--inputs``/``--save-outputs`` .npz files)
numpy are needed.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from .errors import BundleError
from .extract import open_bundle
from .host import tuned_cap_here
from .manifest import IOSpec, Manifest
from .model_parts import concrete_shape, example_sizes
from .verify import read_manifest, verify_bundle


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _spec(s: IOSpec) -> str:
    extra = f" (= input {s.input_index})" if s.input_index is not None else ""
    return f"{s.name}: {s.dtype}[{', '.join(map(str, s.shape))}]{extra}"


def inspect_text(m: Manifest, path: Path | str | None = None) -> str:
    """A readable summary of a manifest: model, target, io, weights, kernels with every
    candidate's median time, the chosen one and whether PGO visited it, the tactic steps likewise,
    and the ATen operators that stayed plain calls (with counts)."""
    lines = [f"bundle   {path}" if path is not None else "bundle",
             f"model    {m.model_name}  (format {m.format} v{m.format_version}, built by {m.producer.name} "
             f"{m.producer.version})"]
    t = m.target
    soc = (f"{t.soc}{', emulated on' if t.emulated else ''} " if t.soc else "")
    lines.append(f"target   {m.backend} {soc}{t.arch} -march={t.march}  "
                 f"({len(t.isa)} ISA features: {' '.join(t.isa) if t.isa else '-'})")
    lines.append(f"compiler {t.compiler}")
    lines.append(f"torch    {m.torch.version}  cxx11_abi={m.torch.cxx11_abi}")
    lines.append(f"cores    limit {m.core_limit if m.core_limit is not None else 'none'}, tuned for {m.cores}, "
                 f"topn {m.topn}")
    if m.call_threads is not None:
        lines.append(f"threads  {m.call_threads.describe()}")
        _, note = tuned_cap_here(m)
        if note is not None:
            lines.append(f"         on this host: {note}")
    lines.append("inputs")
    lines += [f"  {_spec(s)}" for s in m.inputs]
    lines.append("outputs")
    lines += [f"  {_spec(s)}" for s in m.outputs]
    lines += [f"  mutates input {mu.input} in place ({mu.value})" for mu in m.mutations]
    w = m.weights
    lines.append(f"weights  {len(w.tensors)} tensors, {_fmt_bytes(sum(t.nbytes for t in w.tensors))} in {w.file}")
    if m.dynamic is None:
        lines += _graph_lines(m.graph, "graph    ")
    else:
        lines += _dynamic_lines(m)
    visited = sum(1 for k in m.kernels if k.visited)
    gemm = sum(1 for k in m.kernels if k.name.startswith("gemm_"))  # generated GEMMs of tactic steps
    kinds = f"{len(m.kernels) - gemm} fused" + (f" + {gemm} GEMM" if gemm else "")
    lines.append(f"kernels  {kinds}, {visited} visited by PGO")
    for k in m.kernels:
        tag = "visited" if k.visited else "not visited (candidate 0 kept)"
        lines.append(f"  {k.name}  chosen #{k.chosen_index} key {k.kernel_key}  "
                     f"block_dim {k.block_dim}  workspace {k.workspace}  [{tag}]")
        lines.append(f"    tiling {k.tiling_repr}")
        for c in k.candidates:
            mark = "*" if c.index == k.chosen_index else " "
            timing = "failed" if c.failed else ("not timed" if c.median_us is None else f"{c.median_us:.1f} us")
            lines.append(f"    {mark} #{c.index} {timing:>12}  block_dim {c.block_dim}  {c.tiling_repr}")
    if m.dynamic is None:
        lines += _tactic_lines(m.tactics, m.graph)
    lines += _precision_lines(m)
    lines.append(f"members  {len(m.members)} files, {_fmt_bytes(m.declared_bytes)} uncompressed")
    for name, info in m.members.items():
        lines.append(f"  {name}  {_fmt_bytes(info.size)}  sha256 {info.sha256[:16]}...")
    return "\n".join(lines)


def _graph_lines(g, head: str) -> list[str]:
    mem = g.memory
    flush = [f"{head}denormals flushed to zero in every call (built with --flush-denormals)"] if g.flush_denormals else []
    if not mem:
        return flush
    steps = mem.get("steps", {})
    return flush + [f"{head}arena {_fmt_bytes(mem.get('arena_bytes', 0))} for {mem.get('arena_buffers', 0)} "
            f"buffers (unshared {_fmt_bytes(mem.get('arena_unshared_bytes', 0))}), steps "
            + ", ".join(f"{k} {v}" for k, v in sorted(steps.items() if isinstance(steps, dict) else []))]


def _dynamic_lines(m: Manifest) -> list[str]:
    """The dynamic dims, the batch dims and every plan (its sizes, graph, kernels, tactics)."""
    d = m.dynamic
    lines = ["dynamic  " + ", ".join(f"{x.name} in [{x.min}, {x.max}]" for x in d.dims)]
    if d.batch is not None:
        lines.append(f"batch    dim {d.batch.dim!r}: dim 0 of inputs {list(d.batch.inputs)} and outputs "
                     f"{list(d.batch.outputs)} (what a server batches on)")
    else:
        lines.append("batch    none (no dynamic dim is dim 0 of every input and output)")
    jit = {k.name for k in m.kernels if k.tiling_repr.endswith("sched=jit")}
    lines.append(f"plans    {len(d.plans)}: the bucket's static plan on an exact match of its sizes, else the "
                 "generic plan")
    for i, p in enumerate(d.plans):
        n_jit = sum(1 for name, _ in p.kernels if name in jit)
        kinds = f"{len(p.kernels)} kernels" + (f" ({n_jit} jit: sizes as arguments, tiling per launch)"
                                               if n_jit else "")
        lines.append(f"  [{i}] {p.label()}: {kinds}, {len(p.weights)} weights, {p.graph.library}")
        lines += _graph_lines(p.graph, "      graph ")
        if p.kind == "generic":
            lines.append("      arena placed for the declared maxima (buffers sized per call inside it)")
        lines += ["      " + line for line in _tactic_lines(p.tactics, p.graph)]
    return lines


def _precision_lines(m) -> list[str]:
    """The manifest's precision record: requested, computed, each step's precision (every plan's,
    in a dynamic bundle), the error against its budget and the CPU features it needs (empty
    without ``--precision``)."""
    if m.precision is None:
        return []
    p = m.precision
    steps = {}
    plans = m.dynamic.plans if m.dynamic is not None else ()
    for t in [*(m.tactics or ()), *(t for plan in plans for t in plan.tactics or ())]:
        for u in t.uses or ({"chosen_index": t.chosen_index},):
            prec = t.candidates[u["chosen_index"]].precision
            steps[prec] = steps.get(prec, 0) + 1
    per = ", ".join(f"{k} x{n}" for k, n in sorted(steps.items()))
    return [f"precision {p.requested} requested; computes {p.computes} (steps: {per or '-'}); error "
            f"{p.error:.3g} <= budget {p.budget:g} ({p.metric} on {p.input_sets} calibration input set(s))"
            + (f"; needs CPU features {', '.join(p.requires)}" if p.requires else "")]


def _tactic_lines(tactics, graph) -> list[str]:
    """The tactic steps (every candidate's median, the chosen one per use) and the ATen
    operators that run as plain calls, with counts."""
    lines = []
    if tactics is not None:
        chosen = {}
        for t in tactics:
            for u in t.uses or ({"chosen_index": t.chosen_index},):
                name = t.candidates[u["chosen_index"]].name
                chosen[(t.kind, name)] = chosen.get((t.kind, name), 0) + 1
        total = sum(len(t.uses) or 1 for t in tactics)
        summary = ", ".join(f"{kind} {name} x{n}" for (kind, name), n in sorted(chosen.items()))
        lines.append(f"tactics  {total} heavy steps ({len(tactics)} distinct): {summary or '-'}")
        for t in tactics:
            picks = sorted({u["chosen_index"] for u in t.uses}) or [t.chosen_index]
            tag = "visited" if t.visited else "not visited (candidate 0 kept)"
            uses = f" x{len(t.uses)}" if len(t.uses) > 1 else ""
            lines.append(f"  {t.name}{uses}  {t.kind}, chosen "
                         + ", ".join(f"#{i} {t.candidates[i].name} ({t.candidates[i].precision})" for i in picks)
                         + f"  [{tag}]")
            for c in t.candidates:
                mark = "*" if c.index in picks else " "
                timing = ("disqualified" if c.disqualified else "failed") if c.failed else \
                    ("not timed" if c.median_us is None else f"{c.median_us:.1f} us")
                lines.append(f"    {mark} #{c.index} {timing:>12}  {c.name}  {c.precision}  key {c.key}")
    ops = graph.aten_ops
    if ops is not None:
        listed = ", ".join(f"{op.removeprefix('aten.')} x{n}" for op, n in ops.items())
        lines.append(f"aten ops {sum(ops.values())} plain ATen calls per model call: {listed or 'none'}")
    return lines


def inspect_bundle(path: Path | str, as_json: bool = False) -> tuple[str, int]:
    """(text, exit status) of ``inspect``: the summary, or the manifest as JSON."""
    try:
        manifest = read_manifest(path)
    except BundleError as e:
        return f"error: {e.kind}: {e}", 1
    if as_json:
        return json.dumps(manifest.to_json(), indent=1), 0
    return inspect_text(manifest, path), 0


def verify_lines(path: Path | str, trusted_keys=None) -> tuple[list[str], int]:
    """(lines, exit status) of ``verify``: one line per problem (``<ErrorClass>: message``), or
    one ``OK`` line. ``trusted_keys``: see :func:`~ascendc_pack_runtime.verify_bundle`."""
    rep = verify_bundle(path, trusted_keys=trusted_keys)
    if rep.ok:
        name = rep.manifest.model_name if rep.manifest is not None else "?"
        checksum = "zstd checksum verified" if rep.has_checksum else "no zstd checksum in this bundle"
        signed = (f"signed by trusted key {rep.signer}" if rep.signature_checked else
                  f"signed by key {rep.signer} (not checked: no trusted keys)" if rep.signer else "unsigned")
        return [f"OK {path}: {name}, {rep.members_checked} members verified "
                f"(sizes and sha256), {checksum}, {signed}, compatible with this host"], 0
    return [f"{p.kind}: {p}" for p in rep.problems], 1


def _load_inputs(model, inputs_file: str | None, seed: int):
    import torch

    specs = model.input_specs
    if inputs_file is None:
        g = torch.Generator().manual_seed(seed)
        sizes = example_sizes(model)   # a dynamic bundle: random inputs at its first bucket's sizes
        out = []
        for s in specs:
            shape = concrete_shape(s, sizes)
            if s.dtype.is_floating_point or s.dtype.is_complex:
                t = torch.randn(shape, generator=g, dtype=s.dtype)
            elif s.dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=g).bool()
            else:
                t = torch.randint(0, 10, shape, generator=g, dtype=s.dtype)
            out.append(t)
        return out
    np = _numpy("--inputs FILE.npz")
    with np.load(inputs_file, allow_pickle=False) as data:
        keys = list(data.keys())
        if all(s.name in keys for s in specs):
            arrays = [data[s.name] for s in specs]
        elif len(keys) == len(specs):
            arrays = [data[k] for k in sorted(keys, key=lambda k: (len(k), k))]  # arr_0, arr_1, ... arr_10
        else:
            names = ", ".join(s.name for s in specs)
            raise ValueError(f"{inputs_file} holds arrays {keys}; the model takes {len(specs)} inputs ({names}): "
                             "name the arrays after the inputs or store them in order")
        return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return math.nan
    k = (len(sorted_ms) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (k - lo)


def run_bundle(path: Path | str, *, inputs_file: str | None = None, repeat: int = 20, warmup: int = 1,
               seed: int = 0, cache_dir: str | None = None, trusted_keys=None, threads: int | None = None,
               check: str | None = None, rtol: float | None = None, atol: float | None = None,
               save_outputs: str | None = None, profile: int = 0) -> tuple[list[str], int, dict]:
    """(lines, exit status, results) of ``run``: load (``threads``: see :func:`~.load`), call
    ``warmup + repeat`` times, report output dtypes/shapes and latency percentiles (ms).

    ``check``: a model file whose eager module gets the same inputs; every output must match by
    the accuracy rule (:mod:`.accuracy`; ``rtol``/``atol`` override it), else exit status 1.
    ``save_outputs``: write the first call's outputs to this ``.npz``, one array per output
    named after the manifest's outputs (needs numpy). ``profile``: also profile this many calls
    and report the slowest steps (:func:`~.step_profile.profile_steps`)."""
    import torch
    from torch.utils import _pytree as pytree

    from . import WAIT_POLICY
    from .model import load

    if repeat < 1:
        return ["error: --repeat must be at least 1"], 1, {}
    if profile < 0:
        return [f"error: --profile must be a number of calls, 0 or more (got {profile})"], 1, {}
    try:
        if save_outputs is not None:
            _numpy("--save-outputs F.npz")
        reference = None
        if check is not None:
            from .eager import load_eager_module

            reference = load_eager_module(check)
        t0 = time.perf_counter()
        model = load(path, cache_dir=cache_dir, trusted_keys=trusted_keys, threads=threads)
        load_ms = (time.perf_counter() - t0) * 1e3
        inputs = _load_inputs(model, inputs_file, seed)
        mutates = bool(model.contract.mutations)
        out = None
        times = []
        for k in range(warmup + repeat):
            args = [t.clone() for t in inputs] if mutates else inputs
            t = time.perf_counter()
            res = model(*args)
            dt = (time.perf_counter() - t) * 1e3
            if k == 0:
                out = res
            if k >= warmup:
                times.append(dt)
    except BundleError as e:
        return [f"error: {e.kind}: {e}"], 1, {}
    except (ValueError, OSError) as e:
        return [f"error: {e}"], 1, {}
    flat, _ = pytree.tree_flatten(out)
    lines = [f"model {model.name}: loaded in {load_ms:.1f} ms from {model.directory}",
             f"inputs: {'random (seed %d)' % seed if inputs_file is None else inputs_file}: "
             + ", ".join(f"{s.name} {str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
                         for s, t in zip(model.input_specs, inputs)),
             (f"threads: cap {model.threads}{'' if threads else ' (tuned at build: manifest call_threads)'} "
              "(fused kernels and torch's intra-op threads during calls); " if model.threads else
              f"threads: no cap (fused kernels: their block_dim; torch intra-op: {torch.get_num_threads()}"
              + (f"; {model.threads_note}, --threads N caps" if model.threads_note else "") + "); ")
             + WAIT_POLICY.describe()]
    outputs = []
    for i, t in enumerate(flat):
        if isinstance(t, torch.Tensor):
            desc = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
            outputs.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)})
        else:
            desc = repr(t)
            outputs.append({"value": repr(t)})
        name = model.output_specs[i].name if i < len(model.output_specs) else ""
        lines.append(f"output {i} {name}: {desc}" if name else f"output {i}: {desc}")
    times.sort()
    pct = {f"p{q}": _percentile(times, q / 100) for q in (50, 90, 99)}
    lines.append(f"latency over {repeat} call(s) (+{warmup} warm-up): " +
                 ", ".join(f"{k} {v:.3f} ms" for k, v in pct.items()) +
                 f", min {times[0]:.3f} ms, max {times[-1]:.3f} ms")
    names = [s.name for s in model.output_specs]
    model_manifest = model.contract
    step_profile = None
    if profile:
        from .step_profile import profile_steps

        make_args = (lambda: [t.clone() for t in inputs]) if mutates else None
        step_profile = profile_steps(model, inputs, calls=profile, warmup=0, make_args=make_args)
        lines += step_profile.lines()
    model.close()
    rc, results = 0, {"outputs": outputs, "latency_ms": pct, "load_ms": load_ms, "profile": step_profile}
    if save_outputs is not None:
        line, rc = _save_outputs(save_outputs, names, flat)
        lines.append(line)
    if reference is not None:
        from .eager import compare_with_eager

        budget = _budget(model_manifest, rtol, atol)
        checks, problem = compare_with_eager(reference, inputs, flat, names, rtol=rtol, atol=atol, budget=budget)
        lines.append(f"check against {check} (eager, same inputs)" + (
            f", by the accuracy budget {budget:g} the bundle was built with ({model_manifest.precision.computes} "
            "steps; relative error of every output):" if budget is not None else ":"))
        lines += [f"  {c.describe()}" for c in checks]
        bad = sum(not c.ok for c in checks)
        lines.append("check: OK" if problem is None else
                     f"check: MISMATCH: {bad} of {len(checks)} output(s) differ from eager" if bad else
                     f"check: MISMATCH: {problem}")
        rc = max(rc, 0 if problem is None else 1)
        results["check"] = [{"name": c.name, "max_error": c.max_error, "allowed": c.allowed, "ok": c.ok}
                            for c in checks]
    return lines, rc, results


def _budget(manifest, rtol, atol) -> float | None:
    """The precision budget ``run --check`` compares by: the manifest's, for a bundle with
    low-precision steps, unless ``--rtol/--atol`` ask for the accuracy rule."""
    record = getattr(manifest, "precision", None)
    if record is None or not record.low or rtol is not None or atol is not None:
        return None
    return record.budget


def _numpy(what: str):
    try:
        import numpy
    except ImportError:
        raise ValueError(f"{what} needs numpy, which is not installed: pip install numpy") from None
    return numpy


def _save_outputs(path: str, names: list[str], flat: list) -> tuple[str, int]:
    """Write the outputs to an .npz named by the manifest's output names: (report line, status)."""
    import torch

    np = _numpy("--save-outputs F.npz")
    arrays, widened = {}, []
    for name, t in zip(names, flat):
        if not isinstance(t, torch.Tensor):
            arrays[name] = np.asarray(t)
            continue
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: widen exactly
            widened.append(name)
            t = t.float()
        arrays[name] = t.detach().resolve_conj().contiguous().numpy()
    try:
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    except OSError as e:
        return f"error: cannot write --save-outputs {path}: {e}", 1
    note = f" ({', '.join(widened)}: bfloat16 saved as float32)" if widened else ""
    return f"saved {len(arrays)} output(s) to {path}: {', '.join(arrays)}{note}", 0


def extract(path: Path | str, cache_dir: str | None = None, verify: str = "sizes",
            trusted_keys=None) -> tuple[str, int]:
    """(directory or error line, exit status) of ``extract``: verify and extract the bundle
    into the cache (for the C++ API)."""
    try:
        ex = open_bundle(path, cache_dir=cache_dir, verify=verify, trusted_keys=trusted_keys)
    except BundleError as e:
        return f"error: {e.kind}: {e}", 1
    return str(ex.directory), 0


__all__ = ["inspect_text", "inspect_bundle", "verify_lines", "run_bundle", "extract"]
