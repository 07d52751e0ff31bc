"""Match ``softmax(Q·Kᵀ·s + mask)·V`` in a captured Program (part of :mod:`ascendc_pack.tactics.match`).

Capture leaves both ``scaled_dot_product_attention`` and the written-out chain as::

    QQ = mul(q, a) | q                        KK = mul(permute(k, [0,1,3,2]), a) | permute(k, ...)
    S  = view(bmm(view(expand(QQ)), view(expand(KK))), [B, H, L, S])  (* c | / c)
    s  = add(S, mask) | where(bool_mask, S, scalar_tensor(-inf)) | S
    p  = div(exp(sub(s, amax(s))), sum(...))  (then, for _safe_softmax: where(all masked, 0, p);
         then, from an eval-mode dropout, perhaps clone(p), or alias(p) after copy elision)
    out = view(bmm(view(expand(p)), view(expand(v))), [B, H, L, Ev])

The scale is ``a² · c``. K and V whose heads were repeated for grouped-query attention
(``view(clone(expand(unsqueeze(k0, 2))))``) are taken back to ``k0`` (``kv_heads``). Kᵀ written
as one ``permute(k, [0, 2, 3, 1])`` of [B, S, H, E] keys (timm's LeViT) is split first
(:func:`split_key_permutes`).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ascendc_pack.ir.program import AtenStep, Program, Ref, TensorSpec
from ascendc_pack.tactics.attention_sources import SOURCES, copy_source

NEG_INF = float("-inf")


def _step(mt, name, op) -> AtenStep | None:
    s = mt.step_of(name)
    return s if s is not None and s.op == op else None


def _consumer(mt, name, op, args_pred=lambda s: True) -> int | None:
    for c in mt.consumers(name):
        s = mt.g.steps[c]
        if c not in mt.taken and isinstance(s, AtenStep) and s.op == op and not s.multi and args_pred(s):
            return c
    return None


def _unview3(mt, name3: str, steps: list) -> str | None:
    """``view(expand(X, shape4), shape3)`` -> X (a 4-D value); the view/expand go into ``steps``.
    A contiguous ``clone`` between the view and the expand (capture makes one of a strided X, e.g.
    a head of a ``qkv`` projection) goes too: the kernels read X in place, the others as X."""
    v = _step(mt, name3, "aten.view.default")
    if v is None:
        return None
    inner = v.args[0].name
    c = _step(mt, inner, "aten.clone.default") or _step(mt, inner, "aten.alias.default")
    if c is not None and _plain_copy(c):
        steps.append(mt.index_of(inner))
        inner = c.args[0].name
    e = _step(mt, inner, "aten.expand.default")
    if e is None:
        return None
    x = e.args[0].name
    if list(e.args[1]) != list(mt.spec(x).shape):
        return None
    steps += [mt.index_of(name3), mt.index_of(inner)]
    return x


def _plain_copy(c: AtenStep) -> bool:
    """A ``clone`` that only copies (to a contiguous tensor), or the ``alias`` copy elision made of
    one: the attention reads its source instead."""
    if c.op == "aten.alias.default":
        return not c.kwargs
    return c.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format and len(c.kwargs) <= 1


def _scaled(mt, name: str, steps: list) -> tuple[str, float]:
    """``mul(X, a)`` -> (X, a) with the step recorded; anything else -> (name, 1.0)."""
    s = mt.step_of(name)
    if s is not None and s.op in ("aten.mul.Scalar", "aten.mul.Tensor") and isinstance(s.args[0], Ref) \
            and isinstance(s.args[1], (int, float)) and not isinstance(s.args[1], bool) and not s.kwargs:
        steps.append(mt.index_of(name))
        return s.args[0].name, float(s.args[1])
    return name, 1.0


def _gqa_source(mt, name: str) -> tuple[str, int, list] | None:
    """``view(clone(expand(unsqueeze(k0, 2), [B, Hkv, G, S, E])), [B, H, S, E])`` -> (k0, Hkv, steps)."""
    v = _step(mt, name, "aten.view.default")
    c = v and _step(mt, v.args[0].name, "aten.clone.default")
    e = c and _step(mt, c.args[0].name, "aten.expand.default")
    u = e and _step(mt, e.args[0].name, "aten.unsqueeze.default")
    if not u or u.args[1] != 2:
        return None
    k0 = u.args[0].name
    shape = mt.spec(k0).shape
    if len(shape) != 4 or len(e.args[1]) != 5 or list(e.args[1])[:2] != list(shape[:2]):
        return None
    names = [name, v.args[0].name, c.args[0].name, e.args[0].name]
    return k0, shape[1], [mt.index_of(n) for n in names]


def match_attention(mt, i: int):
    """The attention whose softmax starts at ``amax`` step ``i`` of matcher ``mt``
    (:class:`ascendc_pack.tactics.match.Matcher`): ``(fields, steps, bind, output)`` or None."""
    amax = mt.g.steps[i]
    if list(amax.args[1:]) != [[-1], True] or amax.kwargs:
        return None
    s = amax.args[0].name
    ss = mt.spec(s)
    if ss is None or len(ss.shape) != 4 or ss.dtype not in mt.dtypes:
        return None
    steps = [i]
    # the softmax
    sub = _consumer(mt, s, "aten.sub.Tensor", lambda x: x.args == [Ref(s), Ref(amax.outputs[0])])
    exp = sub is not None and mt.only_consumer(mt.g.steps[sub].outputs[0], "aten.exp.default")
    if not exp:
        return None
    e = mt.g.steps[exp].outputs[0]
    total = _consumer(mt, e, "aten.sum.dim_IntList", lambda x: list(x.args[1:]) == [[-1], True] and not x.kwargs)
    div = total is not None and mt.only_consumer(mt.g.steps[total].outputs[0], "aten.div.Tensor")
    if not div or mt.g.steps[div].args != [Ref(e), Ref(mt.g.steps[total].outputs[0])]:
        return None
    steps += [sub, exp, total, div]
    p = mt.g.steps[div].outputs[0]
    safe = _safe_guard(mt, s, p, steps)
    if safe:
        p = mt.g.steps[steps[-1]].outputs[0]
    # torchvision's swin: F.dropout(p, training=False), a clone (an alias once copies are elided)
    copy = next((c for c in (mt.only_consumer(p, op) for op in ("aten.clone.default", "aten.alias.default"))
                 if c is not None), None)
    if copy is not None and _plain_copy(mt.g.steps[copy]):
        steps.append(copy)
        p = mt.g.steps[copy].outputs[0]
    # P·V
    pe = mt.only_consumer(p, "aten.expand.default")
    pv = pe is not None and mt.only_consumer(mt.g.steps[pe].outputs[0], "aten.view.default")
    bmm2 = pv and mt.only_consumer(mt.g.steps[pv].outputs[0], "aten.bmm.default")
    if not bmm2 or mt.g.steps[bmm2].args[0] != Ref(mt.g.steps[pv].outputs[0]):
        return None
    out_view = mt.only_consumer(mt.g.steps[bmm2].outputs[0], "aten.view.default")
    if out_view is None:
        return None
    steps += [pe, pv, bmm2, out_view]
    v = _unview3(mt, mt.g.steps[bmm2].args[1].name, steps)
    if v is None:
        return None
    # the scores
    mask = mask_shape = mask_windows = None
    mask_kind = "float"
    pre = mt.step_of(s)
    windowed = _windowed_mask(mt, s, steps)
    bool_mask = _bool_mask(mt, s, steps) if windowed is None else None
    bias = None
    if windowed is not None:
        scores, mask, mask_shape, mask_windows = windowed
        bias = _position_bias(mt, scores, mask, mask_shape, steps)
        if bias is not None:
            scores, bias, mask_shape = bias
    elif bool_mask is not None:
        scores, mask = bool_mask
        mask_kind = "bool"
    elif pre is not None and pre.op == "aten.add.Tensor" and not pre.kwargs and all(isinstance(a, Ref) for a in pre.args):
        scores, mask = pre.args[0].name, pre.args[1].name
        steps.append(mt.index_of(s))
    else:
        scores = s
    scale = 1.0
    post = mt.step_of(scores)
    if post is not None and post.op in ("aten.mul.Tensor", "aten.div.Tensor") and not post.kwargs \
            and isinstance(post.args[1], (int, float)) and not isinstance(post.args[1], bool):
        c = float(post.args[1])
        scale = c if post.op == "aten.mul.Tensor" else 1.0 / c
        steps.append(mt.index_of(scores))
        scores = post.args[0].name
    s4 = _step(mt, scores, "aten.view.default")
    bmm1 = s4 and _step(mt, s4.args[0].name, "aten.bmm.default")
    if not bmm1:
        return None
    steps += [mt.index_of(scores), mt.index_of(s4.args[0].name)]
    qq = _unview3(mt, bmm1.args[0].name, steps)
    kk = _unview3(mt, bmm1.args[1].name, steps)
    if qq is None or kk is None:
        return None
    q, a = _scaled(mt, qq, steps)
    kt, b = _scaled(mt, kk, steps)
    t = mt.step_of(kt)
    if t is None or not ((t.op == "aten.permute.default" and list(t.args[1]) == [0, 1, 3, 2]) or
                         (t.op == "aten.transpose.int" and sorted(d % 4 for d in t.args[1:3]) == [2, 3])):
        return None
    steps.append(mt.index_of(kt))
    k = t.args[0].name
    scale *= a * b
    # grouped-query attention: take K/V back to their own heads
    kv_heads = None
    gk, gv = _gqa_source(mt, k), _gqa_source(mt, v)
    if gk and gv and gk[1] == gv[1]:
        inside = set(steps) | set(gk[2]) | set(gv[2])
        if all(mt.private(mt.g.steps[j].outputs[0], inside) for j in gk[2] + gv[2]):
            k, v, kv_heads = gk[0], gv[0], gk[1]
            steps += gk[2] + gv[2]
    qs, ks, vs = mt.spec(q), mt.spec(k), mt.spec(v)
    if any(x is None or len(x.shape) != 4 or x.dtype != ss.dtype for x in (qs, ks, vs)):
        return None
    B, H, L, E = qs.shape
    S, Ev = ks.shape[2], vs.shape[3]
    if mask is not None:
        ms = mt.spec(mask)
        if ms is None or ms.dtype != (ss.dtype if mask_kind == "float" else "bool") or (mask_shape is None and not (  # (a window mask: checked)
                len(ms.shape) in (2, 3, 4) and _broadcasts(tuple(ms.shape), (B, H, L, S)))):
            return None
        mask_shape = mask_shape or tuple(ms.shape)
    out = mt.g.steps[out_view].outputs[0]
    steps = sorted(set(steps))
    inside = set(steps)
    produced = [o for j in steps for o in mt.g.steps[j].outputs if o and o != out]
    if any(not mt.private(n, inside) for n in produced) or inside & mt.taken:
        return None
    fields = {"batch": B, "heads": H, "q_len": L, "kv_len": S, "head_dim": E, "kv_heads": kv_heads,
              "v_head_dim": Ev if Ev != E else None, "scale": scale if not math.isclose(scale, E ** -0.5) else None,
              "mask": mask_kind if mask is not None else None,
              "mask_shape": mask_shape, "causal": False, "safe_softmax": safe, "dtype": ss.dtype,
              "mask_windows": mask_windows}
    bind = {"q": q, "k": k, "v": v, **({"mask": mask} if mask is not None else {}),
            **({"mask_bias": bias} if bias is not None else {})}
    sources = _copy_sources(mt, bind, inside)
    if sources:
        fields["sources"] = {t: recipe for t, (_, recipe) in sources.items()}
        bind.update({f"{t}_src": src for t, (src, _) in sources.items()})
    return fields, steps, bind, out


def _copy_sources(mt, bind: dict, inside: set) -> dict:
    """``{input: (P, recipe)}`` of the q/k/v that are views of a contiguous copy of ``P`` read by
    nothing else (:mod:`ascendc_pack.tactics.attention_sources`): all of them or none."""
    found = {t: copy_source(mt, bind[t]) for t in SOURCES}
    if any(f is None for f in found.values()):
        return {}
    chains = inside | {i for f in found.values() for i in f[2]}
    made = [o for f in found.values() for i in f[2] for o in mt.g.steps[i].outputs if o]
    if not all(mt.private(n, chains) for n in made) or (chains - inside) & mt.taken:
        return {}
    return {t: (f[0], f[1]) for t, f in found.items()}


def _broadcasts(mask: tuple, scores: tuple) -> bool:
    """A mask of this shape broadcasts to the scores: one per key (its last size is S), and every
    other size 1 or the scores' (e.g. a key padding mask [B, 1, 1, S], a causal one [L, S])."""
    if not mask or len(mask) > len(scores) or mask[-1] != scores[-1]:
        return False
    return all(m in (1, f) for m, f in zip(mask[::-1], scores[::-1]))


