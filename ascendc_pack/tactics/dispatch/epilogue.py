"""Pointwise ops that follow a heavy op (its epilogue), fused into it where the tactic can.

Semantics: ``out = unary(binary(affine(y), other))`` with ``y = op(x) + bias``, where
``affine`` is a per-output-channel ``y * scale + shift`` (an eval-mode BatchNorm, folded into the
weights at build), ``binary`` an elementwise op with another activation of ``y``'s shape (the
residual add), ``unary`` an activation. The oneDNN attribute strings below are those torch 2.13's
``mkldnn::_linear_pointwise`` / ``_convolution_pointwise(.binary)`` accept (ATen's
``fusion_unary_attr_map`` / ``fusion_binary_alg_map``, checked by tests/test_tactics.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascendc_pack.ir.epilogue import BINARY as EPILOGUE_BINARY
from ascendc_pack.ir.epilogue import EPILOGUE, eager
from ascendc_pack.tactics.dispatch.spec import Call, Ref

UNARY: dict[str, tuple[str, str | None, str, tuple]] = {
    n: (*op.onednn, op.aten, op.aten_kwargs) for n, op in EPILOGUE.items() if not op.binary and op.onednn}
"""our name -> (oneDNN attr, oneDNN algorithm, ATen op, ATen kwargs): the unary ops oneDNN fuses
(:data:`ascendc_pack.ir.epilogue.EPILOGUE`)."""
BINARY: dict[str, str] = {n: EPILOGUE[n].aten for n in EPILOGUE_BINARY}
"""binary(y, other) -> its ATen op; "sub" is y - other."""


@dataclass(frozen=True)
class Epilogue:
    """The pointwise ops after a heavy op: see the module docstring for the order."""

    affine: bool = False
    binary: str | None = None
    unary: str | None = None

    def __post_init__(self):
        if self.unary is not None and self.unary not in UNARY:
            raise ValueError(f"unknown unary epilogue {self.unary!r}; known: {sorted(UNARY)}")
        if self.binary is not None and self.binary not in BINARY:
            raise ValueError(f"unknown binary epilogue {self.binary!r}; known: {sorted(BINARY)}")

    @property
    def replaces(self) -> tuple[str, ...]:
        """The ATen ops of the captured graph this epilogue stands for, in order."""
        ops: list[str] = ["aten::mul.Tensor", "aten::add.Tensor"] if self.affine else []
        if self.binary:
            ops.append(BINARY[self.binary] + ".Tensor")
        if self.unary:
            ops.append(UNARY[self.unary][2])
        return tuple(ops)

    def to_json(self) -> dict:
        return {"affine": self.affine, "binary": self.binary, "unary": self.unary}

    @property
    def label(self) -> str:
        parts = (["affine"] if self.affine else []) + ([self.binary] if self.binary else []) \
            + ([self.unary] if self.unary else [])
        return "+".join(parts) or "none"


def onednn_unary(unary: str | None) -> tuple[str, tuple, str | None]:
    """``(attr, scalars, algorithm)`` arguments of the oneDNN pointwise ops for ``unary``."""
    if unary is None:
        return "none", (), None
    attr, algorithm, _, _ = UNARY[unary]
    return attr, (), algorithm


def aten_calls(epi: Epilogue, src: str, out: str, *, inplace: bool, affine: bool | None = None,
               binary: bool | None = None, unary: bool | None = None) -> list[Call]:
    """ATen calls applying (the chosen parts of) ``epi`` to tensor ``src``; the result is ``out``.

    ``inplace`` writes into ``src`` (only when ``src`` is a fresh result the tactic owns); the
    parts default to those ``epi`` has. The affine part reads ``scale_b`` / ``shift_b`` (scale
    and shift viewed to broadcast over ``y``; see :func:`affine_view_calls`) and ``other`` is
    the binary operand.
    """
    affine = epi.affine if affine is None else affine and epi.affine
    binary = bool(epi.binary) if binary is None else binary and bool(epi.binary)
    unary = bool(epi.unary) if unary is None else unary and bool(epi.unary)
    suffix = "_" if inplace else ""
    calls: list[Call] = []
    cur = src

    def step(op: str, *args, kwargs=()):
        nonlocal cur
        name = f"{out}_{len(calls)}"
        calls.append(Call(op, (Ref(cur), *args), tuple(kwargs), out=name))
        cur = name

    if affine:
        step(f"aten::mul{suffix}.Tensor", Ref("scale_b"))
        step(f"aten::add{suffix}.Tensor", Ref("shift_b"))
    if binary:
        step(f"{BINARY[epi.binary]}{suffix}.Tensor", Ref("other"))
    if unary:
        _, _, op, kw = UNARY[epi.unary]
        step(op + suffix, kwargs=kw)
    if not calls:
        return []
    last = calls[-1]
    calls[-1] = Call(last.op, last.args, last.kwargs, out=out)
    return calls


def affine_view_calls(channels_dim: int, ndim: int) -> list[Call]:
    """Build-time calls viewing the 1-D ``scale`` / ``shift`` so they broadcast over an output
    of ``ndim`` dims whose channels are dim ``channels_dim``."""
    shape = tuple(-1 if d == channels_dim else 1 for d in range(ndim))
    return [Call("aten::view", (Ref("scale"), shape), out="scale_b"),
            Call("aten::view", (Ref("shift"), shape), out="shift_b")]


def fold_affine_calls(weight: str, bias: str | None, weight_ndim: int) -> list[Call]:
    """Build-time calls folding ``y * scale + shift`` into the weights (output channels are the
    weight's dim 0): ``weight_f = weight * scale``, ``bias_f = bias * scale + shift``."""
    shape = (-1,) + (1,) * (weight_ndim - 1)
    calls = [Call("aten::view", (Ref("scale"), shape), out="scale_w"),
             Call("aten::mul.Tensor", (Ref(weight), Ref("scale_w")), out="weight_f")]
    if bias is None:
        calls.append(Call("aten::clone", (Ref("shift"),), out="bias_f"))
    else:
        calls += [Call("aten::mul.Tensor", (Ref(bias), Ref("scale")), out="bias_scaled"),
                  Call("aten::add.Tensor", (Ref("bias_scaled"), Ref("shift")), out="bias_f")]
    return calls


def apply_eager(epi: Epilogue, y: torch.Tensor, *, other=None, scale=None, shift=None,
                channels_dim: int = 1) -> torch.Tensor:
    """The reference: ``epi`` applied to ``y`` with plain eager PyTorch."""
    if epi.affine:
        shape = [1] * y.dim()
        shape[channels_dim] = -1
        y = y * scale.view(shape) + shift.view(shape)
    if epi.binary:
        y = eager(epi.binary, y, other)
    if epi.unary:
        y = eager(epi.unary, y)
    return y
