"""Tactics: candidate implementations of the heavy steps (GEMM, convolution, attention, max pooling).

A step (:class:`LinearStep`, :class:`ConvStep`, :class:`AttentionStep`, :class:`PoolStep`) describes one heavy op of
a captured graph with the pointwise ops fused into it; :func:`candidates` lists the tactics
(:class:`Tactic`: data, JSON-serializable) this torch build and CPU can run for it, the step as
captured first. A tactic runs in two parts, both pure functions over named tensors:

    tactic = candidates(step)[i]
    prepared = prepare(tactic, weights)            # derived weights: stage "build", then "load"
    out = run(tactic, activations, prepared)       # the per-call op sequence
    stored_weights(tactic)                         # what a bundle keeps: weights + build-stage results

Weights are the step's constants (``weight``, ``bias``, ``scale``, ``shift``); activations the
rest (``x``, ``other``; ``q``, ``k``, ``v``, ``mask``). Every op is called through the dispatcher
by its qualified name (see :mod:`.dispatch`), as the C++ graph will.
"""

from __future__ import annotations

import math
from typing import Mapping, Union

import torch

from ascendc_pack.tactics.dispatch.attention import AttentionStep, attention_reference, attention_tactics
from ascendc_pack.tactics.dispatch.conv import ConvStep, conv_reference, conv_tactics
from ascendc_pack.tactics.dispatch.dispatcher import TacticError, bind, execute, reachable, unreachable_ops
from ascendc_pack.tactics.dispatch.epilogue import BINARY, UNARY, Epilogue
from ascendc_pack.tactics.dispatch.gemm import LinearStep, linear_reference, linear_tactics
from ascendc_pack.tactics.dispatch.pool import PoolStep, pool_reference, pool_tactics
from ascendc_pack.tactics.dispatch.spec import Call, Dtype, MemoryFormat, Prepack, Ref, Tactic

Step = Union[LinearStep, ConvStep, AttentionStep, PoolStep]
WEIGHTS = ("weight", "bias", "scale", "shift")

__all__ = [
    "AttentionStep", "BINARY", "Call", "ConvStep", "Dtype", "Epilogue", "LinearStep", "MemoryFormat",
    "PoolStep", "Prepack", "Ref", "Step", "Tactic", "TacticError", "UNARY", "WEIGHTS", "bind", "candidates", "check",
    "execute", "host_isa", "prepare", "random_env", "reachable", "reference", "run", "split",
    "step_from_json", "stored_weights", "unreachable_ops",
]

_STEP_TYPES = {"linear": LinearStep, "conv": ConvStep, "attention": AttentionStep, "pool": PoolStep}


def step_from_json(d: Mapping) -> Step:
    """The step description ``d`` (``step.to_json()``; unknown keys are ignored) as a step."""
    cls = _STEP_TYPES[d["kind"]]
    names = set(cls.__dataclass_fields__)
    kw = {k: v for k, v in d.items() if k in names}
    if "epilogue" in kw:
        kw["epilogue"] = Epilogue(**kw["epilogue"])
    for k, v in kw.items():
        if isinstance(v, list):
            kw[k] = tuple(v)
    return cls(**kw)


def candidates(step: Step) -> list[Tactic]:
    """The tactics for ``step`` whose every op the dispatcher reaches here; candidate 0 is the
    step as captured (ATen)."""
    make = {"linear": linear_tactics, "conv": conv_tactics, "attention": attention_tactics,
            "pool": pool_tactics}[step.kind]
    return [t for t in make(step) if not unreachable_ops(t)]


