"""Convolution tactics (2-D, incl. grouped, depthwise and 1x1), then the epilogue.

Candidates, each with an input ``layout`` (the memory format it runs in: ``contiguous`` or
``channels_last``; an input arriving in the other format is converted first, which a chain of
convolutions planned in one layout does once at its ends, not per step):

* ``aten``: ``aten::convolution`` as captured, the epilogue as separate ATen ops. Candidate 0.
* ``aten_cl``: the same op on channels_last input and weight (ATen then runs oneDNN in NHWC,
  but reorders the weight on every call), the epilogue in place.
* ``onednn`` / ``onednn_cl``: ``mkldnn::_convolution_pointwise(.binary)`` on a weight reordered
  at load by ``mkldnn::_reorder_convolution_weight`` for this host and input shape, with bias
  and one unary, or one binary (residual add) followed by relu, fused (any other unary after a
  binary runs in place). Its output is channels_last whatever
  the input's format (``out_layout``). An eval BatchNorm-like affine is folded into the weights
  at build by every tactic but ``aten``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ascendc_pack.tactics.dispatch.epilogue import Epilogue, aten_calls, affine_view_calls, apply_eager, fold_affine_calls, onednn_unary
from ascendc_pack.tactics.dispatch.gemm import onednn_supports
from ascendc_pack.tactics.dispatch.spec import Call, MemoryFormat, Prepack, Ref, Tactic

LAYOUTS = ("contiguous", "channels_last")
CL = MemoryFormat("channels_last")


def window_out(step) -> tuple[int, int]:
    """Output height and width of a sliding-window step (``x_shape``, ``kernel``, ``stride``,
    ``padding``, ``dilation``: a convolution or a pooling)."""
    return tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                 for s, p, d, k, st in zip(step.x_shape[2:], step.padding, step.dilation, step.kernel, step.stride))


@dataclass(frozen=True)
class ConvStep:
    """``aten::convolution`` of ``x`` [N, C, H, W] by a constant weight [O, C/groups, kh, kw].

    ``layout``: the memory format ``x`` arrives in. Tensor names: ``x``, ``weight``, ``bias``
    [O], ``other`` (binary epilogue, the output's shape), ``scale`` / ``shift`` [O] (affine).
    """

    x_shape: tuple[int, int, int, int]
    out_channels: int
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    bias: bool = True
    epilogue: Epilogue = field(default_factory=Epilogue)
    layout: str = "contiguous"
    dtype: str = "float32"
    kind = "conv"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.x_shape[1] % self.groups or self.out_channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide the {self.x_shape[1]} input and "
                             f"{self.out_channels} output channels")

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, self.x_shape[1] // self.groups, *self.kernel)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.x_shape[0], self.out_channels, *window_out(self))

    def to_json(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the step reads, by name."""
        s: dict[str, tuple[int, ...]] = {"x": self.x_shape, "weight": self.weight_shape}
        if self.bias:
            s["bias"] = (self.out_channels,)
        if self.epilogue.binary:
            s["other"] = self.out_shape
        if self.epilogue.affine:
            s["scale"] = s["shift"] = (self.out_channels,)
        return s


def _replaces(step: ConvStep) -> tuple[str, ...]:
    return ("aten::convolution", *step.epilogue.replaces)


def _geometry(step: ConvStep) -> tuple:
    return tuple(step.padding), tuple(step.stride), tuple(step.dilation), step.groups


def _tactic(step: ConvStep, name: str, layout: str, prepack, calls, output: str, out_layout: str) -> Tactic:
    params = (("epilogue", step.epilogue.label), ("layout", layout), ("out_layout", out_layout))
    return Tactic("conv", name, _replaces(step), tuple(step.shapes()), tuple(prepack), tuple(calls), output,
                  params)


def _aten_conv(step: ConvStep, x: str, w: str, b: str | None) -> Call:
    return Call("aten::convolution", (Ref(x), Ref(w), Ref(b) if b else None, tuple(step.stride),
                                      tuple(step.padding), tuple(step.dilation), False, (0, 0), step.groups),
                out="y")


def aten_tactic(step: ConvStep) -> Tactic:
    """Candidate 0: ``aten::convolution`` as captured, the epilogue as separate ATen ops."""
    epi = step.epilogue
    prepack = [Prepack(c, "build") for c in affine_view_calls(1, 4)] if epi.affine else []
    post = aten_calls(epi, "y", "out", inplace=False)
    calls = [_aten_conv(step, "x", "weight", "bias" if step.bias else None), *post]
    return _tactic(step, "aten", step.layout, prepack, calls, "out" if post else "y", step.layout)


def _folded(step: ConvStep) -> tuple[list[Prepack], str, str | None]:
    """Build-time affine folding shared by the non-captured tactics."""
    if not step.epilogue.affine:
        return [], "weight", ("bias" if step.bias else None)
    calls = fold_affine_calls("weight", "bias" if step.bias else None, 4)
    return [Prepack(c, "build") for c in calls], "weight_f", "bias_f"


def _to_layout(step: ConvStep, layout: str) -> list[Call]:
    """Convert ``x`` to ``layout`` when it arrives in the other format."""
    if layout == step.layout:
        return []
    fmt = CL if layout == "channels_last" else MemoryFormat("contiguous_format")
    return [Call("aten::contiguous", (Ref("x"),), (("memory_format", fmt),), out="x_l")]


def aten_cl_tactic(step: ConvStep) -> Tactic:
    """``aten::convolution`` in channels_last (weight relaid at build), epilogue in place."""
    prepack, w, b = _folded(step)
    prepack.append(Prepack(Call("aten::contiguous", (Ref(w),), (("memory_format", CL),), out="weight_cl"), "build"))
    relayout = _to_layout(step, "channels_last")
    x = "x_l" if relayout else "x"
    post = aten_calls(step.epilogue, "y", "out", inplace=True, affine=False)
    calls = [*relayout, _aten_conv(step, x, "weight_cl", b), *post]
    return _tactic(step, "aten_cl", "channels_last", prepack, calls, "out" if post else "y", "channels_last")


def onednn_tactic(step: ConvStep, layout: str) -> Tactic:
    """oneDNN convolution on a weight packed at load for this input shape, post-ops fused."""
    epi = step.epilogue
    prepack, w, b = _folded(step)
    padding, stride, dilation, groups = _geometry(step)
    prepack.append(Prepack(Call("mkldnn::_reorder_convolution_weight",
                                (Ref(w), padding, stride, dilation, groups, tuple(step.x_shape)), out="weight_packed"),
                           "load", isa_dependent=True))
    relayout = _to_layout(step, layout)
    x = Ref("x_l" if relayout else "x")
    bias = Ref(b) if b else None
    attr, scalars, algorithm = onednn_unary(epi.unary)
    post: list[Call] = []
    if epi.binary:
        # after a binary post-op the convolution fuses only relu (ATen's fusion_unary_alg_map)
        fused = epi.unary == "relu"
        conv = Call("mkldnn::_convolution_pointwise.binary",
                    (x, Ref("other"), Ref("weight_packed"), bias, padding, stride, dilation, groups, epi.binary,
                     None, attr if fused else None, scalars, algorithm if fused else None), out="y")
        if not fused:
            post = aten_calls(epi, "y", "out", inplace=True, affine=False, binary=False)
    else:
        conv = Call("mkldnn::_convolution_pointwise",
                    (x, Ref("weight_packed"), bias, padding, stride, dilation, groups, attr, scalars, algorithm),
                    out="y")
    name = "onednn_cl" if layout == "channels_last" else "onednn"
    return _tactic(step, name, layout, prepack, [*relayout, conv, *post], "out" if post else "y", "channels_last")


def conv_tactics(step: ConvStep) -> list[Tactic]:
    """The candidates for ``step`` that this torch build and CPU can run; ``aten`` first."""
    out = [aten_tactic(step), aten_cl_tactic(step)]
    if onednn_supports(step.dtype):
        out += [onednn_tactic(step, "contiguous"), onednn_tactic(step, "channels_last")]
    return out


def conv_reference(step: ConvStep, env: dict) -> torch.Tensor:
    """Eager PyTorch's answer for ``step`` on the named tensors ``env``."""
    y = torch.nn.functional.conv2d(env["x"], env["weight"], env.get("bias"), step.stride, step.padding,
                                   step.dilation, step.groups)
    return apply_eager(step.epilogue, y, other=env.get("other"), scale=env.get("scale"), shift=env.get("shift"),
                       channels_dim=1)
