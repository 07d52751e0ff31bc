"""Generated convolution kernels as tactic candidates of convolution steps (docs/TACTICS.md).

Kernel families, all float32 with a bias or a folded BatchNorm, a residual ``add`` and one
activation fused:

* ``dwconv`` (:mod:`ascendc_pack.kernels.conv.depthwise`, docs/DWCONV.md): depthwise convolutions (channel
  multiplier 1, any kernel size, stride, padding and dilation); weight packed ``[kh, kw, C]``;
* ``directconv`` (:mod:`ascendc_pack.kernels.conv.direct`, docs/DIRECTCONV.md): dense convolutions
  (groups 1) but the 1x1 stride-1 ones, which are GEMMs (:mod:`ascendc_pack.tactics.families.gemm`);
  weight packed in output-channel blocks of the candidate's ``ocb``;
* ``directconv_nchw``: the same kernel reading an entry step's NCHW ``x`` (and residual) in place;
* ``winograd`` (:mod:`ascendc_pack.kernels.conv.winograd`, docs/WINOGRAD.md): 3x3 stride-1 dense convolutions
  with at least :data:`~ascendc_pack.kernels.conv.winograd.MIN_CHANNELS` input channels as Winograd F(2x2, 3x3)
  (2.25x fewer multiply-adds); weight transformed and packed at build;
* ``conv_amx_bf16`` (:mod:`ascendc_pack.kernels.conv.amx`, docs/GEMM.md): the dense convolutions of
  ``directconv`` as implicit GEMMs in bfloat16 on the AMX tile unit, a low-precision candidate
  (offered with ``--precision bf16`` / ``auto`` on a host with AMX-BF16; the bundle then requires
  ``amx_bf16``); weight rounded and packed at build;
* ``conv_amx_direct_bf16``: those with a multiple of 32 input channels and output rows that fill
  their 16-pixel strips once more, x's rows rounded per task and every A tile read from them in place
  (no im2col);
* ``conv_amx_nchw_bf16``: the im2col kernel reading an entry step's NCHW ``x`` in place (the
  3-channel stem of a CNN: no relayout of the input);
* ``conv_amx_rows_bf16``: an entry step's NCHW ``x`` of at most 4 channels, its rows rounded per task
  into 2 or 4 channels a pixel and read in place, an A tile a kernel row of taps (the stem without an
  im2col).

A step a family takes gets the cost model's first :data:`CONV_KERNEL_TILINGS` tilings of its
kernel as candidates of its chain's channels_last configuration. The kernel reads NHWC memory (a
channels_last ``x``; an NCHW one is copied, which the candidate's timing pays like the graph
does; one copy when the residual is ``x`` itself), or NCHW for ``directconv_nchw``, and the
weight packed at build (the BatchNorm folded in, stored in the bundle), and writes
the channels_last output. Like a generated GEMM it is verified in the kernel sandbox before it
is timed, and a chosen one launches from graph.cpp like a fused kernel, its library a bundle
member.

Each generator is one :class:`ConvFamily` of the tactic registry
(:mod:`ascendc_pack.tactics.families.registry`): the spec of a step (or None when the step is not
its kind), planning (candidates + sources), the launcher, the build-time weights.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

import ascendc_pack.kernels.conv.amx as amxconv
import ascendc_pack.kernels.conv.direct as directconv
import ascendc_pack.kernels.conv.depthwise as dwconv
import ascendc_pack.kernels.conv.winograd as winograd
from ascendc_pack.autotune.verify import verify_in_sandbox
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.program import TacticStep, TensorSpec
from ascendc_pack.kernels.conv.common import UNARY_OPS, fold_affine
from ascendc_pack.kernels.conv.depthwise_launch import DwConvKernel
from ascendc_pack.kernels.conv.direct_launch import (AmxConvKernel, AmxDirectConvKernel, AmxRowsConvKernel, ConvKernel,
                                                     WinogradKernel)
from ascendc_pack.tactics.families.base import KernelFamily, KernelTactic
from ascendc_pack.tactics.families.gemm import OnAmx, epilogue_steps, low_precision_check
from ascendc_pack.tactics.rewrite import CL as CL_NAME  # a step description's layout

log = logging.getLogger("ascendc_pack")

CL = torch.channels_last
MIN_DIRECT_CHANNELS = 8
"""The direct convolution vectorizes over output channels: fewer than a vector's worth is slow."""
CONV_KERNEL_TILINGS = 1
"""Tilings of a convolution's generated kernel compiled per step (the cost model's first ones):
efficientnet_b0 has 16 depthwise convolutions and each tiling is a compile in the cold build; the
depthwise cost model was fitted to measured candidates (docs/DWCONV.md)."""
WINOGRAD_TILINGS = 2
"""The Winograd kernel's: its estimate ranks output-channel blocks and band modes within ~20 %,
so PGO times the best and the best of another block or mode (measured 10-40 % apart)."""
AMX_TILINGS = 3
"""The AMX convolutions': their estimates misrank tilings by up to 2x (the best of resnet18's
7x7-pixel 512-channel convolution was the fifth), so PGO times three."""


