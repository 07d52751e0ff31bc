"""Generated attention kernels (:mod:`ascendc_pack.kernels.attention.generator`) as tactic candidates of
attention steps.

A float32 attention step gets, besides ``unfused`` (candidate 0) and torch's ``flash``, up to
``config.topn`` tilings of its generated kernel (``attention_<step name>``). The kernel reads
``q``, ``k`` and ``v`` with the strides they arrive in (recorded on the real inputs; a tensor that
arrives otherwise is copied, in the candidate's timing as in the graph; one that is a view of a
contiguous copy, as ``nn.MultiheadAttention`` makes, is read from what was copied:
:mod:`ascendc_pack.tactics.attention_sources`) and a mask as its own
contiguous tensor, and writes the ``[B, L, H, Ev]`` memory flash attention returns. Like the other
generated kernels a candidate is verified in the kernel sandbox before it is timed, and a chosen
one launches from graph.cpp (its library a bundle member).

With ``--precision bf16`` / ``auto`` on a host with AMX-BF16 the same steps also get the AMX
bfloat16 kernel's candidates (family ``attention_amx_bf16``, :mod:`ascendc_pack.kernels.attention.amx`):
the same spec, inputs and output, Q·Kᵀ and P·V on the tile unit, verified within the bf16 step
tolerance and chosen by the precision search; the bundle then requires ``amx_bf16``.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.autotune.verify import verify_in_sandbox
from ascendc_pack.ir.program import TacticStep, TensorSpec
import ascendc_pack.kernels.attention.amx as amx_attention
from ascendc_pack.kernels.attention.generator import AttnKernel, AttnSpec, AttnSpecError, plan
from ascendc_pack.tactics.attention_sources import resolve, source_spec
from ascendc_pack.tactics.families.base import KernelFamily, KernelTactic
from ascendc_pack.tactics.families.gemm import OnAmx, low_precision_check

log = logging.getLogger("ascendc_pack")


def _strides(spec: TensorSpec | None, shape: tuple) -> tuple[int, int, int]:
    """(batch, head, row) strides of a value of ``shape`` as it arrives: its recorded strides
    when it has this shape and a dense last dimension, else contiguous (it will be copied)."""
    if spec is not None and spec.stride is not None and tuple(spec.shape) == tuple(shape) and spec.stride[-1] == 1:
        return tuple(spec.stride[:3])
    return tuple(contiguous_strides(shape)[:3])


def _arriving(step: TacticStep, values: dict, n: str) -> TensorSpec | None:
    """How input ``n`` arrives at a generated kernel: through its recipe from the value it was
    copied from when the step has one (:mod:`ascendc_pack.tactics.attention_sources`), else as bound."""
    recipe, src = (step.desc.get("sources") or {}).get(n), step.bind.get(f"{n}_src")
    if recipe is not None and src in values:
        return source_spec(recipe, values[src])
    return values.get(step.bind.get(n))


def attention_spec(step: TacticStep, values: dict) -> AttnSpec | None:
    """The generated kernel's spec of a float32 attention ``step`` (``values``: the specs of its
    program's values), or None when the kernel does not take it."""
    d = step.desc
    if step.tactic_kind != "attention" or d.get("dtype") != "float32":
        return None
    a = T.step_from_json(d)
    shapes = a.shapes()
    strides = {n: _strides(_arriving(step, values, n), shapes[n]) for n in ("q", "k", "v")}
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


class AttentionFamily(KernelFamily):
    """The generated fused-attention kernel of float32 attention steps."""

    name = "attention"
    kinds = ("attention",)
    weights = "none"
    graph = "generic"

    def spec_of(self, step: TacticStep, values: dict) -> AttnSpec | None:
        return attention_spec(step, values)

    def spec_from_json(self, d: dict) -> AttnSpec:
        return AttnSpec.from_json(d)

    def plan(self, spec: AttnSpec, config, target):
        return plan(spec, config, target)

    def extra(self, step: TacticStep, spec, so_path: str, kernel_key: str) -> dict:
        return {"sources": step.desc["sources"]} if step.desc.get("sources") else {}

    def runner(self, t: KernelTactic, named: dict, pool: int | None = None) -> AttnKernelRunner:
        return AttnKernelRunner(t, resolve(named, t.extra.get("sources")), pool)

    def lowered_runner(self, t: KernelTactic, named: dict):
        kernel = AttnKernel(t.spec, t.so_path, t.candidate.kernel_key)
        return lambda named: kernel(resolve(named, t.extra.get("sources")))

    def input_layouts(self, chosen: dict) -> dict:
        return AttnSpec.from_json(chosen["spec"]).input_layouts()

    def output_layout(self, chosen: dict) -> tuple:
        a = AttnSpec.from_json(chosen["spec"])
        return a.out_shape, a.out_strides, "float32"


class AttnKernelRunner:
    """One candidate on a step's named tensors: :meth:`verify` runs it in the kernel sandbox, and
    only then may it be called in-process. A call is what the graph runs: the copies of operands
    that arrive in another layout than the kernel's, then the bound launch (on ``pool`` when given)."""

    def __init__(self, t: KernelTactic, named: dict, pool: int | None = None):
        self.t = t
        self.kernel = AttnKernel(t.spec, t.so_path, t.candidate.kernel_key)
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
                                 lambda x: x.reshape(spec.out_shape), check=low_precision_check(self.t))

    def values(self) -> dict[str, TensorSpec]:
        return {"out": TensorSpec.of(self.out)}


ATTENTION = AttentionFamily()


class AmxAttentionFamily(OnAmx, AttentionFamily):
    """The same steps in bfloat16 on the AMX tile unit (:mod:`ascendc_pack.kernels.attention.amx`)."""

    name = "attention_amx_bf16"

    def spec_of(self, step: TacticStep, values: dict) -> AttnSpec | None:
        spec = attention_spec(step, values)
        return None if spec is None else dataclasses.replace(spec, name=spec.name.replace("attention_", "attention_amx_", 1))

    def plan(self, spec: AttnSpec, config, target):
        return amx_attention.plan(spec, config, target)


AMX_ATTENTION = AmxAttentionFamily()


__all__ = ["AMX_ATTENTION", "ATTENTION", "AmxAttentionFamily", "AttentionFamily", "AttnKernelRunner", "attention_spec"]