def _windowed_mask(mt, s: str, steps: list):
    """Shifted-window attention's mask: ``s = view(add(view(S, [N, W, H, L, S]), m), [N*W, H, L, S])``
    -> ``(S, m, mask_shape, windows)`` with the steps recorded: a mask per window (``m`` of
    ``[1, W, Hm, L, S]`` or ``[W, Hm, L, S]``) is ``mask_windows=W`` of shape ``[W, Hm, L, S]``; one
    per image and window (``[N, W, ...]``) or one for all (``[1, 1, ...]``) a plain 4-D mask. None
    for anything else."""
    v2 = _step(mt, s, "aten.view.default")
    add = v2 and _step(mt, v2.args[0].name, "aten.add.Tensor")
    if not add or add.kwargs or not all(isinstance(a, Ref) for a in add.args):
        return None
    v1 = _step(mt, add.args[0].name, "aten.view.default")
    if v1 is None:
        return None
    scores, mask = v1.args[0].name, add.args[1].name
    s4, s5, ms = mt.spec(scores), mt.spec(add.args[0].name), mt.spec(mask)
    if s4 is None or s5 is None or ms is None or len(s4.shape) != 4 or len(s5.shape) != 5 or len(ms.shape) > 5 \
            or tuple(mt.spec(s).shape) != tuple(s4.shape):
        return None
    n, w, h, l, k = s5.shape
    if n * w != s4.shape[0] or (h, l, k) != tuple(s4.shape[1:]):
        return None
    b0, w0, h0, l0, k0 = (1,) * (5 - len(ms.shape)) + tuple(ms.shape)
    if (l0, k0) != (l, k) or h0 not in (1, h):
        return None
    if (b0, w0) == (1, w) and w > 1:
        shape, windows = (w, h0, l, k), w
    elif (b0, w0) in ((1, 1), (n, w)):
        shape, windows = (b0 * w0, h0, l, k), None
    else:
        return None
    steps += [mt.index_of(s), mt.index_of(v2.args[0].name), mt.index_of(add.args[0].name)]
    return scores, mask, shape, windows


