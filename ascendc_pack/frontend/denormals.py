"""Whether a model computes denormal floats on its example inputs: the build's hint to
``--flush-denormals`` (docs/PRECISION.md "Denormals").

On x86 every instruction that reads or writes a denormal float (below 1.18e-38 for float32) takes
a microcode assist, and a model that makes many of them - a softmax over a -100 mask, as in Swin's
shifted windows - runs several times slower than it needs to (swin_mask 0.82 ms vs 0.15 ms
flushed). Nothing in a latency table says why, so a build that does not flush runs its verification's
eager call on the example inputs under :class:`DenormalCounter` (no extra call of the model, whose
forward may count its calls or update state) and names the operators that made them.
"""

from __future__ import annotations

import collections
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SHARE = 1e-3
"""A hint is given when at least this share of the floating values the operators produce is denormal."""


@dataclass(frozen=True)
class DenormalReport:
    """Denormal values among the floating outputs of every ATen operator of one eager call."""

    denormal: int
    values: int
    by_op: tuple[tuple[str, int], ...]   # (operator, denormal values it produced), most first

    @property
    def share(self) -> float:
        return self.denormal / self.values if self.values else 0.0

    @property
    def worth_flushing(self) -> bool:
        return self.share >= SHARE

    def hint(self) -> str:
        """One paragraph for the build summary."""
        ops = ", ".join(f"{op} {n}" for op, n in self.by_op[:3])
        return (f"denormals: {self.share:.1%} of the float values this model computes on its example inputs are "
                f"denormal (below {torch.finfo(torch.float32).tiny:.3g}; {ops}); each costs a microcode assist on "
                "x86: rebuild with --flush-denormals to flush them to zero (several times faster on a masked "
                "softmax; results change only by those tiny values; docs/PRECISION.md \"Denormals\")")


class DenormalCounter(TorchDispatchMode):
    """Counts the denormal values in every floating output of every ATen operator it sees (not of
    views: they compute nothing)."""

    def __init__(self):
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()
        self.values = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "is_view", False):
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and t.device.type == "cpu":
                tiny = torch.finfo(t.dtype).tiny
                a = t.detach().abs()
                n = int(torch.count_nonzero((a < tiny) & (a > 0)))
                self.values += t.numel()
                if n:
                    self.by_op[str(func.overloadpacket)] += n
        return out

    def report(self) -> DenormalReport:
        return DenormalReport(sum(self.by_op.values()), self.values, tuple(self.by_op.most_common()))


def flushes_now() -> bool:
    """Whether this thread flushes denormals now (a denormal times one comes out zero)."""
    return (torch.tensor([1e-39]) * 1.0).item() == 0.0


@contextmanager
def flushing(on: bool) -> Iterator[None]:
    """Run the block with denormals flushed on this thread when ``on`` (``torch.set_flush_denormal``,
    as a ``--flush-denormals`` bundle runs its calls), then give the thread its mode back: PGO times
    the candidates in the mode the bundle will run in."""
    if not on:
        yield
        return
    before = flushes_now()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


def count_denormals(module: torch.nn.Module, inputs: tuple) -> DenormalReport:
    """One eager call of ``module`` on clones of ``inputs`` under :class:`DenormalCounter` (for
    tools and tests; the build counts during the eager call it makes anyway)."""
    from ascendc_pack.frontend.check import plain_cond

    counter = DenormalCounter()
    args = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]  # the model may update them in place
    with torch.no_grad(), plain_cond(), counter:
        module(*args)
    return counter.report()


__all__ = ["SHARE", "DenormalReport", "DenormalCounter", "count_denormals", "flushes_now", "flushing"]
