"""Constant folding: a Program pass that runs, once at build time, the steps whose result is the
same on every call, and makes their results weights.

A step is constant when it is a deterministic ATen call (no random op, no ``empty``-like op
whose values are undefined, no in-place op) and every tensor it reads is a weight or another
constant step's result. Typical: a mask rebuilt on every call from constants by slice
assignment (torchvision's swin: ``attn_mask[h, w] = count``, ~90 ``slice_scatter`` steps per
block), index tensors built with ``arange``, a weight transformed by arithmetic.

Only the constant values that a non-constant step (or the model's output) reads become weights,
and not when that would be wasteful: a view of a weight stays a view (computed once at load,
free), a value made by one factory call (``full``, ``arange``, ... with no tensor input) stays a
call, and a value over ``max_bytes`` stays computed. Weights nobody reads any more are dropped.
Run it on the captured program, before fusion.
"""

from __future__ import annotations

import dataclasses

import logging
from dataclasses import dataclass

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides, is_dense, itemsize, numel

from ascendc_pack.frontend.executor import resolve_op, run_aten
from ascendc_pack.ir.program import AtenStep, CondStep, ModelProgram, Program, TensorSpec
from ascendc_pack.ir.symbolic import any_symbolic

log = logging.getLogger(__name__)

FOLD_MAX_BYTES = 64 << 20
"""Largest constant value folded into a weight (bigger ones stay computed per call)."""

_UNDEFINED_VALUES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                     "empty_permuted"}


@dataclass(frozen=True)
class FoldResult:
    """The folded model and its weights, and what changed."""

    model: ModelProgram
    weights: dict
    folded_steps: int                  # steps no longer run per call
    new_weights: tuple[str, ...]       # constant values that became weights
    removed_weights: tuple[str, ...]   # weights nothing reads any more


def is_foldable(step: AtenStep) -> bool:
    """A deterministic, side-effect-free ATen call with every output named."""
    if not step.outputs or any(o is None for o in step.outputs):
        return False
    try:
        op = resolve_op(step.op)
    except AttributeError:
        return False
    if torch.Tag.nondeterministic_seeded in op.tags or op.__name__.split(".")[0] in _UNDEFINED_VALUES:
        return False
    schema = op._schema
    return not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _dynamic(step: AtenStep, p: Program) -> bool:
    return any_symbolic(step.args, list(step.kwargs.values()),
                        [p.values[o].shape for o in step.outputs if o is not None and o in p.values])


def _is_view(step: AtenStep) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in resolve_op(step.op)._schema.returns)


