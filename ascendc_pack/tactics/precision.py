"""The precision of each heavy step, chosen end to end under an accuracy budget (``--precision``).

PGO (:mod:`ascendc_pack.tactics.tune`) has verified and timed every candidate of every tactic
step, low-precision ones included (each within its step tolerance, ``lowp.STEP_TOLERANCE``), and
picked per step the fastest candidate in the model's own precision. This module then decides
which steps switch to their fastest low-precision candidate, by the error of the **whole model**
on the calibration inputs (the example inputs and every ``get_calibration_inputs()`` set), not
step by step:

* **metric** (:func:`model_error`): the largest relative error ``||y - y_ref|| / ||y_ref||``
  (``ascendc_pack_runtime.accuracy.relative_error``, float64 over every element) of any floating
  output on any input set, where ``y_ref`` is the model in its own precision (the reference
  executor) and ``y`` the same run with the switched steps in low precision (the others as their
  reference: a float32 candidate differs from it by float32 rounding, ~1e-6, three orders below a
  budget);
* **gain**: per step name, (its chosen float32 candidate's time - its low-precision candidate's
  time, plus for int8 the passes PGO does not time) x its uses, PGO medians when timed
  (``--topn`` > 1), the cost model's predictions at ``--topn 1``; only steps that gain, that every run reached (an unreached step's error is not on
  the calibration inputs) and, for a convolution, whose chain runs channels_last (the
  low-precision convolutions return channels_last) are candidates;
* **search** (:func:`choose`): the steps in order of gain; all of them first (one evaluation); if
  that is over the budget, a bisection for the longest prefix of the order within the budget
  (errors grow with the steps switched, so the prefix is monotone in practice; every accepted
  assignment is measured, never assumed), then each remaining step alone on top of it, in gain
  order, kept when the error stays within the budget (falling back step by step), at most
  :data:`MAX_EVALUATIONS` model runs per input set in all. The final assignment's error is the
  measured one, reported next to the budget; none fitting leaves the float32 bundle, and says so;
* **trim** (:func:`_trim`): a step can cost more error than it saves time - resnet18's classifier
  (its output is the model's: 2.3e-3 of the 4.0e-3 bf16 error, for 6 µs of 1.9 ms). The accepted
  steps with the smallest gains (at most :data:`MAX_TRIMS`, each at most :data:`TRIM_SHARE` of the
  total) are each tried back in float32, and stay there when that lowers error x time **
  :data:`TRIM_WEIGHT` (the relative error falls about eight times more than the heavy steps' time
  grows), so a loose budget does not buy a worse model for next to nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ascendc_pack_runtime.accuracy import relative_error

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.frontend.executor import run_model, run_reference_tactic
from ascendc_pack.tactics.dispatch.dispatcher import bind, execute
from ascendc_pack.tactics.dispatch.lowp import NATIVE, features, precision_of
from ascendc_pack.tactics.families.registry import DISPATCH
from ascendc_pack.tactics.rewrite import in_layout_chain

log = logging.getLogger("ascendc_pack")

METRIC = "relative_l2"
"""The budget's metric: max over outputs and calibration input sets of ``||y - y_ref|| / ||y_ref||``."""
FEW_SETS = 4
"""Below this many calibration input sets an int8 build says its scales may not cover other inputs."""
MAX_EVALUATIONS = 24
"""Model runs (per input set) the search may spend beyond the first one."""
MAX_TRIMS = 4
"""Accepted steps (the smallest gains first) the search tries back in float32 (:func:`_trim`)."""
TRIM_SHARE = 0.05
"""... each of them gaining at most this share of all the accepted steps' gain."""
TRIM_WEIGHT = 8
"""... and given back when that lowers error x time ** TRIM_WEIGHT: the relative error must fall
about this many times more than the time grows (a low precision is asked for speed). resnet18
(--precision bf16, PGO times): its classifier back in float32 takes the error 3.97e-3 -> 3.27e-3
for 0.7 % more time (given back), its 1x1 convolutions then 4.6 % less error for 1.4 % more time
and 7 % for 1.7 % (kept in bf16; a weight of 4 gave the last one back, and the bundle measured 5 %
slower with all three)."""


