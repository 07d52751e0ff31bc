"""The cost model of the dispatcher tactics: a predicted time for every candidate of a heavy
step, from the host profile (:mod:`ascendc_pack.kernels.target`), so that a step's candidate 0
is the candidate predicted fastest, as the seed's solver makes a fused kernel's candidate 0 its
best guess (docs/TACTICS.md "Candidate order").

A candidate's time is a roofline with a fixed cost per call::

    t = fixed_us + max(flops / (peak × efficiency), bytes / bandwidth) + extra passes

* ``peak``: the host's float32 FMA rate (``ghz`` × 2 ports × lanes × 2 flops, every usable core);
  ``bandwidth``: one thread's memory stream × cores; both measured by the host profile;
* ``efficiency`` and ``fixed_us`` per implementation (:data:`RATES`): how much of the peak a
  GEMM / convolution of that library reaches and what one call costs besides. They were fitted to
  the per-step measurements of docs/TACTICS.md (``bench/tactics_bench.py``: oneDNN on a packed
  weight ~2x ATen's GEMM and ~1.3x its NCHW convolution; MKL's packed SGEMM level with ATen,
  which is MKL; ATen cheapest per call on a 1-row GEMV, where every candidate streams the weight)
  and to PGO's medians of a mobilenet_v3_small (the per-call costs);
* a generated kernel (GEMM, convolution, attention) is predicted by its own family's cost model
  (``est_us`` of its first tiling: :func:`~ascendc_pack.tactics.decide.order_by_prediction`);
* a bfloat16 candidate (``*_bf16``, ``--precision``) runs its library's inner loops
  :func:`bf16_speedup` times faster and pays its conversions: the activations read in float32 and
  written in bfloat16, the result read in bfloat16 and written in float32 (6 bytes per element each);
  an int8 one (``*_int8``) :func:`int8_speedup` times faster, paying the quantization of its input
  (read float32, write uint8: 5 bytes per element; its result is float32 already);
* extra passes over memory: the epilogue ATen as captured runs as one more fused kernel (read and
  write the output, read a residual), a channels_last candidate's relayout of an NCHW input, the
  weight ATen's channels_last convolution reorders on every call, the scores the unfused attention
  writes and reads back (``bmm``, softmax, ``bmm``);
* a convolution's short dot products (fewer than 64 multiply-adds per output: depthwise and
  grouped ones, and a network's first, 3-channel layer) reach that share of the library's rate:
  PGO measured oneDNN 358-429 µs on mobilenet_v3_small's first convolution (3x3 over 3 channels)
  where the full-rate roofline said 154 µs and the generated direct convolution took 75-209 µs
  (``--topn 1`` ran it on oneDNN: 1.86 -> 1.57 ms for the bundle once it did not);
* a library's depthwise or 1x1 convolution takes :data:`LIBRARY_CONV` times its roofline, where a
  generated kernel is the alternative (``dwconv``; the GEMM of a 1x1): PGO measured oneDNN's
  channels_last depthwise convolutions 1.4-2.2x the generated ``dwconv`` kernel on efficientnet_b0's
  five mispredicted steps, where the roofline put them level, and its 1x1 convolutions 1.4-2.0x the
  generated GEMM on all 19 of that model's 1x1 steps over 1x1 pixels (median 1.63), where the
  rooflines put them 0.65-2.1x: ``--topn 1`` ran eight of those steps on oneDNN (efficientnet_b0 at
  ``--topn 1`` 1.29x its ``--topn 4`` bundle).

It only orders candidates: PGO (``--topn`` > 1) times them on the real arguments and its medians
decide. The prediction is recorded next to them (``tuning.json``) so the two can be compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ascendc_pack.kernels.target import CpuTarget

#: float32 bytes
F32 = 4


@dataclass(frozen=True)
class Rate:
    """One implementation: the fraction of the FMA peak its inner loops reach and its fixed cost
    per call (µs)."""

    efficiency: float
    fixed_us: float


RATES = {
    "aten": Rate(0.35, 20.0),       # ATen addmm (MKL sgemm) / aten::convolution, epilogue a separate pass
    "mkl": Rate(0.35, 15.0),        # MKL packed SGEMM: no per-call packing of the weight
    "onednn": Rate(0.70, 30.0),     # oneDNN on a weight packed at load, post-ops fused
    "onednn_cl": Rate(0.70, 30.0),
    "aten_cl": Rate(0.45, 25.0),    # oneDNN in NHWC behind ATen, the weight reordered per call
    "unfused": Rate(0.35, 40.0),    # bmm, softmax, bmm: three calls
    "flash": Rate(0.35, 25.0),      # torch's fused CPU flash attention
}
"""Fixed costs: a dispatcher call's primitive lookup, argument checks and allocation, as PGO on a
mobilenet_v3_small measured them (a 1x1 convolution of one pixel: ATen 27 µs, oneDNN 42 µs, the
generated GEMM 1.3 µs; 2-core Xeon, load 2): what lets a generated kernel's estimate (its family's
cost model, no dispatcher in between) rank first on small steps, as PGO found it does."""


LIBRARY_CONV = 2.0
"""A library's depthwise or 1x1 convolution: measured time ÷ its roofline estimate, relative to the
generated kernels' own estimates (the efficientnet_b0 steps above; 2026-12-06, Intel host)."""


