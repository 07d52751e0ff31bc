"""Launching a generated direct-convolution candidate on torch tensors (see
:mod:`ascendc_pack.kernels.conv.direct` for the spec, the candidates and the kernel): operand checks, the
weight packed for the candidate's channel block, the eager reference it must match and seeded
operands for tests and benchmarks."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ascendc_pack_runtime.kernels import KernelLibrary

from ascendc_pack.kernels.conv.common import apply_eager_epilogue, check_dense, check_nhwc, epilogue_operands

import ascendc_pack.kernels.conv.amx as amx
import ascendc_pack.kernels.conv.winograd as winograd
from ascendc_pack.kernels.conv.direct import ConvSpec, ConvSpecError, ConvTiling, pack_weight

# the same table as kernels/conv/depthwise_launch.py's
def _stored(spec: ConvSpec, what: str, t, layout: str, c: int, h: int, w: int) -> None:
    if layout == "nchw":
        _dense(spec, f"{what} (x_layout / residual_layout 'nchw')", t, (spec.n, c, h, w), " (x.contiguous())")
    else:
        check_nhwc(ConvSpecError, f"direct conv {spec.name}", what, t, spec.n, c, h, w)


def _dense(spec: ConvSpec, what: str, t, shape, hint: str, dtype: torch.dtype = torch.float32) -> None:
    check_dense(ConvSpecError, f"direct conv {spec.name}", what, t, shape, hint, dtype)


class ConvKernel:
    """One compiled direct-convolution candidate on torch tensors: checks the operands against
    the spec and launches. Operands: ``x`` NHWC memory (a channels_last ``[N, C, H, W]`` or a
    contiguous ``[N, H, W, C]``; a contiguous ``[N, C, H, W]`` with ``x_layout="nchw"``), the
    weight packed for this candidate (:meth:`prepare_weight`, i.e. ``pack_weight(weight,
    kernel.ocb)``), bias ``[O]``, the residual of y's shape (stored ``residual_layout``). Returns
    ``y`` as a channels_last ``[N, O, OH, OW]`` tensor. Not thread-safe: concurrent calls would
    share the workspace."""

    tiling_type = ConvTiling
    weight_dtype = torch.float32

    def __init__(self, spec: ConvSpec, so_path: str | os.PathLike, kernel_key: str | None = None):
        self.spec = spec
        self.lib = KernelLibrary(so_path, kernel_key)
        if self.lib.info["n_inputs"] != spec.n_inputs or self.lib.info["name"] != spec.name:
            raise ConvSpecError(f"direct conv {spec.name}: {so_path} is kernel {self.lib.info['name']} "
                                f"with {self.lib.info['n_inputs']} inputs, not this spec's")
        self.tiling = self.tiling_type.parse(self.lib.info["tiling_repr"])
        self.workspace_buffer = torch.empty(self.lib.workspace, dtype=torch.uint8) if self.lib.workspace else None

    @property
    def ocb(self) -> int:
        """The output-channel block the packed weight must have."""
        return self.tiling.ocb

    @property
    def packed_shape(self) -> tuple[int, ...]:
        s = self.spec
        return (-(-s.c_out // self.ocb), s.kh, s.kw, s.c_in, self.ocb)

    def prepare_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` ``[O, C, kh, kw]`` packed for this candidate (once, at load)."""
        s = self.spec
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (s.c_out, s.c_in, s.kh, s.kw):
            got = list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ConvSpecError(f"direct conv {s.name}: the weight must be [{s.c_out}, {s.c_in}, {s.kh}, {s.kw}], "
                                f"got {got}")
        return self.pack(weight)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_weight(weight, self.ocb)

    def __call__(self, x: torch.Tensor, w_packed: torch.Tensor, bias: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 max_threads: int = 0) -> torch.Tensor:
        s = self.spec
        _stored(s, "x", x, s.x_layout, s.c_in, s.h, s.w)
        _dense(s, "the packed weight", w_packed, self.packed_shape,
               f" (pack the [O, C, kh, kw] weight with kernel.prepare_weight)", self.weight_dtype)
        ins = [x, w_packed] + epilogue_operands(
            s, bias, residual, s.c_out, lambda r: _stored(s, "residual", r, s.residual_layout, s.c_out, s.oh, s.ow))
        if out is None:
            out = torch.empty((s.n, s.c_out, s.oh, s.ow), memory_format=torch.channels_last)
        _stored(s, "out", out, "nhwc", s.c_out, s.oh, s.ow)
        rc = self.lib.launch(ins, [out], self.workspace_buffer, max_threads)
        if rc != 0:
            raise RuntimeError(f"direct conv {s.name} ({self.lib.kernel_key}) failed with status {rc}")
        return out


