"""Generated GEMM kernels (:mod:`ascendc_pack.kernels.gemm.generator`) as tactic candidates of GEMM steps.

A linear tactic step whose epilogue the GEMM template can fuse (bias, a residual ``add``, then
relu / gelu / gelu_tanh / silu / sigmoid) gets, besides the dispatcher tactics, the tiling
candidates of a :class:`~ascendc_pack.kernels.gemm.generator.GemmSpec` (``gemm_<step name>``): B is the weight as
the graph holds it (``b_constant``, so candidates may pack it once at load), A the activation
made contiguous, C contiguous ``[m, n]``. They compile through the kernel cache like fused
kernels (one ``compile_kernels`` call for every step, before any run), are verified in the
kernel sandbox on the step's real arguments (a generated kernel could crash or hang: the build
must survive it) and timed with the other candidates. A chosen GEMM runs in graph.cpp as a kernel
launch, its B packed at load by the library's ``ap_gemm_pack_b``, and its library is a bundle
member like every kernel (listed in ``manifest.kernels``, re-hashed before ``dlopen``).

A 1x1 convolution (stride 1, no padding, one group) is the same GEMM on channels_last rows
(a ``KernelTactic`` of family ``gemm`` with ``extra["conv"]``): A = ``x`` as [N*H*W, C] rows (a view of a channels_last ``x``, a copy
of an NCHW one), B = the weight as [O, C] with an eval BatchNorm folded in at build, C = the
output's [N*H*W, O] rows, which *is* the channels_last [N, O, H, W] output (a view). It is a
candidate of the chain's channels_last configuration (``out_layout`` channels_last), with at most
:data:`CONV_TILINGS` tilings: a network has dozens of 1x1 convolutions, and every tiling is a
compile in the cold build.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ascendc_pack.autotune.verify import verify_in_sandbox
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.kernels.gemm.amx import FEATURE as AMX_FEATURE, amx_applies, amx_offered
from ascendc_pack.kernels.gemm.amx import plan as amx_plan
from ascendc_pack.kernels.gemm.generator import DTYPES, RESIDUAL_OPS, GemmSpec, plan
from ascendc_pack.kernels.gemm.launch import GemmKernel, PackedB, logical_b
from ascendc_pack.tactics.decide import low_check
from ascendc_pack.tactics.dispatch.lowp import NATIVE
from ascendc_pack.tactics.families.base import KernelFamily, KernelTactic

log = logging.getLogger("ascendc_pack")

UNARY = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
CONV_UNARY = UNARY + ("hardswish", "hardsigmoid")
CONV_TILINGS = 1
"""Tilings of a 1x1 convolution's GEMM (the cost model's first ones): mobilenet_v3_small has 34
1x1 convolutions, efficientnet_b0 about 40 distinct ones, and each tiling is a compile of about
0.25 s of CPU in the cold build; the cost model's pick was within a few % of the PGO winner of two."""


class GemmFamily(KernelFamily):
    """Generated GEMMs of linear steps and of 1x1 convolutions (see the module docstring)."""

    name = "gemm"
    kinds = ("linear", "conv")
    weights = "bound"
    graph = "gemm"

    def spec_of(self, step: TacticStep, values: dict) -> GemmSpec | None:
        return gemm_spec(step, values)

    def spec_from_json(self, d: dict) -> GemmSpec:
        return GemmSpec.from_json(d)

    def plan(self, spec: GemmSpec, config, target):
        return plan(spec, config, target)

    def tilings_for(self, step: TacticStep) -> int | None:
        return CONV_TILINGS if step.tactic_kind == "conv" else None

    def extra(self, step: TacticStep, spec: GemmSpec, so_path: str, kernel_key: str) -> dict:
        k = GemmKernel(spec, so_path, kernel_key)
        out = {"b_packed": k.b_packed, "packed_b_bytes": k.packed_b_bytes}
        if step.tactic_kind == "conv":
            out["conv"] = {"x_shape": list(step.desc["x_shape"]), "affine": bool(step.desc["epilogue"]["affine"])}
        return out

    def lowered_extra(self, t: KernelTactic) -> dict:
        return {"conv": {**t.extra["conv"], "affine": False}} if "conv" in t.extra else {}

    def param(self, t: KernelTactic, key: str, default=None):
        if "conv" in t.extra:
            return {"layout": "channels_last", "out_layout": "channels_last"}.get(key, default)
        return default

    def stored_weights(self, t: KernelTactic) -> str:
        return "made" if "conv" in t.extra else "bound"   # a 1x1 convolution's: [O, C], BatchNorm folded

    def kernel_weights(self, t: KernelTactic, named: dict) -> dict:
        if "conv" in t.extra:
            return conv_gemm_weights(t.spec, t.extra["conv"]["affine"], named)
        return super().kernel_weights(t, named)

    def runner(self, t: KernelTactic, named: dict, pool: int | None = None) -> GemmRunner:
        return GemmRunner(t, named, pool)

    def lowered_runner(self, t: KernelTactic, named: dict):
        """Python mode of a lowered GEMM step: B packed once from ``named``'s weight."""
        kernel = GemmKernel(t.spec, t.so_path, t.candidate.kernel_key)
        b = kernel.prepare_b(named["weight"])
        n, k = t.spec.n, t.spec.k

        def run(named: dict) -> torch.Tensor:
            res = [_rows(t, named["other"], n)] if "other" in named else []
            return _result(t, kernel(_rows(t, named["x"], k), b, named.get("bias"), res))

        return run


