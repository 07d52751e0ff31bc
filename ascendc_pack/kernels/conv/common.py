"""What the generated convolution kernels share (``dwconv``: depthwise, ``directconv``: dense):
the fusable epilogue steps and their C statements, output geometry, BatchNorm folding, the
threading threshold, and the launchers' operand checks and eager epilogue."""

from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn.functional as F

from ascendc_pack_runtime.tensor_meta import same_layout

from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.kernels.gemm.generator import EPILOGUE_C as GEMM_EPILOGUE_C
from ascendc_pack.kernels.fused.tiling import PAYOFF_MARGIN

UNARY_OPS = ("relu", "relu6", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish", "hardsigmoid", "tanh")
EPILOGUE_OPS = ("add",) + UNARY_OPS
"""Pointwise steps the kernels fuse, applied in order after the bias; ``add`` adds the residual
input (NHWC, the output's shape; at most one)."""

UNARY_C = {
    **GEMM_EPILOGUE_C,
    "relu6": "v = v < 0.0f ? 0.0f : v; v = v > 6.0f ? 6.0f : v;",
    "hardsigmoid": "{ auto t = v + 3.0f; t = t < 0.0f ? 0.0f : t; t = t > 6.0f ? 6.0f : t; v = t / 6.0f; }",
    "hardswish": "{ auto t = v + 3.0f; t = t < 0.0f ? 0.0f : t; t = t > 6.0f ? 6.0f : t; v = v * t / 6.0f; }",
    "tanh": "v = ap_tanh(v);",
}
"""C statement of each unary step on ``v`` (torch's formulas): the GEMM's snippets, plus the rest."""

PARALLEL_MIN_US = 100.0
"""Multi-thread candidates are proposed only for convolutions whose best single-thread estimate
is at least this: waking a passive team and its closing barrier cost ~11 us (tiling.Target), and
on a busy host a second thread often is not there at all."""

Pair = tuple[int, int]

EAGER_UNARY = {
    "relu": torch.relu,
    "relu6": F.relu6,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "tanh": torch.tanh,
}
"""Eager PyTorch's op for each unary step (what the kernels must match)."""


class IntTiling:
    """What a kernel's tiling (a frozen dataclass of int parameters) shares: ``tiling_repr``
    (``name=value`` pairs, sorted by name, ``;``-separated: what its libraries describe) and
    ``parse`` back; subclasses name the error class and the kernel kind for the message."""

    error = ValueError
    kind = "kernel"

    @property
    def tiling_repr(self) -> str:
        return ";".join(f"{k}={getattr(self, k)}" for k in _field_names(type(self)))

    @classmethod
    def parse(cls, tiling_repr: str):
        """The tiling of a candidate's ``tiling_repr`` (what a kernel library describes)."""
        try:
            d = dict(kv.split("=") for kv in tiling_repr.split(";"))
            return cls(**{k: int(d[k]) for k in _field_names(cls)})
        except (KeyError, ValueError, TypeError):
            raise cls.error(f"not a {cls.kind} tiling: {tiling_repr!r}") from None


def _field_names(cls) -> list[str]:
    return sorted(f.name for f in fields(cls))


def scored_space(spec, target, space, workspace, estimate, make) -> list:
    """The distinct tilings of ``space`` as estimated candidates ``make(tiling, Candidate,
    est_us)`` (``workspace(spec, t)`` bytes, ``estimate(spec, t, target)`` µs), lowest estimate
    first; multi-thread ones only where the best single-thread estimate is at least
    :data:`PARALLEL_MIN_US` and they are within ``PAYOFF_MARGIN`` of it."""
    scored, seen = [], set()
    for t in space:
        cand = Candidate(t.tiling_repr, workspace(spec, t), t.bd)
        if cand.kernel_key not in seen:
            seen.add(cand.kernel_key)
            scored.append(make(t, cand, estimate(spec, t, target)))
    single = min(c.est_us for c in scored if c.tiling.bd == 1)
    scored = [c for c in scored if c.tiling.bd == 1 or (single >= PARALLEL_MIN_US
                                                        and c.est_us <= PAYOFF_MARGIN * single)]
    return sorted(scored, key=lambda c: (c.est_us, c.candidate.tiling_repr))


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


def apply_eager_epilogue(epilogue, y: torch.Tensor, residual=None) -> torch.Tensor:
    """The epilogue steps with torch's ops (the reference of every candidate)."""
    for op in epilogue:
        y = y + residual if op == "add" else EAGER_UNARY[op](y)
    return y


def check_nhwc(error, kernel: str, what: str, t, n: int, c: int, h: int, w: int) -> None:
    """``t`` must be a CPU float32 [n, c, h, w] channels_last tensor (NHWC memory), or that memory
    shaped [n, h, w, c]; else ``error`` naming ``kernel`` (e.g. "depthwise conv k1") and the fix."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device.type != "cpu":
        got = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise error(f"{kernel}: {what} must be a CPU float32 tensor, got {got}")
    nchw = ((n, c, h, w), (h * w * c, 1, w * c, c))
    nhwc = ((n, h, w, c), (h * w * c, w * c, c, 1))
    if not any(same_layout(t.shape, t.stride(), *layout) for layout in (nchw, nhwc)):
        raise error(f"{kernel}: {what} is {list(t.shape)} with strides {t.stride()}; the kernel reads NHWC "
                    f"memory: a channels_last {list(nchw[0])} tensor (x.contiguous(memory_format="
                    f"torch.channels_last)) or a contiguous {list(nhwc[0])}")


def check_dense(error, kernel: str, what: str, t, shape, hint: str) -> None:
    """``t`` must be a contiguous CPU float32 tensor of ``shape``."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device.type != "cpu" \
            or tuple(t.shape) != tuple(shape) or not t.is_contiguous():
        got = f"{type(t).__name__}" if not isinstance(t, torch.Tensor) else \
            f"{t.dtype} {list(t.shape)} strides {t.stride()} on {t.device}"
        raise error(f"{kernel}: {what} must be a contiguous CPU float32 {list(shape)} tensor{hint}, got {got}")


__all__ = ["UNARY_OPS", "EPILOGUE_OPS", "UNARY_C", "PARALLEL_MIN_US", "Pair", "EAGER_UNARY", "IntTiling", "scored_space",
           "out_size", "interior", "fold_affine", "apply_eager_epilogue", "check_nhwc", "check_dense"]
