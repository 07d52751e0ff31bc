"""Run tactic calls through the dispatcher by qualified name, and check those names resolve.

``torch.ops.<ns>.<name>.<overload>`` is the boxed dispatcher entry of an operator (the Python
arguments are pushed on a stack and ``callBoxed`` runs), the same entry the C++ graph reaches
with ``c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)``. Running a tactic here
through nothing but those names is what makes it renderable there.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ascendc_pack.tactics.dispatch.spec import Call, Dtype, MemoryFormat, Ref, Tactic

# A CPU tensor reaches an op through one of these dispatch keys' kernels.
CPU_KEYS = ("CPU", "MkldnnCPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
"""Dispatch keys of a CPU kernel (``MkldnnCPU``: ops on oneDNN-packed weights, e.g. ``onednn::qconv2d_pointwise``)."""


class TacticError(RuntimeError):
    """A tactic that cannot run here: an op missing from the dispatcher, an unbound tensor name."""


def resolve(op: str):
    """The ``torch._ops.OpOverload`` for ``"ns::name[.overload]"``.

    Raises:
        TacticError: the dispatcher has no such operator or overload.
    """
    problem = reachable(op)
    if problem:
        raise TacticError(problem)
    ns, _, rest = op.partition("::")
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


def reachable(op: str) -> str | None:
    """None if the dispatcher finds ``op`` by its qualified name and has a CPU kernel for it,
    else what is wrong."""
    if "::" not in op:
        return f"{op!r} is not a qualified operator name (expected 'namespace::name[.overload]')"
    name, _, overload = op.partition(".")
    try:
        torch._C._dispatch_find_schema_or_throw(name, overload)
    except RuntimeError:
        return (f"the dispatcher has no operator {op!r} in torch {torch.__version__} "
                "(built without oneDNN/MKL, or renamed); this tactic cannot be used here")
    if not any(torch._C._dispatch_has_kernel_for_dispatch_key(op, k) for k in CPU_KEYS):
        return f"operator {op!r} has no CPU kernel in torch {torch.__version__}"
    return None


def unreachable_ops(tactic: Tactic) -> list[str]:
    """One line per op of ``tactic`` the dispatcher cannot run on CPU (empty: all reachable)."""
    return [p for p in (reachable(op) for op in tactic.ops) if p]


def _value(v, env: Mapping[str, torch.Tensor]):
    if isinstance(v, Ref):
        if v.name not in env:
            raise TacticError(f"tensor {v.name!r} is not bound (known: {sorted(env)})")
        return env[v.name]
    if isinstance(v, MemoryFormat):
        return getattr(torch, v.name)
    if isinstance(v, Dtype):
        return getattr(torch, v.name)
    if isinstance(v, tuple):
        return [_value(x, env) for x in v]
    return v


def bind(calls: tuple[Call, ...] | list[Call]) -> list[tuple[object, Call]]:
    """Resolve every call's operator once (:func:`execute` then skips the lookups)."""
    return [(resolve(c.op), c) for c in calls]


def execute(calls, env: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run ``calls`` (a list of :class:`Call`, or :func:`bind`'s result) in order on the named
    tensors ``env``; returns ``env`` plus every result."""
    bound = dict(env)
    for item in calls:
        fn, c = item if isinstance(item, tuple) else (resolve(item.op), item)
        result = fn(*[_value(a, bound) for a in c.args], **{k: _value(v, bound) for k, v in c.kwargs})
        bound[c.out] = result[c.index] if c.index is not None else result
    return bound
