"""The whole pipeline in order, one call per stage (docs/DESIGN.md §2).

load model.py -> capture -> fold constants -> tactic pass -> tune tactics (PGO of the heavy
steps) -> lower the chosen tactics -> fuse -> tile/render/compile -> tune kernels (PGO) ->
render graph + bundle.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ascendc_pack.frontend.capture import Captured, capture, random_ops
from ascendc_pack.frontend.capture_cache import capture_cached
from ascendc_pack.frontend.check import check_against_eager, compare_outputs  # noqa: F401 (compare_outputs re-exported)
from ascendc_pack.errors import ConfigError, PackError, VerificationError
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.frontend.loader import LoadedModel, load_model_file

log = logging.getLogger("ascendc_pack")


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
    shapes = lambda inputs: [tuple(t.shape) for t in inputs]  # noqa: E731
    # a model with dynamic dims is captured at its example's shape: the other buckets are checked
    # by the build (each captured at its own shape, and the generic plan at every input set)
    sets = [s for s in loaded.all_input_sets if shapes(s) == shapes(loaded.example_inputs)]
    checks = check_against_eager(loaded.module, sets, lambda *xs: run_model(mp, captured.weights, xs),
                                 names=mp.output_names, atol=atol, rtol=rtol)
    lines = []
    if len(sets) < len(loaded.all_input_sets):
        lines.append(f"{len(loaded.all_input_sets) - len(sets)} input set(s) of other shapes (dynamic dims) not "
                     "checked here: `ascendc-pack build` checks every bucket and the generic plan")
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
class Prepared:
    """What :func:`prepare` produced: the model after constant folding and the tactic choices
    (``captured``: its program and weights), the fused model, the compiled kernel candidates,
    the tactic outcomes by step name (:class:`~ascendc_pack.tactics.tune.TacticChoice`; empty
    without input sets or with ``topn`` 1) and the seconds of each stage."""

    captured: Captured
    fused: object
    kernels: dict
    tactics: dict
    seconds: dict
    tactics_profiled: int = 0
    tactics_disqualified: int = 0
    precision: object = None   # the PrecisionReport of --precision (None: the model's own precision)

    def __iter__(self):  # (captured, fused, kernels, seconds), as before tactics
        return iter((self.captured, self.fused, self.kernels, self.seconds))


@dataclass
class BuildResult:
    """What :func:`build` produced.

    ``output`` is the bundle path, ``choices`` the tuned winner of every fused kernel,
    ``fallbacks`` the kernels bundled as their ATen steps because no candidate passed, and
    ``seconds`` the time of each stage (capture, fuse, compile, tune, graph_compile, bundle).
    The counts are this build's own: ``kernels_compiled`` candidates run through the compiler,
    ``cache_hits`` candidates reused from the cache, ``compile_failures`` candidates that failed
    to compile, ``kernels_profiled`` kernels whose candidates were verified and timed,
    ``candidates_disqualified`` candidates verification rejected. ``tactics`` maps every tactic
    step name to its :class:`~ascendc_pack.tactics.tune.TacticChoice`; ``tactics_profiled`` counts
    the tactic steps verified and timed by this build (0 on a warm cache).
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
    verification: list = field(default_factory=list)   # InputSetCheck per input set; [] = not verified
    tactics: dict = field(default_factory=dict)
    tactics_profiled: int = 0
    tactics_disqualified: int = 0
    call_threads: object = None   # the manifest's CallThreads record (None: not timed: 1 core, or --topn 1 with few steps)
    precision: object = None      # the PrecisionReport of --precision (None: the model's own precision)
    denormals: object = None      # a DenormalReport when the model makes many denormals and the build does not flush

    def summary(self) -> str:
        from ascendc_pack.tactics.report import tactic_table
        from ascendc_pack.tune.python_mode import summary_table

        text = summary_table(self.choices, self.fallbacks)
        if self.tactics:
            text += "\n\n" + tactic_table(self.tactics)
        if self.call_threads is not None:
            text += "\n\ncall threads: " + self.call_threads.describe()
        if self.precision is not None:
            text += "\n\n" + self.precision.describe()
        if self.denormals is not None:
            text += "\n\n" + self.denormals.hint()
        if self.verification:
            text += "\n\n" + verification_table(self.verification)
        return text