def peak_flops_per_us(target: CpuTarget) -> float:
    """Float32 flops per µs of every core: ``ghz`` (vector FMAs per ns per port) × 2 ports ×
    lanes × 2 flops × cores × 1000."""
    return target.ghz * 2 * target.lanes * 2 * target.cores * 1e3


def bytes_per_us(target: CpuTarget) -> float:
    """Memory bytes per µs of every core (one thread's stream × cores)."""
    return target.mem_gbps * 1e3 * target.cores


def bf16_speedup() -> float:
    """How much faster bfloat16 inner loops run than float32 ones here: 4 with AMX-BF16 tiles
    (oneDNN's bfloat16 GEMMs and 3x3 convolutions measured 3.5-5.3x faster than float32 on a
    Xeon with AMX, one thread), 2 with AVX512_BF16 dot products alone (twice the lanes), 1 else."""
    from ascendc_pack.toolchain.compiler import host_cpu_flags

    flags = set(host_cpu_flags())
    return 4.0 if "amx_bf16" in flags else 2.0 if {"avx512_bf16", "bf16"} & flags else 1.0


def int8_speedup() -> float:
    """How much faster int8 inner loops run than float32 ones here: 8 with AMX-INT8 tiles (oneDNN's
    int8 3x3 convolutions and GEMMs measured 1.5-2x its bfloat16 ones on AMX, 2026-12-06), 4 with
    VNNI dot products (four int8 products per float32 lane), 1 else."""
    from ascendc_pack.toolchain.compiler import host_cpu_flags

    flags = set(host_cpu_flags())
    return 8.0 if "amx_int8" in flags else 4.0 if {"avx512_vnni", "avx_vnni"} & flags else 1.0


def _base(name: str) -> str:
    """A candidate's library name without its precision suffix (``onednn_cl_bf16`` -> ``onednn_cl``)."""
    return name.removesuffix("_bf16").removesuffix("_int8")


def _roofline(name: str, flops: float, nbytes: float, target: CpuTarget) -> float:
    rate = RATES.get(_base(name), RATES["aten"])
    speedup = bf16_speedup() if name.endswith("_bf16") else int8_speedup() if name.endswith("_int8") else 1.0
    return rate.fixed_us + max(flops / (peak_flops_per_us(target) * rate.efficiency * speedup),
                               nbytes / bytes_per_us(target))