def _row_order(t: KernelTactic, x: torch.Tensor) -> torch.Tensor:
    """``x`` viewed in the order of the kernel's rows' elements (NHWC for a 1x1 convolution)."""
    return x.permute(0, 2, 3, 1) if "conv" in t.extra else x


def _rows(t: KernelTactic, x: torch.Tensor, n: int) -> torch.Tensor:
    """An activation (or the step's output) as the kernel's row-major [m, n] operand."""
    return _row_order(t, x).reshape(t.spec.m, n).contiguous()


def _result(t: KernelTactic, c: torch.Tensor) -> torch.Tensor:
    """The kernel's C as the step's output (a 1x1 convolution's: channels_last NCHW, a view)."""
    if "conv" not in t.extra:
        return c
    n, _, h, w = t.extra["conv"]["x_shape"]
    return rows_nchw(c, (n, t.spec.n, h, w))


def rows_nchw(c: torch.Tensor, out_shape) -> torch.Tensor:
    """[N*H*W, O] rows as the channels_last [N, O, H, W] tensor they are (a view)."""
    n, o, h, w = out_shape
    return c.view(n, h, w, o).permute(0, 3, 1, 2)


def conv_gemm_weights(spec: GemmSpec, affine: bool, named: dict) -> dict:
    """A 1x1 convolution's weight as [O, C] and its bias, with the BatchNorm affine folded in
    (``weight * scale``, ``bias * scale + shift``, as the dispatcher tactics fold it)."""
    w = named["weight"].reshape(spec.n, spec.k)
    b = named.get("bias")
    if affine:
        scale, shift = named["scale"].reshape(-1), named["shift"].reshape(-1)
        w = w * scale.view(-1, 1)
        b = shift.clone() if b is None else b * scale + shift
    out = {"weight": w.contiguous()}
    if b is not None:
        out["bias"] = b.contiguous()
    return out


def epilogue_steps(epi: dict) -> tuple[str, ...]:
    """A step's epilogue (``{"binary", "unary"}``; bias and affine go elsewhere) as a generated
    kernel's steps: the binary with the residual, then the activation."""
    return ((epi["binary"],) if epi["binary"] else ()) + ((epi["unary"],) if epi["unary"] else ())


def conv_gemm_spec(step: TacticStep) -> GemmSpec | None:
    """The GEMM a float32 1x1 convolution step is (stride 1, no padding, one group), or None."""
    d, epi = step.desc, step.desc["epilogue"]
    if tuple(d["kernel"]) != (1, 1) or tuple(d["stride"]) != (1, 1) or tuple(d["padding"]) != (0, 0) \
            or d["groups"] != 1 or d["dtype"] != "float32" or epi["binary"] not in (None, *RESIDUAL_OPS) \
            or epi["unary"] not in (None, *CONV_UNARY):
        return None
    n, c, h, w = d["x_shape"]
    epilogue = epilogue_steps(epi)
    return GemmSpec(f"gemm_{step.name}", n * h * w, d["out_channels"], c, 1, "float32", None, (0, 1, c), True,
                    bool(d["bias"] or epi["affine"]), epilogue)


def gemm_spec(step: TacticStep, values: dict) -> GemmSpec | None:
    """The GEMM a linear (or 1x1 convolution) step is, or None when the template cannot take it
    (a shape, dtype or epilogue it does not fuse)."""
    if step.tactic_kind == "conv":
        return conv_gemm_spec(step)
    d, epi = step.desc, step.desc["epilogue"]
    if d["dtype"] not in DTYPES or epi["affine"] or epi["binary"] not in (None, *RESIDUAL_OPS) \
            or epi["unary"] not in (None, *UNARY):
        return None
    w = values[step.bind["weight"]]
    stride = w.stride or (w.shape[1], 1)
    rows, cols = stride  # the weight as held: [n, k] (nk) or [k, n] (kn)
    b_strides = (0, cols, rows) if d["weight_layout"] == "nk" else (0, rows, cols)
    epilogue = epilogue_steps(epi)
    return GemmSpec(f"gemm_{step.name}", d["m"], d["n"], d["k"], 1, d["dtype"], None, b_strides, True, d["bias"],
                    epilogue)