class WinogradKernel(ConvKernel):
    """One compiled Winograd F(2x2, 3x3) candidate (:mod:`ascendc_pack.kernels.conv.winograd`): the operands
    of :class:`ConvKernel`, the weight transformed and packed ``[O/ocb][16][C][ocb]``."""

    tiling_type = winograd.WinoTiling

    @property
    def packed_shape(self) -> tuple[int, ...]:
        s = self.spec
        return (-(-s.c_out // self.ocb), 16, s.c_in, self.ocb)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return winograd.pack_weight(weight, self.ocb)


class AmxConvKernel(ConvKernel):
    """One compiled AMX bfloat16 convolution candidate (:mod:`ascendc_pack.kernels.conv.amx`): the
    operands of :class:`ConvKernel` (``x`` and the residual NHWC), the weight rounded to bfloat16
    and packed ``[ceil(O/16), KP/2, 16, 2]``."""

    tiling_type = amx.AmxConvTiling
    weight_dtype = torch.bfloat16

    @property
    def packed_shape(self) -> tuple[int, ...]:
        return amx.packed_shape(self.spec)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return amx.pack_weight(weight, self.spec.x_layout)


class AmxDirectConvKernel(AmxConvKernel):
    """A candidate of the direct AMX convolution (its tiling: :class:`~ascendc_pack.kernels.conv.amx.AmxDirectTiling`)."""

    tiling_type = amx.AmxDirectTiling


class AmxRowsConvKernel(AmxDirectConvKernel):
    """A candidate of the kernel-row AMX convolution (an NCHW ``x`` of at most 4 channels): the
    weight packed over :func:`~ascendc_pack.kernels.conv.amx.rows_channels` channels a tap
    (``pack_weight(w, "rows")``)."""

    @property
    def packed_shape(self) -> tuple[int, ...]:
        return amx.packed_shape(self.spec, rows=True)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return amx.pack_weight(weight, "rows")


def eager_reference(spec: ConvSpec, x: torch.Tensor, weight: torch.Tensor, bias=None, residual=None) -> torch.Tensor:
    """What eager PyTorch computes for ``spec``: ``F.conv2d`` on ``x`` ([N, C, H, W], any layout)
    with the ``[O, C, kh, kw]`` weight, then the epilogue steps with torch's ops."""
    y = F.conv2d(x, weight, bias, spec.stride, spec.padding, spec.dilation)
    return apply_eager_epilogue(spec.epilogue, y, residual)


def random_operands(spec: ConvSpec, seed: int = 0):
    """(x [N, C, H, W], weight [O, C, kh, kw], bias or None, residual or None) in the spec's
    layouts, seeded normal values, the weight scaled by 1/sqrt(C kh kw) (for tests and benchmarks)."""
    g = torch.Generator().manual_seed(seed)
    fmt = {"nhwc": torch.channels_last, "nchw": torch.contiguous_format}
    x = torch.randn(spec.n, spec.c_in, spec.h, spec.w, generator=g).contiguous(memory_format=fmt[spec.x_layout])
    weight = torch.randn(spec.c_out, spec.c_in, spec.kh, spec.kw, generator=g) * \
        (1.0 / (spec.c_in * spec.kh * spec.kw) ** 0.5)
    bias = torch.randn(spec.c_out, generator=g) if spec.bias else None
    residual = torch.randn(spec.n, spec.c_out, spec.oh, spec.ow, generator=g).contiguous(
        memory_format=fmt[spec.residual_layout]) \
        if spec.residual else None
    return x, weight, bias, residual


__all__ = ["AmxConvKernel", "AmxDirectConvKernel", "AmxRowsConvKernel", "ConvKernel", "WinogradKernel", "eager_reference", "pack_weight", "random_operands"]
