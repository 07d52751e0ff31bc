"""Launching a generated GEMM candidate on torch tensors (see :mod:`ascendc_pack.kernels.gemm.generator` for the
spec, the candidates and the kernel): operand checks, B packed once for candidates that read it
packed (``ap_gemm_pack_b``, layout in ``ascendc_pack/gemm_abi.h``), the eager reference it must
match and seeded operands for tests and benchmarks."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ascendc_pack_runtime.kernels import KernelLibrary
from ascendc_pack_runtime.tensor_meta import same_layout

from ascendc_pack.kernels.gemm.generator import DTYPES, GemmSpec, GemmSpecError


def _check(spec: GemmSpec, what: str, t, shape, strides) -> None:
    dtype = DTYPES[spec.dtype][1]
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device.type != "cpu":
        got = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise GemmSpecError(f"GEMM {spec.name}: {what} must be a CPU {dtype} tensor, got {got}")
    if not same_layout(t.shape, t.stride(), shape, strides):
        raise GemmSpecError(f"GEMM {spec.name}: {what} is {list(t.shape)} with strides {t.stride()}, "
                            f"the kernel was generated for {list(shape)} with strides {list(strides)}")


def logical_b(spec: GemmSpec, b: torch.Tensor) -> torch.Tensor:
    """B as the logical [(batch,) K, N] view the spec's strides describe; ``b`` may be that view
    or, for a transposed B, the tensor as held ([N, K], e.g. nn.Linear's weight)."""
    st = spec.b_strides
    shape, strides = ((spec.batch,), st[:1]) if st[0] else ((), ())
    shape, strides = shape + (spec.k, spec.n), strides + st[1:]
    if isinstance(b, torch.Tensor) and b.dim() >= 2 and not same_layout(b.shape, b.stride(), shape, strides):
        b = b.transpose(-1, -2)  # given as held
    _check(spec, "B (as [K, N])", b, shape, strides)
    return b


class _GemmInfo(ctypes.Structure):
    _fields_ = [("b_packed", ctypes.c_int32), ("nr", ctypes.c_int32), ("packed_b_bytes", ctypes.c_int64),
                ("b_batches", ctypes.c_int64)]


@dataclass(frozen=True)
class PackedB:
    """A B packed by :meth:`GemmKernel.pack_b`: valid for candidates of the same GEMM and NR."""

    data: torch.Tensor
    gemm: str
    nr: int


class GemmKernel:
    """One compiled GEMM candidate on torch tensors: checks operands against the spec, packs a
    constant B once (:meth:`prepare_b`) when the candidate reads it packed, launches. Not
    thread-safe: concurrent calls would share the workspace.

    Operands are A [batch, M, K] (or [M, K] when batch is 1), B as :func:`logical_b` takes it
    (or its :class:`PackedB`), bias [N], residuals broadcasting to [batch, M, N] with the spec's
    strides."""

    def __init__(self, spec: GemmSpec, so_path: str | os.PathLike, kernel_key: str | None = None):
        self.spec = spec
        self.lib = KernelLibrary(so_path, kernel_key)
        cdll = ctypes.CDLL(str(so_path), mode=getattr(ctypes, "RTLD_LOCAL", 0))  # the same handle
        cdll.ap_gemm_describe.restype = ctypes.POINTER(_GemmInfo)
        info = cdll.ap_gemm_describe().contents
        self.b_packed, self.nr, self.packed_b_bytes = bool(info.b_packed), int(info.nr), int(info.packed_b_bytes)
        self._pack = cdll.ap_gemm_pack_b
        self._pack.restype, self._pack.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
        self.workspace_buffer = torch.empty(self.lib.workspace, dtype=torch.uint8) if self.lib.workspace else None

    def pack_b(self, b: torch.Tensor, max_threads: int = 0) -> PackedB:
        """B packed into this candidate's NR-wide panels (layout in gemm_abi.h)."""
        b = logical_b(self.spec, b)
        packed = torch.empty(self.packed_b_bytes // 4, dtype=torch.float32)
        if self._pack(b.data_ptr(), packed.data_ptr(), max_threads) != 0:
            raise RuntimeError(f"GEMM {self.spec.name}: ap_gemm_pack_b failed")
        return PackedB(packed, self.spec.name, self.nr)

    def prepare_b(self, b: torch.Tensor) -> torch.Tensor | PackedB:
        """What to pass as B on every call: B packed (now, once) if the candidate reads it packed."""
        return self.pack_b(b) if self.b_packed else b

    def __call__(self, a: torch.Tensor, b: torch.Tensor | PackedB, bias: torch.Tensor | None = None,
                 residuals=(), out: torch.Tensor | None = None, max_threads: int = 0) -> torch.Tensor:
        s = self.spec
        lead = ((s.batch,), s.a_strides[:1]) if s.batch > 1 else ((), ())
        _check(s, "A", a, lead[0] + (s.m, s.k), lead[1] + s.a_strides[1:])
        if self.b_packed != isinstance(b, PackedB) or (self.b_packed and (b.gemm, b.nr) != (s.name, self.nr)):
            raise GemmSpecError(f"GEMM {s.name}: this candidate reads B " + (
                f"packed with NR={self.nr}; pass prepare_b(B) of a candidate with that NR" if self.b_packed
                else "as given, not packed"))
        ins = [a, b.data if self.b_packed else logical_b(s, b)]
        if s.bias:
            _check(s, "bias (the kernel adds one)", bias, (s.n,), (1,))
            ins.append(bias)
        if len(residuals) != len(s.residual_strides):
            raise GemmSpecError(f"GEMM {s.name}: the epilogue adds {len(s.residual_strides)} residual(s), "
                                f"got {len(residuals)}")
        full = (s.batch, s.m, s.n)
        for i, (r, st) in enumerate(zip(residuals, s.residual_strides)):
            try:
                _check(s, f"residual {i}", r.expand(full), full, st)
            except (RuntimeError, AttributeError):
                raise GemmSpecError(f"GEMM {s.name}: residual {i} must broadcast to {list(full)}") from None
            ins.append(r)
        oshape, ostride = (full, (s.m * s.n, s.n, 1)) if s.batch > 1 else (full[1:], (s.n, 1))
        out = torch.empty(oshape, dtype=DTYPES[s.dtype][1]) if out is None else out
        _check(s, "out", out, oshape, ostride)
        rc = self.lib.launch(ins, [out], self.workspace_buffer, max_threads)
        if rc != 0:
            raise RuntimeError(f"GEMM {s.name} ({self.lib.kernel_key}) failed with status {rc}")
        return out


def eager_reference(spec: GemmSpec, a: torch.Tensor, b: torch.Tensor, bias=None, residuals=()) -> torch.Tensor:
    """What eager PyTorch computes for ``spec`` on the same operands (as :class:`GemmKernel`
    takes them): ``F.linear`` for a transposed shared B (a weight), else ``torch.matmul`` (+ bias),
    then the epilogue steps with torch's own ops."""
    s, kn = spec, logical_b(spec, b)
    if s.b_transposed and not s.b_strides[0]:
        y = F.linear(a, kn.transpose(-1, -2), bias)
    else:
        y = torch.matmul(a, kn)
        y = y + bias if bias is not None else y
    res = iter(residuals)
    for op in s.epilogue:
        if op == "add":
            y = y + next(res)
        elif op == "mul":
            y = y * next(res)
        elif op == "gelu":
            y = F.gelu(y)
        elif op == "gelu_tanh":
            y = F.gelu(y, approximate="tanh")
        else:
            y = {"relu": torch.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "hardswish": F.hardswish,
                 "hardsigmoid": F.hardsigmoid}[op](y)
    return y


def random_operands(spec: GemmSpec, seed: int = 0):
    """(A, B as the logical [K, N] view, bias, residuals) with the spec's layouts, filled from
    a seeded normal distribution (for tests and benchmarks)."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[spec.dtype][1]

    def strided(shape, strides):
        out = torch.empty_strided(shape, strides, dtype=dt)
        return out.copy_(torch.randn(shape, generator=g).to(dt))

    lead = ((spec.batch,), spec.a_strides[:1]) if spec.batch > 1 else ((), ())
    a = strided(lead[0] + (spec.m, spec.k), lead[1] + spec.a_strides[1:])
    blead = ((spec.batch,), spec.b_strides[:1]) if spec.b_strides[0] else ((), ())
    b = strided(blead[0] + (spec.k, spec.n), blead[1] + spec.b_strides[1:])
    bias = strided((spec.n,), (1,)) if spec.bias else None
    residuals = []
    for st in spec.residual_strides:  # the dims a stride-0 residual broadcasts over are 1
        shape = [d if s else 1 for d, s in zip((spec.batch, spec.m, spec.n), st)]
        while len(shape) > 1 and shape[0] == 1:
            shape.pop(0)
        residuals.append(torch.randn(shape, generator=g).to(dt))
    return a, b, bias, residuals


__all__ = ["GemmKernel", "PackedB", "logical_b", "eager_reference", "random_operands"]
