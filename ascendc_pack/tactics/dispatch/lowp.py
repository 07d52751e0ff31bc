"""Low-precision tactics: the heavy op in bfloat16 on oneDNN (int8: :mod:`.int8`), opt-in (``--precision``).

A float32 step's bfloat16 candidate converts what it reads, runs the heavy op in bfloat16 on a
weight converted once, and converts its result back, so the graph around it stays float32::

    x_bf16 = x.to(bfloat16)                    # per call (a channels_last chain: one pass, both)
    y_bf16 = oneDNN op(x_bf16, weight_bf16)    # weight: rounded at build (stored in bfloat16,
    y = y_bf16.to(float32)                     #   half the bytes), packed at load for this ISA
    out = epilogue(y)                          # bias + one unary fused in bfloat16 when there is
                                               #   no residual; a residual add and what follows
                                               #   run in float32 (the residual stream is not rounded)

* ``onednn_bf16`` (GEMM): ``mkldnn::_linear_pointwise`` on ``mkldnn::_reorder_linear_weight`` of
  the bfloat16 weight (bias float32, which oneDNN accepts beside bfloat16 input);
* ``onednn_bf16`` / ``onednn_cl_bf16`` (convolution): ``mkldnn::_convolution_pointwise``, the
  channels_last candidate of a chain converting and relayouting ``x`` in one ``_to_copy``; both
  return channels_last, like their float32 siblings (``out_layout``);
* ``flash_bf16`` (attention): torch's CPU flash attention on bfloat16 ``q``, ``k``, ``v`` (and mask).

Each records ``("precision", "bf16")`` in its params. They are offered only where the host
computes bfloat16 natively (:func:`bf16_offered`: AVX512_BF16 or AMX-BF16 on x86, BF16 on
aarch64, and oneDNN's bfloat16 path in this torch), since emulated bfloat16 is slower than
float32; a bundle that uses one records that CPU feature in ``target.isa`` (:func:`bf16_feature`),
so the runtime refuses a host without it with its typed ISA error. Verification checks a
low-precision candidate by its relative error against the step's float32 reference
(:data:`STEP_TOLERANCE`), not by the float32 accuracy rule; the model-wide budget is checked end
to end (:mod:`ascendc_pack.tactics.precision`).
"""

from __future__ import annotations

import dataclasses

from ascendc_pack.tactics.dispatch.attention import AttentionStep, flash_applies, flash_tactic
from ascendc_pack.tactics.dispatch.conv import ConvStep, _folded, _geometry, _replaces
from ascendc_pack.tactics.dispatch.epilogue import aten_calls, onednn_unary
from ascendc_pack.tactics.dispatch.gemm import LinearStep, _build_weights, _inputs, onednn_supports
from ascendc_pack.tactics.dispatch.int8 import conv_int8_tactic, int8_feature, linear_int8_tactic, quant_params
from ascendc_pack.tactics.dispatch.spec import Call, Dtype, MemoryFormat, Prepack, Ref, Tactic

NATIVE = "fp32"
LOW = ("bf16", "int8")
"""The low precisions candidates exist for (int8: :mod:`ascendc_pack.tactics.dispatch.int8`)."""
STEP_TOLERANCE = {"bf16": 2e-2, "int8": 5e-2}
"""The relative error (``||y - ref|| / ||ref||``) one low-precision candidate may have against its
step's float32 reference on the real arguments: bfloat16 keeps 8 significant bits (a relative
rounding of 2^-9 = 0.2 % per operand; a GEMM step measures 0.2-0.3 %), so 2 % flags a broken
candidate, not rounding; int8 rounds to 1/255 of the calibrated range (a GEMM or convolution step
on normal activations measures 0.6-0.9 %), so 5 %."""
BF16 = Dtype("bfloat16")
F32 = Dtype("float32")


def precision_of(t) -> str:
    """The precision a tactic computes its heavy op in (``fp32``: the step's own dtype)."""
    return t.param("precision", NATIVE) if hasattr(t, "param") else NATIVE


def features(precision: str, flags: set[str]) -> str | None:
    """The CPU feature a ``precision`` step needs on a host with ``flags`` (None: none there)."""
    return {"bf16": bf16_feature, "int8": int8_feature}.get(precision, lambda _: None)(flags)


def bf16_feature(flags: set[str]) -> str | None:
    """The CPU feature that gives this host native bfloat16 dot products (None: none)."""
    for f in ("avx512_bf16", "amx_bf16", "bf16"):
        if f in flags:
            return f
    return None


def bf16_offered(flags: set[str] | None = None) -> str | None:
    """Why bfloat16 candidates are not offered on this host (None: they are)."""
    import torch

    from ascendc_pack.toolchain.compiler import host_cpu_flags

    flags = set(host_cpu_flags()) if flags is None else flags
    if not onednn_supports("bfloat16"):
        return f"this torch build ({torch.__version__}) has no oneDNN bfloat16 path on this CPU"
    if bf16_feature(flags) is None:
        return ("this CPU has no native bfloat16 dot product (AVX512_BF16, AMX-BF16 or aarch64 BF16): emulated "
                "bfloat16 is slower than float32")
    return None


def _cast(src: str, out: str, dtype: Dtype, memory_format: MemoryFormat | None = None) -> Call:
    kw = (("dtype", dtype),) + ((("memory_format", memory_format),) if memory_format else ())
    return Call("aten::_to_copy", (Ref(src),), kw, out=out)


def _params(t: Tactic) -> tuple:
    return tuple(sorted({**dict(t.params), "precision": "bf16"}.items()))