def _conversions(name: str, elems: float, target: CpuTarget, x_elems: float = 0.0) -> float:
    """The float32 <-> bfloat16 conversions of a bfloat16 candidate over ``elems`` elements, the
    quantization of an int8 candidate's ``x_elems`` inputs."""
    if name.endswith("_int8"):
        return 5.0 * x_elems / bytes_per_us(target)
    return 6.0 * elems / bytes_per_us(target) if name.endswith("_bf16") else 0.0


def int8_passes_us(kind: str, desc: dict, target: CpuTarget) -> float:
    """The passes an int8 candidate adds to the bundle that PGO does not time (it times the
    quantized op, as lowered): the quantization of its input (read float32, write uint8; fused into
    the kernel producing the input, which still writes its float32 result when another step reads
    it) and, when its epilogue has more than the ReLU the quantized op fuses (a residual add, SiLU,
    GELU), that epilogue over its float32 result (read, write), where the float32 candidates fuse
    it. The precision search charges them to the int8 candidate: on efficientnet_b0 three int8
    steps PGO timed faster made a bundle 1.2x slower (a 1x1 convolution's SiLU and a depthwise
    convolution's quantization, 0.65 ms)."""
    if kind == "linear":
        x_elems, out_elems = desc["m"] * desc["k"], desc["m"] * desc["n"]
    elif kind == "conv":
        oh, ow = _out_hw(desc)
        x_elems, out_elems = math.prod(desc["x_shape"]), desc["x_shape"][0] * desc["out_channels"] * oh * ow
    else:
        return 0.0
    epi = desc.get("epilogue") or {}
    unfused = bool(epi.get("binary")) or epi.get("unary") not in (None, "relu")
    return (5.0 * x_elems + (2 * F32 * out_elems if unfused else 0.0)) / bytes_per_us(target)


def _epilogue_passes(desc: dict, name: str) -> float:
    """Extra passes over the output the candidate makes for its epilogue."""
    epi = desc.get("epilogue") or {}
    if not (epi.get("affine") or epi.get("binary") or epi.get("unary")):
        return 0.0
    name = _base(name)
    if name in ("aten", "unfused"):
        return 2.0 + (1.0 if epi.get("binary") else 0.0)   # one fused kernel: read y (+ other), write out
    if name == "mkl":
        return (2.0 if epi.get("binary") or epi.get("affine") else 0.0) + (2.0 if epi.get("unary") else 0.0)
    if name.startswith("onednn") and epi.get("binary") and epi.get("unary") not in (None, "relu"):
        return 2.0                                         # a unary after the binary runs in place
    return 0.0


def linear_us(desc: dict, name: str, target: CpuTarget) -> float:
    """Predicted µs of a GEMM step's dispatcher candidate ``name``."""
    m, k, n = desc["m"], desc["k"], desc["n"]
    out = m * n * F32
    nbytes = (m * k + k * n + n) * F32 + out
    return (_roofline(name, 2.0 * m * k * n, nbytes, target) + _epilogue_passes(desc, name) * out / bytes_per_us(target)
            + _conversions(name, m * k + m * n, target, m * k))


