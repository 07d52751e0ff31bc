"""Compare something that runs a model (the reference executor, a bundle) with eager PyTorch.

One accuracy rule for every check (``ascendc_pack_runtime.accuracy``): dtype- and
magnitude-aware tolerances, and, when an output misses them, a second look against a float64
run of the model (an output as accurate as eager's own passes). ``capture --check`` and the
end of ``build`` both use :func:`check_against_eager`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from ascendc_pack_runtime.accuracy import OutputCheck, check_budget, check_outputs, first_problem
from ascendc_pack_runtime.outputs import leaves, tree_of

log = logging.getLogger("ascendc_pack")


@dataclass(frozen=True)
class InputSetCheck:
    """How one input set compared: its label and one check per output tensor."""

    label: str
    outputs: list[OutputCheck]
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def compare_outputs(expected, actual, atol: float | None = None, rtol: float | None = None,
                    names: list[str] | None = None, reference64=None) -> str | None:
    """None if two output structures match by the accuracy rule, else the first difference."""
    checks, problem = _compare(expected, actual, atol, rtol, names, reference64)
    return problem or first_problem(checks)


def _compare(expected, actual, atol, rtol, names, reference64, budget=None) -> tuple[list[OutputCheck], str | None]:
    if tree_of(expected) != tree_of(actual):
        return [], (f"output structure differs: expected {_shape_of(expected)}, got {_shape_of(actual)}")
    exp, act = leaves(expected), leaves(actual)
    names = names or [f"output {i}" for i in range(len(exp))]
    if budget is not None:
        return check_budget(names, exp, act, budget), None
    ref = leaves(reference64) if reference64 is not None else None
    return check_outputs(names, exp, act, ref, rtol=rtol, atol=atol), None


@contextlib.contextmanager
def plain_cond():
    """Run ``torch.cond`` as what it means in eager mode, ``true_fn(*operands) if pred else
    false_fn(*operands)`` (torch's documented semantics), while the eager reference runs. Called
    outside ``torch.compile``, ``torch.cond`` compiles itself with dynamo: about 1.5 s on its
    first call, most of a warm rebuild of a model with branches. Code that imported ``cond``
    by name keeps torch's (slower, same result)."""
    original = torch.cond

    def cond(pred, true_fn, false_fn, operands=()):
        taken = true_fn if bool(pred) else false_fn
        return taken(*operands)

    torch.cond = cond
    try:
        yield
    finally:
        torch.cond = original


def check_against_eager(module: torch.nn.Module, input_sets: list[tuple], run: Callable,
                        names: list[str] | None = None, atol: float | None = None,
                        rtol: float | None = None, budget: float | None = None,
                        watch=None) -> list[InputSetCheck]:
    """Run ``run(*inputs)`` and eager ``module(*inputs)`` on every input set and compare them,
    input mutations included. An output that misses the tolerances gets a second look against a
    float64 run of the model (computed only then). ``budget``: compare every floating output by
    its relative error against this precision budget instead (a bundle with low-precision steps).
    ``watch``: a context manager (a dispatch mode) the eager call on the first input set runs
    under, to observe it without calling the model once more."""
    results = []
    module64 = None
    for k, inputs in enumerate(input_sets):
        label = "example inputs" if k == 0 else f"calibration set {k - 1}"
        eager_in, our_in = _clone(inputs), _clone(inputs)
        with torch.no_grad(), plain_cond(), (watch if k == 0 and watch is not None else contextlib.nullcontext()):
            expected = module(*eager_in)
        actual = run(*our_in)
        checks, problem = _compare(expected, actual, atol, rtol, names, None, budget)
        if budget is None and problem is None and first_problem(checks) is not None:
            module64 = module64 if module64 is not None else _float64_copy(module)
            ref = _float64_run(module64, inputs) if module64 is not False else None
            if ref is not None:
                checks, problem = _compare(expected, actual, atol, rtol, names, ref)
        problem = problem or first_problem(checks)
        for i, (e, r) in enumerate(zip(eager_in, our_in)):
            if problem is None and not torch.equal(e, r):
                problem = f"input {i} after the call differs from eager's in-place result"
        results.append(InputSetCheck(label, checks, problem))
    return results


def _float64_copy(module: torch.nn.Module):
    try:
        return copy.deepcopy(module).to(torch.float64)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be copied: no second look
        log.info("no float64 reference (%s: %s)", type(exc).__name__, exc)
        return False


def _float64_run(module64: torch.nn.Module, inputs: tuple):
    wide = tuple(t.to(torch.float64) if t.is_floating_point() else t.clone() for t in inputs)
    try:
        with torch.no_grad(), plain_cond():
            return module64(*wide)
    except Exception as exc:  # noqa: BLE001 - some models only run in their own dtype
        log.info("no float64 reference (%s: %s)", type(exc).__name__, exc)
        return None


def _clone(inputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in inputs)


def _shape_of(obj) -> str:
    tree = tree_of(obj)
    kind = tree["kind"]
    if kind == "leaf":
        return "a tensor"
    extra = tree.get("keys") or tree.get("fields")
    return f"{kind} of {len(tree['items'])}" + (f" {extra}" if extra else "")
