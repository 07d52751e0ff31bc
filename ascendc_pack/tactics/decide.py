"""What a tactic step's tuning records say, and how a choice is made from them.

:class:`TacticResult` (one candidate's outcome) and :class:`TacticChoice` (one distinct step: its
candidates in the cost model's order, their results, the choice) are the records
:mod:`ascendc_pack.tactics.tune` fills; the functions here decide from them without running
anything: the fastest candidate per precision (:func:`pick_by_precision`), a convolution chain's
configuration (:func:`chain_decision`, on PGO medians or the cost model's predictions), what a
choice rests on (:func:`verified_on`), a low-precision candidate's check against its step
tolerance (:func:`low_check`), the precisions a build offers (:func:`offered_precisions`) and the
synthetic arguments a step no run reached is verified on (:func:`synthetic_env`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.choice import MeasurementQuality, rel_spread
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.tactics.dispatch.int8 import int8_offered
from ascendc_pack.tactics.dispatch.lowp import NATIVE, STEP_TOLERANCE, bf16_offered, precision_of
from ascendc_pack.tactics.families.registry import DISPATCH
from ascendc_pack.tactics.rewrite import in_layout_chain


@dataclass
class TacticResult:
    """One candidate's outcome: its key and name, its median and samples (µs; None/[] when not
    timed), why it failed (``error``; ``disqualified`` when verification rejected it) and the
    layouts of its tensors on the real arguments (``values``, what the graph plans with)."""

    index: int
    key: str
    name: str
    median_us: float | None = None
    samples_us: list[float] = field(default_factory=list)
    error: str | None = None
    disqualified: dict | None = None
    values: dict[str, TensorSpec] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rel_spread(self) -> float | None:
        return rel_spread(self.samples_us, self.median_us)

    def to_json(self) -> dict:
        d = {"index": self.index, "key": self.key, "name": self.name, "median_us": self.median_us,
             "samples_us": [round(x, 3) for x in self.samples_us], "error": self.error}
        if self.disqualified is not None:
            d["disqualified"] = self.disqualified
        if self.values is not None:
            d["values"] = {k: v.to_json() for k, v in self.values.items()}
        return d

    @staticmethod
    def from_json(d: dict) -> TacticResult:
        values = d.get("values")
        return TacticResult(int(d["index"]), d["key"], d["name"], d.get("median_us"), list(d.get("samples_us", [])),
                            d.get("error"), d.get("disqualified"),
                            {k: TensorSpec.from_json(v) for k, v in values.items()} if values is not None else None)


@dataclass
class TacticChoice:
    """The outcome of one distinct tactic step (all steps sharing ``name``).

    ``best`` is the fastest verified candidate; ``uses`` one entry per step with this name
    (``inputs``, ``outputs``, ``chosen_index``: after the chain decision, ``chain``, ``visited``);
    ``chosen_index`` is the first use's choice."""

    name: str
    kind: str
    desc: dict
    candidates: list[T.Tactic]
    results: list[TacticResult]
    best: int = 0
    visited: bool = False
    from_cache: bool = False
    profiled: bool = False
    quality: MeasurementQuality | None = None
    uses: list[dict] = field(default_factory=list)
    captured: int = 0              # the index of the as-captured candidate (the fallback)
    predicted_us: list = field(default_factory=list)   # the cost model's µs per candidate (None: none)
    checked: bool = False          # verified in order without timing (--topn 1); ``best`` is the first that passed
    synthetic: bool = False        # verified on arbitrary arguments of its shapes (no run reached it)
    low: dict = field(default_factory=dict)   # precision -> its fastest verified candidate (``--precision``)

    def native(self, i: int) -> bool:
        """Whether candidate ``i`` computes in the model's own precision."""
        return precision_of(self.candidates[i]) == NATIVE

    @property
    def chosen_index(self) -> int:
        return self.uses[0]["chosen_index"] if self.uses else 0

    @property
    def decided(self) -> bool:
        return self.profiled or self.from_cache or self.checked or len(self.candidates) == 1

    def verified(self, i: int) -> bool:
        """Whether candidate ``i`` ran and passed verification (the as-captured one: whether it ran)."""
        r = self.results[i] if i < len(self.results) else None
        return r is not None and r.values is not None and r.error is None

    def first_verified(self) -> int:
        """The first candidate in the cost model's order that passed verification; the as-captured
        one when none before it did (it is the reference)."""
        return next((i for i in range(len(self.candidates))
                     if self.native(i) and (self.verified(i) or i == self.captured)), self.captured)

    def to_json(self) -> dict:
        pred = self.predicted_us or [None] * len(self.candidates)
        return {"name": self.name, "kind": self.kind, "desc": self.desc, "best_index": self.best,
                "chosen_index": self.chosen_index, "visited": self.visited, "captured_index": self.captured,
                "timed": bool(self.profiled or self.from_cache), "verified_on": verified_on(self),
                "low_precision": dict(self.low),
                "candidates": [{**r.to_json(), "predicted_us": None if p is None else round(p, 3),
                                "tactic": t.to_json()} for r, t, p in zip(self.results, self.candidates, pred)],
                "uses": self.uses, **({"quality": self.quality.to_json()} if self.quality else {})}