def verification_table(checks: list) -> str:
    """Per output, the largest error of the bundle against eager over every input set."""
    worst: dict = {}
    for c in checks:
        for o in c.outputs:
            w = worst.get(o.name)
            if w is None or o.max_error * max(w.allowed, 1e-300) > w.max_error * max(o.allowed, 1e-300):
                worst[o.name] = o
    head = f"{'output':<40} {'max error':>10} {'allowed':>10}"
    lines = [f"bundle vs eager on {len(checks)} input set(s):", head, "-" * len(head)]
    for name, o in worst.items():
        lines.append(f"{name[:40]:<40} {o.max_error:>10.3g} {o.allowed:>10.3g}")
    return "\n".join(lines)


def prepare(module: torch.nn.Module, example_inputs, *, name: str = "model", config=None, progress=None,
            output_names: list[str] | None = None, input_sets=None, protocol=None,
            tactics: bool = True, before_tuning=None) -> Prepared:
    """capture -> fold -> tactics -> fuse -> tile/render/compile (see :class:`Prepared`).

    With ``tactics`` the heavy steps become tactic steps; with ``input_sets`` (input tuples) and
    ``config.topn`` > 1 their candidates are verified and timed on those inputs (PGO) and the
    choices applied before fusion; without, every heavy step stays ATen as captured.
    ``progress``: a :class:`~ascendc_pack.progress.Progress` reporting the stages (default: silent);
    ``before_tuning``: called before the tactics are timed (the build waits there for the graph
    interpreter compiling in the background).
    """
    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.passes.copy_elision import elide_copies
    from ascendc_pack.passes.fold import fold_constants
    from ascendc_pack.passes.fuse import fuse
    from ascendc_pack.passes.meta_layouts import meta_layout_cache
    from ascendc_pack.kernels.fused.build import prepare_kernels, total_candidates
    from ascendc_pack.progress import Progress
    from ascendc_pack.tune.python_mode import inline_kernels

    backend = get_backend(config.backend)  # a backend this host cannot use fails here, before capture
    progress = progress or Progress(enabled=False)
    with progress.stage("capture") as st:
        captured, hit = capture_cached(module, _clone(example_inputs), name=name, cache_dir=config.cache_dir,
                                       output_names=output_names)
        if hit:
            st.note("reused from the capture cache")
        folded = fold_constants(captured.model, captured.weights)
        captured = Captured(elide_copies(folded.model), folded.weights)
    choices, counts, precision = {}, (0, 0), None
    if tactics and backend.name == "cpu":  # tactics are CPU kernels; on npu heavy steps stay ATen (torch_npu)
        with meta_layout_cache(config.cache_dir):
            captured, choices, counts, precision = _tactics(captured, config, progress, input_sets or [], protocol,
                                                            before_tuning)
        # a lowered step may return the layout a clone after it makes (an attention kernel's output)
        captured = Captured(elide_copies(captured.model), captured.weights)
    with progress.stage("fuse"):
        fused = fuse(captured.model)
        # kernels the backend cannot generate run as their ATen steps (never a wrong kernel)
        unsupported = {s.name: why for s in fused.program.fused_steps() if (why := backend.unsupported(s.kernel))}
        for kernel, why in sorted(unsupported.items()):
            log.warning("kernel %s stays ATen on the %s backend: %s", kernel, backend.name, why)
        fused = inline_kernels(fused, unsupported)
    with progress.stage("compile", total=total_candidates(fused.program, config)) as st:
        kernels = prepare_kernels(fused.program, config, st.advance)
    return Prepared(captured, fused, kernels, choices, dict(progress.seconds), *counts, precision=precision)


