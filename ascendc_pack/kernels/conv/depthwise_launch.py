"""Launching a generated depthwise-convolution candidate on torch tensors (see
:mod:`ascendc_pack.kernels.conv.depthwise` for the spec, the candidates and the kernel): operand checks, the
eager reference it must match and seeded operands for tests and benchmarks."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ascendc_pack_runtime.kernels import KernelLibrary

from ascendc_pack.kernels.conv.common import apply_eager_epilogue, check_dense, check_nhwc, epilogue_operands

from ascendc_pack.kernels.conv.depthwise import DwConvSpec, DwConvSpecError, pack_weight

def _nhwc(spec: DwConvSpec, what: str, t, c: int, h: int, w: int) -> None:
    check_nhwc(DwConvSpecError, f"depthwise conv {spec.name}", what, t, spec.n, c, h, w)


def _dense(spec: DwConvSpec, what: str, t, shape, hint: str) -> None:
    check_dense(DwConvSpecError, f"depthwise conv {spec.name}", what, t, shape, hint)


class DwConvKernel:
    """One compiled depthwise-convolution candidate on torch tensors: checks the operands
    against the spec and launches. Operands: ``x`` NHWC memory (:func:`_nhwc`), the weight packed
    ``[kh, kw, C]`` (:func:`~ascendc_pack.kernels.conv.depthwise.pack_weight`), bias ``[C]``, the residual in the
    output's layout. Returns ``y`` as a channels_last ``[N, C, OH, OW]`` tensor."""

    def __init__(self, spec: DwConvSpec, so_path: str | os.PathLike, kernel_key: str | None = None):
        self.spec = spec
        self.lib = KernelLibrary(so_path, kernel_key)
        if self.lib.info["n_inputs"] != spec.n_inputs or self.lib.info["name"] != spec.name:
            raise DwConvSpecError(f"depthwise conv {spec.name}: {so_path} is kernel {self.lib.info['name']} "
                                  f"with {self.lib.info['n_inputs']} inputs, not this spec's")
        self.workspace_buffer = None  # the kernel needs none

    def __call__(self, x: torch.Tensor, w_khkwc: torch.Tensor, bias: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 max_threads: int = 0) -> torch.Tensor:
        s = self.spec
        _nhwc(s, "x", x, s.c, s.h, s.w)
        _dense(s, "the weight", w_khkwc, (s.kh, s.kw, s.c), " (pack a [C, 1, kh, kw] weight with pack_weight)")
        ins = [x, w_khkwc] + epilogue_operands(s, bias, residual, s.c,
                                               lambda r: _nhwc(s, "residual", r, s.c, s.oh, s.ow))
        if out is None:
            out = torch.empty((s.n, s.c, s.oh, s.ow), memory_format=torch.channels_last)
        _nhwc(s, "out", out, s.c, s.oh, s.ow)
        rc = self.lib.launch(ins, [out], None, max_threads)
        if rc != 0:
            raise RuntimeError(f"depthwise conv {s.name} ({self.lib.kernel_key}) failed with status {rc}")
        return out


def eager_reference(spec: DwConvSpec, x: torch.Tensor, weight: torch.Tensor, bias=None, residual=None) -> torch.Tensor:
    """What eager PyTorch computes for ``spec``: ``F.conv2d(groups=C)`` on ``x`` ([N, C, H, W],
    any layout) with the ``[C, 1, kh, kw]`` weight, then the epilogue steps with torch's ops."""
    y = F.conv2d(x, weight, bias, spec.stride, spec.padding, spec.dilation, spec.c)
    return apply_eager_epilogue(spec.epilogue, y, residual)


def random_operands(spec: DwConvSpec, seed: int = 0):
    """(x channels_last [N, C, H, W], weight [C, 1, kh, kw], bias or None, residual or None),
    seeded normal values (for tests and benchmarks)."""
    g = torch.Generator().manual_seed(seed)
    cl = torch.channels_last
    x = torch.randn(spec.n, spec.c, spec.h, spec.w, generator=g).contiguous(memory_format=cl)
    weight = torch.randn(spec.c, 1, spec.kh, spec.kw, generator=g) * (1.0 / (spec.kh * spec.kw) ** 0.5)
    bias = torch.randn(spec.c, generator=g) if spec.bias else None
    residual = torch.randn(spec.n, spec.c, spec.oh, spec.ow, generator=g).contiguous(memory_format=cl) \
        if spec.residual else None
    return x, weight, bias, residual


__all__ = ["DwConvKernel", "eager_reference", "pack_weight", "random_operands"]
