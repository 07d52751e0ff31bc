"""Generated attention kernels (:mod:`ascendc_pack.kernels.attention.generator`) as tactic candidates of
attention steps.

A float32 attention step gets, besides ``unfused`` (candidate 0) and torch's ``flash``, up to
``config.topn`` tilings of its generated kernel (``attention_<step name>``). The kernel reads
``q``, ``k`` and ``v`` with the strides they arrive in (recorded on the real inputs; a tensor that
arrives otherwise is copied, in the candidate's timing as in the graph) and a mask as its own
contiguous tensor, and writes the ``[B, L, H, Ev]`` memory flash attention returns. Like the other
generated kernels a candidate is verified in the kernel sandbox before it is timed, and a chosen
one launches from graph.cpp (its library a bundle member).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.kernels.attention.generator import AttnKernel, AttnSpec, AttnSpecError, plan
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.toolchain.compiler import compile_kernels
from ascendc_pack.kernels.gemm.generator import GemmTarget
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.autotune.verify import verify_in_sandbox

log = logging.getLogger("ascendc_pack")


def _strides(spec: TensorSpec | None, shape: tuple) -> tuple[int, int, int]:
    """(batch, head, row) strides of a value of ``shape`` as it arrives: its recorded strides
    when it has this shape and a dense last dimension, else contiguous (it will be copied)."""
    if spec is not None and spec.stride is not None and tuple(spec.shape) == tuple(shape) and spec.stride[-1] == 1:
        return tuple(spec.stride[:3])
    return tuple(contiguous_strides(shape)[:3])


def attention_spec(step: TacticStep, values: dict) -> AttnSpec | None:
    """The generated kernel's spec of a float32 attention ``step`` (``values``: the specs of its
    program's values), or None when the kernel does not take it."""
    d = step.desc
    if step.tactic_kind != "attention" or d.get("dtype") != "float32":
        return None
    a = T.step_from_json(d)
    shapes = a.shapes()
    strides = {n: _strides(values.get(step.bind.get(n)), shapes[n]) for n in ("q", "k", "v")}
    mask_shape = None
    if a.mask:
        ms = tuple(shapes["mask"])
        mask_shape = (1,) * (4 - len(ms)) + ms
    try:
        return AttnSpec(f"attention_{step.name}", a.batch, a.heads, a.hkv, a.q_len, a.kv_len, a.head_dim, a.ev,
                        a.softmax_scale, strides["q"], strides["k"], strides["v"], a.mask, mask_shape, a.causal,
                        a.safe_softmax, a.mask_windows)
    except AttnSpecError as e:
        log.debug("no generated attention kernel for %s: %s", step.name, e)
        return None


@dataclass(frozen=True)
class AttnKernelTactic:
    """One tiling of an attention step's generated kernel, as a tactic candidate."""

    spec: AttnSpec
    candidate: Candidate
    so_path: str
    rank: int

    kind = "attention"

    @property
    def name(self) -> str:
        return f"kernel#{self.rank}"

    @property
    def key(self) -> str:
        return self.candidate.kernel_key

    def param(self, key: str, default=None):
        return default

    def to_json(self) -> dict:
        c = self.candidate
        return {"kind": "attention", "name": self.name, "attention": self.spec.to_json(), "kernel_key": c.kernel_key,
                "tiling_repr": c.tiling_repr, "workspace": c.workspace, "block_dim": c.block_dim}

    def lowered(self) -> dict:
        """What a lowered step keeps (``TacticStep.chosen``): the JSON plus the library's path in
        the build cache (Python mode; the bundle names its own member)."""
        return {**self.to_json(), "kernel": self.spec.name, "so_path": self.so_path}

    @staticmethod
    def from_lowered(chosen: dict) -> AttnKernelTactic:
        cand = Candidate(chosen["tiling_repr"], chosen["workspace"], chosen["block_dim"])
        return AttnKernelTactic(AttnSpec.from_json(chosen["attention"]), cand, chosen["so_path"], 0)


def plan_attention_kernels(steps: list[TacticStep], values_of: dict, config) -> dict:
    """The kernel build of every attention step the generated kernel takes (by step name;
    ``values_of[name]``: its program's value specs), with ``config.topn`` candidates rendered."""
    out, target = {}, None
    for s in steps:
        spec = attention_spec(s, values_of[s.name])
        if spec is not None:
            target = target or GemmTarget.detect(config.effective_cores, config.march)
            out[s.name] = plan(spec, config, target)
    return out


def compile_attention_plans(plans: dict, config, progress=None) -> dict[str, list[AttnKernelTactic]]:
    """Compile every planned kernel (one ``compile_kernels`` call, cached like fused kernels);
    the candidates that compiled, as tactics, by step name."""
    if not plans:
        return {}
    out: dict[str, list[AttnKernelTactic]] = {}
    compiled = compile_kernels([b.build for b in plans.values()], config, progress)
    for (name, b), ck in zip(plans.items(), compiled):
        out[name] = []
        for rank, (cand, cc) in enumerate(zip(b.candidates, ck.candidates)):
            if cc.ok:
                out[name].append(AttnKernelTactic(b.spec, cc.candidate, str(cc.so_path), rank))
            else:
                log.info("attention %s candidate #%d did not compile", b.spec.name, rank)
    return out


class AttnKernelRunner:
    """One candidate on a step's named tensors: :meth:`verify` runs it in the kernel sandbox, and
    only then may it be called in-process. A call is what the graph runs: the copies of operands
    that arrive in another layout than the kernel's, then the bound launch (on ``pool`` when given)."""

    def __init__(self, t: AttnKernelTactic, named: dict, pool: int | None = None):
        self.t = t
        self.kernel = AttnKernel(t.spec, t.so_path, t.key)
        self.ins = self.kernel.operands(named)
        self._copies = [(dst, named[n]) for n, dst in zip(("q", "k", "v", "mask"), self.ins)
                        if dst.data_ptr() != named[n].data_ptr()]
        self.out = self.kernel.new_output()
        self._launch = self.kernel.lib.bind(self.ins, [self.out], self.kernel.workspace_buffer, pool=pool)

    def __call__(self) -> torch.Tensor:
        for dst, src in self._copies:
            dst.copy_(src.reshape(dst.shape))
        if self._launch() != 0:
            raise RuntimeError(f"attention kernel {self.t.spec.name} ({self.t.key}) failed")
        return self.out

    def verify(self, expected: torch.Tensor, ref64, sandbox, timeout_s: float) -> dict | None:
        """Run the candidate once in the kernel sandbox; None if its output matches the
        reference by the accuracy rule, else the disqualification record."""
        spec = self.t.spec
        return verify_in_sandbox(sandbox, self.t.so_path, self.t.candidate.workspace, self.ins,
                                 (spec.out_shape, torch.float32, spec.out_strides), timeout_s, expected, ref64,
                                 lambda x: x.reshape(spec.out_shape))

    def values(self) -> dict[str, TensorSpec]:
        return {"out": TensorSpec.of(self.out)}


def lowered_attention_runner(chosen: dict, named: dict):
    """Python mode of a lowered step (``TacticStep.chosen``): returns ``run(named) -> output``."""
    t = AttnKernelTactic.from_lowered(chosen)
    kernel = AttnKernel(t.spec, t.so_path, t.key)
    return lambda named: kernel(named)


__all__ = ["AttnKernelTactic", "AttnKernelRunner", "attention_spec", "plan_attention_kernels",
           "compile_attention_plans", "lowered_attention_runner"]