def _position_bias(mt, scores: str, mask: str, mask_shape: tuple, steps: list):
    """Swin's shifted blocks add two constants before the window mask's views: ``S + bias`` (the
    relative position bias, ``[H, L, S]`` or ``[1, H, L, S]``), then the window mask. Both constant:
    ``(S, bias, combined mask shape [W, H, L, S])`` with the add recorded (the tactic pass folds the
    two into one mask weight); else None (the bias add stays outside, unmatched)."""
    add = mt.step_of(scores)
    if add is None or add.op != "aten.add.Tensor" or add.kwargs or not all(isinstance(a, Ref) for a in add.args):
        return None
    s, bias = add.args[0].name, add.args[1].name
    ss, bs = mt.spec(s), mt.spec(bias)
    if ss is None or bs is None or not (mt.constant(bias) and mt.constant(mask)) or bs.dtype != ss.dtype:
        return None
    h, l, k = ss.shape[1:]
    if tuple(bs.shape[-3:]) != (h, l, k) or any(d != 1 for d in bs.shape[:-3]):
        return None
    steps.append(mt.index_of(scores))
    return s, bias, (mask_shape[0], h, l, k)


def _bool_mask(mt, s: str, steps: list):
    """``s = where(mask, S, scalar_tensor(-inf))`` (a boolean mask written out, e.g. a causal
    ``torch.where(mask, scores, -inf)``) -> ``(S, mask)`` with its steps recorded; else None."""
    w = _step(mt, s, "aten.where.self")
    if w is None or w.kwargs or not all(isinstance(a, Ref) for a in w.args):
        return None
    mask, scores, fill = (a.name for a in w.args)
    f = _step(mt, fill, "aten.scalar_tensor.default")
    if f is None or len(f.args) != 1 or f.args[0] != NEG_INF or not mt.private(fill, {mt.index_of(s)}):
        return None
    steps += [mt.index_of(s), mt.index_of(fill)]
    return scores, mask


