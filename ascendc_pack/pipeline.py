"""The whole pipeline in order, one call per stage (DESIGN 2)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .capture import Captured, capture
from .errors import PackError
from .executor import run_model
from .loader import LoadedModel, load_model_file


def capture_file(model_file: str | Path) -> tuple[LoadedModel, Captured]:
    """Load a model.py and capture it (stage 1 of the pipeline)."""
    loaded = load_model_file(model_file)
    captured = capture(loaded.module, _clone(loaded.example_inputs), name=loaded.name)
    return loaded, captured


def compare_outputs(expected, actual, atol: float = 1e-5, rtol: float = 1e-5) -> str | None:
    """None if two output structures match, else a description of the first difference."""
    exp_flat, exp_spec = pytree.tree_flatten(expected)
    act_flat, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return f"output structure differs: expected {exp_spec}, got {act_spec}"
    for i, (e, a) in enumerate(zip(exp_flat, act_flat)):
        if not isinstance(e, torch.Tensor):
            if e != a:
                return f"output {i}: expected {e!r}, got {a!r}"
            continue
        if e.shape != a.shape or e.dtype != a.dtype:
            return f"output {i}: expected {e.dtype}{list(e.shape)}, got {a.dtype}{list(a.shape)}"
        if not torch.allclose(e, a, atol=atol, rtol=rtol, equal_nan=True):
            diff = (e.double() - a.double()).abs().nan_to_num(0).max().item()
            return f"output {i}: values differ (max abs diff {diff:.3g})"
    return None


def check_reference(loaded: LoadedModel, captured: Captured) -> list[str]:
    """Run the reference executor on every input set and compare with eager.

    Returns one report line per input set; raises PackError on the first mismatch.
    """
    lines = []
    for k, inputs in enumerate(loaded.all_input_sets):
        label = "example inputs" if k == 0 else f"calibration set {k - 1}"
        eager_in, ref_in = _clone(inputs), _clone(inputs)
        with torch.no_grad():
            expected = loaded.module(*eager_in)
        actual = run_model(captured.model, captured.weights, ref_in)
        problem = compare_outputs(expected, actual)
        for i, (e, r) in enumerate(zip(eager_in, ref_in)):
            if problem is None and not torch.equal(e, r):
                problem = f"input {i} after the call differs from eager's in-place result"
        if problem:
            raise PackError(f"reference executor does not match eager on {label}: {problem}")
        lines.append(f"reference executor matches eager on {label}")
    return lines


def _clone(inputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in inputs)