@dataclass
class PrecisionReport:
    """What the search did: ``requested`` (``--precision``), ``budget`` (relative error, metric
    :data:`METRIC`), ``offered`` (the low precisions with candidates on this host) and
    ``not_offered`` (why one was not), ``error`` (the final assignment's measured error on the
    ``input_sets`` calibration sets), ``steps`` (step name -> precision, every tactic step),
    ``evaluations`` (model runs per input set), ``considered`` (steps that could switch) and
    ``note`` (one line for the summary: why the bundle stayed float32, when it did)."""

    requested: str
    budget: float
    offered: tuple[str, ...]
    not_offered: str | None
    error: float = 0.0
    steps: dict[str, str] = field(default_factory=dict)
    evaluations: int = 0
    considered: int = 0
    input_sets: int = 0
    note: str | None = None
    kernel_features: tuple[str, ...] = ()
    trimmed: tuple[str, ...] = ()

    @property
    def computes(self) -> str:
        """``fp32`` or the low precisions the bundle uses (``bf16``)."""
        lows = sorted({p for p in self.steps.values() if p != NATIVE})
        return "+".join(lows) if lows else NATIVE

    @property
    def verify_budget(self) -> float | None:
        """The budget verification compares the bundle by: None while every step computes in the
        model's own precision (then the float32 accuracy rule applies)."""
        return self.budget if self.computes != NATIVE else None

    @property
    def requires(self) -> tuple[str, ...]:
        """CPU features the chosen low-precision steps need on the host (``avx512_bf16``,
        ``avx512_vnni``...; ``amx_bf16`` for a generated AMX GEMM)."""
        lows = sorted({p for p in self.steps.values() if p != NATIVE})
        if not lows:
            return ()
        from ascendc_pack.toolchain.compiler import host_cpu_flags

        flags = set(host_cpu_flags())
        return tuple(dict.fromkeys([*(f for p in lows if (f := features(p, flags))), *self.kernel_features]))

    def describe(self) -> str:
        """One paragraph for the build summary: the request, the choice, the error next to the budget."""
        low = sum(p != NATIVE for p in self.steps.values())
        head = (f"precision: {self.requested} requested, accuracy budget {self.budget:g} ({METRIC}: the worst "
                f"output's ||y - y_fp32|| / ||y_fp32|| over {self.input_sets} calibration input set(s))")
        if self.not_offered:
            head += f"; not offered: {self.not_offered}"
        if low:
            body = (f"{low} of {len(self.steps)} tactic steps run in {self.computes}; error {self.error:.3g} <= budget "
                    f"{self.budget:g} ({self.evaluations} model evaluations)")
            if self.trimmed:
                body += (f"; kept float32 where switching cost more error than it saved time: "
                         f"{', '.join(self.trimmed)}")
        else:
            body = f"every step stays float32: {self.note or 'no low-precision step was chosen'}"
        if "int8" in self.steps.values() and self.input_sets < FEW_SETS:
            body += (f"\nint8 scales come from {self.input_sets} calibration input set(s): inputs beyond their ranges "
                     "saturate, so other inputs can cost more than the budget (run --check measures it); define "
                     "get_calibration_inputs() in the model file with inputs like the ones it will serve")
        return head + "\n" + body

    def to_json(self) -> dict:
        return {"requested": self.requested, "budget": self.budget, "metric": METRIC, "offered": list(self.offered),
                "not_offered": self.not_offered, "error": self.error, "computes": self.computes,
                "requires": list(self.requires), "evaluations": self.evaluations, "considered": self.considered,
                "input_sets": self.input_sets, "note": self.note, "trimmed": list(self.trimmed),
                "steps": dict(self.steps)}


def merged(labelled: dict[str, PrecisionReport]) -> PrecisionReport:
    """One report of several searches on their own input sets (a dynamic bundle's buckets, each
    tuned at its shape; ``labelled``: label -> report): every step, the worst error, the sums of
    the work, and each search's note under its label."""
    reports = list(labelled.values())
    first = reports[0]
    steps = {k: v for r in reports for k, v in r.steps.items()}
    low = any(p != NATIVE for p in steps.values())
    return PrecisionReport(
        first.requested, first.budget, first.offered, first.not_offered, error=max(r.error for r in reports),
        steps=steps, evaluations=sum(r.evaluations for r in reports), considered=sum(r.considered for r in reports),
        input_sets=sum(r.input_sets for r in reports),
        note=None if low else "; ".join(f"{k}: {r.note}" for k, r in labelled.items() if r.note) or None,
        kernel_features=tuple(dict.fromkeys(f for r in reports for f in r.kernel_features)),
        trimmed=tuple(dict.fromkeys(t for r in reports for t in r.trimmed)))