def _safe_guard(mt, s: str, p: str, steps: list) -> bool:
    """``where(not any(s != -inf), 0, p)`` after the softmax (``_safe_softmax``): record its steps."""
    eq = _consumer(mt, s, "aten.eq.Scalar", lambda x: len(x.args) == 2 and x.args[1] == NEG_INF)
    if eq is None:
        return False
    n1 = mt.only_consumer(mt.g.steps[eq].outputs[0], "aten.logical_not.default")
    anyd = n1 is not None and mt.only_consumer(mt.g.steps[n1].outputs[0], "aten.any.dim")
    n2 = anyd and mt.only_consumer(mt.g.steps[anyd].outputs[0], "aten.logical_not.default")
    full = _consumer(mt, p, "aten.full_like.default", lambda x: x.args[1:2] == [0])
    where = n2 and full is not None and mt.only_consumer(mt.g.steps[n2].outputs[0], "aten.where.self")
    if not where or mt.g.steps[where].args != [Ref(mt.g.steps[n2].outputs[0]), Ref(mt.g.steps[full].outputs[0]),
                                               Ref(p)]:
        return False
    steps += [eq, n1, anyd, n2, full, where]
    return True


KEYS_T = [0, 2, 3, 1]
"""The permutation taking [B, S, H, E] keys straight to Kᵀ = [B, H, E, S]."""


