"""The whole pipeline in order, one call per stage (DESIGN 2).

load model.py -> capture -> fuse -> tile/render/compile -> tune (PGO) -> render graph + bundle.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .capture import Captured, capture
from .check import check_against_eager, compare_outputs  # noqa: F401 (compare_outputs re-exported)
from .errors import PackError
from .executor import run_model
from .loader import LoadedModel, load_model_file


def capture_file(model_file: str | Path) -> tuple[LoadedModel, Captured]:
    """Load a model.py and capture it (stage 1 of the pipeline)."""
    loaded = load_model_file(model_file)
    captured = capture(loaded.module, _clone(loaded.example_inputs), name=loaded.name,
                       output_names=loaded.output_names)
    return loaded, captured


def check_reference(loaded: LoadedModel, captured: Captured, atol: float | None = None,
                    rtol: float | None = None) -> list[str]:
    """Run the reference executor on every input set and compare with eager (the accuracy rule
    of ``ascendc_pack_runtime.accuracy``).

    Returns one report line per input set; raises PackError on the first mismatch.
    """
    mp = captured.model
    checks = check_against_eager(loaded.module, loaded.all_input_sets,
                                 lambda *xs: run_model(mp, captured.weights, xs),
                                 names=mp.output_names, atol=atol, rtol=rtol)
    lines = []
    for c in checks:
        if not c.ok:
            raise PackError(f"reference executor does not match eager on {c.label}: {c.problem}. "
                            "If the difference is acceptable, pass --atol/--rtol (or --no-check).")
        worst = max(c.outputs, key=lambda o: o.max_error / o.allowed if o.allowed else 0, default=None)
        tail = f" (worst {worst.describe()})" if worst is not None and worst.max_error else ""
        lines.append(f"reference executor matches eager on {c.label}{tail}")
    return lines


def _clone(inputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in inputs)


# --- the whole pipeline -------------------------------------------------------------------------

@dataclass
class BuildResult:
    """What :func:`build` produced: the bundle path, the choices and the timings of each stage."""

    output: Path | None
    choices: dict
    seconds: dict[str, float]
    kernels_compiled: int
    kernels_profiled: int

    def summary(self) -> str:
        from .tune import summary_table

        return summary_table(self.choices)


def _progress_bar(enabled: bool, length: int, label: str):
    import contextlib

    import click

    if not enabled or length == 0:
        return contextlib.nullcontext(None)
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


def prepare(module: torch.nn.Module, example_inputs, *, name: str = "model", config=None, progress: bool = False):
    """capture -> fuse -> tile/render/compile. Returns (captured, fused model, kernels, seconds)."""
    from .fuse import fuse
    from .kernels import prepare_kernels, total_candidates

    seconds = {}
    t0 = time.perf_counter()
    captured = capture(module, _clone(example_inputs), name=name)
    seconds["capture"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fused = fuse(captured.model)
    seconds["fuse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with _progress_bar(progress, total_candidates(fused.program, config), "compiling kernels") as bar:
        kernels = prepare_kernels(fused.program, config, bar.update if bar is not None else None)
    seconds["compile"] = time.perf_counter() - t0
    return captured, fused, kernels, seconds


def compile(model: torch.nn.Module, example_inputs, *, topn: int = 1, cores: int | None = None,
            cache_dir=None, calibration_inputs=None, jobs: int | None = None, debug: bool | None = None):
    """Compile ``model`` into a Python-mode callable (no bundle, no graph .so), like torch.compile.

    Fused kernels with several candidates tune themselves on their first call on that call's
    real arguments; ``calibration_inputs`` (a list of input tuples) are run right away.

    Returns:
        A :class:`ascendc_pack.tune.PythonModeModule`; call it like the model.
    """
    from .config import BuildConfig
    from .tune import PythonModeModule

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores)
    captured, fused, kernels, _ = prepare(model, example_inputs, name=type(model).__name__, config=config)
    pm = PythonModeModule(fused, captured.weights, kernels)
    for inputs in calibration_inputs or []:
        pm(*_clone(inputs))
    return pm


def build(model: torch.nn.Module, example_inputs, *, topn: int = 1, output=None, calibration_inputs=None,
          cores: int | None = None, cache_dir=None, jobs: int | None = None, debug: bool | None = None,
          march: str | None = None, name: str | None = None, progress: bool = False) -> BuildResult:
    """Build a tuned ``.ascpack`` bundle of ``model`` (the whole pipeline, DESIGN 2).

    PGO runs the Python-mode module on the example inputs and on every calibration input set;
    kernels no run reached keep candidate 0 and are reported unvisited.

    Returns:
        A :class:`BuildResult`; ``output`` is the bundle path.
    """
    from . import autotune
    from . import compiler as compile_stage
    from .bundle import build_bundle
    from .config import BuildConfig
    from .tune import PythonModeModule

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores, march=march)
    name = name or type(model).__name__
    calls0, prof0 = compile_stage.STATS.compiler_calls, autotune.STATS.kernels_profiled
    captured, fused, kernels, seconds = prepare(model, example_inputs, name=name, config=config, progress=progress)
    input_sets = [tuple(example_inputs), *[tuple(c) for c in calibration_inputs or []]]
    t0 = time.perf_counter()
    n_tune = sum(1 for k in kernels.values() if len(k.compiled.candidates) > 1)
    with _progress_bar(progress and n_tune > 0, n_tune, "tuning kernels ") as bar:
        pm = PythonModeModule(fused, captured.weights, kernels,
                              log_progress=(lambda _: bar.update(1)) if bar is not None else None)
        for inputs in input_sets:
            pm(*_clone(inputs))
    seconds["tune"] = time.perf_counter() - t0
    choices = pm.choices()
    t0 = time.perf_counter()
    out = Path(output) if output is not None else Path(f"{name}.ascpack")
    report = build_bundle(fused, captured.weights, choices, out, config)
    seconds["bundle"] = time.perf_counter() - t0
    seconds["graph_compile"] = report.graph.compile_seconds
    return BuildResult(output=out, choices=choices, seconds=seconds,
                       kernels_compiled=compile_stage.STATS.compiler_calls - calls0,
                       kernels_profiled=autotune.STATS.kernels_profiled - prof0)


def build_file(model_file, **kwargs) -> BuildResult:
    """:func:`build` for a model.py file (its calibration inputs included)."""
    loaded = load_model_file(model_file)
    kwargs.setdefault("output", Path(f"{loaded.name}.ascpack"))
    return build(loaded.module, loaded.example_inputs, calibration_inputs=loaded.calibration_inputs,
                 name=loaded.name, **kwargs)
