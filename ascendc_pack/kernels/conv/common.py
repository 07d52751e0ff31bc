"""What the generated convolution kernels share (``dwconv``: depthwise, ``directconv``: dense; the
max pooling shares the geometry): the epilogue steps they fuse (the ops themselves:
:mod:`ascendc_pack.ir.epilogue`), field checks and output geometry, BatchNorm folding, and the
launchers' operand checks and eager epilogue."""

from __future__ import annotations

import torch

from ascendc_pack_runtime.tensor_meta import same_layout

from ascendc_pack.cache import check_component
from ascendc_pack.ir.epilogue import eager

UNARY_OPS = ("relu", "relu6", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish", "hardsigmoid", "tanh")
EPILOGUE_OPS = ("add",) + UNARY_OPS
"""Pointwise steps the kernels fuse, applied in order after the bias; ``add`` adds the residual
input (NHWC, the output's shape; at most one)."""

Pair = tuple[int, int]

def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """Output positions along one axis of a convolution."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def interior(out: int, size: int, k: int, s: int, p: int, d: int) -> tuple[int, int]:
    """Output positions ``[lo, hi)`` whose every tap lies inside the input (no padding read);
    ``hi == lo`` when there are none."""
    lo = min(out, -(-p // s))
    last = size - 1 + p - (k - 1) * d  # largest o * s with the last tap inside
    hi = min(out, last // s + 1) if last >= 0 else 0
    return lo, max(lo, hi)


def fold_affine(weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor,
                shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold a per-channel ``y * scale + shift`` after the convolution (an eval BatchNorm:
    ``scale = gamma / sqrt(var + eps)``, ``shift = beta - mean * scale``) into ``(weight, bias)``
    (the same arithmetic as the tactics' ``fold_affine_calls``)."""
    w = weight * scale.view(-1, *([1] * (weight.dim() - 1)))
    b = shift.clone() if bias is None else bias * scale + shift
    return w, b


class ConvGeometry:
    """What a convolution spec (a frozen dataclass with ``name``, ``n``, ``h``, ``w``, ``kh``,
    ``kw``, ``stride``, ``padding``, ``dilation``, ``bias`` and ``epilogue``) derives from its
    shape, and the checks of it every generated convolution kernel makes. Subclasses name their
    ``error`` class and ``kind`` (the messages' "depthwise conv k1")."""

    error = ValueError
    kind = "conv"

    def check_fields(self, sizes: tuple[str, ...]) -> None:
        """The kernel name (a cache path component), the positive ints ``sizes``, and ``stride``
        (>= 1), ``padding`` (>= 0) and ``dilation`` (>= 1) as (rows, columns) pairs - an int is
        both - stored as tuples; else ``error`` naming the field."""
        try:
            check_component(self.name, f"{self.kind} kernel name")
        except ValueError as e:
            raise self.error(str(e)) from None
        for what in sizes:
            v = getattr(self, what)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise self.error(f"{self.kind} {self.name}: {what} must be a positive int, got {v!r}")
        for what, least in (("stride", 1), ("padding", 0), ("dilation", 1)):
            value = getattr(self, what)
            v = (value, value) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
            if len(v) != 2 or any(not isinstance(e, int) or isinstance(e, bool) or e < least for e in v):
                raise self.error(f"{self.kind} {self.name}: {what} must be an int or a pair of ints >= {least} "
                                 f"(rows, columns), got {value!r}")
            object.__setattr__(self, what, v)

    def check_geometry(self) -> None:
        """One residual ``add`` at most, and an output of one position at least along each axis."""
        if self.epilogue.count("add") > 1:
            raise self.error(f"{self.kind} {self.name}: epilogue has {self.epilogue.count('add')} 'add' steps, the "
                             f"kernel takes one residual input; add the others separately")
        for axis, size, k, s, p, d in self._axes():
            if out_size(size, k, s, p, d) < 1:
                raise self.error(f"{self.kind} {self.name}: the dilated kernel ({d * (k - 1) + 1}) is larger than "
                                 f"the padded input {axis} ({size + 2 * p}); no output. Increase padding or use a "
                                 f"smaller kernel or dilation")

    def _axes(self):
        return [("height", self.h, self.kh, self.stride[0], self.padding[0], self.dilation[0]),
                ("width", self.w, self.kw, self.stride[1], self.padding[1], self.dilation[1])]

    @property
    def oh(self) -> int:
        return out_size(*self._axes()[0][1:])

    @property
    def ow(self) -> int:
        return out_size(*self._axes()[1][1:])

    @property
    def interior_rows(self) -> tuple[int, int]:
        return interior(self.oh, *self._axes()[0][1:])

    @property
    def interior_cols(self) -> tuple[int, int]:
        return interior(self.ow, *self._axes()[1][1:])

    @property
    def residual(self) -> bool:
        return "add" in self.epilogue

    @property
    def n_inputs(self) -> int:
        return 2 + int(self.bias) + int(self.residual)


def epilogue_operands(spec, bias, residual, channels: int, check_residual) -> list:
    """The bias and residual operands a convolution kernel's launch passes after ``x`` and the
    weight, each checked against ``spec`` (a :class:`ConvGeometry`): a bias ``[channels]`` when it
    has one, a residual in the output's layout (``check_residual(residual)``) when it adds one,
    and neither otherwise."""
    kernel = f"{spec.kind} {spec.name}"
    ins = []
    if spec.bias:
        check_dense(spec.error, kernel, "bias (the kernel adds one)", bias, (channels,), "")
        ins.append(bias)
    elif bias is not None:
        raise spec.error(f"{kernel}: the spec has no bias, got one; fold it into the spec")
    if spec.residual:
        if residual is None:
            raise spec.error(f"{kernel}: the epilogue adds a residual, got none")
        check_residual(residual)
        ins.append(residual)
    elif residual is not None:
        raise spec.error(f"{kernel}: the epilogue has no 'add', got a residual")
    return ins


def apply_eager_epilogue(epilogue, y: torch.Tensor, residual=None) -> torch.Tensor:
    """The epilogue steps with torch's ops (the reference of every candidate)."""
    for op in epilogue:
        y = y + residual if op == "add" else eager(op, y)
    return y


def check_nhwc(error, kernel: str, what: str, t, n: int, c: int, h: int, w: int,
               dtype: torch.dtype = torch.float32) -> None:
    """``t`` must be a CPU ``dtype`` [n, c, h, w] channels_last tensor (NHWC memory), or that memory
    shaped [n, h, w, c]; else ``error`` naming ``kernel`` (e.g. "depthwise conv k1") and the fix."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device.type != "cpu":
        got = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise error(f"{kernel}: {what} must be a CPU {str(dtype).removeprefix('torch.')} tensor, got {got}")
    nchw = ((n, c, h, w), (h * w * c, 1, w * c, c))
    nhwc = ((n, h, w, c), (h * w * c, w * c, c, 1))
    if not any(same_layout(t.shape, t.stride(), *layout) for layout in (nchw, nhwc)):
        raise error(f"{kernel}: {what} is {list(t.shape)} with strides {t.stride()}; the kernel reads NHWC "
                    f"memory: a channels_last {list(nchw[0])} tensor (x.contiguous(memory_format="
                    f"torch.channels_last)) or a contiguous {list(nhwc[0])}")


def check_dense(error, kernel: str, what: str, t, shape, hint: str, dtype: torch.dtype = torch.float32) -> None:
    """``t`` must be a contiguous CPU tensor of ``shape`` and ``dtype``."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device.type != "cpu" \
            or tuple(t.shape) != tuple(shape) or not t.is_contiguous():
        got = f"{type(t).__name__}" if not isinstance(t, torch.Tensor) else \
            f"{t.dtype} {list(t.shape)} strides {t.stride()} on {t.device}"
        raise error(f"{kernel}: {what} must be a contiguous CPU {str(dtype).removeprefix('torch.')} {list(shape)} "
                    f"tensor{hint}, got {got}")


__all__ = ["UNARY_OPS", "EPILOGUE_OPS", "Pair", "ConvGeometry", "epilogue_operands", "out_size", "interior", "fold_affine", "apply_eager_epilogue", "check_nhwc", "check_dense"]
