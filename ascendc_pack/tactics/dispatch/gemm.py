"""GEMM tactics: ``y = x @ B (+ bias)`` with a constant ``B``, then its epilogue.

Covers what capture leaves of ``nn.Linear`` and of a matmul by a constant (``aten::addmm`` /
``aten::mm`` on a 2-D ``x``; the views around them stay outside the step). Candidates:

* ``aten``: the step as captured (``permute`` of the weight + ``addmm``/``mm``), then the
  epilogue as separate ATen ops. Candidate 0.
* ``onednn``: ``mkldnn::_linear_pointwise(.binary)`` on a weight reordered at load by
  ``mkldnn::_reorder_linear_weight`` for this host and ``m`` rows; bias and one unary or one
  binary post-op fused (oneDNN linear takes one or the other; a unary after a binary runs as an
  in-place ATen op). An eval BatchNorm-like affine is folded into the weights at build.
* ``mkl``: MKL's packed SGEMM (``mkl::_mkl_reorder_linear_weight`` at load, ``mkl::_mkl_linear``),
  bias fused, the rest of the epilogue in place; float32 only. MKL's packed buffer cannot be
  moved (its metadata depends on its address, Inductor's freezing pass says so), so it is made at
  load, never stored; it takes ~6-7 MB whatever the weight's size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ascendc_pack.tactics.dispatch.epilogue import Epilogue, aten_calls, affine_view_calls, apply_eager, fold_affine_calls, onednn_unary
from ascendc_pack.tactics.dispatch.spec import Call, Prepack, Ref, Tactic

LAYOUTS = ("nk", "kn")


@dataclass(frozen=True)
class LinearStep:
    """``y = x @ B + bias`` for ``x`` [m, k], then ``epilogue``; ``B`` is a constant weight.

    ``weight_layout``: ``"nk"`` when the weight is stored [n, k] and the graph multiplies by its
    transpose (``nn.Linear``: ``addmm(bias, x, permute(weight, [1, 0]))``), ``"kn"`` when it is
    stored [k, n] and used as is. Tensor names: ``x``, ``weight``, ``bias`` [n], ``other`` [m, n]
    (binary epilogue), ``scale`` / ``shift`` [n] (affine epilogue).
    """

    m: int
    k: int
    n: int
    bias: bool = True
    weight_layout: str = "nk"
    epilogue: Epilogue = field(default_factory=Epilogue)
    dtype: str = "float32"
    kind = "linear"

    def __post_init__(self):
        if self.weight_layout not in LAYOUTS:
            raise ValueError(f"weight_layout must be one of {LAYOUTS}, got {self.weight_layout!r}")

    @property
    def weight_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.weight_layout == "nk" else (self.k, self.n)

    @property
    def captured_op(self) -> str:
        return "aten::addmm" if self.bias else "aten::mm"

    def to_json(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the step reads, by name."""
        s: dict[str, tuple[int, ...]] = {"x": (self.m, self.k), "weight": self.weight_shape}
        if self.bias:
            s["bias"] = (self.n,)
        if self.epilogue.binary:
            s["other"] = (self.m, self.n)
        if self.epilogue.affine:
            s["scale"] = s["shift"] = (self.n,)
        return s


def _inputs(step: LinearStep) -> tuple[str, ...]:
    return tuple(step.shapes())


def aten_tactic(step: LinearStep) -> Tactic:
    """Candidate 0: the captured ``addmm``/``mm``, the epilogue as separate ATen ops."""
    epi = step.epilogue
    prepack = [Prepack(c, "build") for c in affine_view_calls(1, 2)] if epi.affine else []
    b = "weight"
    calls: list[Call] = []
    if step.weight_layout == "nk":
        calls.append(Call("aten::permute", (Ref("weight"), (1, 0)), out="weight_t"))
        b = "weight_t"
    y = "y"
    if step.bias:
        calls.append(Call("aten::addmm", (Ref("bias"), Ref("x"), Ref(b)), out=y))
    else:
        calls.append(Call("aten::mm", (Ref("x"), Ref(b)), out=y))
    post = aten_calls(epi, y, "out", inplace=False)
    calls += post
    return Tactic("linear", "aten", (step.captured_op, *epi.replaces), _inputs(step), tuple(prepack),
                  tuple(calls), "out" if post else y, (("epilogue", epi.label),))