def fold_constants(model: ModelProgram, weights: dict[str, torch.Tensor], *,
                   max_bytes: int = FOLD_MAX_BYTES) -> FoldResult:
    """Fold the constant steps of ``model``'s top-level program into weights (see the module
    docstring). ``weights`` maps weight names to tensors; neither argument is modified."""
    p = model.program
    constant = set(model.weights)
    producer: dict[str, AtenStep] = {}
    for step in p.steps:
        if isinstance(step, AtenStep) and all(n in constant for n in step.input_names()) and is_foldable(step) \
                and not _dynamic(step, p):  # a size that varies per call (generic plans) is computed per call
            for o in step.outputs:
                constant.add(o)
                producer[o] = step
    if not producer:
        return FoldResult(model, dict(weights), 0, (), ())

    # constant values read by what stays per call; an output stays computed (the caller owns it)
    constant_steps = {id(s) for s in producer.values()}
    frontier = list(dict.fromkeys(n for n in _reads(p, skip=constant_steps) if n in producer))
    fold = [n for n in frontier if n not in p.outputs and _worth_folding(n, producer, weights, p, max_bytes)]
    keep = [n for n in frontier if n not in fold]
    if not fold:
        return FoldResult(model, dict(weights), 0, (), ())

    values = _evaluate(p, producer, weights, fold)
    # steps still needed: the non-constant ones and whatever the kept constant values need
    needed = _needed_steps(keep, producer)
    steps = [s for s in p.steps if id(s) not in constant_steps or id(s) in needed]
    new_specs = dict(p.values)
    new_weights = dict(weights)
    for n in fold:
        spec = p.values[n]
        stride = spec.stride if spec.stride is not None and is_dense(spec.shape, spec.stride) \
            else contiguous_strides(spec.shape)
        t = torch.empty_strided(spec.shape, stride, dtype=values[n].dtype)
        t.copy_(values[n])
        new_weights[n] = t
        new_specs[n] = TensorSpec(tuple(spec.shape), spec.dtype, tuple(stride))
    kept_program = Program(inputs=[], steps=steps, outputs=list(p.outputs), values=new_specs)
    read = set(_reads(kept_program, skip=set()))
    weight_names = [w for w in model.weights if w in read] + fold
    removed = tuple(w for w in model.weights if w not in read)
    for w in removed:
        new_weights.pop(w, None)
        new_specs.pop(w, None)
    program = Program(inputs=weight_names + list(model.user_inputs), steps=steps, outputs=list(p.outputs),
                      values=new_specs)
    fqns = {w: model.weight_fqns.get(w, w) for w in model.weights if w in read}
    fqns.update({n: f"<folded {n}>" for n in fold})
    folded = dataclasses.replace(model, program=program, weights=weight_names, weight_fqns=fqns)
    n_folded = len(p.steps) - len(steps)
    log.info("constant folding: %d steps run once at build time, %d new weights (%s bytes), %d weights dropped",
             n_folded, len(fold), sum(new_weights[n].numel() * new_weights[n].element_size() for n in fold),
             len(removed))
    return FoldResult(folded, new_weights, n_folded, tuple(fold), removed)


def _reads(program: Program, skip: set) -> list[str]:
    """Every value name read by a step of ``program`` whose id() is not in ``skip``, and by
    its outputs."""
    out = []
    for s in program.steps:
        if id(s) in skip:
            continue
        out.extend(s.input_names())
    out.extend(program.outputs)
    return out


def _worth_folding(name: str, producer: dict, weights: dict, p: Program, max_bytes: int) -> bool:
    spec = p.values[name]
    if numel(spec.shape) * itemsize(spec.dtype) > max_bytes:
        return False
    # a view of a weight stays a view (free at load, no copy in the bundle); a factory call
    # (full, arange, ...) or a view of one stays a call: cheaper to run than to store
    step = producer[name]
    while _is_view(step) and step.input_names():
        src = step.input_names()[0]
        if src in weights:
            return False
        step = producer[src]
    return bool(step.input_names())


def _evaluate(p: Program, producer: dict, weights: dict, names: list[str]) -> dict:
    """Run the constant steps ``names`` depend on, in program order, through torch."""
    needed = _needed_steps(names, producer)
    env = dict(weights)
    with torch.no_grad():
        for s in p.steps:
            if id(s) in needed:
                run_aten(s, env)
    return {n: env[n] for n in names}


def _needed_steps(names: list[str], producer: dict) -> set[int]:
    """id() of every constant step computing ``names`` (transitively)."""
    needed: set[int] = set()
    stack = list(names)
    seen = set()
    while stack:
        n = stack.pop()
        if n in seen or n not in producer:
            continue
        seen.add(n)
        needed.add(id(producer[n]))
        stack.extend(producer[n].input_names())
    return needed


def remove_dead_steps(p: Program) -> Program:
    """Without the deterministic ATen steps nothing reads any more (e.g. the views of BatchNorm
    statistics a lowered step no longer needs), branches included."""
    live = set(p.outputs)
    kept = []
    for s in reversed(p.steps):
        if isinstance(s, AtenStep) and is_foldable(s) and not any(o in live for o in s.outputs):
            continue
        if isinstance(s, CondStep):
            s = dataclasses.replace(s, then_branch=remove_dead_steps(s.then_branch),
                                    else_branch=remove_dead_steps(s.else_branch))
            live.update(s.operands)
        live.update(s.input_names())
        kept.append(s)
    return dataclasses.replace(p, steps=kept[::-1])


__all__ = ["fold_constants", "FoldResult", "is_foldable", "remove_dead_steps", "FOLD_MAX_BYTES"]