class _Evaluator:
    """Runs the model with a set of steps switched to a low-precision candidate and measures
    :data:`METRIC` against the model in its own precision."""

    def __init__(self, tuner, input_sets: list):
        self.tuner = tuner
        self.input_sets = [tuple(t.clone() for t in ins) for ins in input_sets]
        self.refs = [self._outputs(ins, {}) for ins in self.input_sets]
        self.prepared: dict = {}
        self.memo: dict = {}
        self.runs = 0

    def _outputs(self, inputs, switch: dict[str, int]) -> list[torch.Tensor]:
        from torch.utils import _pytree as pytree

        run = (lambda s, env: self._run(s, env, switch)) if switch else None
        out = run_model(self.tuner.model, self.tuner.weights, [t.clone() for t in inputs], run_tactic=run)
        return [t for t in pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]

    def _run(self, step, env: dict, switch: dict[str, int]) -> torch.Tensor:
        from ascendc_pack.tactics.tune import _arrival, _shaped

        i = switch.get(step.name)
        if i is None:
            return run_reference_tactic(step, env)
        ch = self.tuner.choices[step.name]
        tactic = ch.candidates[i]
        named = {t: _shaped(env[v], step.shapes.get(t)) for t, v in step.bind.items()}
        key = (id(step), i)
        if tactic.family != DISPATCH:  # a generated kernel (verified in the sandbox before it got here)
            if key not in self.prepared:
                made = tactic.kernel_weights(named)
                self.prepared[key] = (made, tactic.impl.lowered_runner(tactic, {**named, **made}))
            made, run = self.prepared[key]
            with torch.no_grad():
                got = run({**_arrival(tactic, step.desc, named), **made})
        else:
            weights, acts = T.split(named)
            if key not in self.prepared:
                self.prepared[key] = (T.prepare(tactic, weights), bind(tactic.calls))
            prepared, calls = self.prepared[key]
            with torch.no_grad():
                got = execute(calls, {**prepared, **_arrival(tactic, step.desc, acts)})[tactic.output]
        spec = self.tuner.programs[id(step)].values[step.outputs[0]]
        out = got.reshape(spec.shape)
        if spec.stride is not None and tuple(out.stride()) != tuple(spec.stride):
            # the ATen steps after it read the captured layout (a channels_last result, relaid once)
            out = torch.empty_strided(spec.shape, spec.stride, dtype=out.dtype).copy_(out)
        return out

    def error(self, switch: dict[str, int]) -> float:
        """The worst relative error of any floating output on any input set (each assignment is
        run once)."""
        key = frozenset(switch.items())
        if key in self.memo:
            return self.memo[key]
        self.runs += 1
        worst = 0.0
        for ins, refs in zip(self.input_sets, self.refs):
            outs = self._outputs(ins, switch)
            for r, o in zip(refs, outs):
                if r.is_floating_point():
                    worst = max(worst, relative_error(r, o))
        self.memo[key] = worst
        return worst


def _time(ch, i: int) -> float | None:
    """A candidate's PGO median, else the cost model's prediction (``--topn 1``)."""
    r = ch.results[i]
    if r.median_us is not None:
        return r.median_us
    return ch.predicted_us[i] if i < len(ch.predicted_us) else None


def _unseen(tuner, ch, i: int) -> float:
    """µs a low-precision candidate costs the bundle beyond its timed core: an int8 one's input
    quantization and unfused epilogue (:func:`~ascendc_pack.tactics.predict.int8_passes_us`)."""
    target = getattr(tuner, "target", None)
    if precision_of(ch.candidates[i]) != "int8" or target is None:
        return 0.0
    from ascendc_pack.tactics.predict import int8_passes_us

    return int8_passes_us(ch.kind, ch.desc, target)


def _native_us(tuner, decisions: dict[int, int]) -> float:
    """The heavy steps' time in the model's own precision: every tactic step's chosen candidate
    (PGO median, else prediction), summed over uses."""
    return sum(t for s in tuner.instances if (t := _time(tuner.choices[s.name], decisions[id(s)])) is not None)


def _trim(ev, accepted: list, error: float, native_us: float, switch_of) -> tuple[list, float]:
    """``accepted`` without the steps whose float32 lowers error x time ** :data:`TRIM_WEIGHT`,
    and its error: of the :data:`MAX_TRIMS` smallest gains, each at most :data:`TRIM_SHARE` of the
    total, tried in turn (time: the heavy steps', ``native_us`` less the accepted gains)."""
    gain = sum(g for g, _, _ in accepted)
    time_us = native_us - gain
    if error <= 0.0 or time_us <= 0.0:
        return accepted, error
    small = [a for a in sorted(accepted, key=lambda a: (a[0], a[1])) if a[0] <= TRIM_SHARE * gain]
    for item in small[:MAX_TRIMS]:
        rest = [a for a in accepted if a is not item]
        e = ev.error(switch_of(rest))
        log.debug("precision: %s back in float32: error %.3g -> %.3g, heavy steps %.0f -> %.0f µs", item[1], error, e,
                  time_us, time_us + item[0])
        if e * (time_us + item[0]) ** TRIM_WEIGHT < error * time_us ** TRIM_WEIGHT:
            accepted, error, time_us = rest, e, time_us + item[0]
    return accepted, error