def _build_weights(step: LinearStep) -> tuple[list[Prepack], str, str | None]:
    """Build-time derivations shared by the packed tactics: the weight as [n, k] contiguous and
    the affine folded in. Returns (prepacks, weight name, bias name or None)."""
    calls: list[Call] = []
    w, b = "weight", ("bias" if step.bias else None)
    if step.weight_layout == "kn":
        calls += [Call("aten::t", (Ref("weight"),), out="weight_kn_t"),
                  Call("aten::contiguous", (Ref("weight_kn_t"),), out="weight_nk")]
        w = "weight_nk"
    if step.epilogue.affine:
        calls += fold_affine_calls(w, b, 2)
        w, b = "weight_f", "bias_f"
    return [Prepack(c, "build") for c in calls], w, b


def onednn_tactic(step: LinearStep) -> Tactic:
    """oneDNN inner product on a weight packed at load, bias and one post-op fused."""
    epi = step.epilogue
    prepack, w, b = _build_weights(step)
    prepack.append(Prepack(Call("mkldnn::_reorder_linear_weight", (Ref(w), step.m), out="weight_packed"),
                           "load", isa_dependent=True))
    bias = Ref(b) if b else None
    if epi.binary:
        calls = [Call("mkldnn::_linear_pointwise.binary",
                      (Ref("x"), Ref("other"), Ref("weight_packed"), bias, epi.binary), out="y")]
        post = aten_calls(epi, "y", "out", inplace=True, affine=False, binary=False)
    else:
        attr, scalars, algorithm = onednn_unary(epi.unary)
        calls = [Call("mkldnn::_linear_pointwise", (Ref("x"), Ref("weight_packed"), bias, attr, scalars, algorithm),
                      out="y")]
        post = []
    return Tactic("linear", "onednn", (step.captured_op, *epi.replaces), _inputs(step), tuple(prepack),
                  tuple(calls + post), "out" if post else "y", (("epilogue", epi.label),))


def mkl_tactic(step: LinearStep) -> Tactic:
    """MKL packed SGEMM (weight packed at load), bias fused, the rest of the epilogue in place."""
    epi = step.epilogue
    prepack, w, b = _build_weights(step)
    prepack.append(Prepack(Call("mkl::_mkl_reorder_linear_weight", (Ref(w), step.m), out="weight_mkl"),
                           "load", isa_dependent=True))
    calls = [Call("mkl::_mkl_linear", (Ref("x"), Ref("weight_mkl"), Ref(w), Ref(b) if b else None, step.m),
                  out="y")]
    post = aten_calls(epi, "y", "out", inplace=True, affine=False)
    return Tactic("linear", "mkl", (step.captured_op, *epi.replaces), _inputs(step), tuple(prepack),
                  tuple(calls + post), "out" if post else "y", (("epilogue", epi.label),))


def onednn_supports(dtype: str) -> bool:
    """Whether this torch build and CPU run oneDNN's fp32 / bf16 / fp16 linear and convolution."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == "bfloat16":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == "float16":
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return dtype == "float32"


def linear_tactics(step: LinearStep) -> list[Tactic]:
    """The candidates for ``step`` that this torch build and CPU can run; ``aten`` first."""
    out = [aten_tactic(step)]
    if onednn_supports(step.dtype):
        out.append(onednn_tactic(step))
    if torch._C.has_mkl and step.dtype == "float32":
        out.append(mkl_tactic(step))
    return out


def linear_reference(step: LinearStep, env: dict) -> torch.Tensor:
    """Eager PyTorch's answer for ``step`` on the named tensors ``env``."""
    w = env["weight"] if step.weight_layout == "nk" else env["weight"].t()
    y = torch.nn.functional.linear(env["x"], w, env.get("bias"))
    return apply_eager(step.epilogue, y, other=env.get("other"), scale=env.get("scale"),
                       shift=env.get("shift"), channels_dim=1)
