"""The pipeline of a model with dynamic dims (docs/DESIGN.md §2.10): a tuned static plan per
bucket, the generic plan, one bundle.

* **Buckets**: the example and calibration input sets grouped by their shape; each group is
  built exactly as a static build builds its inputs (:func:`ascendc_pack.pipeline.prepare_and_tune`:
  capture at that shape, tactics and fused kernels tuned by PGO, candidate 0 for what no run
  reached). Kernels computing the same at the same shapes are one kernel (their names are
  digests of their specs), so they compile and tune once.
* **Generic plan**: the model captured with torch.export's dynamic shapes (sizes are
  expressions over the dims), fused as usual; every fused kernel whose sizes hold a dim is a jit
  kernel (sizes as arguments, tiling chosen per launch), the others static kernels (candidate 0,
  or a bucket's tuned choice of the same kernel). Heavy steps stay ATen calls, which take any
  size (the generated GEMM and attention kernels are static per bucket).
* **Bundle** (:mod:`ascendc_pack.package.dynamic_bundle`), then the build checks itself: every
  input set through the runtime's plan choice (its bucket) and through the generic plan, against
  eager.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import torch

from ascendc_pack.errors import PackError
from ascendc_pack.frontend.capture_dynamic import capture_symbolic
from ascendc_pack.frontend.dynamic import (DynamicShapes, batch_declaration, forward_input_names, group_buckets,
                                           parse_declaration, resize_batch)
from ascendc_pack.pipeline import BuildResult, _verify_bundle, check_against_eager, prepare_and_tune
from ascendc_pack.tactics.precision import merged

log = logging.getLogger("ascendc_pack")


def build_dynamic(model: torch.nn.Module, input_sets: list, decl: DynamicShapes, *, topn: int = 1, output=None,
                  cores: int | None = None, cache_dir=None, jobs: int | None = None, debug: bool | None = None,
                  march: str | None = None, name: str | None = None, progress=False, backend: str | None = None,
                  protocol=None, verify: bool = True, atol: float | None = None, rtol: float | None = None,
                  output_names: list[str] | None = None, tactics: bool = True,
                  generic_gemm: str = "onednn", flush_denormals: bool = False, precision: str | None = None,
                  accuracy_budget: float | None = None) -> BuildResult:
    """Build a dynamic-shape bundle of ``model`` (see the module docstring).

    ``input_sets``: the example inputs then every calibration set, at one or more shapes inside
    ``decl``'s ranges (each distinct shape is a bucket); ``decl``: a
    :class:`~ascendc_pack.frontend.dynamic.DynamicShapes`, or what ``torch.export.export(...,
    dynamic_shapes=...)`` takes. The other arguments are :func:`ascendc_pack.pipeline.build`'s.
    ``generic_gemm``: how the generic plan runs its GEMMs by a weight: ``onednn`` (a weight
    reordered at load, any row count) or ``aten`` (as captured). ``precision`` /
    ``accuracy_budget``: as for a static build, searched per bucket on the bucket's own input
    sets (the generic plan computes in the model's precision: its heavy steps are ATen or oneDNN
    float32 calls); verification then compares the buckets by the budget. Returns a
    :class:`~ascendc_pack.pipeline.BuildResult` whose ``choices`` / ``tactics`` / ``fallbacks``
    merge every plan's.
    """
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.graph.render import start_graph_runtime
    from ascendc_pack.package.dynamic_bundle import build_dynamic_bundle
    from ascendc_pack.progress import Progress
    from ascendc_pack.tune.python_mode import inline_kernels

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores, march=march,
                                 backend=backend, flush_denormals=flush_denormals, precision=precision,
                                 accuracy_budget=accuracy_budget)
    input_sets = [tuple(t.contiguous() for t in inputs) for inputs in input_sets]  # every plan takes them dense
    if not isinstance(decl, DynamicShapes):
        names = forward_input_names(model, len(input_sets[0]))
        decl = parse_declaration(decl, input_sets[0], names, "dynamic_shapes")
        for k, inputs in enumerate(input_sets[1:]):
            decl.check_static_dims(input_sets[0], inputs, f"input set {k + 1}")
    if config.backend != "cpu":
        raise PackError(f"dynamic shapes are built for the cpu backend only (--backend {config.backend} was "
                        "given): build the npu bundle with static shapes, one per shape")
    name = name or type(model).__name__
    progress = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    out = Path(output) if output is not None else Path(f"{name}.ascpack")
    if out.is_dir():
        raise PackError(f"output {out} is a directory; pass a file path such as {out / (name + '.ascpack')}")
    interpreter = start_graph_runtime(config)
    buckets = group_buckets(decl, input_sets)
    # the generic plan's capture first: a model that cannot be captured with its dims dynamic fails
    # before any bucket is tuned
    example = generic_example(decl, input_sets)
    with progress.stage("capture_generic", label="capture (dynamic shapes)"):
        symbolic = capture_symbolic(model, example, decl, name=name, output_names=output_names)
    plans, counts, reports = [], _Counts(), {}
    for key, sets in buckets.items():
        sizes = dict(zip((d.name for d in decl.dims), key))
        log.info("bucket %s: %d input set(s)", sizes, len(sets))
        prep, pm = prepare_and_tune(model, sets[0], sets, config=config, name=name, progress=progress,
                                    output_names=output_names, protocol=protocol, tactics=tactics,
                                    before_tuning=interpreter.result)
        fallbacks = pm.fallbacks()
        plans.append(_bucket_plan(sizes, inline_kernels(prep.fused, fallbacks), prep, pm.choices()))
        counts.add(prep, pm, fallbacks)
        if prep.precision is not None:
            reports[plans[-1].label()] = prep.precision
    interpreter.result()
    generic = build_generic(symbolic, config, progress=progress,
                            tuned={n: c for p in plans for n, c in p.choices.items()},
                            gemm_hint=decl.sizes_of(example) if generic_gemm == "onednn" and tactics else None)
    plans.append(generic)
    report = merged(reports) if reports else None
    with progress.stage("bundle", label="graph compile + bundle"):
        staged = out.with_name(f".{out.name}.{os.getpid()}.unverified") if verify else out
        build_dynamic_bundle(plans, decl, staged, config, precision=report)
    checks = []
    if verify:
        budget = report.verify_budget if report is not None else None
        with progress.stage("verify", label="verify bundle vs eager"):
            checks = _verify(model, input_sets, staged, out, plans[-1].model.output_names, atol, rtol, budget)
    return BuildResult(output=out, choices=counts.choices, seconds=dict(progress.seconds),
                       kernels_compiled=counts.compiled, kernels_profiled=counts.profiled,
                       cache_hits=counts.hits, compile_failures=counts.failures,
                       candidates_disqualified=counts.disqualified, fallbacks=counts.fallbacks, verification=checks,
                       tactics=counts.tactics, tactics_profiled=counts.tactics_profiled,
                       tactics_disqualified=counts.tactics_disqualified, precision=report)


class _Counts:
    """Every plan's choices and counts, merged for the BuildResult."""

    def __init__(self):
        self.choices, self.fallbacks, self.tactics = {}, {}, {}
        self.compiled = self.profiled = self.hits = self.failures = self.disqualified = 0
        self.tactics_profiled = self.tactics_disqualified = 0

    def add(self, prep, pm, fallbacks) -> None:
        self.choices.update(pm.choices())
        self.fallbacks.update(fallbacks)
        self.tactics.update(prep.tactics)
        c = pm.compile_counts
        self.compiled += c.compiler_calls
        self.hits += c.cache_hits
        self.failures += c.failures
        self.profiled += pm.kernels_profiled
        self.disqualified += pm.candidates_disqualified
        self.tactics_profiled += prep.tactics_profiled
        self.tactics_disqualified += prep.tactics_disqualified