def _fusable(step: TacticStep) -> bool:
    """float32, and an epilogue the kernels fuse: a residual ``add`` and one activation at most."""
    epi = step.desc["epilogue"]
    return step.desc["dtype"] == "float32" and epi["binary"] in (None, "add") \
        and (epi["unary"] is None or epi["unary"] in UNARY_OPS)


def _spec(make, step: TacticStep):
    """``make(desc, bias, epilogue)``'s spec for ``step``, or None when the kernel refuses it."""
    d, epi = step.desc, step.desc["epilogue"]
    try:
        return make(d, bool(d["bias"] or epi["affine"]), epilogue_steps(epi))
    except (dwconv.DwConvSpecError, directconv.ConvSpecError) as e:
        log.debug("no generated kernel for %s: %s", step.name, e)
        return None


def _dw_spec(step: TacticStep):
    d = step.desc
    c = d["x_shape"][1]
    if d["groups"] != c or d["out_channels"] != c or not _fusable(step):
        return None
    return _spec(lambda d, bias, epi: dwconv.DwConvSpec.from_conv(
        f"dwconv_{step.name}", tuple(d["x_shape"]), tuple(d["kernel"]), tuple(d["stride"]), tuple(d["padding"]),
        tuple(d["dilation"]), bias=bias, epilogue=epi), step)


def _direct_spec(step: TacticStep, in_place: bool = False):
    """The direct convolution of ``step`` reading NHWC memory (an NCHW ``x`` copied first), or with
    ``in_place`` an entry step's NCHW ``x`` (and residual) as they arrive (None for other steps)."""
    d = step.desc
    gemm = tuple(d["kernel"]) == (1, 1) and tuple(d["stride"]) == (1, 1) and tuple(d["padding"]) == (0, 0)
    if d["groups"] != 1 or gemm or d["out_channels"] < MIN_DIRECT_CHANNELS or not _fusable(step):
        return None
    arrives_nchw = d.get("position") != "interior" and d["layout"] != CL_NAME
    if in_place and not arrives_nchw:
        return None
    layouts = dict(x_layout="nchw", residual_layout="nhwc" if d.get("other_layout") == CL_NAME else "nchw") \
        if in_place else {}
    return _spec(lambda d, bias, epi: directconv.ConvSpec.from_conv(
        f"directconv{'_nchw' if in_place else ''}_{step.name}", tuple(d["x_shape"]),
        (d["out_channels"], d["x_shape"][1], *d["kernel"]), tuple(d["stride"]), tuple(d["padding"]),
        tuple(d["dilation"]), bias=bias, epilogue=epi, **layouts), step)


def _amx_spec_of(prefix: str, applies, in_place: bool = False):
    """The spec function of an AMX convolution family: ``directconv``'s spec of a step (NHWC, or
    with ``in_place`` an entry step's NCHW x), renamed with ``prefix``, where ``applies(spec)``
    finds no reason against it (None for other steps)."""
    old = "directconv_nchw_" if in_place else "directconv_"

    def spec_of(step: TacticStep):
        spec = _direct_spec(step, in_place)
        if spec is None or applies(spec) is not None:
            return None
        return dataclasses.replace(spec, name=spec.name.replace(old, prefix, 1))

    return spec_of


def _winograd_spec(step: TacticStep):
    """The Winograd F(2x2, 3x3) convolution of a 3x3 stride-1 ``step`` (None for other steps)."""
    spec = _direct_spec(step)
    if spec is None or spec.c_in < winograd.MIN_CHANNELS:
        return None
    try:
        spec = dataclasses.replace(spec, name=spec.name.replace("directconv_", "winograd_", 1))
        winograd.check_spec(spec)
    except directconv.ConvSpecError as e:
        log.debug("no Winograd kernel for %s: %s", step.name, e)
        return None
    return spec


