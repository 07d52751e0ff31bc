"""Attention tactics: ``softmax(Q·Kᵀ·scale + mask)·V`` as one step, incl. grouped-query attention.

The step is what capture leaves of ``scaled_dot_product_attention`` (decomposed into two
``bmm``, a scale, the mask, ``_safe_softmax``) or of the same chain written out. Candidates:

* ``unfused``: the chain as captured (K/V heads repeated for GQA, ``matmul``, scale, mask,
  softmax, ``matmul``). Candidate 0.
* ``flash``: torch's fused CPU flash attention ``aten::_scaled_dot_product_flash_attention_for_cpu``
  (blocked, online softmax, no [L, S] score matrix; takes K/V with fewer heads than Q natively
  and an additive float mask: a bool mask becomes one with ``where`` per call); Q, K and V must
  have the same head size.

A row whose every score is masked gives 0 in ``flash`` and in ``_safe_softmax`` (what SDPA's
decomposition captures) but NaN in a written-out ``softmax``; ``flash`` is therefore a
candidate only when ``safe_softmax`` is set or no row can be fully masked (no mask, or a causal
mask alone with ``q_len <= kv_len``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ascendc_pack.tactics.dispatch.spec import Call, Dtype, Prepack, Ref, Tactic

MASKS = (None, "bool", "float")
NEG_INF = float("-inf")


@dataclass(frozen=True)
class AttentionStep:
    """Attention over ``q`` [B, H, L, E], ``k`` [B, Hkv, S, E], ``v`` [B, Hkv, S, Ev].

    ``mask``: ``None``, ``"bool"`` (True keeps a score) or ``"float"`` (added to the scores),
    of ``mask_shape`` (broadcastable to [B, H, L, S]); ``causal`` additionally keeps only
    ``j <= i`` (top-left aligned, as SDPA's ``is_causal``); ``scale`` defaults to ``1/sqrt(E)``.
    ``mask_windows`` (a float mask only): the batch is ``B / W`` images of ``W`` windows each
    (shifted-window attention) and the ``[W, Hm, L, S]`` mask is window ``b % W``'s, added as
    ``scores.view(B / W, W, H, L, S) + mask``.
    """

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    kv_heads: int | None = None
    v_head_dim: int | None = None
    scale: float | None = None
    mask: str | None = None
    mask_shape: tuple[int, ...] | None = None
    causal: bool = False
    safe_softmax: bool = True
    dtype: str = "float32"
    mask_windows: int | None = None
    kind = "attention"

    def __post_init__(self):
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {self.mask!r}")
        if self.mask_windows and (self.mask != "float" or self.batch % self.mask_windows
                                  or len(self.mask_shape or ()) != 4 or self.mask_shape[0] != self.mask_windows):
            raise ValueError(f"mask_windows={self.mask_windows} needs a float mask of shape [W, Hm, L, S] and a "
                             f"batch that is a multiple of W, got {self.mask} {self.mask_shape} / {self.batch}")
        if self.heads % self.hkv:
            raise ValueError(f"kv_heads={self.hkv} must divide heads={self.heads} (grouped-query attention)")

    @property
    def hkv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ev(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    def to_json(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the step reads, by name."""
        b, s = self.batch, self.kv_len
        out = {"q": (b, self.heads, self.q_len, self.head_dim), "k": (b, self.hkv, s, self.head_dim),
               "v": (b, self.hkv, s, self.ev)}
        if self.mask:
            out["mask"] = tuple(self.mask_shape or (b, 1, self.q_len, s))
        return out


def _replaces(step: AttentionStep) -> tuple[str, ...]:
    masking = {None: (), "float": ("aten::add.Tensor",), "bool": ("aten::where.self",)}[step.mask]
    softmax = "aten::_safe_softmax" if step.safe_softmax else "aten::_softmax"
    return ("aten::bmm", "aten::mul.Tensor", *masking, softmax, "aten::bmm")


def _tactic(step: AttentionStep, name: str, prepack, calls, output: str) -> Tactic:
    params = (("causal", step.causal), ("gqa_groups", step.heads // step.hkv), ("mask", step.mask))
    return Tactic("attention", name, _replaces(step), tuple(step.shapes()), tuple(prepack), tuple(calls), output,
                  params)


def unfused_tactic(step: AttentionStep) -> Tactic:
    """Candidate 0: the ATen chain as captured."""
    calls: list[Call] = []
    prepack: list[Prepack] = []
    k, v = "k", "v"
    groups = step.heads // step.hkv
    if groups > 1:
        calls += [Call("aten::repeat_interleave.self_int", (Ref("k"), groups, 1), out="k_rep"),
                  Call("aten::repeat_interleave.self_int", (Ref("v"), groups, 1), out="v_rep")]
        k, v = "k_rep", "v_rep"
    calls += [Call("aten::transpose.int", (Ref(k), -2, -1), out="k_t"),
              Call("aten::matmul", (Ref("q"), Ref("k_t")), out="scores"),
              Call("aten::mul.Scalar", (Ref("scores"), step.softmax_scale), out="s")]
    if step.causal:
        prepack += [Prepack(Call("aten::ones", ((step.q_len, step.kv_len),), (("dtype", Dtype("bool")),),
                                 out="causal_ones"), "build"),
                    Prepack(Call("aten::tril", (Ref("causal_ones"),), out="causal_keep"), "build")]
        calls.append(Call("aten::where.ScalarOther", (Ref("causal_keep"), Ref("s"), NEG_INF), out="s_causal"))
    s = "s_causal" if step.causal else "s"
    if step.mask == "float" and step.mask_windows:
        w = step.mask_windows
        calls += [Call("aten::view", (Ref(s), (step.batch // w, w, step.heads, step.q_len, step.kv_len)), out="s_win"),
                  Call("aten::add.Tensor", (Ref("s_win"), Ref("mask")), out="s_win_masked"),
                  Call("aten::view", (Ref("s_win_masked"), (step.batch, step.heads, step.q_len, step.kv_len)),
                       out="s_masked")]
        s = "s_masked"
    elif step.mask == "float":
        calls.append(Call("aten::add.Tensor", (Ref(s), Ref("mask")), out="s_masked"))
        s = "s_masked"
    elif step.mask == "bool":
        calls.append(Call("aten::where.ScalarOther", (Ref("mask"), Ref(s), NEG_INF), out="s_masked"))
        s = "s_masked"
    if step.safe_softmax:
        calls.append(Call("aten::_safe_softmax", (Ref(s), -1), out="p"))
    else:
        calls.append(Call("aten::_softmax", (Ref(s), -1, False), out="p"))
    calls.append(Call("aten::matmul", (Ref("p"), Ref(v)), out="out"))
    return _tactic(step, "unfused", prepack, calls, "out")


def flash_tactic(step: AttentionStep) -> Tactic:
    """torch's fused CPU flash attention (GQA native, additive float mask)."""
    calls: list[Call] = []
    mask = None
    if step.mask == "bool":
        calls.append(Call("aten::where.Scalar", (Ref("mask"), 0.0, NEG_INF), out="mask_add"))
        mask = "mask_add"
        if step.dtype != "float32":
            calls.append(Call("aten::_to_copy", (Ref("mask_add"),), (("dtype", Dtype(step.dtype)),), out="mask_cast"))
            mask = "mask_cast"
    elif step.mask == "float":
        mask = "mask"
    calls.append(Call("aten::_scaled_dot_product_flash_attention_for_cpu",
                      (Ref("q"), Ref("k"), Ref("v"), 0.0, step.causal),
                      (("attn_mask", Ref(mask) if mask else None), ("scale", step.softmax_scale)),
                      out="out", index=0))
    return _tactic(step, "flash", [], calls, "out")


def flash_applies(step: AttentionStep) -> bool:
    """Whether ``flash`` gives eager's answer for every input (see the module docstring)."""
    no_full_rows = step.mask is None and (not step.causal or step.q_len <= step.kv_len)
    return (step.dtype in ("float32", "bfloat16", "float16") and step.ev == step.head_dim  # "same head size"
            and (step.safe_softmax or no_full_rows) and not step.mask_windows)  # its mask is 4-D [B, ...]


def attention_tactics(step: AttentionStep) -> list[Tactic]:
    """The candidates for ``step``; ``unfused`` (as captured) first."""
    out = [unfused_tactic(step)]
    if flash_applies(step):
        out.append(flash_tactic(step))
    return out


def attention_reference(step: AttentionStep, env: dict) -> torch.Tensor:
    """Eager PyTorch's answer: the math written out (fully masked rows: 0 if ``safe_softmax``)."""
    q, k, v = env["q"], env["k"], env["v"]
    groups = step.heads // step.hkv
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = (q @ k.transpose(-2, -1)) * step.softmax_scale
    if step.causal:
        keep = torch.ones(step.q_len, step.kv_len, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, NEG_INF)
    if step.mask == "float" and step.mask_windows:
        w = step.mask_windows
        s = (s.view(step.batch // w, w, *s.shape[1:]) + env["mask"]).view(s.shape)
    elif step.mask == "float":
        s = s + env["mask"]
    elif step.mask == "bool":
        s = s.masked_fill(~env["mask"], NEG_INF)
    p = torch.softmax(s, -1)
    if step.safe_softmax:
        p = torch.where(torch.isneginf(s).all(-1, keepdim=True), torch.zeros_like(p), p)
    return p @ v
