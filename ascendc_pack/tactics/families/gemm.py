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
(:class:`ConvGemmTactic`): A = ``x`` as [N*H*W, C] rows (a view of a channels_last ``x``, a copy
of an NCHW one), B = the weight as [O, C] with an eval BatchNorm folded in at build, C = the
output's [N*H*W, O] rows, which *is* the channels_last [N, O, H, W] output (a view). It is a
candidate of the chain's channels_last configuration (``out_layout`` channels_last), with at most
:data:`CONV_TILINGS` tilings: a network has dozens of 1x1 convolutions, and every tiling is a
compile in the cold build.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.toolchain.compiler import compile_kernels
from ascendc_pack.kernels.gemm.generator import DTYPES, RESIDUAL_OPS, GemmSpec, GemmTarget, plan
from ascendc_pack.kernels.gemm.launch import GemmKernel, PackedB, logical_b
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.autotune.verify import verify_in_sandbox

log = logging.getLogger("ascendc_pack")

UNARY = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
CONV_UNARY = UNARY + ("hardswish", "hardsigmoid")
CONV_TILINGS = 1
"""Tilings of a 1x1 convolution's GEMM (the cost model's first ones): mobilenet_v3_small has 34
1x1 convolutions, efficientnet_b0 about 40 distinct ones, and each tiling is a compile of about
0.25 s of CPU in the cold build; the cost model's pick was within a few % of the PGO winner of two."""