def _tactics(captured: Captured, config, progress, input_sets, protocol, before_tuning=None):
    """Tactic pass, PGO of the tactic steps on ``input_sets``, lowering of the choices."""
    from ascendc_pack.autotune.protocol import Protocol
    from ascendc_pack.tactics.attention_sources import read_sources_in_place
    from ascendc_pack.tactics.lower import lower_tactics, propagate_layouts
    from ascendc_pack.tactics.pool_widen import widen_after_pools
    from ascendc_pack.tactics.rewrite import find_tactics
    from ascendc_pack.tactics.tune import TacticTuner

    found = find_tactics(captured.model, captured.weights)
    if not found.found:
        return captured, {}, (0, 0), _no_steps_precision(config)
    tuner = TacticTuner(found.model, found.weights, config, protocol or Protocol(),
                        calibration=input_sets)
    with progress.stage("compile", total=tuner.compile_total()) as st:  # GEMM tilings, epilogue kernels
        tuner.compile(st.advance)
    if before_tuning is not None:
        before_tuning()
    try:  # a warm cache times nothing, but the runs still say which steps the inputs reach
        with progress.stage("tactics", total=tuner.pending(), label="tune tactics") as st:
            done = tuner.pending()
            for inputs in () if _reach_without_running(tuner, found.model, input_sets) else input_sets:
                tuner(*_clone(inputs))
                st.advance(done - tuner.pending())
                done = tuner.pending()
    finally:
        tuner.close()
    decisions = tuner.decisions()
    precision = None
    if config.low_precision:  # which steps run in low precision: the whole model's error under the budget
        from ascendc_pack.tactics import precision as lowp

        with progress.stage("precision", label="precision under the accuracy budget"):
            precision = lowp.choose(tuner, decisions, input_sets, config.precision, config.accuracy_budget)
        tuner.record_uses(decisions)
    lowered = lower_tactics(found.model, found.weights, decisions, tuner.choices)
    model = propagate_layouts(lowered.model) if lowered.lowered else lowered.model
    if lowered.lowered:  # a bfloat16 convolution's widening moves after the max pooling reading it
        model = read_sources_in_place(widen_after_pools(model, tuner.choices, config))
    return Captured(model, lowered.weights), tuner.choices, (tuner.profiled, tuner.disqualified), precision


def _no_steps_precision(config):
    """The precision report of a model without heavy steps (None without ``--precision``)."""
    if not config.low_precision:
        return None
    from ascendc_pack.tactics.precision import PrecisionReport
    from ascendc_pack.tactics.tune import offered_precisions

    offered, why = offered_precisions(config)
    return PrecisionReport(config.precision, config.accuracy_budget, offered, why,
                           note="the model has no heavy step (GEMM, convolution, attention) to run in low precision")


def _reach_without_running(tuner, model, input_sets) -> bool:
    """On a warm cache of a program without ``torch.cond`` every run only marks every step
    reached: do that without running (``tuner``: a TacticTuner or PythonModeModule). True if so."""
    if not input_sets or tuner.pending() or model.program.has_branches():
        return False
    tuner.reach_all()
    return True


def compile(model: torch.nn.Module, example_inputs, *, topn: int = 1, cores: int | None = None,
            cache_dir=None, calibration_inputs=None, jobs: int | None = None, debug: bool | None = None,
            backend: str | None = None, protocol=None):
    """Compile ``model`` into a Python-mode callable (no bundle, no graph .so), like torch.compile.

    Fused kernels with several candidates verify and tune themselves on their first call on that
    call's real arguments; ``calibration_inputs`` (a list of input tuples) are run right away.
    ``protocol``: the PGO :class:`~ascendc_pack.autotune.protocol.Protocol` (default timings).

    Returns:
        A :class:`ascendc_pack.tune.python_mode.PythonModeModule`; call it like the model.
    """
    from ascendc_pack.autotune.protocol import Protocol
    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.autotune.timing_pool import timing_pool
    from ascendc_pack.tune.python_mode import PythonModeModule

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores,
                                 backend=backend)
    captured, fused, kernels, _ = prepare(model, example_inputs, name=type(model).__name__, config=config,
                                          input_sets=[tuple(example_inputs)], protocol=protocol)
    pm = PythonModeModule(fused, captured.weights, kernels, protocol or Protocol(),
                          backend=get_backend(config.backend), pool=timing_pool(config))
    for inputs in calibration_inputs or []:
        pm(*_clone(inputs))
    return pm