class GemmRunner:
    """One GEMM candidate on a step's named tensors: B prepared (packed) once; :meth:`verify`
    runs it in the kernel sandbox, and only then may it be called in-process. A call is what the
    graph runs: the bound launch (no Python checks; on ``pool``, the graph's task pool, when
    given) after the copies of operands that arrive in another layout than the kernel's rows (a
    view otherwise, free in the graph too)."""

    def __init__(self, gt: KernelTactic, named: dict, pool: int | None = None):
        self.gt = gt
        self.kernel = GemmKernel(gt.spec, gt.so_path, gt.candidate.kernel_key)
        self.x, self.other = named["x"], named.get("other")
        weights = gt.kernel_weights(named)
        self.b = self.kernel.prepare_b(weights["weight"])
        self.bias = weights.get("bias")
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.a = self._operand(self.x, gt.spec.k)
        self.residuals = [self._operand(self.other, gt.spec.n)] if self.other is not None else []
        spec = gt.spec
        self.out = torch.empty((spec.m, spec.n), dtype=DTYPES[spec.dtype][1])
        b = self.b.data if isinstance(self.b, PackedB) else logical_b(spec, self.b)
        ins = [self.a, b] + ([self.bias] if self.bias is not None else []) + self.residuals
        self._launch = self.kernel.lib.bind(ins, [self.out], self.kernel.workspace_buffer, pool=pool)

    def _operand(self, t: torch.Tensor, n: int) -> torch.Tensor:
        src = _row_order(self.gt, t)
        if src.is_contiguous():
            return src.reshape(self.gt.spec.m, n)
        rows = torch.empty((self.gt.spec.m, n), dtype=t.dtype)
        self._copies.append((rows.view(src.shape), src))
        rows.view(src.shape).copy_(src)
        return rows

    def __call__(self) -> torch.Tensor:
        for dst, src in self._copies:
            dst.copy_(src)
        if self._launch() != 0:
            raise RuntimeError(f"GEMM {self.gt.spec.name} ({self.gt.key}) failed")
        return self.out

    def verify(self, expected: torch.Tensor, ref64, sandbox, timeout_s: float) -> dict | None:
        """Run the candidate once in the kernel sandbox; None if its output matches the
        reference by the accuracy rule, else the disqualification record."""
        spec = self.gt.spec
        b = self.b.data if isinstance(self.b, PackedB) else logical_b(spec, self.b)
        ins = [self.a, b] + ([self.bias] if self.bias is not None else []) + self.residuals
        return verify_in_sandbox(sandbox, self.gt.so_path, self.gt.candidate.workspace, ins,
                                 ((spec.m, spec.n), DTYPES[spec.dtype][1]), timeout_s, expected, ref64,
                                 lambda t: _rows(self.gt, t, spec.n), check=low_precision_check(self.gt))

    def values(self) -> dict[str, TensorSpec]:
        spec = self.gt.spec
        out = _result(self.gt, torch.empty((spec.m, spec.n), dtype=DTYPES[spec.dtype][1], device="meta"))
        return {"x": TensorSpec.of(self.x), "out": TensorSpec.of(out)}


def low_precision_check(t: KernelTactic):
    """The output check of a low-precision candidate (its step tolerance), None for a native one."""
    prec = t.param("precision")
    if prec in (None, NATIVE):
        return None
    return lambda want, got: low_check(want, got, prec)


GEMM = GemmFamily()


class OnAmx:
    """What the AMX bfloat16 families share (a mixin before their float32 family): low-precision
    candidates (``precision`` ``bf16``), offered with ``--precision bf16`` / ``auto`` on a host with
    AMX-BF16, verified against the step's float32 reference within the bf16 step tolerance, chosen
    by the precision search like the oneDNN bfloat16 tactics; the bundle then requires
    ``amx_bf16`` (their ``feature``)."""

    precision = "bf16"

    def offered(self) -> str | None:
        from ascendc_pack.toolchain.compiler import host_cpu_flags

        return amx_offered(host_cpu_flags())

    def param(self, t: KernelTactic, key: str, default=None):
        if key == "precision":
            return self.precision
        if key == "feature":
            return AMX_FEATURE
        return super().param(t, key, default)


class AmxBf16Family(OnAmx, GemmFamily):
    """The same steps' GEMMs computed in bfloat16 on the AMX tile unit
    (:mod:`ascendc_pack.kernels.gemm.amx`)."""

    name = "gemm_amx_bf16"

    def spec_of(self, step: TacticStep, values: dict) -> GemmSpec | None:
        spec = gemm_spec(step, values)
        if spec is None or amx_applies(spec) is not None:
            return None
        return dataclasses.replace(spec, name=spec.name.replace("gemm_", "gemm_amx_", 1))

    def plan(self, spec: GemmSpec, config, target):
        return amx_plan(spec, config, target)


AMX_BF16 = AmxBf16Family()


__all__ = ["GEMM", "AMX_BF16", "AmxBf16Family", "OnAmx", "GemmFamily", "GemmRunner", "gemm_spec", "conv_gemm_spec", "rows_nchw",
           "conv_gemm_weights", "epilogue_steps", "low_precision_check", "CONV_TILINGS"]
