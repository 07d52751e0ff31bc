"""Calibration of the int8 candidates: each tactic step's input range on the calibration inputs.

An int8 candidate (:mod:`ascendc_pack.tactics.dispatch.int8`) quantizes its activation with a
scale fixed at build. :func:`activation_ranges` runs the model once per calibration input set
(the example inputs and every ``get_calibration_inputs()`` set; the reference executor, every
tactic step as captured) and records, per GEMM / convolution step name, the smallest and largest
value its ``x`` took over all of them: the range the scale covers.
"""

from __future__ import annotations

import torch

from ascendc_pack.frontend.executor import run_model, run_reference_tactic

QUANTIZED_KINDS = ("linear", "conv")


def activation_ranges(model, weights: dict, input_sets: list) -> dict[str, tuple[float, float]]:
    """``{step name: (lo, hi)}``: the range of every GEMM / convolution step's input ``x`` over
    ``input_sets`` (steps no run reached are absent: they get no int8 candidate)."""
    ranges: dict[str, tuple[float, float]] = {}

    def run(step, env: dict) -> torch.Tensor:
        name = step.bind.get("x") if step.tactic_kind in QUANTIZED_KINDS else None
        x = env.get(name) if name else None
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            lo, hi = float(x.min()), float(x.max())
            old = ranges.get(step.name)
            ranges[step.name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        return run_reference_tactic(step, env)

    with torch.no_grad():
        for inputs in input_sets:
            run_model(model, weights, [t.clone() for t in inputs], run_tactic=run)
    return ranges


__all__ = ["QUANTIZED_KINDS", "activation_ranges"]