class ConvFamily(KernelFamily):
    """One convolution kernel generator as a tactic family: its step test, spec, planner,
    launcher and build-time weights."""

    kinds = ("conv",)
    weights = "made"
    graph = "conv"

    def __init__(self, name: str, spec_of, spec_from_json, plan, launcher, pack, tilings: int = CONV_KERNEL_TILINGS):
        self.name, self._spec_of, self._spec_from_json, self._plan = name, spec_of, spec_from_json, plan
        self.launcher, self._pack, self.tilings = launcher, pack, tilings

    def spec_of(self, step: TacticStep, values: dict):
        return self._spec_of(step)

    def spec_from_json(self, d: dict):
        return self._spec_from_json(d)

    def plan(self, spec, config, target):
        return self._plan(spec, config, target)

    def extra(self, step: TacticStep, spec, so_path: str, kernel_key: str) -> dict:
        return {"affine": bool(step.desc["epilogue"]["affine"])}

    def lowered_extra(self, t: KernelTactic) -> dict:
        return {"affine": False}   # its weights are folded and packed at lowering

    def param(self, t: KernelTactic, key: str, default=None):
        """``layout``: the format ``x`` is read in; ``out_layout``: always channels_last."""
        return {"layout": "contiguous" if _x_layout(t) == "nchw" else CL_NAME, "out_layout": CL_NAME}.get(key, default)

    def kernel_weights(self, t: KernelTactic, named: dict) -> dict:
        """The weights the kernel reads (``weight`` packed, ``bias``), the BatchNorm folded in first."""
        w, b = named["weight"], named.get("bias")
        if t.extra.get("affine"):
            w, b = fold_affine(w, b, named["scale"].reshape(-1), named["shift"].reshape(-1))
        return {"weight": self._pack(w, t.candidate), **({"bias": b.contiguous()} if b is not None else {})}

    def runner(self, t: KernelTactic, named: dict, pool: int | None = None) -> ConvKernelRunner:
        return ConvKernelRunner(t, named, pool)

    def lowered_runner(self, t: KernelTactic, named: dict):
        """Python mode of a lowered step (``named`` holds the packed weight): channels_last output,
        ``x`` and the residual relayouted when they arrive in another layout than the kernel's."""
        kernel = self.launcher(t.spec, t.so_path, t.candidate.kernel_key)
        layouts = {"x": _x_layout(t), "other": _residual_layout(t)}

        def run(named: dict) -> torch.Tensor:
            act = {n: v.contiguous(memory_format=MEMORY_FORMATS[layouts[n]]) for n, v in named.items() if n in layouts}
            return kernel(act["x"], named["weight"], named.get("bias"), act.get("other"))

        return run


class AmxConvFamily(OnAmx, ConvFamily):
    """Dense convolutions in bfloat16 on the AMX tile unit (:mod:`ascendc_pack.kernels.conv.amx`)."""


def _x_layout(t: KernelTactic) -> str:
    return getattr(t.spec, "x_layout", "nhwc")


def _residual_layout(t: KernelTactic) -> str:
    return getattr(t.spec, "residual_layout", "nhwc")


def _direct_pack(w, cand: Candidate):
    return directconv.pack_weight(w, directconv.ConvTiling.parse(cand.tiling_repr).ocb)


# A step may get kernels of several families (an entry convolution: the direct kernel on a copy
# of its NCHW input and the one reading it in place; PGO picks: in place was 8 % faster on
# resnet18's 3-channel stem, 28 % slower in CPU time on conv_block's 32 channels of 56x56)
DWCONV = ConvFamily("dwconv", _dw_spec, dwconv.DwConvSpec.from_json, dwconv.plan, DwConvKernel,
                    lambda w, cand: dwconv.pack_weight(w))
DIRECTCONV = ConvFamily("directconv", _direct_spec, directconv.ConvSpec.from_json, directconv.plan, ConvKernel,
                        _direct_pack)
DIRECTCONV_NCHW = ConvFamily("directconv_nchw", lambda step: _direct_spec(step, in_place=True),
                             directconv.ConvSpec.from_json, directconv.plan, ConvKernel, _direct_pack)
WINOGRAD = ConvFamily("winograd", _winograd_spec, directconv.ConvSpec.from_json, winograd.plan, WinogradKernel,
                      lambda w, cand: winograd.pack_weight(w, winograd.WinoTiling.parse(cand.tiling_repr).ocb),
                      WINOGRAD_TILINGS)
AMX_CONV = AmxConvFamily("conv_amx_bf16", _amx_spec_of("conv_amx_", amxconv.amx_conv_applies),
                         directconv.ConvSpec.from_json, amxconv.plan, AmxConvKernel,
                         lambda w, cand: amxconv.pack_weight(w), AMX_TILINGS)