def linear_bf16_tactic(step: LinearStep) -> Tactic:
    """``onednn_bf16``: oneDNN inner product in bfloat16 (module docstring)."""
    epi = step.epilogue
    prepack, w, b = _build_weights(step)
    prepack += [Prepack(_cast(w, "weight_bf16", BF16), "build"),
                Prepack(Call("mkldnn::_reorder_linear_weight", (Ref("weight_bf16"), step.m), out="weight_packed"),
                        "load", isa_dependent=True)]
    bias = Ref(b) if b else None
    attr, scalars, algorithm = onednn_unary(None if epi.binary else epi.unary)
    calls = [_cast("x", "x_bf16", BF16),
             Call("mkldnn::_linear_pointwise", (Ref("x_bf16"), Ref("weight_packed"), bias, attr, scalars, algorithm),
                  out="y_bf16"),
             _cast("y_bf16", "y", F32)]
    post = aten_calls(epi, "y", "out", inplace=True, affine=False) if epi.binary else []
    return Tactic("linear", "onednn_bf16", (step.captured_op, *epi.replaces), _inputs(step), tuple(prepack),
                  tuple(calls + post), "out" if post else "y",
                  (("epilogue", epi.label), ("precision", "bf16")))


def conv_bf16_tactic(step: ConvStep, layout: str) -> Tactic:
    """``onednn_bf16`` (``x`` read as it arrives) / ``onednn_cl_bf16`` (``x`` relaid to
    channels_last in the same pass as its conversion): oneDNN convolution in bfloat16."""
    epi = step.epilogue
    prepack, w, b = _folded(step)
    padding, stride, dilation, groups = _geometry(step)
    prepack += [Prepack(_cast(w, "weight_bf16", BF16), "build"),
                Prepack(Call("mkldnn::_reorder_convolution_weight",
                             (Ref("weight_bf16"), padding, stride, dilation, groups, tuple(step.x_shape)),
                             out="weight_packed"), "load", isa_dependent=True)]
    if b:
        prepack.append(Prepack(_cast(b, "bias_bf16", BF16), "build"))
    relayout = MemoryFormat("channels_last") if layout == "channels_last" and step.layout != layout else None
    attr, scalars, algorithm = onednn_unary(None if epi.binary else epi.unary)
    calls = [_cast("x", "x_bf16", BF16, relayout),
             Call("mkldnn::_convolution_pointwise",
                  (Ref("x_bf16"), Ref("weight_packed"), Ref("bias_bf16") if b else None, padding, stride, dilation,
                   groups, attr, scalars, algorithm), out="y_bf16"),
             _cast("y_bf16", "y", F32)]
    post = aten_calls(epi, "y", "out", inplace=True, affine=False) if epi.binary else []
    name = "onednn_cl_bf16" if layout == "channels_last" else "onednn_bf16"
    params = (("epilogue", epi.label), ("layout", layout), ("out_layout", "channels_last"), ("precision", "bf16"))
    return Tactic("conv", name, _replaces(step), tuple(step.shapes()), tuple(prepack), tuple(calls + post),
                  "out" if post else "y", params)


def attention_bf16_tactic(step: AttentionStep) -> Tactic | None:
    """``flash_bf16``: flash attention on bfloat16 ``q``, ``k``, ``v`` (None where flash does not
    apply)."""
    if not flash_applies(step):
        return None
    low = dataclasses.replace(step, dtype="bfloat16")
    flash = flash_tactic(low)
    calls = [_cast(n, f"{n}_bf16", BF16) for n in ("q", "k", "v")]
    if step.mask == "float":
        calls.append(_cast("mask", "mask_bf16", BF16))
    rename = {"q": "q_bf16", "k": "k_bf16", "v": "v_bf16", "mask": "mask_bf16" if step.mask == "float" else "mask"}

    def renamed(v):
        if isinstance(v, Ref):
            return Ref(rename.get(v.name, v.name))
        return tuple(renamed(x) for x in v) if isinstance(v, tuple) else v

    for c in flash.calls:
        out = "out_bf16" if c.out == flash.output else c.out
        calls.append(Call(c.op, tuple(renamed(a) for a in c.args), tuple((k, renamed(v)) for k, v in c.kwargs),
                          out=out, index=c.index))
    calls.append(_cast("out_bf16", "out", F32))
    return Tactic("attention", "flash_bf16", flash.replaces, tuple(step.shapes()), (), tuple(calls), "out",
                  _params(flash))


def low_precision_tactics(step, precisions, x_range: tuple[float, float] | None = None) -> list[Tactic]:
    """The low-precision candidates of ``step`` for ``precisions`` (``bf16``, ``int8``) that apply
    to it; int8 ones need ``x_range``, the step's calibrated input range ``(lo, hi)``."""
    if getattr(step, "dtype", "float32") != "float32":
        return []
    out: list[Tactic] = []
    if "bf16" in precisions:
        if step.kind == "linear":
            out.append(linear_bf16_tactic(step))
        elif step.kind == "conv":
            out += [conv_bf16_tactic(step, "contiguous"), conv_bf16_tactic(step, "channels_last")]
        elif step.kind == "attention" and (t := attention_bf16_tactic(step)) is not None:
            out.append(t)
    if "int8" in precisions and x_range is not None and step.kind in ("linear", "conv"):
        q = quant_params(*x_range)
        out.append(linear_int8_tactic(step, q) if step.kind == "linear" else conv_int8_tactic(step, q))
    return out


__all__ = ["NATIVE", "LOW", "STEP_TOLERANCE", "precision_of", "features", "bf16_feature", "bf16_offered",
           "linear_bf16_tactic", "conv_bf16_tactic", "attention_bf16_tactic", "low_precision_tactics"]