def conv_us(desc: dict, name: str, target: CpuTarget) -> float:
    """Predicted µs of a convolution step's dispatcher candidate ``name``."""
    n, c, h, w = desc["x_shape"]
    o, groups = desc["out_channels"], desc.get("groups", 1)
    kh, kw = desc["kernel"]
    oh, ow = _out_hw(desc)
    low = name != _base(name)
    x_bytes, out = n * c * h * w * F32, n * o * oh * ow * F32
    w_bytes = o * (c // groups) * kh * kw * F32
    flops = 2.0 * n * o * oh * ow * (c // groups) * kh * kw
    # short dot products (a depthwise / grouped convolution, or a dense one over few input
    # channels: a network's first 3-channel layer) reach a smaller share of the peak
    depth = (c // groups) * kh * kw
    shape_eff = min(1.0, depth / 64.0)
    t = _roofline(name, flops / max(shape_eff, 0.05), x_bytes + w_bytes + out, target)
    if (groups > 1 and c // groups == 1) or (groups == 1 and kh == kw == 1):
        t *= LIBRARY_CONV
    bw = bytes_per_us(target)
    t += _epilogue_passes(desc, name) * out / bw + _conversions(name, (x_bytes + out) / F32, target, x_bytes / F32)
    entry = desc.get("position", "entry") == "entry" and desc.get("layout", "contiguous") != "channels_last"
    name = _base(name)
    if name == "aten_cl" and entry:
        t += 2.0 * x_bytes / bw                                # relayout of the NCHW input
    if name == "onednn_cl" and entry and not low:
        t += 2.0 * x_bytes / bw                                # (a bfloat16 one converts and relayouts at once)
    if name == "onednn" and entry:
        t += 1.0 * x_bytes / bw                                # oneDNN's own reorder of the NCHW input
    if name == "aten_cl":
        t += 2.0 * w_bytes / bw                                # the weight reordered on every call
    return t


def attention_us(desc: dict, name: str, target: CpuTarget) -> float:
    """Predicted µs of an attention step's dispatcher candidate ``name``."""
    b, h, lq, s, e = desc["batch"], desc["heads"], desc["q_len"], desc["kv_len"], desc["head_dim"]
    ev = desc.get("v_head_dim") or e
    hkv = desc.get("kv_heads") or h
    flops = 2.0 * b * h * lq * s * (e + ev)
    io = (b * h * lq * (e + ev) + b * hkv * s * (e + ev)) * F32
    t = _roofline(name, flops, io, target) + _conversions(name, io / F32, target)
    if name == "unfused":  # scores written by the first bmm, read and written by softmax, read by the second
        t += 4.0 * b * h * lq * s * F32 / bytes_per_us(target)
    return t


def pool_us(desc: dict, name: str, target: CpuTarget) -> float:
    """Predicted µs of a max-pooling step's ATen candidate: x read, the values and their int64
    indices written; NCHW input runs ATen's scalar path (~10x its channels_last time here)."""
    n, c, h, w = desc["x_shape"]
    oh, ow = _out_hw(desc)
    t = (n * c * h * w + 3 * n * c * oh * ow) * F32 / bytes_per_us(target)
    cl = desc.get("layout") == "channels_last" or desc.get("position") == "interior"
    return t if cl else 10.0 * t


def _out_hw(desc: dict) -> tuple[int, int]:
    """A convolution step's output height and width."""
    return tuple(_out(s, k, st, p, d) for s, k, st, p, d in zip(
        desc["x_shape"][2:], desc["kernel"], desc.get("stride", (1, 1)), desc.get("padding", (0, 0)),
        desc.get("dilation", (1, 1))))


def _out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


_BY_KIND = {"linear": linear_us, "conv": conv_us, "attention": attention_us, "pool": pool_us}


def predict_us(kind: str, desc: dict, name: str, target: CpuTarget) -> float:
    """The predicted µs of dispatcher candidate ``name`` of a ``kind`` step described by ``desc``
    (the step's JSON). Unknown kinds predict ``inf`` (ordered last)."""
    fn = _BY_KIND.get(kind)
    if fn is None:
        return math.inf
    return fn(desc, name, target)


def by_prediction(kind: str, desc: dict, tactics: list, target: CpuTarget) -> list[tuple[float, object]]:
    """``[(predicted µs, tactic), ...]`` sorted fastest first (a tie keeps the given order)."""
    scored = [(predict_us(kind, desc, t.name, target), i, t) for i, t in enumerate(tactics)]
    return [(us, t) for us, _, t in sorted(scored, key=lambda x: (x[0], x[1]))]


__all__ = ["RATES", "Rate", "by_prediction", "predict_us", "int8_passes_us", "peak_flops_per_us", "bytes_per_us", "linear_us",
           "conv_us", "attention_us", "pool_us"]