def candidates(tuner, decisions: dict[int, int]) -> list[tuple[float, str, tuple[int, ...]]]:
    """``[(gain µs, step name, low-precision candidate indices), ...]`` by gain, largest first;
    a step's indices are its low-precision candidates that gain (one per precision: ``bf16``,
    ``int8``), by gain, largest first."""
    by_name: dict[str, list] = {}
    for s in tuner.instances:
        by_name.setdefault(s.name, []).append(s)
    out = []
    for name, uses in by_name.items():
        ch = tuner.choices[name]
        if not ch.low or not all(id(s) in tuner.reached for s in uses):
            continue
        natives = [decisions[id(s)] for s in uses]
        if ch.kind == "conv" and not all(in_layout_chain(ch.candidates[i]) for i in natives):
            continue  # a chain planned NCHW: the low-precision convolutions return channels_last
        native_t = [_time(ch, i) for i in natives]
        if any(t is None for t in native_t):
            continue
        options = sorted((sum(native_t) - (t + _unseen(tuner, ch, i)) * len(uses), i) for i in ch.low.values()
                         if (t := _time(ch, i)) is not None)
        gaining = [(g, i) for g, i in reversed(options) if g > 0]
        if gaining:
            out.append((gaining[0][0], name, tuple(i for _, i in gaining)))
    return sorted(out, key=lambda g: (-g[0], g[1]))


def choose(tuner, decisions: dict[int, int], input_sets: list, requested: str, budget: float) -> PrecisionReport:
    """Switch steps to their low-precision candidate under ``budget`` (module docstring); updates
    ``decisions`` (candidate index by ``id(step)``) in place and returns the report."""
    report = PrecisionReport(requested, budget, tuple(tuner.offered), tuner.not_offered,
                             steps={name: precision_of(ch.candidates[ch.chosen_index]) for name, ch in
                                    tuner.choices.items()}, input_sets=len(input_sets))
    if not tuner.offered:
        report.note = "this host offers no low precision" + (f" ({tuner.not_offered})" if tuner.not_offered else "")
        return report
    order = candidates(tuner, decisions)
    report.considered = len(order)
    if not order:
        report.note = "no step has a low-precision candidate that verified and is faster here"
        return report
    if not input_sets:
        report.note = "no calibration inputs to measure the error on"
        return report
    ev = _Evaluator(tuner, input_sets)
    switch_of = lambda items: {name: options[0] for _, name, options in items}  # noqa: E731
    accepted: list = []
    err = ev.error(switch_of(order))
    if err <= budget:
        accepted, final = list(order), err
    else:
        lo, hi, final = 0, len(order) - 1, 0.0   # the longest prefix within the budget: in [lo, hi]
        while lo < hi and ev.runs <= MAX_EVALUATIONS:
            mid = (lo + hi + 1) // 2
            e = ev.error(switch_of(order[:mid]))
            if e <= budget:
                lo, final = mid, e
            else:
                hi = mid - 1
        accepted = list(order[:lo])
        for gain, name, options in order[lo:]:   # fall back step by step: each remaining step alone on top,
            for i in options:                      # in its fastest precision, then its next (int8, then bf16)
                if ev.runs > MAX_EVALUATIONS:
                    break
                e = ev.error(switch_of(accepted + [(gain, name, (i,))]))
                if e <= budget:
                    accepted.append((gain, name, (i,)))
                    final = e
                    break
        if accepted and final == 0.0:
            final = ev.error(switch_of(accepted))
    if accepted:
        kept, final = _trim(ev, accepted, final, _native_us(tuner, decisions), switch_of)
        report.trimmed = tuple(name for _, name, _ in accepted if name not in {n for _, n, _ in kept})
        accepted = kept
    report.evaluations = ev.runs
    if not accepted:
        report.note = (f"the budget {budget:g} is too tight for any low-precision step: no step tried stays within "
                       f"it (all {len(order)} together cost {err:.3g})")
        log.info("precision: %s", report.note)
        return report
    switch = switch_of(accepted)
    for s in tuner.instances:
        if s.name in switch:
            decisions[id(s)] = switch[s.name]
    report.error = final
    for name, i in switch.items():
        report.steps[name] = precision_of(tuner.choices[name].candidates[i])
    report.kernel_features = tuple(sorted({f for name, i in switch.items()
                                           if (f := tuner.choices[name].candidates[i].param("feature"))}))
    log.info("precision: %d steps in low precision, error %.3g <= budget %g (%d evaluations)", len(accepted), final,
             budget, ev.runs)
    return report


__all__ = ["METRIC", "MAX_EVALUATIONS", "MAX_TRIMS", "PrecisionReport", "TRIM_SHARE", "TRIM_WEIGHT", "candidates",
           "choose", "merged"]