def split_key_permutes(p: Program) -> Program:
    """``permute(x, [0, 2, 3, 1])`` read only by a matmul's ``expand`` (or a scaling ``mul``) ->
    ``permute(permute(x, [0, 2, 1, 3]), [0, 1, 3, 2])``: the same view, in the two steps the
    matcher knows (heads first, then the transpose), so the keys [B, H, S, E] are a value an
    attention step can read. timm's LeViT writes its Kᵀ this way (22 ``bmm`` left in ATen)."""
    readers: dict[str, list] = {}
    for st in p.steps:
        for n in st.input_names():
            readers.setdefault(n, []).append(st)
    steps, values = [], dict(p.values)
    for st in p.steps:
        if _keys_transposed(st, values, readers):
            src, out = st.args[0].name, st.outputs[0]
            spec = values[src]
            heads = f"{out}__heads"
            stride = spec.stride or tuple(torch.empty(spec.shape, device="meta").stride())
            t = torch.empty_strided(spec.shape, stride, device="meta").permute(0, 2, 1, 3)
            values[heads] = TensorSpec(tuple(t.shape), spec.dtype, tuple(t.stride()))
            steps += [AtenStep("aten.permute.default", [Ref(src), [0, 2, 1, 3]], {}, [heads]),
                      AtenStep("aten.permute.default", [Ref(heads), [0, 1, 3, 2]], {}, [out])]
            continue
        steps.append(st)
    return dataclasses.replace(p, steps=steps, values=values) if len(steps) != len(p.steps) else p


def _keys_transposed(st, values: dict, readers: dict) -> bool:
    """``st`` is a ``permute(x, [0, 2, 3, 1])`` of a 4-D ``x`` read only by matmul ``expand`` /
    scaling ``mul`` steps."""
    if not (isinstance(st, AtenStep) and st.op == "aten.permute.default" and list(st.args[1]) == KEYS_T
            and isinstance(st.args[0], Ref) and len(st.outputs) == 1):
        return False
    spec = values.get(st.args[0].name)
    users = readers.get(st.outputs[0], [])
    return spec is not None and len(spec.shape) == 4 and bool(users) and all(
        isinstance(r, AtenStep) and r.op in ("aten.expand.default", "aten.mul.Scalar", "aten.mul.Tensor")
        for r in users)
