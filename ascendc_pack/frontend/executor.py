"""Run a Program in Python.

The reference executor runs every step through torch: fused kernels and tactic steps by their
original ATen steps. Python mode (PGO) plugs ``run_fused`` / ``run_tactic`` callbacks in to launch
compiled kernels and run the chosen tactics instead.
"""

from __future__ import annotations

from typing import Callable

import torch

from ascendc_pack_runtime.outputs import OutputBuilder

from ascendc_pack.ir.program import AtenStep, CondStep, FusedStep, ModelProgram, Program, Ref, TacticStep

FusedRunner = Callable[[FusedStep, list[torch.Tensor]], list[torch.Tensor]]
TacticRunner = Callable[[TacticStep, dict], torch.Tensor]
"""``run_tactic(step, env) -> output``: ``env`` maps program value names to tensors."""

_OP_CACHE: dict[str, object] = {}


def resolve_op(op: str):
    """``"aten.add.Tensor"`` -> ``torch.ops.aten.add.Tensor``."""
    fn = _OP_CACHE.get(op)
    if fn is None:
        ns, name, overload = op.split(".")
        fn = getattr(getattr(getattr(torch.ops, ns), name), overload)
        _OP_CACHE[op] = fn
    return fn


def _resolve(a, env):
    if isinstance(a, Ref):
        return env[a.name]
    if isinstance(a, list):
        return [_resolve(x, env) for x in a]
    return a


def run_aten(step: AtenStep, env: dict) -> None:
    """Run one ATen step, storing its outputs in ``env``."""
    fn = resolve_op(step.op)
    out = fn(*_resolve(step.args, env), **{k: _resolve(v, env) for k, v in step.kwargs.items()})
    if step.multi:
        for name, val in zip(step.outputs, out):
            if name is not None:
                env[name] = val
    else:
        env[step.outputs[0]] = out


def run_reference_fused(step: FusedStep, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run a fused step through its original ATen steps (the reference semantics)."""
    env = dict(zip(step.inputs, args))
    for s in step.steps:
        run_aten(s, env)
    return [env[o] for o in step.outputs]


def run_reference_tactic(step: TacticStep, env: dict) -> torch.Tensor:
    """Run a tactic step through the ATen steps it replaces (the reference semantics)."""
    local = {n: env[n] for n in step.reference_inputs()}
    for s in step.steps:
        run_aten(s, local)
    return local[step.outputs[0]]


def run_program(program: Program, inputs: list[torch.Tensor], run_fused: FusedRunner | None = None,
                on_cond: Callable[[CondStep, bool], None] | None = None,
                run_tactic: TacticRunner | None = None) -> list[torch.Tensor]:
    """Run ``program`` on ``inputs`` (in ``program.inputs`` order) and return its outputs."""
    run_fused = run_fused or run_reference_fused
    run_tactic = run_tactic or run_reference_tactic
    env = dict(zip(program.inputs, inputs))
    for step in program.steps:
        if isinstance(step, AtenStep):
            run_aten(step, env)
        elif isinstance(step, FusedStep):
            for name, val in zip(step.outputs, run_fused(step, [env[i] for i in step.inputs])):
                env[name] = val
        elif isinstance(step, TacticStep):
            env[step.outputs[0]] = run_tactic(step, env)
        else:
            pred = _resolve(step.pred, env)
            taken = bool(pred.item()) if isinstance(pred, torch.Tensor) else bool(pred)
            if on_cond is not None:
                on_cond(step, taken)
            branch = step.then_branch if taken else step.else_branch
            results = run_program(branch, [env[o] for o in step.operands], run_fused, on_cond, run_tactic)
            env.update(zip(step.outputs, results))
    return [env[o] for o in program.outputs]


def run_model(mp: ModelProgram, weights: dict[str, torch.Tensor], inputs, run_fused: FusedRunner | None = None,
              on_cond=None, run_tactic: TacticRunner | None = None):
    """Call the model like eager does: write input mutations back, return its output structure."""
    inputs = list(inputs)
    if len(inputs) != len(mp.user_inputs):
        raise ValueError(f"model {mp.name!r} takes {len(mp.user_inputs)} inputs, got {len(inputs)}")
    env_inputs = [weights[w] for w in mp.weights] + inputs
    with torch.no_grad():
        results = run_program(mp.program, env_inputs, run_fused, on_cond, run_tactic)
        by_name = dict(zip(mp.program.outputs, results))
        for i, name in enumerate(mp.user_inputs):
            if name in mp.mutations:
                inputs[i].copy_(by_name[mp.mutations[name]])
        flat = [by_name[o] for o in mp.user_outputs]
    return OutputBuilder(mp.out_tree)(flat)
