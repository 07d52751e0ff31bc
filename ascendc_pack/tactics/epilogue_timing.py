"""How PGO times a tactic step's epilogue as the graph will run it (used by :mod:`.tune`).

Candidate 0 (the heavy op as captured) runs its pointwise epilogue as the fused kernels the fuser
makes of it (:func:`epilogue_program`). A bfloat16 library candidate (oneDNN's GEMM) keeps only its
core when lowered (:func:`~ascendc_pack.tactics.lower_casts.core`): its conversion back and its
epilogue (GELU, a residual add, a BatchNorm) become a fused kernel of their own, a pass over the
output that the generated (AMX) kernels do in their epilogue. So PGO times such a core followed by
candidate 0's epilogue kernels, or by the conversion back alone for a step without an epilogue
(:func:`epilogue_tail`, :func:`cast_back`; :func:`core_timed` says which candidates).
vit_s16's bfloat16 fc1 + GELU: oneDNN's core alone timed 145-165 µs against the AMX kernel's 180
with the GELU, some builds took oneDNN, and that bundle ran 9.65 ms a call against 7.70 for the
all-AMX one. The kernels are candidate 0's tiling (the fused cost model's first; single-threaded
for that GELU: 264 µs, ~125 tuned in the graph), so the tail errs against the library candidate.
"""

from __future__ import annotations

import torch

from ascendc_pack.frontend.executor import run_aten
from ascendc_pack.ir.program import FusedStep, Program, TacticStep
from ascendc_pack.tactics.families import registry
from ascendc_pack.tactics.lower_casts import core

EPILOGUE_KINDS = ("linear", "conv")
"""Steps whose candidate-0 program is the heavy op then its pointwise epilogue, if any (an
attention step's is the whole unfused attention: no tail of its own)."""


def epilogue_program(step: TacticStep, values: dict) -> Program:
    """The step's ATen steps with their pointwise tail fused (what the fuser makes of them)."""
    from ascendc_pack.passes.fuse import fuse_program

    return fuse_program(Program(step.reference_inputs(), list(step.steps), list(step.outputs), values))


def core_timed(t) -> bool:
    """A bfloat16 library (dispatcher) candidate that PGO times by its core. Not an int8 one: each
    int8 step quantizes its input in a pass of its own, which an int8 producer's epilogue joins
    (timed with the tail, bert_4l's int8 bundle took float32 GEMMs for its fc1 and ran 0.63x ONNX
    Runtime int8 instead of 0.52x)."""
    return t.family == registry.DISPATCH and t.param("precision", "fp32") == "bf16" and core(t) is not None


def epilogue_tail(step: TacticStep, fused: Program | None, kernels: dict, env: dict, out: torch.Tensor):
    """A runner of ``fused``'s (the step's :func:`epilogue_program`) fused kernels on their inputs,
    computed once here from ``env``; for a step without such kernels (a bias-only GEMM) a pass
    converting a bfloat16 ``out`` (the step's output) back to float32 (:func:`cast_back`); None
    for a step of another kind or when a kernel is missing from ``kernels`` (by step name: it did
    not compile)."""
    if step.tactic_kind not in EPILOGUE_KINDS:
        return None
    steps = fused.fused_steps() if fused is not None else []
    if not steps:
        return cast_back(out)
    if not all(f.name in kernels for f in steps):
        return None
    vals, calls = {n: env[n] for n in fused.inputs}, []
    with torch.no_grad():
        for s in fused.steps:
            if isinstance(s, FusedStep):
                args = [vals[n] for n in s.inputs]
                vals.update(zip(s.outputs, kernels[s.name](args)))
                calls.append((kernels[s.name], args))
            else:
                run_aten(s, vals)
    return lambda: [kernel(args) for kernel, args in calls]


def cast_back(out: torch.Tensor):
    """A pass converting a bfloat16 tensor of ``out``'s shape and layout to float32: what a
    bias-only step's lowered core leaves to a fused cast kernel of its own where its consumer is
    not a fused kernel (vit_s16's qkv feeds the attention step: oneDNN's core timed 120.6 µs
    against the AMX kernel's 126.1, and with oneDNN on the twelve qkv steps the bfloat16 bundle ran
    9.46 ms against 8.16: the cast took 53 µs a step). A consumer kernel that reads bfloat16 saves
    the pass, so this errs against the library candidate, as the epilogue kernels do."""
    src = torch.empty_like(out, dtype=torch.bfloat16)
    dst = torch.empty_like(out)
    return lambda: dst.copy_(src)


def then(first, second):
    """``first()`` then ``second()``, returning ``first``'s result (one timed runner)."""
    def run():
        out = first()
        second()
        return out

    return run


__all__ = ["EPILOGUE_KINDS", "cast_back", "core_timed", "epilogue_program", "epilogue_tail", "then"]