def order_by_prediction(ch: TacticChoice) -> None:
    """Reorder ``ch``'s candidates in the model's own precision by predicted µs (the dispatcher
    tactics' roofline, a generated kernel's family estimate; a tie or no prediction keeps the
    given order), the low-precision ones after them, ordered the same way: at ``--topn 1`` the
    first of each precision that verifies is the one the precision search weighs (resnet18's
    bfloat16 convolutions had oneDNN's, listed first, where the AMX kernels were predicted 2-3x
    faster: 3.04 ms a call against 1.81 with them); ``captured`` follows. Called before any result
    exists."""
    native = [i for i in range(len(ch.candidates)) if ch.native(i)]
    low = [i for i in range(len(ch.candidates)) if not ch.native(i)]
    pred = ch.predicted_us or [None] * len(ch.candidates)
    by_prediction = lambda i: (pred[i] if pred[i] is not None else float("inf"), i)  # noqa: E731
    order = sorted(native, key=by_prediction) + sorted(low, key=by_prediction)
    captured = ch.candidates[ch.captured]
    ch.candidates = [ch.candidates[i] for i in order]
    ch.predicted_us = [pred[i] for i in order]
    ch.captured = ch.candidates.index(captured)


POOL_MARGIN = 0.08
"""A linear step's generated GEMM (run on the graph's task pool) is chosen over a faster library
candidate (ATen, oneDNN, MKL: torch's OpenMP team) within this share of its time, and at most
:data:`POOL_MARGIN_US`. PGO times each step alone; in the graph, an OpenMP step between pool
kernels pays for the two thread sets meeting on the cores: swin_t's --topn 4 bundle, with oneDNN /
MKL on three linear steps 2-6 % faster alone, ran 51-53 ms a call in its own process against
45-47 for the all-pool --topn 1 bundle."""

POOL_MARGIN_US = 50.0
"""The margin's cap: what a step pays for meeting the OpenMP team is about its wake-up (~50 µs on
the 2-vCPU KVM guest, kernel_pool.h), not a share of a long step. mlp's 256x2048x1024 GEMM: the
pool kernel 2725 µs against oneDNN's 2667 alone took the step by the 8 % share, and the bundle ran
1.02-1.03x OpenVINO f32 against 1.00 with oneDNN there (12 interleaved rounds, 2026-12-07)."""


def pick_by_precision(ch: TacticChoice) -> None:
    """From the timed results: ``best`` the fastest candidate in the model's own precision (the
    selection's pick when it is one), ``low`` the fastest of each low precision; in every
    precision a linear step's pool kernel within :data:`POOL_MARGIN` of a library pick is taken
    instead (vit_s16's bfloat16 qkv: oneDNN 105.2 µs alone against the AMX kernel's 107.5; the
    bundle with oneDNN there ran bimodal, up to 1.25x slower a call)."""
    timed: dict[str, list[tuple[float, int]]] = {}
    for i, r in enumerate(ch.results):
        if r.ok and r.median_us is not None:
            timed.setdefault(precision_of(ch.candidates[i]), []).append((r.median_us, i))
    if not ch.native(ch.best) and timed.get(NATIVE):
        ch.best = min(timed[NATIVE])[1]
    elif not ch.native(ch.best):
        ch.best = ch.captured
    ch.best = _pool_within_margin(ch, ch.best, timed.get(NATIVE, []))
    ch.low = {p: _pool_within_margin(ch, min(v)[1], v) for p, v in timed.items() if p != NATIVE}


def _pool_within_margin(ch: TacticChoice, pick: int, timed: list[tuple[float, int]]) -> int:
    """``pick``, or for a linear step whose pick is a library call the fastest generated (pool)
    candidate of ``timed`` within :data:`POOL_MARGIN` (at most :data:`POOL_MARGIN_US`) of it."""
    pick_us = ch.results[pick].median_us
    if ch.kind != "linear" or ch.candidates[pick].family != DISPATCH or pick_us is None:
        return pick
    limit = pick_us + min(pick_us * POOL_MARGIN, POOL_MARGIN_US)
    pool = [(t, i) for t, i in timed if ch.candidates[i].family != DISPATCH and t <= limit]
    return min(pool)[1] if pool else pick