def _bucket_plan(sizes: dict, fused, prep, choices: dict):
    from ascendc_pack.package.dynamic_bundle import PlanBuild

    return PlanBuild("bucket", sizes, fused, prep.captured.weights, choices, dict(prep.tactics))


def generic_example(decl: DynamicShapes, input_sets) -> tuple:
    """The input set the generic plan is captured from: the first with every dynamic dim at
    least 2 (torch.export makes a dim of size 1 a constant, so it could not stay dynamic)."""
    for inputs in input_sets:
        sizes = decl.sizes_of(inputs)
        if all(n >= 2 for n in sizes.values()):
            return tuple(inputs)
    raise PackError("every input set has a dynamic dim of size 1 ("
                    + "; ".join(str(decl.sizes_of(i)) for i in input_sets[:4]) + "), and torch.export makes a dim "
                    "captured at size 1 a constant; add an input set with every dynamic dim >= 2 (e.g. to "
                    "get_calibration_inputs(), or a bucket >= 2 with --buckets): the generic plan is captured from it")


def build_generic(captured, config, *, progress=None, tuned: dict | None = None, gemm_hint: dict | None = None):
    """The generic plan (the module docstring) of a symbolic capture
    (:func:`~ascendc_pack.frontend.capture_dynamic.capture_symbolic`): a :class:`PlanBuild` of kind
    ``generic``. ``tuned``: kernel choices of the buckets by kernel name (a static kernel of the
    generic program that a bucket tuned keeps that choice). ``gemm_hint``: the dims' sizes the
    GEMMs' weights are reordered for (:mod:`ascendc_pack.tactics.dynamic_linear`); None: the
    GEMMs stay ATen calls."""
    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.frontend.capture import Captured
    from ascendc_pack.ir.program import Program
    from ascendc_pack.kernels.fused.build import prepare_kernels
    from ascendc_pack.kernels.fused.jit import compile_jit, is_jit, jit_choice, spec_dims
    from ascendc_pack.package.bundle import choices_from_candidate0
    from ascendc_pack.package.dynamic_bundle import PlanBuild
    from ascendc_pack.passes.copy_elision import elide_copies
    from ascendc_pack.passes.fold import fold_constants
    from ascendc_pack.passes.fuse import fuse
    from ascendc_pack.progress import Progress
    from ascendc_pack.tactics.dynamic_linear import onednn_linears
    from ascendc_pack.tune.python_mode import inline_kernels

    progress = progress or Progress(enabled=False)
    backend = get_backend(config.backend)
    with progress.stage("fuse_generic", label="fuse (generic plan)"):
        folded = fold_constants(captured.model, captured.weights)
        captured = Captured(elide_copies(folded.model), folded.weights)
        if gemm_hint is not None and backend.name == "cpu":
            model, n = onednn_linears(captured.model, _rows_hint(captured.model, gemm_hint))
            log.info("generic plan: %d GEMM(s) by a weight run oneDNN linear on a weight reordered at load", n)
            captured = Captured(model, captured.weights)
        fused = fuse(captured.model)
    steps = {s.name: s for s in fused.program.fused_steps()}
    jit = [s.kernel for s in steps.values() if is_jit(s.kernel)]
    static = [s for n, s in steps.items() if not is_jit(s.kernel)]
    with progress.stage("compile_generic", label="compile (jit kernels)"):
        compiled = compile_jit(jit, config, backend)
        p = fused.program
        prepared = prepare_kernels(Program(p.inputs, static, p.outputs, p.values), config) if static else {}
    choices = {n: c for n, c in (tuned or {}).items() if n in steps and not is_jit(steps[n].kernel)}
    choices.update({n: c for n, c in choices_from_candidate0(fused, {k: v for k, v in prepared.items()
                                                                     if k not in choices}).items()})
    failed = {}
    for n, ck in compiled.items():
        c = ck.candidates[0]
        if c.ok:
            choices[n] = jit_choice(steps[n].kernel, c)
        else:
            failed[n] = c.error
            log.warning("jit kernel %s failed to compile; its steps stay ATen in the generic plan: %s", n,
                        (c.error or "")[-400:])
    fused = inline_kernels(fused, failed)
    choices = {n: c for n, c in choices.items() if n not in failed}
    jit_dims = {s.name: tuple(spec_dims(s.kernel)) for s in fused.program.fused_steps() if is_jit(s.kernel)}
    return PlanBuild("generic", None, fused, captured.weights, choices, {}, jit_dims)


