"""int8 tactics: oneDNN quantized GEMM / convolution with calibrated activation scales (``--precision int8``).

A float32 step's int8 candidate quantizes what it reads, runs the heavy op on int8 values with
int32 accumulation (VNNI / AMX-INT8) and returns float32, so the graph around it stays float32::

    x_u8 = clamp(round(x * (1/s)) + z, 0, 255) -> uint8   # per call; s, z calibrated at build (below)
    y = oneDNN int8 op(x_u8, weight_int8)              # bias (+ relu) fused, float32 out
    out = epilogue(y)                                  # the rest of the epilogue in float32

* **weights**: symmetric per output channel, ``w_scale[o] = max|w[o]| / 127`` and
  ``weight_int8 = round(w / w_scale)`` in [-127, 127]; made at build (the bundle stores the int8
  weight, a quarter of the float32 bytes, and its scales) and packed at load for this host
  (``onednn::qlinear_prepack`` / ``onednn::qconv_prepack``);
* **activations**: asymmetric per tensor, unsigned (oneDNN's x86 int8 path): the step's input
  range ``[lo, hi]`` over every calibration input set (:func:`quant_params`; widened to hold 0)
  gives ``s = (hi - lo) / 255`` and ``z = round(-lo / s)``. A value outside the calibrated range
  saturates: the reason held-out inputs can cost more error than calibration ones, which the build
  reports and ``run --check`` measures;
* ``onednn_int8`` (GEMM): ``onednn::qlinear_pointwise`` (float32 output); ``onednn_int8``
  (convolution): ``onednn::qconv2d_pointwise`` on channels_last uint8 input (the quantization
  relayouts in the same pass), channels_last output like the float32 ``onednn_cl``.

Both record ``("precision", "int8")``, ``("x_scale", s)`` and ``("x_zero_point", z)`` in their
params. Lowered (:mod:`ascendc_pack.tactics.lower_casts`), the quantization becomes ATen steps
the fuser fuses into the kernel producing ``x``, and the epilogue after the op ATen steps fused
into its consumer. Offered only where the host has int8 dot products (:func:`int8_offered`:
AVX512_VNNI, AVX_VNNI or AMX-INT8) and this torch has oneDNN's quantized ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascendc_pack.tactics.dispatch.conv import CL, ConvStep, _folded, _geometry, _replaces
from ascendc_pack.tactics.dispatch.dispatcher import reachable
from ascendc_pack.tactics.dispatch.epilogue import aten_calls
from ascendc_pack.tactics.dispatch.gemm import LinearStep, _build_weights, _inputs
from ascendc_pack.tactics.dispatch.spec import Call, Dtype, Prepack, Ref, Tactic

INT8_FEATURES = ("avx512_vnni", "avx_vnni", "amx_int8")
"""CPU features that give int8 dot products with int32 accumulation (x86); a bundle records the
first the build host has (the one most hosts share: oneDNN uses AMX where it is, VNNI else)."""
QUANT_OPS = ("onednn::qlinear_pointwise", "onednn::qconv2d_pointwise", "onednn::qlinear_prepack",
             "onednn::qconv_prepack")
FUSED_UNARY = ("relu",)
"""Activations fused into the quantized op itself (both ops take ``relu``); any other runs after it."""
U8 = Dtype("uint8")
F32 = Dtype("float32")


@dataclass(frozen=True)
class QuantParams:
    """A per-tensor activation quantization: ``u8 = clamp(round(x * (1 / scale)) + zero_point, 0, 255)``
    (rounded before the integer shift, so a fused kernel's multiply-add contraction cannot change it)."""

    scale: float
    zero_point: int


def quant_params(lo: float, hi: float) -> QuantParams:
    """The uint8 quantization covering ``[lo, hi]`` (widened to hold 0, so zero is exact)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / 255.0
    if not scale > 0.0 or scale != scale or scale == float("inf"):
        return QuantParams(1.0, 0)
    return QuantParams(scale, int(min(255, max(0, round(-lo / scale)))))


def int8_feature(flags: set[str]) -> str | None:
    """The CPU feature that gives this host int8 dot products (None: none)."""
    return next((f for f in INT8_FEATURES if f in flags), None)


def int8_offered(flags: set[str] | None = None) -> str | None:
    """Why int8 candidates are not offered on this host (None: they are)."""
    from ascendc_pack.toolchain.compiler import host_cpu_flags

    flags = set(host_cpu_flags()) if flags is None else flags
    if not torch.backends.mkldnn.is_available() or any(reachable(op) for op in QUANT_OPS):
        return f"this torch build ({torch.__version__}) has no oneDNN quantized linear / convolution"
    if int8_feature(flags) is None:
        return ("this CPU has no int8 dot product (AVX512_VNNI, AVX_VNNI or AMX-INT8): emulated int8 is slower "
                "than float32")
    return None


def _weight_calls(w: str, dims: tuple[int, ...], ndim: int) -> list[Call]:
    """Build-time calls: symmetric per-output-channel int8 ``weight_int8``, its float32 scales
    ``w_scale`` and zero points ``w_zero_point`` (int64 zeros)."""
    view = (-1,) + (1,) * (ndim - 1)
    return [Call("aten::abs", (Ref(w),), out="w_abs"),
            Call("aten::amax", (Ref("w_abs"), dims), out="w_max"),
            Call("aten::clamp_min", (Ref("w_max"), 1e-30), out="w_max_nz"),
            Call("aten::div.Scalar", (Ref("w_max_nz"), 127.0), out="w_scale"),
            Call("aten::view", (Ref("w_scale"), view), out="w_scale_b"),
            Call("aten::div.Tensor", (Ref(w), Ref("w_scale_b")), out="w_div"),
            Call("aten::round", (Ref("w_div"),), out="w_round"),
            Call("aten::_to_copy", (Ref("w_round"),), (("dtype", Dtype("int8")),), out="weight_int8"),
            Call("aten::zeros_like", (Ref("w_scale"),), (("dtype", Dtype("int64")),), out="w_zero_point")]


def quantize_calls(q: QuantParams, memory_format=None) -> list[Call]:
    """Per-call calls quantizing activation ``x`` to ``x_u8`` (pointwise: the fuser takes them)."""
    kw = (("dtype", U8),) + ((("memory_format", memory_format),) if memory_format else ())
    return [Call("aten::mul.Scalar", (Ref("x"), 1.0 / q.scale), out="x_div"),
            Call("aten::round", (Ref("x_div"),), out="x_round"),
            Call("aten::add.Scalar", (Ref("x_round"), float(q.zero_point)), out="x_shift"),
            Call("aten::clamp", (Ref("x_shift"), 0.0, 255.0), out="x_clamp"),
            Call("aten::_to_copy", (Ref("x_clamp"),), kw, out="x_u8")]


def _post(step) -> tuple[str, list[Call]]:
    """The fused post-op of the quantized op and the epilogue calls after it (float32, in place)."""
    epi = step.epilogue
    fused = "relu" if not epi.binary and epi.unary in FUSED_UNARY else "none"
    post = aten_calls(epi, "y", "out", inplace=True, affine=False, unary=fused == "none")
    return fused, post


def _params(step, q: QuantParams, extra=()) -> tuple:
    return (("epilogue", step.epilogue.label), *extra, ("precision", "int8"), ("x_scale", q.scale),
            ("x_zero_point", q.zero_point))


def linear_int8_tactic(step: LinearStep, q: QuantParams) -> Tactic:
    """``onednn_int8``: oneDNN's quantized inner product (module docstring)."""
    prepack, w, b = _build_weights(step)
    prepack += [Prepack(c, "build") for c in _weight_calls(w, (1,), 2)]
    prepack.append(Prepack(Call("onednn::qlinear_prepack", (Ref("weight_int8"), (step.m, step.k)),
                                out="weight_packed"), "load", isa_dependent=True))
    fused, post = _post(step)
    calls = quantize_calls(q) + [
        Call("onednn::qlinear_pointwise",
             (Ref("x_u8"), q.scale, q.zero_point, Ref("weight_packed"), Ref("w_scale"), Ref("w_zero_point"),
              Ref(b) if b else None, 1.0, 0, F32, fused, (), ""), out="y")]
    return Tactic("linear", "onednn_int8", (step.captured_op, *step.epilogue.replaces), _inputs(step),
                  tuple(prepack), tuple(calls + post), "out" if post else "y", _params(step, q))


def conv_int8_tactic(step: ConvStep, q: QuantParams) -> Tactic:
    """``onednn_int8``: oneDNN's quantized convolution, channels_last in and out (module docstring)."""
    prepack, w, b = _folded(step)
    padding, stride, dilation, groups = _geometry(step)
    prepack += [Prepack(c, "build") for c in _weight_calls(w, (1, 2, 3), 4)]
    prepack.append(Prepack(Call("onednn::qconv_prepack",
                                (Ref("weight_int8"), Ref("w_scale"), q.scale, q.zero_point, stride, padding, dilation,
                                 groups, tuple(step.x_shape)), out="weight_packed"), "load", isa_dependent=True))
    fused, post = _post(step)
    calls = quantize_calls(q, CL if step.layout != "channels_last" else None) + [
        Call("onednn::qconv2d_pointwise",
             (Ref("x_u8"), q.scale, q.zero_point, Ref("weight_packed"), Ref("w_scale"), Ref("w_zero_point"),
              Ref(b) if b else None, stride, padding, dilation, groups, 1.0, 0, F32, fused, (), None), out="y")]
    params = _params(step, q, (("layout", "channels_last"), ("out_layout", "channels_last")))
    return Tactic("conv", "onednn_int8", _replaces(step), tuple(step.shapes()), tuple(prepack), tuple(calls + post),
                  "out" if post else "y", params)


__all__ = ["INT8_FEATURES", "QuantParams", "quant_params", "int8_feature", "int8_offered", "quantize_calls",
           "linear_int8_tactic", "conv_int8_tactic"]