def offered_precisions(config: BuildConfig) -> tuple[tuple[str, ...], str | None]:
    """The low precisions this build offers candidates in, and why one asked for is not (None: all)."""
    if not config.low_precision:
        return (), None
    asked = ("bf16", "int8") if config.precision == "auto" else (config.precision,)
    checks = {"bf16": bf16_offered, "int8": int8_offered}
    why = {p: checks[p]() for p in asked}
    missing = "; ".join(f"{p}: {w}" for p, w in why.items() if w)
    return tuple(p for p in asked if not why[p]), missing or None


def low_check(want: torch.Tensor, got: torch.Tensor, prec: str):
    """A low-precision candidate against the float32 reference: its relative error within
    :data:`~ascendc_pack.tactics.dispatch.lowp.STEP_TOLERANCE` (the float32 rule would reject any rounding)."""
    from ascendc_pack_runtime.accuracy import OutputCheck, relative_error

    rel = relative_error(want, got)
    tol = STEP_TOLERANCE[prec]
    problem = None if rel <= tol else (f"relative error {rel:.3g} of a {prec} candidate is above its step tolerance "
                                       f"{tol:g}")
    return OutputCheck("output", rel, tol, None, None, None, problem, f"{prec}: relative error <= {tol:g}")


def measured(ch: TacticChoice) -> bool:
    return (ch.profiled or ch.from_cache) and ch.results[ch.captured].median_us is not None


def median(ch: TacticChoice, i: int) -> float | None:
    return ch.results[i].median_us


def predicted(ch: TacticChoice, i: int) -> float | None:
    """The cost model's µs of a verified candidate (None: not verified, or no prediction)."""
    if not (ch.verified(i) or i == ch.captured) or i >= len(ch.predicted_us):
        return None
    return ch.predicted_us[i]


def chain_decision(chs: list[TacticChoice], time_of=median) -> list[int]:
    """Per step of one convolution chain: all as captured, or each step's fastest channels_last
    candidate, whichever sums to less by ``time_of(choice, index)`` (PGO medians, or the cost
    model's predictions of verified candidates; None: not usable)."""
    captured_t = [time_of(ch, ch.captured) for ch in chs]
    if any(t is None for t in captured_t):
        return [ch.captured for ch in chs]
    best_cl = []
    for ch in chs:
        timed = [(t, i) for i, c in enumerate(ch.candidates)
                 if i != ch.captured and ch.native(i) and in_layout_chain(c) and (t := time_of(ch, i)) is not None]
        if not timed:
            return [ch.captured for ch in chs]
        best_cl.append(min(timed))
    if sum(t for t, _ in best_cl) < sum(captured_t):
        return [i for _, i in best_cl]
    return [ch.captured for ch in chs]


def verified_on(ch: TacticChoice) -> str:
    """What the choice rests on: ``timed`` (PGO), ``checked`` (verified, untimed: --topn 1),
    ``synthetic`` (verified on synthetic arguments: no run reached it) or ``none``."""
    if ch.profiled or ch.from_cache:
        return "timed"
    if ch.synthetic:
        return "synthetic"
    return "checked" if ch.checked else "none"


def synthetic_env(step: TacticStep, values: dict) -> dict:
    """Arbitrary arguments for the values ``step``'s ATen steps read, with the shapes, strides and
    dtypes of ``values`` (normal floats, random bools, zero integers; seeded)."""
    g = torch.Generator().manual_seed(0)
    env = {}
    for n in step.reference_inputs():
        spec = values[n]
        dt = getattr(torch, spec.dtype)
        stride = spec.stride if spec.stride is not None else None
        size = sum((sh - 1) * st for sh, st in zip(spec.shape, stride)) + 1 if stride and all(spec.shape) else \
            max(1, spec.numel)
        if dt.is_floating_point:
            flat = torch.randn(size, generator=g).to(dt)
        elif dt == torch.bool:
            flat = torch.rand(size, generator=g) < 0.8
        else:
            flat = torch.zeros(size, dtype=dt)
        env[n] = flat.as_strided(spec.shape, stride) if stride else flat[:spec.numel].reshape(spec.shape)
    return env


__all__ = ["TacticResult", "TacticChoice", "order_by_prediction", "pick_by_precision", "offered_precisions", "low_check", "measured",
           "median", "predicted", "chain_decision", "verified_on", "synthetic_env"]