def build(model: torch.nn.Module, example_inputs, *, topn: int = 1, output=None, calibration_inputs=None,
          cores: int | None = None, cache_dir=None, jobs: int | None = None, debug: bool | None = None,
          march: str | None = None, name: str | None = None, progress=False, backend: str | None = None,
          protocol=None, verify: bool = True, atol: float | None = None, rtol: float | None = None,
          output_names: list[str] | None = None, tactics: bool = True, precision: str | None = None,
          accuracy_budget: float | None = None, flush_denormals: bool = False) -> BuildResult:
    """Build a tuned ``.ascpack`` bundle of ``model`` (the whole pipeline, docs/DESIGN.md §2).

    PGO runs the Python-mode module on the example inputs and on every calibration input set;
    kernels no run reached keep candidate 0 and are reported unvisited. Each candidate is
    verified against the reference before it is timed; a kernel whose candidates all fail is
    bundled as its ATen steps (with a warning). ``progress``: True reports every stage on
    stderr (bars on a terminal, plain lines otherwise), or pass a
    :class:`~ascendc_pack.progress.Progress`. ``protocol``: the PGO
    :class:`~ascendc_pack.autotune.protocol.Protocol`.

    With ``verify`` (the default) the new bundle is loaded with the runtime and compared with eager
    on the example and calibration inputs (``ascendc_pack_runtime.accuracy``; ``atol``/``rtol``
    override its tolerances) before it is moved to ``output``; a mismatch raises
    :class:`~ascendc_pack.errors.VerificationError` and writes nothing there.
    ``output_names``: one name per output tensor (default: dict keys, namedtuple fields,
    ``output_<i>``). ``tactics``: give the heavy steps (GEMM, convolution, attention) candidate
    implementations timed by PGO (docs/TACTICS.md); False keeps them ATen as captured.
    ``precision`` (``fp32`` / None: the model's own dtype; ``bf16``, ``int8``, ``auto``) offers
    low-precision candidates of the heavy steps (int8: activation scales calibrated on the example
    and calibration inputs), chosen per step under ``accuracy_budget`` (the largest relative
    output error on the example and calibration inputs, default 1e-2; docs/PRECISION.md); the
    bundle's verification then compares by that budget. ``flush_denormals``: every call of the
    bundle flushes denormal floats to zero (much faster where a model makes them, e.g. a masked
    softmax; docs/PRECISION.md "Denormals"); recorded in the manifest.

    Returns:
        A :class:`BuildResult`; ``output`` is the bundle path.
    """
    from ascendc_pack.package.bundle import build_bundle
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.progress import Progress
    from ascendc_pack.graph.render import start_graph_runtime
    from ascendc_pack.tune.python_mode import inline_kernels

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir, jobs=jobs, debug=debug, cores=cores, march=march,
                                 backend=backend, precision=precision, accuracy_budget=accuracy_budget,
                                 flush_denormals=flush_denormals)
    name = name or type(model).__name__
    progress = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    out = Path(output) if output is not None else Path(f"{name}.ascpack")
    if out.is_dir():
        raise PackError(f"output {out} is a directory; pass a file path such as {out / (name + '.ascpack')}")
    input_sets = [tuple(example_inputs), *[tuple(c) for c in calibration_inputs or []]]
    _check_static_sets(input_sets)
    if config.backend == "cpu":  # the host profile first: its OpenMP wake-up needs the other cores idle
        from ascendc_pack.backends.registry import get_backend

        get_backend(config.backend).target(config)
    interpreter = start_graph_runtime(config)  # model-independent: compiles while capture and kernels do

    def wait_for_interpreter():  # never compile while PGO times candidates (tactics, then kernels)
        if not interpreter.done():
            with progress.stage("graph_runtime", label="graph interpreter"):
                interpreter.result()
        interpreter.result()

    prep, pm = prepare_and_tune(model, example_inputs, input_sets, config=config, name=name, progress=progress,
                                output_names=output_names, protocol=protocol, tactics=tactics,
                                before_tuning=wait_for_interpreter)
    captured, fused = prep.captured, prep.fused
    choices, fallbacks = pm.choices(), pm.fallbacks()
    # the graph engineer's render stage will report graph compile progress itself; until then the
    # whole bundle stage shows its elapsed time and the graph compile's share is split off after
    with progress.stage("bundle", label="graph compile + bundle"):
        staged = out.with_name(f".{out.name}.{os.getpid()}.unverified") if verify else out
        bundle_args = (inline_kernels(fused, fallbacks), captured.weights, choices, staged, config)
        report = build_bundle(*bundle_args, tactics=prep.tactics, precision=prep.precision)
    call_threads = _tune_call_threads(staged, input_sets[0], config, report, progress, remove_on_error=verify,
                                      rewrite=lambda rec: build_bundle(*bundle_args, tactics=prep.tactics,
                                                                       call_threads=rec, precision=prep.precision))
    checks, denormals = [], None
    if verify:
        with progress.stage("verify", label="verify bundle vs eager"):
            budget = prep.precision.verify_budget if prep.precision is not None else None
            counter = _denormal_counter(config)
            checks = _verify_bundle(model, input_sets, staged, out, captured.model.output_names, atol, rtol,
                                    random_ops(captured.model.program), budget=budget, watch=counter)
            denormals = _denormals_hint(counter)
    seconds = {k: v for k, v in progress.seconds.items() if k not in ("bundle", "verify")}
    seconds["graph_compile"] = report.graph.compile_seconds
    seconds["bundle"] = max(0.0, progress.seconds["bundle"] - report.graph.compile_seconds)
    if verify:
        seconds["verify"] = progress.seconds["verify"]
    counts = pm.compile_counts
    return BuildResult(output=out, choices=choices, seconds=seconds, kernels_compiled=counts.compiler_calls,
                       kernels_profiled=pm.kernels_profiled, cache_hits=counts.cache_hits,
                       compile_failures=counts.failures, candidates_disqualified=pm.candidates_disqualified,
                       fallbacks=fallbacks, verification=checks, tactics=prep.tactics, call_threads=call_threads,
                       tactics_profiled=prep.tactics_profiled, tactics_disqualified=prep.tactics_disqualified,
                       precision=prep.precision, denormals=denormals)


