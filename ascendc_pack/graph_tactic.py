"""A lowered tactic step as ATen-style steps the graph planner renders (boxed dispatcher calls).

A tactic (:class:`ascendc_pack.tactics.Tactic`) is data: dispatcher calls by qualified name. The
planner (:mod:`ascendc_pack.graph_plan`) renders each as a boxed call like any ATen step:

* ``load``: the load-stage derivations (``mkldnn::_reorder_linear_weight``...), run once when the
  bundle is loaded (their results are static tensors of the graph state, counted in cold start;
  never stored in the bundle, since oneDNN/MKL packed layouts depend on the host's ISA);
* ``calls``: reshapes of the step's inputs to the shapes the tactic reads, the per-call ops, and
  a reshape of the result to the value the program expects.

Names: the tactic's own tensors become ``<output>#<name>`` (unique: the program's value names are).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .executor import resolve_op
from .program import AtenStep, Ref, TacticStep, TensorSpec
from .tactics import Call, Dtype, MemoryFormat, Tactic
from .tactics import Ref as TRef


@dataclass(frozen=True)
class TacticPlan:
    """What the planner renders for one lowered tactic step (see the module docstring);
    ``values``: the recorded layout of every tensor the steps make."""

    load: tuple
    calls: tuple
    values: dict


def op_name(qualified: str) -> str:
    """``"mkldnn::_linear_pointwise.binary"`` -> ``"mkldnn._linear_pointwise.binary"``
    (the program's spelling; the default overload is ``default``)."""
    ns, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    return f"{ns}.{name}.{overload or 'default'}"


def tactic_plan(step: TacticStep, program_values: dict) -> TacticPlan:
    """The load-time and per-call steps of a lowered tactic step (``program_values``: the specs
    of the program's values)."""
    out_spec = program_values[step.outputs[0]]
    tactic = Tactic.from_json(step.chosen)
    prefix = f"{step.outputs[0]}#"
    recorded = step.values or {}
    names: dict[str, str] = {}
    values: dict[str, TensorSpec] = {}
    calls: list[AtenStep] = []
    for t, v in step.bind.items():
        shape = step.shapes.get(t)
        if shape is not None and tuple(program_values[v].shape) != tuple(shape):
            names[t] = prefix + t
            if t in recorded:
                values[prefix + t] = recorded[t]
            calls.append(AtenStep("aten.reshape.default", [Ref(v), list(shape)], {}, [prefix + t]))
        else:
            names[t] = v

    def convert(c: Call) -> AtenStep:
        for n in c.refs():
            names.setdefault(n, prefix + n)
        names[c.out] = prefix + c.out
        if c.out in recorded:
            values[prefix + c.out] = recorded[c.out]
        op = op_name(c.op)
        args = [_arg(a, names) for a in c.args]
        kwargs = {k: _arg(v, names) for k, v in c.kwargs}
        if c.index is None:
            return AtenStep(op, args, kwargs, [prefix + c.out])
        outs: list = [None] * len(resolve_op(op)._schema.returns)
        outs[c.index] = prefix + c.out
        return AtenStep(op, args, kwargs, outs, multi=True)

    load = [convert(p.call) for p in tactic.prepack if p.when == "load"]
    calls += [convert(c) for c in tactic.calls]
    result = names[tactic.output]
    spec = values.get(result)
    if spec is None or tuple(spec.shape) != tuple(out_spec.shape):
        calls.append(AtenStep("aten.reshape.default", [Ref(result), list(out_spec.shape)], {}, [step.outputs[0]]))
    else:  # the last call writes the program's value itself
        last = calls[-1]
        calls[-1] = AtenStep(last.op, last.args, last.kwargs,
                             [step.outputs[0] if o == result else o for o in last.outputs], last.multi)
        values[step.outputs[0]] = spec
    return TacticPlan(tuple(load), tuple(calls), values)


def _arg(a, names: dict):
    if isinstance(a, TRef):
        return Ref(names[a.name])
    if isinstance(a, (MemoryFormat, Dtype)):
        return getattr(torch, a.name)
    if isinstance(a, tuple):
        return [_arg(x, names) for x in a]
    return a


__all__ = ["tactic_plan", "TacticPlan", "op_name"]
