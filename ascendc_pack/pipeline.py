"""The whole pipeline in order, one call per stage (DESIGN 2).

load model.py -> capture -> fuse -> tile/render/compile -> tune (PGO) -> render graph + bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .capture import Captured, capture
from .errors import PackError
from .executor import run_model
from .loader import LoadedModel, load_model_file


def capture_file(model_file: str | Path) -> tuple[LoadedModel, Captured]:
    """Load a model.py and capture it (stage 1 of the pipeline)."""
    loaded = load_model_file(model_file)
    captured = capture(loaded.module, _clone(loaded.example_inputs), name=loaded.name)
    return loaded, captured


def compare_outputs(expected, actual, atol: float = 1e-5, rtol: float = 1e-5) -> str | None:
    """None if two output structures match, else a description of the first difference."""
    exp_flat, exp_spec = pytree.tree_flatten(expected)
    act_flat, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return f"output structure differs: expected {exp_spec}, got {act_spec}"
    for i, (e, a) in enumerate(zip(exp_flat, act_flat)):
        if not isinstance(e, torch.Tensor):
            if e != a:
                return f"output {i}: expected {e!r}, got {a!r}"
            continue
        if e.shape != a.shape or e.dtype != a.dtype:
            return f"output {i}: expected {e.dtype}{list(e.shape)}, got {a.dtype}{list(a.shape)}"
        if not torch.allclose(e, a, atol=atol, rtol=rtol, equal_nan=True):
            diff = (e.double() - a.double()).abs().nan_to_num(0).max().item()
            return f"output {i}: values differ (max abs diff {diff:.3g})"
    return None


def check_reference(loaded: LoadedModel, captured: Captured) -> list[str]:
    """Run the reference executor on every input set and compare with eager.

    Returns one report line per input set; raises PackError on the first mismatch.
    """
    lines = []
    for k, inputs in enumerate(loaded.all_input_sets):
        label = "example inputs" if k == 0 else f"calibration set {k - 1}"
        eager_in, ref_in = _clone(inputs), _clone(inputs)
        with torch.no_grad():
            expected = loaded.module(*eager_in)
        actual = run_model(captured.model, captured.weights, ref_in)
        problem = compare_outputs(expected, actual)
        for i, (e, r) in enumerate(zip(eager_in, ref_in)):
            if problem is None and not torch.equal(e, r):
                problem = f"input {i} after the call differs from eager's in-place result"
        if problem:
            raise PackError(f"reference executor does not match eager on {label}: {problem}")
        lines.append(f"reference executor matches eager on {label}")
    return lines


def _clone(inputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in inputs)


# --- the whole pipeline -------------------------------------------------------------------------

@dataclass
class BuildResult:
    """What :func:`build` produced.

    ``output`` is the bundle path, ``choices`` the tuned winner of every fused kernel,
    ``fallbacks`` the kernels bundled as their ATen steps because no candidate passed, and
    ``seconds`` the time of each stage (capture, fuse, compile, tune, graph_compile, bundle).
    The counts are this build's own: ``kernels_compiled`` candidates run through the compiler,
    ``cache_hits`` candidates reused from the cache, ``compile_failures`` candidates that failed
    to compile, ``kernels_profiled`` kernels whose candidates were verified and timed,
    ``candidates_disqualified`` candidates verification rejected.
    """

    output: Path | None
    choices: dict
    seconds: dict[str, float]
    kernels_compiled: int
    kernels_profiled: int
    cache_hits: int = 0
    compile_failures: int = 0
    candidates_disqualified: int = 0
    fallbacks: dict = field(default_factory=dict)

    def summary(self) -> str:
        from .tune import summary_table

        return summary_table(self.choices, self.fallbacks)


def prepare(module: torch.nn.Module, example_inputs, *, name: str = "model", config=None, progress=None):
    """capture -> fuse -> tile/render/compile. Returns (captured, fused model, kernels, seconds).

    ``progress``: a :class:`~ascendc_pack.progress.Progress` reporting the stages (default: silent).
    """
    from .fuse import fuse
    from .kernels import prepare_kernels, total_candidates
    from .progress import Progress

    progress = progress or Progress(enabled=False)
    with progress.stage("capture"):
        captured = capture(module, _clone(example_inputs), name=name)
    with progress.stage("fuse"):
        fused = fuse(captured.model)
    with progress.stage("compile", total=total_candidates(fused.program, config)) as st:
        kernels = prepare_kernels(fused.program, config, st.advance)
    return captured, fused, kernels, dict(progress.seconds)


def compile(model: torch.nn.Module, example_inputs, *, topn: int = 1, cores: int | None = None,
            cache_dir=None, calibration_inputs=None, jobs: int | None = None, debug: bool | None = None,
            backend: str | None = None, protocol=None):
    """Compile ``model`` into a Python-mode callable (no bundle, no graph .so), like torch.compile.

    Fused kernels with several candidates verify and tune themselves on their first call on that
    call's real arguments; ``calibration_inputs`` (a list of input tuples) are run right away.
    ``protocol``: the PGO :class:`~ascendc_pack.autotune.Protocol` (default timings).

    Returns:
        A :class:`ascendc_pack.tune.PythonModeModule`; call it like the model.
    """
    from .autotune import Protocol
    from .backend import get_backend
    from .config import BuildConfig
    from .tune import PythonModeModule

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores,
                                 backend=backend)
    captured, fused, kernels, _ = prepare(model, example_inputs, name=type(model).__name__, config=config)
    pm = PythonModeModule(fused, captured.weights, kernels, protocol or Protocol(),
                          backend=get_backend(config.backend))
    for inputs in calibration_inputs or []:
        pm(*_clone(inputs))
    return pm


def build(model: torch.nn.Module, example_inputs, *, topn: int = 1, output=None, calibration_inputs=None,
          cores: int | None = None, cache_dir=None, jobs: int | None = None, debug: bool | None = None,
          march: str | None = None, name: str | None = None, progress=False, backend: str | None = None,
          protocol=None) -> BuildResult:
    """Build a tuned ``.ascpack`` bundle of ``model`` (the whole pipeline, DESIGN 2).

    PGO runs the Python-mode module on the example inputs and on every calibration input set;
    kernels no run reached keep candidate 0 and are reported unvisited. Each candidate is
    verified against the reference before it is timed; a kernel whose candidates all fail is
    bundled as its ATen steps (with a warning). ``progress``: True reports every stage on
    stderr (bars on a terminal, plain lines otherwise), or pass a
    :class:`~ascendc_pack.progress.Progress`. ``protocol``: the PGO
    :class:`~ascendc_pack.autotune.Protocol`.

    Returns:
        A :class:`BuildResult`; ``output`` is the bundle path.
    """
    from .autotune import Protocol
    from .backend import get_backend
    from .bundle import build_bundle
    from .config import BuildConfig
    from .progress import Progress
    from .tune import PythonModeModule, inline_kernels

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores, march=march,
                                 backend=backend)
    name = name or type(model).__name__
    progress = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    captured, fused, kernels, _ = prepare(model, example_inputs, name=name, config=config, progress=progress)
    input_sets = [tuple(example_inputs), *[tuple(c) for c in calibration_inputs or []]]
    pm = PythonModeModule(fused, captured.weights, kernels, protocol or Protocol(),
                          backend=get_backend(config.backend))
    with pm, progress.stage("tune", total=pm.pending()) as st:
        pm.log_progress = lambda _: st.advance()
        for inputs in input_sets:
            pm(*_clone(inputs))
    choices, fallbacks = pm.choices(), pm.fallbacks()
    out = Path(output) if output is not None else Path(f"{name}.ascpack")
    # the graph engineer's render stage will report graph compile progress itself; until then the
    # whole bundle stage shows its elapsed time and the graph compile's share is split off after
    with progress.stage("bundle", label="graph compile + bundle"):
        report = build_bundle(inline_kernels(fused, fallbacks), captured.weights, choices, out, config)
    seconds = {k: v for k, v in progress.seconds.items() if k != "bundle"}
    seconds["graph_compile"] = report.graph.compile_seconds
    seconds["bundle"] = max(0.0, progress.seconds["bundle"] - report.graph.compile_seconds)
    counts = pm.compile_counts
    return BuildResult(output=out, choices=choices, seconds=seconds, kernels_compiled=counts.compiler_calls,
                       kernels_profiled=pm.kernels_profiled, cache_hits=counts.cache_hits,
                       compile_failures=counts.failures, candidates_disqualified=pm.candidates_disqualified,
                       fallbacks=fallbacks)


def build_file(model_file, **kwargs) -> BuildResult:
    """:func:`build` for a model.py file (its calibration inputs included)."""
    loaded = load_model_file(model_file)
    kwargs.setdefault("output", Path(f"{loaded.name}.ascpack"))
    return build(loaded.module, loaded.example_inputs, calibration_inputs=loaded.calibration_inputs,
                 name=loaded.name, **kwargs)