def prepare_and_tune(model: torch.nn.Module, example_inputs, input_sets, *, config, name: str, progress,
                     output_names=None, protocol=None, tactics: bool = True, before_tuning=None):
    """:func:`prepare` then PGO of the fused kernels on ``input_sets`` (stage ``tune``):
    ``(Prepared, PythonModeModule)``; the module's ``choices()`` / ``fallbacks()`` are the outcome.
    ``before_tuning`` runs before anything is timed (and once more before the kernels are). With
    ``config.flush_denormals`` every candidate is verified and timed with denormals flushed, as
    the bundle will run."""
    from ascendc_pack.frontend.denormals import flushing

    with flushing(config.flush_denormals):
        return _prepare_and_tune(model, example_inputs, input_sets, config=config, name=name, progress=progress,
                                 output_names=output_names, protocol=protocol, tactics=tactics,
                                 before_tuning=before_tuning)


def _prepare_and_tune(model, example_inputs, input_sets, *, config, name, progress, output_names, protocol, tactics,
                      before_tuning):
    from ascendc_pack.autotune.protocol import Protocol
    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.autotune.timing_pool import timing_pool
    from ascendc_pack.tune.python_mode import PythonModeModule

    prep = prepare(model, example_inputs, name=name, config=config, progress=progress, output_names=output_names,
                   input_sets=input_sets, protocol=protocol, tactics=tactics, before_tuning=before_tuning)
    if before_tuning is not None:
        before_tuning()
    pm = PythonModeModule(prep.fused, prep.captured.weights, prep.kernels, protocol or Protocol(),
                          backend=get_backend(config.backend), pool=timing_pool(config))
    with pm, progress.stage("tune", total=pm.pending()) as st:
        pm.log_progress = lambda _: st.advance()
        for inputs in () if _reach_without_running(pm, prep.fused, input_sets) else input_sets:
            pm(*_clone(inputs))
    return prep, pm


def _denormal_counter(config):
    """A :class:`~ascendc_pack.frontend.denormals.DenormalCounter` for the verification's eager
    call, in a cpu build that does not flush denormals; else None."""
    from ascendc_pack.frontend.denormals import DenormalCounter

    return None if config.flush_denormals or config.backend != "cpu" else DenormalCounter()


def _denormals_hint(counter):
    """The counter's report when the model makes enough denormals to name ``--flush-denormals``."""
    report = counter.report() if counter is not None else None
    if report is None or not report.worth_flushing:
        return None
    log.info("%s", report.hint())
    return report


def _tune_call_threads(staged: Path, inputs: tuple, config, report, progress, remove_on_error: bool, rewrite):
    """The ``call_threads`` record of a CPU build on 2+ cores, tuned or with many steps
    (:func:`~ascendc_pack.tune.call_threads.worth_timing`), with the bundle rewritten by
    ``rewrite(record)``; else None. A bundle that does not load is a VerificationError (and,
    staged, is deleted)."""
    from ascendc_pack_runtime.errors import BundleError

    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.tune.call_threads import tune_call_threads, worth_timing

    steps = report.graph_source.stats.get("steps", {})
    if get_backend(config.backend).name != "cpu" or not worth_timing(config.topn, config.effective_cores, steps):
        return None
    with progress.stage("threads", label="tune call threads"):  # the finished bundle, timed per cap
        try:
            record = tune_call_threads(staged, inputs, config.effective_cores, config.cache_dir,
                                       report.graph_source.source)
            rewrite(record)
            return record
        except BaseException as exc:
            if remove_on_error:
                staged.unlink(missing_ok=True)
            if isinstance(exc, BundleError):
                raise VerificationError(f"the new bundle does not load: {exc}") from None
            raise


