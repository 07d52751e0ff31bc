"""Generated max-pooling kernels (NHWC, float32 or bfloat16) with tiling candidates.

A :class:`MaxPoolSpec` (static shape, kernel, stride, padding, dilation, dtype) describes
``y = max_pool2d(x)`` as eager PyTorch computes it (``ceil_mode=False``; the window's padding
never wins, a NaN in a window makes its maximum NaN); ``x`` and ``y`` are NHWC memory
(channels_last ``[N, C, H, W]`` tensors) of one dtype. Maxima are exact, so a bfloat16 kernel
reads and writes bfloat16 (widened to float32 in registers) and matches eager bit for bit.

Tilings (:class:`MaxPoolTiling`): ``cb`` vector loads of channels kept in registers per output
pixel (a load is ``lanes`` float32 channels, or ``2 * lanes`` bfloat16 ones),
``rb`` output rows per task, ``bd`` threads (the graph's task pool). The cost model
(:func:`propose`) is a roofline: the tensors moving once from memory (x read once: a task's
overlapping window rows stay in cache) against the vector maxima, plus the task pool's fork/join
(``templates/kernel/maxpool.cpp.j2``; :class:`MaxPoolKernel` launches one on tensors,
:func:`eager_reference` is what it must match). ATen's channels_last ``max_pool2d_with_indices``
also computes the indices, which a model that only reads the values discards: 270 µs for
resnet18's stem pool against 60-80 here (docs/TACTICS.md "Pooling").
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch

from ascendc_pack_runtime.kernels import KernelLibrary

from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import PackError
from ascendc_pack.kernels import family
from ascendc_pack.kernels.conv.common import ConvGeometry, Pair, check_nhwc
from ascendc_pack.kernels.family import FamilyBuild, Generator, KernelCandidate, Tiling
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.fused.tiling import Target
from ascendc_pack.kernels.target import CpuTarget

MAX_CANDIDATES = 6
TEMPLATE_NAME = "kernel/maxpool.cpp.j2"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class MaxPoolSpecError(PackError, ValueError):
    """A max-pooling spec or kernel call is inconsistent (the message names the field and the fix)."""


@dataclass(frozen=True)
class MaxPoolSpec(ConvGeometry):
    """One static ``y = max_pool2d(x, (kh, kw), stride, padding, dilation)``: ``x`` NHWC
    ``[n, h, w, c]``, ``y`` NHWC ``[n, oh, ow, c]``, both ``dtype``."""

    error = MaxPoolSpecError
    kind = "max pool"

    name: str
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    dilation: Pair = (1, 1)
    dtype: str = "float32"
    epilogue = ()

    def __post_init__(self):
        self.check_fields(("n", "c", "h", "w", "kh", "kw"))
        if self.dtype not in DTYPES:
            raise MaxPoolSpecError(f"max pool {self.name}: dtype must be one of {', '.join(DTYPES)}, got "
                                   f"{self.dtype!r}; other dtypes run as ATen")
        if 2 * self.padding[0] > self.kh or 2 * self.padding[1] > self.kw:
            raise MaxPoolSpecError(f"max pool {self.name}: padding {self.padding} is more than half the kernel "
                                   f"({self.kh}, {self.kw}); torch refuses it too")
        self.check_geometry()

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """The output as torch shapes it, ``[N, C, OH, OW]`` (stored channels_last)."""
        return (self.n, self.c, self.oh, self.ow)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def n_inputs(self) -> int:
        return 1

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> MaxPoolSpec:
        return MaxPoolSpec(**{**d, **{k: tuple(d[k]) for k in ("stride", "padding", "dilation")}})

    def spec_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


@dataclass(frozen=True)
class MaxPoolTiling(Tiling):
    """``cb`` vector loads of channels per register block (``lanes`` float32 channels each, or
    ``2 * lanes`` bfloat16 ones), ``rb`` output rows per task, ``bd`` threads."""

    cb: int
    rb: int
    bd: int
    lanes: int

    error = MaxPoolSpecError
    kind = "max-pooling"


def estimate_us(spec: MaxPoolSpec, t: MaxPoolTiling, target: CpuTarget) -> float:
    """Rank-only estimate (µs): the busiest thread's vector maxima (one per tap, channel vector and
    output pixel, plus a block's setup per pixel) against x and y moving once from memory, plus the
    task pool's fork/join with more than one thread."""
    unit = t.lanes * (2 if spec.dtype == "bfloat16" else 1)   # channels per load (bfloat16: two per word)
    vectors = -(-spec.c // t.lanes)
    blocks = -(-spec.c // (unit * t.cb))
    tasks = spec.n * -(-spec.oh // t.rb)
    rows = -(-tasks // t.bd) * min(t.rb, spec.oh)
    cycles = rows * spec.ow * (vectors * spec.kh * spec.kw + blocks * 12)
    compute = cycles / (target.ghz * 1e3)
    nbytes = spec.itemsize * spec.n * spec.c * (spec.h * spec.w + spec.oh * spec.ow)
    mem = nbytes / (target.mem_gbps * 1e3 * min(t.bd, tasks) ** 0.8)
    us = max(compute, mem) + 0.25 * min(compute, mem)
    return us + (Target.pool_overhead_us if t.bd > 1 else 0.0)


def _space(spec: MaxPoolSpec, target: CpuTarget) -> list[MaxPoolTiling]:
    loads = -(-spec.c // (target.lanes * (2 if spec.dtype == "bfloat16" else 1)))
    cbs = sorted({min(v, loads) for v in (1, 2, 4, 8)})
    out = []
    for bd in sorted({1, target.cores}):
        for k in (1, 2, 4):
            rb = max(1, -(-spec.oh // (bd * k)))
            if bd > 1 and spec.n * -(-spec.oh // rb) < bd:
                continue
            out += [MaxPoolTiling(cb, rb, bd, target.lanes) for cb in cbs]
    return out


def propose(spec: MaxPoolSpec, target: CpuTarget, topn: int = MAX_CANDIDATES) -> list[KernelCandidate]:
    """Up to ``min(topn, MAX_CANDIDATES)`` distinct candidates, lowest estimate first. Every
    thread count may appear: a pooling pass is memory-bound and the task pool's fork/join is cheap."""
    out, seen = [], set()
    for t in _space(spec, target):
        c = KernelCandidate(t, family.Candidate(t.tiling_repr, 0, t.bd), estimate_us(spec, t, target))
        if c.candidate.kernel_key not in seen:
            seen.add(c.candidate.kernel_key)
            out.append(c)
    out.sort(key=lambda c: (c.est_us, c.candidate.tiling_repr))
    return out[:max(1, min(topn, MAX_CANDIDATES))]


def render(spec: MaxPoolSpec, cand: KernelCandidate, isa: str) -> str:
    """C++ source of one candidate (a static kernel: shapes and tiling compiled in)."""
    c = cand.candidate
    return template_env().get_template(TEMPLATE_NAME).render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, isa=isa, s=spec, t=cand.tiling, oh=spec.oh, ow=spec.ow)


GENERATOR = Generator("maxpool", __name__, TEMPLATE_NAME, propose, render, MaxPoolTiling,
                      workspace=lambda spec, t: 0, estimate=estimate_us)


def plan(spec: MaxPoolSpec, config: BuildConfig, target: CpuTarget | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` and render their sources."""
    return family.plan(GENERATOR, spec, config, target)


# ----------------------------------------------------------------------------- launch


class MaxPoolKernel:
    """One compiled candidate on torch tensors: ``x`` NHWC memory of the spec's dtype in, a
    channels_last ``[N, C, OH, OW]`` tensor out."""

    def __init__(self, spec: MaxPoolSpec, so_path: str | os.PathLike, kernel_key: str | None = None):
        self.spec = spec
        self.lib = KernelLibrary(so_path, kernel_key)
        if self.lib.info["n_inputs"] != 1 or self.lib.info["name"] != spec.name:
            raise MaxPoolSpecError(f"max pool {spec.name}: {so_path} is kernel {self.lib.info['name']} with "
                                   f"{self.lib.info['n_inputs']} inputs, not this spec's")
        self.workspace_buffer = None

    def check_x(self, x: torch.Tensor) -> None:
        s = self.spec
        check_nhwc(MaxPoolSpecError, f"max pool {s.name}", "x", x, s.n, s.c, s.h, s.w, DTYPES[s.dtype])

    def new_output(self) -> torch.Tensor:
        s = self.spec
        return torch.empty(s.out_shape, dtype=DTYPES[s.dtype], memory_format=torch.channels_last)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, max_threads: int = 0) -> torch.Tensor:
        s = self.spec
        self.check_x(x)
        out = self.new_output() if out is None else out
        check_nhwc(MaxPoolSpecError, f"max pool {s.name}", "out", out, s.n, s.c, s.oh, s.ow, DTYPES[s.dtype])
        rc = self.lib.launch([x], [out], None, max_threads)
        if rc != 0:
            raise RuntimeError(f"max pool {s.name} ({self.lib.kernel_key}) failed with status {rc}")
        return out


def eager_reference(spec: MaxPoolSpec, x: torch.Tensor) -> torch.Tensor:
    """What eager PyTorch computes for ``spec`` on ``x`` ([N, C, H, W], any layout)."""
    return torch.nn.functional.max_pool2d(x, (spec.kh, spec.kw), spec.stride, spec.padding, spec.dilation)


__all__ = ["MaxPoolSpec", "MaxPoolSpecError", "MaxPoolTiling", "MaxPoolKernel", "GENERATOR", "DTYPES",
           "eager_reference", "estimate_us", "plan", "propose", "render"]