def reference(step: Step, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Eager PyTorch's answer for ``step`` (written independently of the tactics)."""
    ref = {"linear": linear_reference, "conv": conv_reference, "attention": attention_reference,
           "pool": pool_reference}[step.kind]
    return ref(step, dict(env))


def prepare(tactic: Tactic, weights: Mapping[str, torch.Tensor], stage: str | None = None) -> dict[str, torch.Tensor]:
    """Run ``tactic``'s weight derivations of ``stage`` (``"build"``, ``"load"``; None: both, in
    order) on ``weights``; returns them plus every derived tensor."""
    calls = [p.call for p in tactic.prepack if stage is None or p.when == stage]
    with torch.no_grad():
        return execute(calls, weights)


def run(tactic: Tactic, activations: Mapping[str, torch.Tensor], prepared: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One call of ``tactic`` on ``activations`` with the ``prepared`` weights."""
    with torch.no_grad():
        return execute(tactic.calls, {**prepared, **activations})[tactic.output]


def stored_weights(tactic: Tactic) -> tuple[str, ...]:
    """The tensors a bundle stores for ``tactic``: the step's weights and build-stage results that
    its load-stage derivations or per-call ops read (intermediates of the build stage are not)."""
    later = [p.call for p in tactic.prepack if p.when == "load"] + list(tactic.calls)
    read = set().union(*(c.refs() for c in later)) - {c.out for c in later}
    return tuple(sorted(n for n in read if n in WEIGHTS or n not in tactic.inputs))


def _dtype(step: Step) -> torch.dtype:
    return getattr(torch, step.dtype)


def random_env(step: Step, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors for every name ``step`` reads: normal activations and weights (scaled by
    fan-in so deep outputs stay O(1)), positive ``scale``, a mask keeping ~80 % of scores."""
    g = torch.Generator().manual_seed(seed)
    dt = _dtype(step)
    env: dict[str, torch.Tensor] = {}
    for name, shape in step.shapes().items():
        if name == "mask":
            keep = torch.rand(shape, generator=g) < 0.8
            env[name] = keep if step.mask == "bool" else torch.zeros(shape).masked_fill(~keep, float("-inf")).to(dt)
        elif name == "weight":
            fan_in = math.prod(shape[1:]) if step.kind == "conv" else step.k
            env[name] = (torch.randn(shape, generator=g) / fan_in ** 0.5).to(dt)
        elif name == "scale":
            env[name] = (torch.rand(shape, generator=g) + 0.5).to(dt)
        else:
            env[name] = torch.randn(shape, generator=g).to(dt)
    if step.kind in ("conv", "pool") and step.layout == "channels_last":
        env["x"] = env["x"].contiguous(memory_format=torch.channels_last)
    return env


def split(env: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """``(weights, activations)`` of a step's named tensors."""
    return ({k: v for k, v in env.items() if k in WEIGHTS}, {k: v for k, v in env.items() if k not in WEIGHTS})


def check(step: Step, tactic: Tactic, env: Mapping[str, torch.Tensor], atol: float | None = None,
          rtol: float | None = None) -> str | None:
    """None if ``tactic`` matches :func:`reference` on ``env`` (same shape, dtype, values within
    tolerance, NaN where eager has NaN), else what differs."""
    weights, acts = split(env)
    expected = reference(step, env)
    actual = run(tactic, acts, prepare(tactic, weights))
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return f"{tactic.name}: {actual.dtype}{list(actual.shape)}, eager {expected.dtype}{list(expected.shape)}"
    low = expected.dtype in (torch.bfloat16, torch.float16)
    atol = atol if atol is not None else (3e-2 if low else 2e-4)
    rtol = rtol if rtol is not None else (3e-2 if low else 2e-4)
    if not torch.allclose(actual.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=True):
        diff = (actual.double() - expected.double()).abs().nan_to_num(float("inf")).max().item()
        return f"{tactic.name}: values differ from eager (max abs diff {diff:.3g})"
    return None


def host_isa() -> str:
    """The CPU capability ATen dispatches to here (``AVX512``, ``AVX2``, ``DEFAULT``...): a
    bundle with derived weights made at build records it; those made at load do not need it."""
    return torch.backends.cpu.get_cpu_capability()
