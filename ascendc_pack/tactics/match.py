"""Find heavy steps in a captured Program and the pointwise ops that follow them (the matcher of
the tactic pass, :mod:`ascendc_pack.tactics.rewrite`).

What capture leaves of the heavy ops, and what is matched here:

* **GEMM by a constant**: ``addmm(bias, x, W)`` / ``mm(x, W)`` with ``W`` a constant ``[k, n]``
  (``permute(weight, [1, 0])`` of an ``nn.Linear`` weight, or a constant used as is), and
  ``bmm(x3, W3)`` whose ``W3`` is a constant 2-D ``W`` expanded over the batch (what a
  ``matmul`` of a strided 3-D activation by a weight becomes, e.g. ``nn.MultiheadAttention``'s
  input projection); the batch folds into ``m``.
* **Convolution**: ``aten.convolution`` (2-D, not transposed) by a constant weight.
* **Max pooling**: ``max_pool2d_with_indices`` (2-D, not ``ceil_mode``) whose indices nothing
  reads: no epilogue (what follows a pooling is the next convolution's input).
* **Attention**: ``bmm(Q, Kᵀ)`` (either side scaled), an optional additive mask, the decomposed
  softmax (``amax, sub, exp, sum, div``, and the fully-masked-row guard of ``_safe_softmax``),
  ``bmm(P, V)``, with the expand/view steps around them; K/V heads repeated for grouped-query
  attention (``unsqueeze, expand, clone, view``) are taken back to their ``kv_heads``.

The epilogue, in order (each part optional): a bias add (a constant per output channel, when
the heavy op has no bias), an eval BatchNorm affine ``(y - mean) * scale + bias`` (convolution),
a binary op with another tensor of the output's shape (``add``/``sub``/``mul``: the residual),
and an activation (:data:`UNARY_PATTERNS`, the decomposed forms capture produces, checked
against capture by tests/test_tactic_pass.py). Reshapes between the GEMM and its epilogue are
followed. Every value the match consumes inside must have no reader outside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ascendc_pack.passes.fuse import Graph
from ascendc_pack.ir.epilogue import BINARY, EPILOGUE
from ascendc_pack.ir.program import AtenStep, Program, Ref
from ascendc_pack.tactics.match_attention import match_attention

MM_OPS = ("aten.addmm.default", "aten.mm.default", "aten.bmm.default")
RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
TACTIC_DTYPES = ("float32", "bfloat16", "float16")

UNARY_PATTERNS: dict[str, tuple] = {n: op.pattern for n, op in EPILOGUE.items() if op.pattern is not None}
"""Activations as capture decomposes them (:data:`ascendc_pack.ir.epilogue.EPILOGUE`)."""
_COMMUTATIVE = {"aten.add.Tensor", "aten.mul.Tensor"}
BINARY_OPS = {f"aten.{n}.Tensor": n for n in BINARY}


@dataclass
class Match:
    """One heavy step found: its kind, description fields, the program steps it replaces (indices,
    program order), the tensors it reads and the value it computes.

    ``fields``: keyword arguments of the step description (``tactics.LinearStep``...) besides
    the epilogue; ``epilogue``: ``{"affine", "binary", "unary"}``; ``bind``: tactic tensor name
    -> program value; ``shapes``: tactic tensor name -> shape the tactic reads it with;
    ``affine``: program values ``(mean, scale, bias|None)`` of a BatchNorm affine (the pass turns
    them into ``scale`` / ``shift`` weights).
    """

    kind: str
    fields: dict
    steps: list[int]
    bind: dict[str, str]
    shapes: dict[str, tuple]
    output: str
    epilogue: dict = field(default_factory=lambda: {"affine": False, "binary": None, "unary": None})
    affine: tuple | None = None


class Matcher:
    """Matches heavy steps in one Program; ``constant(name)`` says whether a value never changes."""

    dtypes = TACTIC_DTYPES

    def __init__(self, program: Program, constant):
        self.p = program
        self.g = Graph(program)
        self.constant = constant
        self.taken: set[int] = set()

    # helpers ------------------------------------------------------------------------------------
    def spec(self, name):
        return self.p.values.get(name)

    def step_of(self, name) -> AtenStep | None:
        i = self.g.producer.get(name)
        s = self.g.steps[i] if i is not None else None
        return s if isinstance(s, AtenStep) and not s.multi else None

    def index_of(self, name) -> int | None:
        return self.g.producer.get(name)

    def consumers(self, name) -> list[int]:
        return self.g.consumers.get(name, [])

    def private(self, name, inside) -> bool:
        """``name`` is read only by steps in ``inside`` and is not a program output."""
        return name not in self.g.outputs and all(c in inside for c in self.consumers(name))

    def only_consumer(self, name, op: str | tuple) -> int | None:
        ops = (op,) if isinstance(op, str) else op
        cs = self.consumers(name)
        if len(cs) != 1 or name in self.g.outputs or cs[0] in self.taken:
            return None
        s = self.g.steps[cs[0]]
        return cs[0] if isinstance(s, AtenStep) and s.op in ops and not s.multi else None

    def per_channel(self, name, channels: int, channel_dim_from_end: int) -> bool:
        """A constant of ``channels`` elements broadcasting along one dim (``-channel_dim_from_end``)."""
        spec = self.spec(name)
        if spec is None or not self.constant(name) or math.prod(spec.shape) != channels:
            return False
        shape = list(spec.shape)
        if len(shape) < channel_dim_from_end:
            return False
        return shape[-channel_dim_from_end] == channels and all(
            s == 1 for i, s in enumerate(shape) if i != len(shape) - channel_dim_from_end)

    # epilogue -----------------------------------------------------------------------------------
    def pattern(self, pattern: tuple, v: str, inside: set[int]) -> tuple[list[int], str] | None:
        """Match an activation pattern applied to ``v``; ``(steps, result)`` or None."""
        vals: dict = {"v": v}
        idx: list[int] = []
        for op, args in pattern:
            first = next(a for a in args if a == "v" or (isinstance(a, int) and not isinstance(a, bool)
                                                          and a in vals))
            found = None
            for ci in self.consumers(vals[first]):
                s = self.g.steps[ci]
                if ci in self.taken or ci in idx or ci in inside or not isinstance(s, AtenStep) or s.op != op \
                        or s.kwargs or s.multi:
                    continue
                if self._args_match(s.args, args, vals) or (
                        op in _COMMUTATIVE and len(args) == 2 and self._args_match(s.args, args[::-1], vals)):
                    found = ci
                    break
            if found is None:
                return None
            vals[len(idx)] = self.g.steps[found].outputs[0]
            idx.append(found)
        out = vals[len(idx) - 1]
        within = set(idx) | inside
        if not all(self.private(vals[k], within) for k in range(len(idx) - 1)):
            return None
        return idx, out

    @staticmethod
    def _args_match(actual: list, pattern: tuple, vals: dict) -> bool:
        if len(actual) != len(pattern):
            return False
        for a, p in zip(actual, pattern):
            if p == "v" or (isinstance(p, int) and not isinstance(p, bool) and p in vals and isinstance(a, Ref)):
                if not isinstance(a, Ref) or a.name != vals[p]:
                    return False
            elif isinstance(a, Ref):
                return False
            elif p is None or a is None:
                if p is not a:
                    return False
            elif isinstance(p, float) or isinstance(a, float):
                if not math.isclose(float(a), float(p), rel_tol=1e-12):
                    return False
            elif a != p:
                return False
        return True

    def epilogue(self, m: Match, y: str, channels: int, channel_dim_from_end: int, allow_affine: bool,
                 allow_reshape: bool, has_bias: bool) -> None:
        """Extend match ``m`` (heavy op computing ``y``) with the epilogue that follows."""
        inside = set(m.steps)
        cur = y

        def extend(new: list[int], out: str) -> None:
            nonlocal cur
            m.steps += new
            inside.update(new)
            cur = out

        if allow_reshape:  # views between the GEMM and its epilogue ([m, n] -> [b, s, n])
            while (c := self.only_consumer(cur, RESHAPES)) is not None:
                extend([c], self.g.steps[c].outputs[0])
        if not has_bias:
            c = self.only_consumer(cur, "aten.add.Tensor")
            if c is not None:
                s = self.g.steps[c]
                other = _other_ref(s.args, cur)
                if other is not None and not s.kwargs and self.per_channel(other, channels, channel_dim_from_end):
                    m.fields["bias"] = True
                    m.bind["bias"] = other
                    m.shapes["bias"] = (channels,)
                    extend([c], s.outputs[0])
        if allow_affine:
            self._affine(m, cur, channels, extend)
            cur = m.output if m.affine else cur
        c = self.only_consumer(cur, tuple(BINARY_OPS))
        if c is not None:
            s = self.g.steps[c]
            other = _other_ref(s.args, cur, ordered=s.op == "aten.sub.Tensor")
            ospec, cspec = self.spec(other) if other else None, self.spec(cur)
            if other is not None and not s.kwargs and ospec is not None and cspec is not None \
                    and ospec.shape == cspec.shape and ospec.dtype == cspec.dtype:
                m.epilogue["binary"] = BINARY_OPS[s.op]
                m.bind["other"] = other
                m.shapes["other"] = None  # the heavy op's output shape (filled in by the caller)
                extend([c], s.outputs[0])
        if all(c not in self.taken for c in self.consumers(cur)) and cur not in self.g.outputs:
            for name, pat in UNARY_PATTERNS.items():
                got = self.pattern(pat, cur, inside)
                if got is not None and all(c in set(got[0]) for c in self.consumers(cur)):
                    m.epilogue["unary"] = name
                    extend(*got)
                    break
        m.output = cur

    def _affine(self, m: Match, cur: str, channels: int, extend) -> None:
        """``(cur - mean) * scale [+ bias]`` with per-channel constants: an eval BatchNorm."""
        c1 = self.only_consumer(cur, "aten.sub.Tensor")
        if c1 is None:
            return
        s1 = self.g.steps[c1]
        mean = _other_ref(s1.args, cur, ordered=True)
        if mean is None or s1.kwargs or not self.per_channel(mean, channels, 3):
            return
        c2 = self.only_consumer(s1.outputs[0], "aten.mul.Tensor")
        if c2 is None:
            return
        s2 = self.g.steps[c2]
        scale = _other_ref(s2.args, s1.outputs[0])
        if scale is None or s2.kwargs or not self.per_channel(scale, channels, 3):
            return
        steps, out, bias = [c1, c2], s2.outputs[0], None
        c3 = self.only_consumer(out, "aten.add.Tensor")
        if c3 is not None:
            s3 = self.g.steps[c3]
            b = _other_ref(s3.args, out)
            if b is not None and not s3.kwargs and self.per_channel(b, channels, 3):
                steps, out, bias = steps + [c3], s3.outputs[0], b
        m.epilogue["affine"] = True
        m.affine = (mean, scale, bias)
        extend(steps, out)
        m.output = out

    # heavy ops ----------------------------------------------------------------------------------
    def gemm(self, i: int) -> Match | None:
        s = self.g.steps[i]
        if s.kwargs:  # beta / alpha
            return None
        if s.op == "aten.bmm.default":
            x, b3 = s.args
            w_name, w_steps = self._broadcast_weight(b3.name)
            if w_name is None:
                return None
            bias = None
        else:
            bias, x, b = (s.args if s.op == "aten.addmm.default" else [None, *s.args])
            w_name, w_steps = b.name, []
            if bias is not None and not self.per_channel(bias.name, self.spec(w_name).shape[-1], 1):
                return None
        if not self.constant(w_name) or self.constant(x.name):
            return None
        xs, ws, ys = self.spec(x.name), self.spec(w_name), self.spec(s.outputs[0])
        if xs is None or ws is None or ys is None or len(ws.shape) != 2 or ys.dtype not in TACTIC_DTYPES \
                or xs.dtype != ys.dtype or ws.dtype != ys.dtype:
            return None
        k, n = ws.shape
        mrows = math.prod(xs.shape[:-1])
        layout, weight, steps = "kn", w_name, list(w_steps)
        src = self.step_of(w_name)
        if src is not None and src.op in ("aten.permute.default", "aten.t.default") and \
                (src.op == "aten.t.default" or list(src.args[1]) == [1, 0]) and \
                self.private(w_name, set(steps) | {i}) and self.constant(src.args[0].name):
            layout, weight = "nk", src.args[0].name
            steps.append(self.index_of(w_name))
        m = Match("linear", {"m": mrows, "k": k, "n": n, "bias": bias is not None, "weight_layout": layout,
                             "dtype": ys.dtype},
                  sorted(steps + [i]), {"x": x.name, "weight": weight}, {"x": (mrows, k)}, s.outputs[0])
        if bias is not None:
            m.bind["bias"], m.shapes["bias"] = bias.name, (n,)
        self.epilogue(m, s.outputs[0], n, 1, allow_affine=False, allow_reshape=True, has_bias=bias is not None)
        if "other" in m.bind:
            m.shapes["other"] = (mrows, n)
        return m

    def _broadcast_weight(self, b3: str) -> tuple[str | None, list[int]]:
        """``view(expand(W, [b, k, n]), [b, k, n])`` of a constant 2-D ``W``: (W, steps)."""
        v = self.step_of(b3)
        steps = []
        if v is not None and v.op in RESHAPES:
            steps.append(self.index_of(b3))
            e_name = v.args[0].name
            e = self.step_of(e_name)
        else:
            e_name, e = b3, v
        if e is None or e.op != "aten.expand.default":
            return None, []
        steps.append(self.index_of(e_name))
        w = e.args[0].name
        ws = self.spec(w)
        if ws is None or len(ws.shape) != 2 or not all(self.private(n, set(steps) | {self.g.consumers[b3][0]})
                                                        for n in (b3, e_name)) or len(self.consumers(b3)) != 1:
            return None, []
        return w, steps

    def conv(self, i: int) -> Match | None:
        s = self.g.steps[i]
        x, w, b, stride, padding, dilation, transposed, _, groups = s.args
        xs, ws, ys = self.spec(x.name), self.spec(w.name), self.spec(s.outputs[0])
        if transposed or s.kwargs or xs is None or ws is None or len(xs.shape) != 4 or len(ws.shape) != 4 \
                or not self.constant(w.name) or self.constant(x.name) or ys.dtype not in TACTIC_DTYPES \
                or (b is not None and not self.constant(b.name)):
            return None
        layout = "channels_last" if xs.stride is not None and _is_channels_last(xs.shape, xs.stride) \
            else "contiguous"
        m = Match("conv", {"x_shape": tuple(xs.shape), "out_channels": ws.shape[0], "kernel": tuple(ws.shape[2:]),
                           "stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation),
                           "groups": groups, "bias": b is not None, "layout": layout, "dtype": ys.dtype},
                  [i], {"x": x.name, "weight": w.name}, {}, s.outputs[0])
        if b is not None:
            m.bind["bias"] = b.name
        self.epilogue(m, s.outputs[0], ws.shape[0], 3, allow_affine=True, allow_reshape=False,
                      has_bias=b is not None)
        if "bias" in m.bind:
            m.shapes["bias"] = (ws.shape[0],)
        if "other" in m.bind:
            m.shapes["other"] = tuple(ys.shape)
        return m

    def pool(self, i: int) -> Match | None:
        """``max_pool2d_with_indices`` (2-D, ``ceil_mode=False``) whose indices nothing reads."""
        s = self.g.steps[i]
        if s.kwargs or len(s.outputs) != 2 or not 2 <= len(s.args) <= 6:
            return None
        y, idx = s.outputs
        if idx is not None and (self.consumers(idx) or idx in self.g.outputs):
            return None
        x, kernel, stride, padding, dilation, ceil_mode = list(s.args) + [(), 0, 1, False][len(s.args) - 2:]
        if not isinstance(x, Ref) or ceil_mode:
            return None
        xs, ys = self.spec(x.name), self.spec(y)
        if xs is None or ys is None or len(xs.shape) != 4 or ys.dtype not in ("float32", "bfloat16") \
                or self.constant(x.name):
            return None
        pair = lambda v: (v, v) if isinstance(v, int) else (tuple(v) * 2 if len(v) == 1 else tuple(v))  # noqa: E731
        kernel, stride = pair(kernel), pair(stride) if stride else pair(kernel)
        layout = "channels_last" if xs.stride is not None and _is_channels_last(xs.shape, xs.stride) \
            else "contiguous"
        return Match("pool", {"x_shape": tuple(xs.shape), "kernel": kernel, "stride": stride,
                              "padding": pair(padding), "dilation": pair(dilation), "layout": layout,
                              "dtype": ys.dtype}, [i], {"x": x.name}, {}, y)

    def attention(self, i: int) -> Match | None:
        """Attention whose softmax starts with ``amax`` step ``i`` (see the module docstring)."""
        found = match_attention(self, i)
        return Match("attention", *found[:3], {}, found[3]) if found else None

    # the whole program --------------------------------------------------------------------------
    def run(self) -> list[Match]:
        """Every match, attention first (its bmm pairs are not GEMMs by a constant), then GEMMs
        and convolutions in program order; a step belongs to one match at most."""
        found = []
        for kind, ops in (("attention", ("aten.amax.default",)), ("gemm", MM_OPS),
                          ("conv", ("aten.convolution.default",)), ("pool", ("aten.max_pool2d_with_indices.default",))):
            for i, s in enumerate(self.g.steps):
                if i in self.taken or not isinstance(s, AtenStep) or s.op not in ops:
                    continue
                m = getattr(self, kind)(i)
                if m is not None and not (set(m.steps) & self.taken):
                    self.taken.update(m.steps)
                    found.append(m)
        return found


def _other_ref(args: list, cur: str, ordered: bool = False) -> str | None:
    """The tensor operand of a binary step that is not ``cur`` (``ordered``: ``cur`` must be first)."""
    if len(args) != 2 or not all(isinstance(a, Ref) for a in args):
        return None
    a, b = args
    if a.name == cur and b.name != cur:
        return b.name
    if not ordered and b.name == cur and a.name != cur:
        return a.name
    return None


def _is_channels_last(shape, stride) -> bool:
    n, c, h, w = shape
    return c > 1 and h * w > 1 and tuple(stride) == (h * w * c, 1, w * c, c)


__all__ = ["Match", "Matcher", "UNARY_PATTERNS", "BINARY_OPS"]
