"""Max-pooling steps: ``aten::max_pool2d_with_indices`` whose indices nothing reads.

The only dispatcher candidate is ``aten``, the op as captured (it keeps its input's memory
format and computes the indices too); the generated kernel
(:mod:`ascendc_pack.tactics.families.pool`) reads NHWC memory and writes the maxima only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ascendc_pack.tactics.dispatch.conv import window_out
from ascendc_pack.tactics.dispatch.spec import Call, Ref, Tactic

LAYOUTS = ("contiguous", "channels_last")


@dataclass(frozen=True)
class PoolStep:
    """``max_pool2d(x)`` of ``x`` [N, C, H, W] (``ceil_mode=False``); ``layout``: the memory format
    ``x`` arrives in as captured, ``position``: ``interior`` when ``x`` comes from a convolution
    step (through layout-keeping ops), so it arrives channels_last when the chain runs so."""

    x_shape: tuple[int, int, int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    layout: str = "contiguous"
    dtype: str = "float32"
    position: str = "entry"
    kind = "pool"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (*self.x_shape[:2], *window_out(self))

    def to_json(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"x": self.x_shape}


def pool_tactics(step: PoolStep) -> list[Tactic]:
    """Candidate 0 and only dispatcher candidate: the captured op, its values kept."""
    call = Call("aten::max_pool2d_with_indices", (Ref("x"), tuple(step.kernel), tuple(step.stride),
                                                 tuple(step.padding), tuple(step.dilation), False), out="y", index=0)
    return [Tactic("pool", "aten", ("aten::max_pool2d_with_indices",), ("x",), (), (call,), "y",
                   (("layout", step.layout),))]


def pool_reference(step: PoolStep, env: dict) -> torch.Tensor:
    """Eager PyTorch's answer for ``step`` on the named tensors ``env``."""
    return torch.nn.functional.max_pool2d(env["x"], step.kernel, step.stride, step.padding, step.dilation)


__all__ = ["PoolStep", "pool_reference", "pool_tactics"]
