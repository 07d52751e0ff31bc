"""The one table of epilogue ops: the pointwise ops a heavy step (GEMM, convolution) fuses.

Everything the code knows about an epilogue op is one :class:`EpilogueOp` row of
:data:`EPILOGUE`: the ATen op a tactic's ``replaces`` names, the pattern capture decomposes it
into (what :mod:`ascendc_pack.tactics.match` finds), the oneDNN post-op, the eager PyTorch
function every kernel is checked against, the C statement the generated kernels run and its
cost in the kernels' cost models. Which ops a kernel family *takes* is that family's policy (a
tuple of names beside its generator); what an op *is* lives only here.

The generated kernels' version hashes cover this module (:mod:`ascendc_pack.kernels.family`):
editing a row rebuilds every cached kernel that could have used it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class EpilogueOp:
    """One epilogue op.

    ``binary``: it combines ``y`` with a residual input (``y op other``); ``aten``/``aten_kwargs``:
    the ATen op of the captured graph it stands for (``aten::relu``; a binary op's ``.Tensor``
    overload is implied); ``pattern``: its decomposed form as capture produces it (``(op, args)``
    per step; ``"v"`` the input, an int an earlier step's result; None when capture never produces
    it); ``onednn``: ``(attr, algorithm)`` of torch's ``mkldnn::*_pointwise`` ops (None: oneDNN
    does not fuse it); ``eager``: the reference; ``c``: a C statement on the float ``v``
    (kernel_math.h functions; None for binary ops, whose C depends on the residual's layout);
    ``vector``: ``c`` is also valid on a GCC vector ``v``; ``cycles``: per vector in registers (the
    GEMM and direct-convolution cost models), ``pass_cycles``: per vector in a separate pass over a
    finished row (the depthwise cost model, measured standalone on the build host: silu ~1 ns per
    float)."""

    name: str
    binary: bool
    aten: str
    eager: Callable
    cycles: float
    pass_cycles: float
    aten_kwargs: tuple = ()
    pattern: tuple | None = None
    onednn: tuple[str, str | None] | None = None
    c: str | None = None
    vector: bool = False


_CLAMP6 = "{ auto t = v + 3.0f; t = t < 0.0f ? 0.0f : t; t = t > 6.0f ? 6.0f : t; "

EPILOGUE = MappingProxyType({op.name: op for op in (
    EpilogueOp("relu", False, "aten::relu", torch.relu, 1, 1, pattern=(("aten.relu.default", ("v",)),),
               onednn=("relu", None), c="v = v < 0.0f ? 0.0f : v;", vector=True),
    EpilogueOp("relu6", False, "aten::hardtanh", F.relu6, 2, 2, aten_kwargs=(("min_val", 0.0), ("max_val", 6.0)),
               c="v = v < 0.0f ? 0.0f : v; v = v > 6.0f ? 6.0f : v;", vector=True),
    EpilogueOp("sigmoid", False, "aten::sigmoid", torch.sigmoid, 10, 30, pattern=(("aten.sigmoid.default", ("v",)),),
               onednn=("sigmoid", None), c="v = ap_sigmoid(v);"),
    EpilogueOp("tanh", False, "aten::tanh", torch.tanh, 12, 30, pattern=(("aten.tanh.default", ("v",)),),
               onednn=("tanh", None), c="v = ap_tanh(v);"),
    EpilogueOp("silu", False, "aten::silu", F.silu, 10, 24,
               pattern=(("aten.sigmoid.default", ("v",)), ("aten.mul.Tensor", ("v", 0))),
               onednn=("swish", None), c="v = v / (1.0f + ap_exp(-v));"),
    EpilogueOp("gelu", False, "aten::gelu", F.gelu, 12, 60, aten_kwargs=(("approximate", "none"),),
               pattern=(("aten.mul.Tensor", ("v", 0.5)), ("aten.mul.Tensor", ("v", 0.7071067811865476)),
                        ("aten.erf.default", (1,)), ("aten.add.Tensor", (2, 1)), ("aten.mul.Tensor", (0, 3))),
               onednn=("gelu", "none"), c="v = ap_gelu(v);"),
    EpilogueOp("gelu_tanh", False, "aten::gelu", lambda t: F.gelu(t, approximate="tanh"), 12, 35,
               aten_kwargs=(("approximate", "tanh"),),
               pattern=(("aten.mul.Tensor", ("v", "v")), ("aten.mul.Tensor", (0, "v")),
                        ("aten.mul.Tensor", (1, 0.044715)), ("aten.add.Tensor", ("v", 2)),
                        ("aten.mul.Tensor", (3, 0.7978845608028654)), ("aten.mul.Tensor", ("v", 0.5)),
                        ("aten.tanh.default", (4,)), ("aten.add.Tensor", (6, 1)), ("aten.mul.Tensor", (5, 7))),
               onednn=("gelu", "tanh"),
               c="v = ap_gelu_tanh(v);"),
    EpilogueOp("hardswish", False, "aten::hardswish", F.hardswish, 5, 5,
               pattern=(("aten.add.Tensor", ("v", 3)), ("aten.clamp.default", (0, 0)),
                        ("aten.clamp.default", (1, None, 6)), ("aten.mul.Tensor", ("v", 2)),
                        ("aten.div.Tensor", (3, 6))),
               onednn=("hardswish", None), c=_CLAMP6 + "v = v * t / 6.0f; }", vector=True),
    EpilogueOp("hardsigmoid", False, "aten::hardsigmoid", F.hardsigmoid, 4, 4,
               pattern=(("aten.add.Tensor", ("v", 3)), ("aten.clamp.default", (0, 0)),
                        ("aten.clamp.default", (1, None, 6)), ("aten.div.Tensor", (2, 6))),
               onednn=("hardsigmoid", None), c=_CLAMP6 + "v = t / 6.0f; }", vector=True),
    EpilogueOp("add", True, "aten::add", torch.add, 1, 1, vector=True),
    EpilogueOp("sub", True, "aten::sub", torch.sub, 1, 1, vector=True),
    EpilogueOp("mul", True, "aten::mul", torch.mul, 1, 1, vector=True),
)})
"""Every epilogue op by name (the matcher tries the unary patterns in this order)."""

UNARY = tuple(n for n, op in EPILOGUE.items() if not op.binary)
BINARY = tuple(n for n, op in EPILOGUE.items() if op.binary)


def c_statement(name: str) -> str:
    """The C statement of unary op ``name`` on the float ``v``."""
    op = EPILOGUE[name]
    if op.c is None:
        raise KeyError(f"epilogue op {name!r} has no C statement of its own (a binary op)")
    return op.c


def eager(name: str, y: torch.Tensor, other: torch.Tensor | None = None) -> torch.Tensor:
    """Op ``name`` applied to ``y`` (and the residual ``other``) in eager PyTorch."""
    op = EPILOGUE[name]
    return op.eager(y, other) if op.binary else op.eager(y)


__all__ = ["EpilogueOp", "EPILOGUE", "UNARY", "BINARY", "c_statement", "eager"]