def _rows_hint(model, sizes: dict) -> int:
    """The row count of the program's first GEMM at ``sizes`` (what its weights are reordered for)."""
    from ascendc_pack.ir.program import AtenStep
    from ascendc_pack.ir.symbolic import evaluate, is_symbolic

    for s in model.program.steps:
        if isinstance(s, AtenStep) and s.op in ("aten.addmm.default", "aten.mm.default"):
            rows = model.program.values[s.outputs[0]].shape[0]
            if is_symbolic(rows):
                return evaluate(rows, sizes)
    return 1


def _verify(module, input_sets, staged: Path, out: Path, names, atol, rtol, budget=None) -> list:
    """The staged bundle against eager on every input set, through the plan the runtime picks
    (their buckets; by the precision ``budget`` when they run steps in low precision) and through
    the generic plan (float32: by ``atol`` / ``rtol``; :func:`ascendc_pack.pipeline._verify_bundle`)."""

    def generic(model) -> list:
        checks = check_against_eager(module, input_sets, lambda *xs: model.run_plan("generic", *xs), names=names,
                                     atol=atol, rtol=rtol)
        return [dataclasses.replace(c, label=f"{c.label} (generic plan)") for c in checks]

    return _verify_bundle(module, input_sets, staged, out, names, atol, rtol, also=generic, budget=budget)


