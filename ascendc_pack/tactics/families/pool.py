"""The generated max-pooling kernel (:mod:`ascendc_pack.kernels.pool.maxpool`) as tactic
candidates of max-pooling steps.

A ``pool`` step (``max_pool2d_with_indices`` whose indices nothing reads, float32 or bfloat16)
gets, besides ``aten`` (candidate 0, the op as captured), up to ``config.topn`` tilings of the
kernel (``maxpool_<step name>``). The kernel reads NHWC memory: a pooling inside a convolution
chain gets its input channels_last when the chain runs so (its candidates are timed that way);
an input that arrives otherwise is copied first, in the candidate's timing as in the graph. It
writes the channels_last maxima only (ATen also computes the indices), is verified in the kernel
sandbox before it is timed, and a chosen one launches from graph.cpp.
"""

from __future__ import annotations

import logging

import torch

from ascendc_pack.autotune.verify import verify_in_sandbox
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.kernels.pool import maxpool
from ascendc_pack.tactics.families.base import KernelFamily, KernelTactic

log = logging.getLogger("ascendc_pack")

CL = torch.channels_last


def pool_spec(step: TacticStep) -> maxpool.MaxPoolSpec | None:
    """The kernel's spec of a max-pooling ``step``, or None when the kernel does not take it."""
    d = step.desc
    if step.tactic_kind != "pool":
        return None
    try:
        return maxpool.MaxPoolSpec(f"maxpool_{step.name}", *d["x_shape"], *d["kernel"], tuple(d["stride"]),
                                   tuple(d["padding"]), tuple(d["dilation"]), d["dtype"])
    except maxpool.MaxPoolSpecError as e:
        log.debug("no generated max pooling for %s: %s", step.name, e)
        return None


def nhwc_strides(shape) -> tuple[int, int, int, int]:
    """The strides of NHWC memory of an [N, C, H, W] shape (channels_last)."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


class PoolFamily(KernelFamily):
    """The generated max pooling of ``pool`` steps."""

    name = "maxpool"
    kinds = ("pool",)
    weights = "none"
    graph = "generic"

    def spec_of(self, step: TacticStep, values: dict) -> maxpool.MaxPoolSpec | None:
        return pool_spec(step)

    def spec_from_json(self, d: dict) -> maxpool.MaxPoolSpec:
        return maxpool.MaxPoolSpec.from_json(d)

    def plan(self, spec: maxpool.MaxPoolSpec, config, target):
        return maxpool.plan(spec, config, target)

    def runner(self, t: KernelTactic, named: dict, pool: int | None = None) -> PoolRunner:
        return PoolRunner(t, named, pool)

    def lowered_runner(self, t: KernelTactic, named: dict):
        kernel = maxpool.MaxPoolKernel(t.spec, t.so_path, t.candidate.kernel_key)
        return lambda named: kernel(named["x"].contiguous(memory_format=CL))

    def input_layouts(self, chosen: dict) -> dict:
        s = maxpool.MaxPoolSpec.from_json(chosen["spec"])
        shape = (s.n, s.c, s.h, s.w)
        return {"x": (shape, nhwc_strides(shape), s.dtype)}

    def output_layout(self, chosen: dict) -> tuple:
        s = maxpool.MaxPoolSpec.from_json(chosen["spec"])
        return s.out_shape, nhwc_strides(s.out_shape), s.dtype


class PoolRunner:
    """One candidate on a step's ``x``: :meth:`verify` runs it in the kernel sandbox, and only then
    may it be called in-process. A call is what the graph runs: a copy of ``x`` when it arrives in
    another layout than NHWC, then the bound launch (on ``pool`` when given)."""

    def __init__(self, t: KernelTactic, named: dict, pool: int | None = None):
        self.t = t
        self.kernel = maxpool.MaxPoolKernel(t.spec, t.so_path, t.candidate.kernel_key)
        x = named["x"]
        self.x = x if x.is_contiguous(memory_format=CL) else torch.empty_like(x, memory_format=CL)
        self._copy = None if self.x is x else x
        self.kernel.check_x(self.x)
        self.out = self.kernel.new_output()
        self._launch = self.kernel.lib.bind([self.x], [self.out], None, pool=pool)

    def __call__(self) -> torch.Tensor:
        if self._copy is not None:
            self.x.copy_(self._copy)
        if self._launch() != 0:
            raise RuntimeError(f"max pool kernel {self.t.spec.name} ({self.t.key}) failed")
        return self.out

    def verify(self, expected: torch.Tensor, ref64, sandbox, timeout_s: float) -> dict | None:
        """Run the candidate once in the kernel sandbox; None if its output matches the
        reference (maxima are exact: the accuracy rule passes only equal values), else the
        disqualification record."""
        if self._copy is not None:
            self.x.copy_(self._copy)
        s = self.t.spec
        return verify_in_sandbox(sandbox, self.t.so_path, 0, [self.x],
                                 (s.out_shape, maxpool.DTYPES[s.dtype], nhwc_strides(s.out_shape)), timeout_s,
                                 expected, ref64)

    def values(self) -> dict[str, TensorSpec]:
        return {"out": TensorSpec.of(self.out)}


POOL = PoolFamily()