AMX_NCHW_CONV = AmxConvFamily("conv_amx_nchw_bf16", _amx_spec_of("conv_amx_nchw_", amxconv.amx_conv_applies, True),
                              directconv.ConvSpec.from_json, amxconv.plan, AmxConvKernel,
                              lambda w, cand: amxconv.pack_weight(w, "nchw"), AMX_TILINGS)
AMX_DIRECT_CONV = AmxConvFamily("conv_amx_direct_bf16", _amx_spec_of("conv_amxd_", amxconv.direct_pays),
                                directconv.ConvSpec.from_json, amxconv.plan_direct, AmxDirectConvKernel,
                                lambda w, cand: amxconv.pack_weight(w), AMX_TILINGS)
AMX_ROWS_CONV = AmxConvFamily("conv_amx_rows_bf16", _amx_spec_of("conv_amxr_", amxconv.rows_pays, True),
                              directconv.ConvSpec.from_json, amxconv.plan_rows, AmxRowsConvKernel,
                              lambda w, cand: amxconv.pack_weight(w, "rows"), AMX_TILINGS)


MEMORY_FORMATS = {"nhwc": CL, "nchw": torch.contiguous_format}


def in_layout(t: torch.Tensor, layout: str) -> bool:
    """``t`` is stored as a kernel reading ``layout`` ("nhwc" / "nchw") needs it."""
    return t.dim() == 4 and t.is_contiguous(memory_format=MEMORY_FORMATS[layout])


class ConvKernelRunner:
    """One candidate on a step's named tensors: weights folded and packed once; :meth:`verify`
    runs it in the kernel sandbox, and only then may it be called in-process. A call is what the
    graph runs: the bound launch (on ``pool`` when given) after the copy of an operand that
    arrives NCHW."""

    def __init__(self, t: KernelTactic, named: dict, pool: int | None = None):
        self.t = t
        self.kernel = t.impl.launcher(t.spec, t.so_path, t.candidate.kernel_key)
        w = t.kernel_weights(named)
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.x_spec = TensorSpec.of(named["x"])
        x = self._stored(named["x"], _x_layout(t))
        ins = [x, w["weight"]] + ([w["bias"]] if "bias" in w else [])
        if "other" in named:  # a residual that is x (conv_block) shares its copy
            same = named["other"] is named["x"] and _residual_layout(t) == _x_layout(t)
            ins.append(x if same else self._stored(named["other"], _residual_layout(t)))
        self.ins = ins
        self.out = torch.empty(t.spec.out_shape, memory_format=CL)
        self._launch = self.kernel.lib.bind(ins, [self.out], self.kernel.workspace_buffer, pool=pool)

    def _stored(self, t: torch.Tensor, layout: str) -> torch.Tensor:
        """``t`` in ``layout`` (the kernel's): itself, or a copy refreshed before every call."""
        if in_layout(t, layout):
            return t
        buf = torch.empty_like(t, memory_format=MEMORY_FORMATS[layout])
        buf.copy_(t)
        self._copies.append((buf, t))
        return buf

    def __call__(self) -> torch.Tensor:
        for dst, src in self._copies:
            dst.copy_(src)
        if self._launch() != 0:
            raise RuntimeError(f"{self.t.family} {self.t.spec.name} ({self.t.key}) failed")
        return self.out

    def verify(self, expected: torch.Tensor, ref64, sandbox, timeout_s: float) -> dict | None:
        """Run the candidate once in the kernel sandbox; None if its output matches the
        reference by the accuracy rule, else the disqualification record."""
        return verify_in_sandbox(sandbox, self.t.so_path, self.t.candidate.workspace, self.ins,
                                 (self.t.spec.out_shape, torch.float32, self.out.stride()), timeout_s, expected, ref64,
                                 check=low_precision_check(self.t))

    def values(self) -> dict[str, TensorSpec]:
        return {"x": self.x_spec, "out": TensorSpec.of(self.out)}


__all__ = ["AmxConvFamily", "ConvFamily", "ConvKernelRunner", "DWCONV", "DIRECTCONV", "DIRECTCONV_NCHW", "WINOGRAD",
           "AMX_CONV", "AMX_NCHW_CONV", "AMX_DIRECT_CONV", "AMX_ROWS_CONV", "in_layout", "CONV_KERNEL_TILINGS", "WINOGRAD_TILINGS", "AMX_TILINGS"]