def cli_input_sets(example_inputs, input_names, lo: int, hi: int, buckets: list[int]):
    """The CLI form (``--dynamic-batch LO:HI --buckets ...``): the declaration (dim 0 of every
    input is ``batch``) and one input set per bucket size, made from the example inputs by
    repeating their rows along dim 0."""
    decl = batch_declaration(example_inputs, input_names, lo, hi)
    return decl, [resize_batch(example_inputs, b) for b in buckets]


def build_file(model_file, *, dynamic_batch: str | None = None, buckets: str | None = None, **kwargs) -> BuildResult:
    """Build a model file: with dynamic dims (its ``get_dynamic_shapes()``, or the CLI's
    ``dynamic_batch`` ``"LO:HI"`` with ``buckets`` ``"B1,B2,..."``) a dynamic bundle, else
    :func:`ascendc_pack.pipeline.build_file`'s static one."""
    from ascendc_pack.frontend.dynamic import parse_buckets, parse_range
    from ascendc_pack.frontend.loader import load_model_file
    from ascendc_pack.pipeline import build_file as build_static
    from ascendc_pack.progress import Progress

    if buckets is not None and dynamic_batch is None:
        raise PackError("--buckets needs --dynamic-batch MIN:MAX (the range the bucket sizes lie in)")
    progress = kwargs.pop("progress", False)
    progress = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    with progress.stage("load", label="load model file"):
        loaded = load_model_file(model_file)
    kwargs["progress"] = progress
    if dynamic_batch is None and loaded.dynamic is None:
        return build_static(loaded, **kwargs)
    if dynamic_batch is not None:
        if loaded.dynamic is not None:
            raise PackError(f"{model_file} declares its dynamic dims (get_dynamic_shapes()); drop --dynamic-batch, "
                            "or drop get_dynamic_shapes() to use the CLI form")
        lo, hi = parse_range(dynamic_batch)
        sizes = parse_buckets(buckets, lo, hi) if buckets else [loaded.example_inputs[0].shape[0]]
        names = forward_input_names(loaded.module, len(loaded.example_inputs))
        decl, sets = cli_input_sets(loaded.example_inputs, names, lo, hi, sizes)
    else:
        decl, sets = loaded.dynamic, loaded.all_input_sets
    kwargs.setdefault("output", Path(f"{loaded.name}.ascpack"))
    kwargs.setdefault("output_names", loaded.output_names)
    return build_dynamic(loaded.module, sets, decl, name=loaded.name, **kwargs)


__all__ = ["build_dynamic", "build_generic", "generic_example", "build_file", "cli_input_sets"]
