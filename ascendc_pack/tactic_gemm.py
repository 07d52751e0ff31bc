"""Generated GEMM kernels (:mod:`ascendc_pack.gemm`) as tactic candidates of GEMM steps.

A linear tactic step whose epilogue the GEMM template can fuse (bias, a residual ``add``, then
relu / gelu / gelu_tanh / silu / sigmoid) gets, besides the dispatcher tactics, the tiling
candidates of a :class:`~ascendc_pack.gemm.GemmSpec` (``gemm_<step name>``): B is the weight as
the graph holds it (``b_constant``, so candidates may pack it once at load), A the activation
made contiguous, C contiguous ``[m, n]``. They compile through the kernel cache like fused
kernels (one ``compile_kernels`` call for every step, before any run), are verified in the
kernel sandbox on the step's real arguments (a generated kernel could crash or hang: the build
must survive it) and timed with the other candidates. A chosen GEMM runs in graph.cpp as a kernel
launch, its B packed at load by the library's ``ap_gemm_pack_b``, and its library is a bundle
member like every kernel (listed in ``manifest.kernels``, re-hashed before ``dlopen``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ascendc_pack_runtime.accuracy import check_tensor

from .candidate import Candidate
from .compiler import compile_kernels
from .gemm import DTYPES, GemmSpec, GemmTarget, plan
from .gemm_launch import GemmKernel, PackedB, logical_b
from .program import TacticStep, TensorSpec
from .verify import Arena, launch_checked

log = logging.getLogger("ascendc_pack")

UNARY = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")


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


def gemm_spec(step: TacticStep, values: dict) -> GemmSpec | None:
    """The GEMM a linear step is, or None when the template cannot fuse its epilogue."""
    d, epi = step.desc, step.desc["epilogue"]
    if d["dtype"] not in DTYPES or epi["affine"] or epi["binary"] not in (None, "add") \
            or epi["unary"] not in (None, *UNARY):
        return None
    w = values[step.bind["weight"]]
    stride = w.stride or (w.shape[1], 1)
    rows, cols = stride  # the weight as held: [n, k] (nk) or [k, n] (kn)
    b_strides = (0, cols, rows) if d["weight_layout"] == "nk" else (0, rows, cols)
    epilogue = (("add",) if epi["binary"] else ()) + ((epi["unary"],) if epi["unary"] else ())
    return GemmSpec(f"gemm_{step.name}", d["m"], d["n"], d["k"], 1, d["dtype"], None, b_strides, True, d["bias"],
                    epilogue)


def plan_gemms(steps: list[TacticStep], values_of: dict, config) -> dict:
    """The GEMM of each linear step the template can take (by step name; ``values_of[name]``:
    the specs of its program's values), with its ``config.topn`` candidates rendered."""
    out = {}
    target = None
    for s in steps:
        spec = gemm_spec(s, values_of[s.name])
        if spec is not None:
            target = target or GemmTarget.detect(config.effective_cores, config.march)
            out[s.name] = plan(spec, config, target)
    return out


def compile_gemm_plans(plans: dict, config, progress=None) -> dict[str, list[GemmTactic]]:
    """Compile every planned GEMM (one ``compile_kernels`` call, cached like fused kernels);
    the candidates that compiled, as tactics, by step name, in the cost model's order."""
    if not plans:
        return {}
    out: dict[str, list[GemmTactic]] = {}
    for (name, b), ck in zip(plans.items(), compile_kernels([b.build for b in plans.values()], config, progress)):
        cands = []
        for rank, (gc, cc) in enumerate(zip(b.candidates, ck.candidates)):
            if not cc.ok:
                log.info("GEMM %s candidate #%d did not compile", b.spec.name, rank)
                continue
            k = GemmKernel(b.spec, cc.so_path, cc.candidate.kernel_key)
            cands.append(GemmTactic(b.spec, cc.candidate, str(cc.so_path), k.b_packed, k.packed_b_bytes, rank))
        out[name] = cands
    return out


class GemmRunner:
    """One GEMM candidate on a step's named tensors: B prepared (packed) once, then launches."""

    def __init__(self, gt: GemmTactic, named: dict):
        self.gt = gt
        self.kernel = GemmKernel(gt.spec, gt.so_path, gt.key)
        self.a = named["x"].contiguous()
        self.b = self.kernel.prepare_b(named["weight"])
        self.bias = named.get("bias")
        self.residuals = [named["other"].contiguous()] if "other" in named else []

    def __call__(self) -> torch.Tensor:
        return self.kernel(self.a, self.b, self.bias, self.residuals)

    def verify(self, expected: torch.Tensor, ref64, sandbox, timeout_s: float) -> dict | None:
        """Run the candidate once in the kernel sandbox; None if its output matches the
        reference by the accuracy rule, else the disqualification record."""
        spec = self.gt.spec
        b = self.b.data if isinstance(self.b, PackedB) else logical_b(spec, self.b)
        ins = [self.a, b] + ([self.bias] if self.bias is not None else []) + self.residuals
        arena = Arena(ins, [((spec.m, spec.n), DTYPES[spec.dtype][1])])
        try:
            bad = launch_checked(sandbox, self.gt.so_path, arena, self.gt.candidate.workspace, timeout_s)
            if bad is not None:
                return _verdict(bad.reason, bad.detail)
            got = arena.outputs[0].clone()
        finally:
            arena.close()
        want = expected.reshape(got.shape)
        check = check_tensor("output", want, got, ref64.reshape(got.shape) if ref64 is not None else None)
        if not check.ok:
            return {**_verdict("wrong result", check.problem), "max_error": check.max_error, "allowed": check.allowed}
        return None

    def values(self) -> dict[str, TensorSpec]:
        spec = self.gt.spec
        return {"x": TensorSpec.of(self.a), "out": TensorSpec((spec.m, spec.n), spec.dtype, (spec.n, 1))}


def lowered_gemm_runner(chosen: dict, named: dict):
    """Python mode of a lowered GEMM step (``TacticStep.chosen``): B packed once from ``named``'s
    weight; returns ``run(named) -> C``."""
    spec = GemmSpec.from_json(chosen["gemm"])
    kernel = GemmKernel(spec, chosen["so_path"], chosen["kernel_key"])
    b = kernel.prepare_b(named["weight"])

    def run(named: dict) -> torch.Tensor:
        res = [named["other"].contiguous()] if "other" in named else []
        return kernel(named["x"].contiguous(), b, named.get("bias"), res)

    return run


def _verdict(reason: str, detail: str) -> dict:
    return {"reason": reason, "detail": detail, "output": None, "max_error": None, "allowed": None}


__all__ = ["GemmTactic", "GemmRunner", "gemm_spec", "plan_gemms", "compile_gemm_plans", "lowered_gemm_runner"]