@dataclass(frozen=True)
class GemmTactic:
    """One tiling candidate of a step's generated GEMM, as a tactic candidate."""

    spec: GemmSpec
    candidate: Candidate
    so_path: str
    b_packed: bool
    packed_b_bytes: int
    rank: int  # its place in the cost model's order

    kind = "linear"

    @property
    def name(self) -> str:
        return f"gemm#{self.rank}"

    @property
    def key(self) -> str:
        return self.candidate.kernel_key

    def param(self, key: str, default=None):
        return default

    def to_json(self) -> dict:
        c = self.candidate
        return {"kind": "linear", "name": self.name, "gemm": self.spec.to_json(), "kernel_key": c.kernel_key,
                "tiling_repr": c.tiling_repr, "workspace": c.workspace, "block_dim": c.block_dim,
                "b_packed": self.b_packed, "packed_b_bytes": self.packed_b_bytes}

    def lowered(self) -> dict:
        """What a lowered step keeps (``TacticStep.chosen``): the JSON plus the library's path in
        the build cache (for the Python-mode run; the bundle names its own member)."""
        return {**self.to_json(), "kernel": self.spec.name, "so_path": self.so_path}

    def kernel_weights(self, named: dict) -> dict:
        """The weights the kernel reads (``weight``, ``bias``), from the step's weights."""
        return {n: named[n] for n in ("weight", "bias") if n in named}

    def rows(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """An activation (or the step's output) as the kernel's row-major [m, n] operand."""
        return self.row_order(t).reshape(self.spec.m, n).contiguous()

    def row_order(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` viewed in the order of the rows' elements (its rows are this view, copied
        densely when it is not contiguous)."""
        return t

    def result(self, c: torch.Tensor) -> torch.Tensor:
        """The kernel's C as the step's output."""
        return c


@dataclass(frozen=True)
class ConvGemmTactic(GemmTactic):
    """A 1x1 convolution's generated GEMM on channels_last rows (see the module docstring)."""

    x_shape: tuple = ()
    affine: bool = False

    kind = "conv"

    def param(self, key: str, default=None):
        return {"layout": "channels_last", "out_layout": "channels_last"}.get(key, default)

    @property
    def out_shape(self) -> tuple:
        n, _, h, w = self.x_shape
        return (n, self.spec.n, h, w)

    def to_json(self) -> dict:
        return {**super().to_json(), "kind": "conv", "conv": {"x_shape": list(self.x_shape), "affine": self.affine}}

    def kernel_weights(self, named: dict) -> dict:
        return conv_gemm_weights(self.spec, self.affine, named)

    def row_order(self, t: torch.Tensor) -> torch.Tensor:
        return t.permute(0, 2, 3, 1)

    def result(self, c: torch.Tensor) -> torch.Tensor:
        return rows_nchw(c, self.out_shape)


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


@dataclass(frozen=True)
class GemmPlan:
    """A step's GEMM, its rendered candidates, and (1x1 convolutions) the step's geometry."""

    build: object  # gemm.GemmBuild
    conv: dict | None = None  # {"x_shape", "affine"} of a 1x1 convolution


def plan_gemms(steps: list[TacticStep], values_of: dict, config) -> dict[str, GemmPlan]:
    """The GEMM of each linear or 1x1 convolution step the template can take (by step name;
    ``values_of[name]``: the specs of its program's values), with its ``config.topn``
    candidates rendered (:data:`CONV_TILINGS` at most for a convolution)."""
    out = {}
    target = None
    for s in steps:
        spec = gemm_spec(s, values_of[s.name])
        if spec is None:
            continue
        target = target or GemmTarget.detect(config.effective_cores, config.march)
        conv = None
        cfg = config
        if s.tactic_kind == "conv":
            conv = {"x_shape": tuple(s.desc["x_shape"]), "affine": bool(s.desc["epilogue"]["affine"])}
            cfg = dataclasses.replace(config, topn=min(config.topn, CONV_TILINGS))
        out[s.name] = GemmPlan(plan(spec, cfg, target), conv)
    return out


def compile_gemm_plans(plans: dict[str, GemmPlan], config, progress=None) -> dict[str, list[GemmTactic]]:
    """Compile every planned GEMM (one ``compile_kernels`` call, cached like fused kernels);
    the candidates that compiled, as tactics, by step name, in the cost model's order."""
    if not plans:
        return {}
    out: dict[str, list[GemmTactic]] = {}
    builds = [p.build.build for p in plans.values()]
    for (name, p), ck in zip(plans.items(), compile_kernels(builds, config, progress)):
        b, cands = p.build, []
        for rank, (gc, cc) in enumerate(zip(b.candidates, ck.candidates)):
            if not cc.ok:
                log.info("GEMM %s candidate #%d did not compile", b.spec.name, rank)
                continue
            k = GemmKernel(b.spec, cc.so_path, cc.candidate.kernel_key)
            args = (b.spec, cc.candidate, str(cc.so_path), k.b_packed, k.packed_b_bytes, rank)
            cands.append(ConvGemmTactic(*args, **p.conv) if p.conv else GemmTactic(*args))
        out[name] = cands
    return out


class GemmRunner:
    """One GEMM candidate on a step's named tensors: B prepared (packed) once; :meth:`verify`
    runs it in the kernel sandbox, and only then may it be called in-process. A call is what the
    graph runs: the bound launch (no Python checks; on ``pool``, the graph's task pool, when
    given) after the copies of operands that arrive in another layout than the kernel's rows (a
    view otherwise, free in the graph too)."""

    def __init__(self, gt: GemmTactic, named: dict, pool: int | None = None):
        self.gt = gt
        self.kernel = GemmKernel(gt.spec, gt.so_path, gt.key)
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
        src = self.gt.row_order(t)
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
                                 lambda t: self.gt.rows(t, spec.n))

    def values(self) -> dict[str, TensorSpec]:
        spec = self.gt.spec
        out = self.gt.result(torch.empty((spec.m, spec.n), dtype=DTYPES[spec.dtype][1], device="meta"))
        return {"x": TensorSpec.of(self.x), "out": TensorSpec.of(out)}


def lowered_tactic(chosen: dict) -> GemmTactic:
    """The GEMM tactic a lowered step's ``chosen`` records (its library in the build cache)."""
    spec = GemmSpec.from_json(chosen["gemm"])
    cand = Candidate(chosen["tiling_repr"], chosen["workspace"], chosen["block_dim"])
    args = (spec, cand, chosen["so_path"], chosen["b_packed"], chosen["packed_b_bytes"], 0)
    if "conv" in chosen:  # its weights were folded at lowering: bound as [O, C] and bias
        return ConvGemmTactic(*args, x_shape=tuple(chosen["conv"]["x_shape"]), affine=False)
    return GemmTactic(*args)


def lowered_gemm_runner(chosen: dict, named: dict):
    """Python mode of a lowered GEMM step (``TacticStep.chosen``): B packed once from ``named``'s
    weight; returns ``run(named) -> the step's output``."""
    gt = lowered_tactic(chosen)
    kernel = GemmKernel(gt.spec, chosen["so_path"], chosen["kernel_key"])
    b = kernel.prepare_b(named["weight"])
    n, k = gt.spec.n, gt.spec.k

    def run(named: dict) -> torch.Tensor:
        res = [gt.rows(named["other"], n)] if "other" in named else []
        return gt.result(kernel(gt.rows(named["x"], k), b, named.get("bias"), res))

    return run


__all__ = ["GemmTactic", "ConvGemmTactic", "GemmRunner", "GemmPlan", "gemm_spec", "conv_gemm_spec", "plan_gemms",
           "compile_gemm_plans", "lowered_gemm_runner", "lowered_tactic", "rows_nchw",
           "conv_gemm_weights", "epilogue_steps", "CONV_TILINGS"]
