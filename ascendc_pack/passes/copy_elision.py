"""Copy elision: a ``clone`` (or a pad by zero) into the layout its input already has becomes a view of the input.

Capture turns every eval-mode ``nn.Dropout`` / ``DropPath`` into an ``aten.clone`` (timm's ViT has
two per block: one copies the MLP's 197x1536 hidden activation, 2.5 % of vit_s16's call), and so
is a ``.contiguous()`` or ``clone()`` of a tensor that already has that layout. The captured
program is functional (no step writes a value in place), so such a copy holds the same bytes as
its input for the whole call: the pass makes it ``aten.alias`` of the input, a view the fuser
folds into its readers' loads and the graph renders once at load.

A clone stays a copy when it changes the layout (a relayout: its readers may need it), when its
result is a program output (an output owns its memory), when its input is, through views, a
program input (the user's tensors and the weights must not be aliased by values the call
returns or hands on), and in a program with an in-place step. The pipeline runs it on the
captured program after constant folding, and again once the tactic steps are lowered (a lowered
step may return the layout a clone after it makes: an attention kernel's ``[B, L, H, E]``
output before ``permute(...).contiguous()``). Outputs that are views of one value share its
memory, as eager's (eval-mode dropout returns its input itself).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ascendc_pack_runtime.tensor_meta import is_dense

from ascendc_pack.ir.ops import VIEW_OPS
from ascendc_pack.ir.program import AtenStep, CondStep, ModelProgram, Program, Ref

log = logging.getLogger("ascendc_pack")

_SAME_LAYOUT_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def elide_copies(model: ModelProgram) -> ModelProgram:
    """``model`` with its layout-preserving clones made views (see the module docstring)."""
    program, n = _elide(model.program)
    if n:
        log.info("copy elision: %d clone(s) of a value already in that layout are views", n)
    return dataclasses.replace(model, program=program)


def _elide(p: Program) -> tuple[Program, int]:
    if any(in_place_step(s) for s in p.steps):
        return p, 0
    producer = {o: s for s in p.steps for o in s.outputs if o is not None}
    outputs, inputs, values = set(p.outputs), set(p.inputs), dict(p.values)
    steps, n = [], 0
    for s in p.steps:
        if isinstance(s, CondStep):
            then_b, a = _elide(s.then_branch)
            else_b, b = _elide(s.else_branch)
            s, n = dataclasses.replace(s, then_branch=then_b, else_branch=else_b), n + a + b
        elif _same_layout_clone(s, p.values) and s.outputs[0] not in outputs \
                and _root(s.args[0].name, producer) not in inputs:
            values[s.outputs[0]] = values[s.args[0].name]  # the strides of size-1 dims may differ
            s, n = AtenStep("aten.alias.default", [s.args[0]], {}, list(s.outputs)), n + 1
        steps.append(s)
    return dataclasses.replace(p, steps=steps, values=values), n


def _same_layout_clone(s, values: dict) -> bool:
    """A clone, or a pad by zero everywhere (torchvision's swin pads every block's input to whole
    windows: by nothing at 224², still a copy), into the layout its input already has."""
    if not (isinstance(s, AtenStep) and not s.multi and s.args and isinstance(s.args[0], Ref)):
        return False
    clone = s.op == "aten.clone.default" and len(s.args) == 1 and set(s.kwargs) <= {"memory_format"} \
        and s.kwargs.get("memory_format") in _SAME_LAYOUT_FORMATS
    no_pad = s.op == "aten.constant_pad_nd.default" and len(s.args) in (2, 3) and not s.kwargs \
        and isinstance(s.args[1], (list, tuple)) and not any(s.args[1])
    if not (clone or no_pad):
        return False
    src, dst = values.get(s.args[0].name), values.get(s.outputs[0])
    return src is not None and dst is not None and src.stride is not None and dst.stride is not None \
        and src.shape == dst.shape and src.dtype == dst.dtype and is_dense(src.shape, src.stride) \
        and all(a == b for n, a, b in zip(src.shape, src.stride, dst.stride) if n != 1)


def _root(name: str, producer: dict) -> str:
    """The value ``name`` is a view of (itself when it is not a view)."""
    s = producer.get(name)
    while isinstance(s, AtenStep) and s.op in VIEW_OPS and s.args and isinstance(s.args[0], Ref):
        name = s.args[0].name
        s = producer.get(name)
    return name


def in_place_step(s) -> bool:
    """An ATen step writing one of its inputs (``add_``, ``copy_``): the program is not functional."""
    name = s.op.split(".")[1] if isinstance(s, AtenStep) and s.op.count(".") >= 1 else ""
    return name.endswith("_")


__all__ = ["elide_copies", "in_place_step"]