def _verify_bundle(module, input_sets, staged: Path, out: Path, names, atol, rtol, random: list[str] = (),
                   also=None, budget=None, watch=None) -> list:
    """Load the staged bundle with the runtime, compare it with eager (by the precision ``budget``
    when steps run in low precision), then move it to ``out``; on a mismatch (or a load failure)
    delete it and raise VerificationError (``random``: the program's random-number ops, which
    explain a mismatch). ``also(model)``: more checks of the loaded model (a dynamic bundle's
    generic plan). ``watch``: a dispatch mode eager's call on the example inputs runs under."""
    import ascendc_pack_runtime as rt

    try:
        try:
            model = rt.load(staged)
        except rt.BundleError as exc:
            raise VerificationError(f"the new bundle does not load: {exc}") from None
        try:
            checks = check_against_eager(module, input_sets, model, names=names, atol=atol, rtol=rtol, budget=budget,
                                         watch=watch)
            if also is not None:
                checks += also(model)
        finally:
            model.close()
        bad = [c for c in checks if not c.ok]
        if bad:
            kept = f"; the previous {out} was left as it was" if out.exists() else ""
            if random:
                raise VerificationError(
                    f"the new bundle does not match eager on {bad[0].label}: the model draws random numbers in "
                    f"forward ({', '.join(random)}), so eager and the bundle draw different ones and cannot "
                    f"agree. No bundle was written to {out}{kept}. Build the model in its deterministic form "
                    "(model.eval(), no sampling in forward), or pass --no-verify to ship it as it is.")
            raise VerificationError(
                f"the new bundle does not match eager on {bad[0].label}: {bad[0].problem}. No bundle was "
                f"written to {out}{kept}. If the difference is acceptable, rebuild with "
                f"{'a larger --accuracy-budget' if budget is not None else '--atol/--rtol'}; "
                "--no-verify skips this check. Otherwise please report it: it is a bug in ascendc-pack.")
        os.replace(staged, out)
        return checks
    finally:
        staged.unlink(missing_ok=True)


def _check_static_sets(input_sets: list[tuple]) -> None:
    """Every calibration set has the example's inputs: a static bundle runs those shapes and
    dtypes only (its program was captured at them), so another set could not calibrate it."""
    example = input_sets[0]
    for n, ins in enumerate(input_sets[1:], 1):
        problem = _set_mismatch(ins, example)
        if problem:
            raise ConfigError(f"calibration input set {n} {problem}: a static bundle runs the example's shapes only; "
                              "give calibration inputs of those shapes, or build with dynamic dims (a model file's "
                              "get_dynamic_shapes(), or --dynamic-batch MIN:MAX)")


def _set_mismatch(ins: tuple, example: tuple) -> str | None:
    """How an input set differs from the example's (count, tensor or not, shape, dtype), or None."""
    if len(ins) != len(example):
        return f"has {len(ins)} inputs, the example inputs {len(example)}"
    for i, (a, e) in enumerate(zip(ins, example)):
        tensors = isinstance(a, torch.Tensor), isinstance(e, torch.Tensor)
        if tensors[0] != tensors[1] or (all(tensors) and (a.shape != e.shape or a.dtype != e.dtype)):
            return f"input {i} is {_describe(a)}, the example's {_describe(e)}"
    return None


def _describe(x) -> str:
    return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def build_file(model_file, **kwargs) -> BuildResult:
    """:func:`build` for a model.py file (its calibration inputs included), or for a
    :class:`LoadedModel` already loaded. Loading the file (the user's imports, the model's
    construction) is the build's first stage, ``load``."""
    from ascendc_pack.progress import Progress

    progress = kwargs.pop("progress", False)
    progress = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    if isinstance(model_file, LoadedModel):
        loaded = model_file
    else:
        with progress.stage("load", label="load model file"):
            loaded = load_model_file(model_file)
    kwargs["progress"] = progress
    kwargs.setdefault("output", Path(f"{loaded.name}.ascpack"))
    kwargs.setdefault("output_names", loaded.output_names)
    return build(loaded.module, loaded.example_inputs, calibration_inputs=loaded.calibration_inputs,
                 name=loaded.name, **kwargs)
