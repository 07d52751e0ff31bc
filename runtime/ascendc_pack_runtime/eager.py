"""``run --check MODEL.py``: the model file's eager module as the reference of a bundle's outputs.

The runtime has a loader of its own, on purpose, rather than reusing ``ascendc_pack.frontend.loader``
when the compiler happens to be installed: the runtime never imports ``ascendc_pack`` (a bundle
runs on machines without g++), and ``ascendc-pack run --check`` and ``python -m
ascendc_pack_runtime run --check`` must behave the same everywhere. It needs less than the
build's loader: only the module (``get_model()`` or a module attribute ``model``), since the
inputs are the ones ``run`` uses (random, or ``--inputs FILE.npz``). The comparison is the
project's one accuracy rule (:mod:`.accuracy`), with the same float64 second look as ``build``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .accuracy import OutputCheck, check_budget, check_outputs, first_problem


class ModelFileLoadError(ValueError):
    """The model file given to ``--check`` cannot provide an eager module."""


def load_eager_module(path: str | Path) -> torch.nn.Module:
    """Import the model file ``path`` and return its module in eval mode (``get_model()``, else
    a module attribute ``model``); a :class:`ModelFileLoadError` naming the problem otherwise."""
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise ModelFileLoadError(f"--check {path}: not a Python model file (expected an existing .py file that "
                                 "defines get_model())")
    name = "_ascendc_pack_check_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered first, as torch.cond models need to find themselves
    try:
        spec.loader.exec_module(module)
        factory = getattr(module, "get_model", None)
        model = factory() if callable(factory) else getattr(module, "model", None)
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        sys.modules.pop(name, None)
        raise ModelFileLoadError(f"--check {path}: importing it or calling get_model() raised "
                                 f"{type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise ModelFileLoadError(f"--check {path}: get_model() (or `model`) must give a torch.nn.Module, got "
                                 f"{type(model).__name__}; a model file defines def get_model(): return MyModel()")
    return model.eval()


def compare_with_eager(module: torch.nn.Module, inputs: list[torch.Tensor], actual: list[torch.Tensor],
                       names: list[str], rtol: float | None = None,
                       atol: float | None = None, budget: float | None = None) -> tuple[list[OutputCheck], str | None]:
    """(one check per output, the first problem or None): the bundle's flat ``actual`` outputs
    against ``module(*inputs)``; an output that misses the tolerances gets a second look against
    a float64 run of the module (passes if as accurate as eager). ``budget``: compare by the
    precision budget of a bundle with low-precision steps instead (:func:`~.accuracy.check_budget`)."""
    with torch.no_grad():
        expected = pytree.tree_leaves(module(*[t.clone() for t in inputs]))
    if len(expected) != len(actual):
        return [], f"the bundle gives {len(actual)} output tensors, the model file's module {len(expected)}"
    if budget is not None:
        checks = check_budget(names, expected, actual, budget)
        return checks, first_problem(checks)
    checks = check_outputs(names, expected, actual, rtol=rtol, atol=atol)
    if first_problem(checks) is not None:
        wide = _float64_outputs(module, inputs)
        if wide is not None and len(wide) == len(expected):
            checks = check_outputs(names, expected, actual, wide, rtol=rtol, atol=atol)
    return checks, first_problem(checks)


def _float64_outputs(module: torch.nn.Module, inputs: list[torch.Tensor]) -> list | None:
    """The module's outputs computed in float64, or None when the model cannot run that way."""
    try:
        wide = copy.deepcopy(module).to(torch.float64)
        with torch.no_grad():
            return pytree.tree_leaves(wide(*[t.double() if t.is_floating_point() else t.clone() for t in inputs]))
    except Exception:  # noqa: BLE001 - some models run only in their own dtype: no second look
        return None


__all__ = ["ModelFileLoadError", "load_eager_module", "compare_with_eager"]
