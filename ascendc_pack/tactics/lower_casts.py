"""A lowered low-precision step hands its conversions to the fuser (part of :mod:`ascendc_pack.tactics.lower`).

A bfloat16 candidate (:mod:`ascendc_pack.tactics.dispatch.lowp`) converts its inputs to bfloat16,
runs the heavy op, converts the result back and applies what is left of its epilogue (a residual
add, the activation after it) in float32. Run inside the tactic, each conversion is one more
pass over memory in graph.cpp (``aten::_to_copy``: 27 % of an mlp's bfloat16 call). Lowered,
the step keeps only the heavy op, on bfloat16 values, and the conversions and the rest of the
epilogue become ATen steps of the program around it::

    x_bf16 = _to_copy(x, bfloat16)          # fused by the fuser into x's producer kernel
    y_bf16 = TacticStep(x_bf16)             # the heavy op (bias, activation fused), bfloat16 out
    y = _to_copy(y_bf16, float32)           # fused into the consumer kernel, which reads bfloat16
    out = add(y, other) [, relu(...)]       #   and the residual / activation with it

The values between them are the same as inside the tactic, so the result is unchanged: the fuser
only saves the passes (and, where nothing else reads the float32 ``x``, its producer writes
bfloat16 alone). An int8 step (:mod:`ascendc_pack.tactics.dispatch.int8`) is lowered the same
way: its quantization (``mul``, ``round``, ``add``, ``clamp``, ``_to_copy(uint8)``) goes before
it, into ``x``'s producer, and the epilogue after its op (which returns float32 itself) after it.
"""

from __future__ import annotations

import dataclasses

import torch

from ascendc_pack.ir.program import AtenStep, Program, Ref, TacticStep, TensorSpec
from ascendc_pack.tactics.dispatch.spec import Dtype, MemoryFormat, Tactic
from ascendc_pack.tactics.dispatch.spec import Ref as TRef
from ascendc_pack.tactics.families.registry import DISPATCH, lowered_family

CAST = "aten::_to_copy"


def _is_cast(c, dtype: str) -> bool:
    kw = dict(c.kwargs)
    return c.op == CAST and len(c.args) == 1 and isinstance(c.args[0], TRef) and kw.get("dtype") == Dtype(dtype) \
        and set(kw) <= {"dtype", "memory_format"}


def _torch_kwargs(call) -> dict:
    out = {}
    for k, v in call.kwargs:
        if isinstance(v, Dtype):
            v = getattr(torch, v.name)
        elif isinstance(v, MemoryFormat):
            v = getattr(torch, v.name)
        out[k] = v
    return out


def _contiguous(shape) -> tuple:
    out, acc = [], 1
    for d in reversed(tuple(shape)):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def _aten_op(qualified: str) -> str:
    """``"aten::add_.Tensor"`` -> ``"aten.add.Tensor"`` (the out-of-place op of an in-place call)."""
    ns, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    return f"{ns}.{name.removesuffix('_')}.{overload or 'default'}"


QUANTIZE_OPS = frozenset({"aten::mul.Scalar", "aten::add.Scalar", "aten::round", "aten::clamp"})
"""Pointwise ops an int8 candidate quantizes its input with (before its ``_to_copy`` to uint8)."""


def _converts(c, made: set[str]) -> bool:
    """Whether call ``c`` converts a value of ``made`` (a step input or an earlier conversion's
    result) towards the heavy op's precision: a cast to bfloat16 / uint8, or a quantizing
    pointwise op on scalars."""
    if not c.args or not isinstance(c.args[0], TRef) or c.args[0].name not in made:
        return False
    if c.op == CAST:
        return _is_cast(c, "bfloat16") or _is_cast(c, "uint8")
    return c.op in QUANTIZE_OPS and not c.kwargs and not any(isinstance(a, (TRef, tuple)) for a in c.args[1:])


def core(tactic: Tactic) -> tuple[int, int] | None:
    """``(head, last)``: a low-precision tactic's calls ``[head:last]`` are what a lowered step
    keeps (the heavy op on low-precision values; the conversions before it and, for bfloat16, the
    conversion back and the epilogue after it go to the fuser); None for any other tactic. PGO
    times that core, as the bundle will run it."""
    if tactic.param("precision", "fp32") == "fp32":
        return None
    calls = list(tactic.calls)
    made, head = set(tactic.inputs), 0
    while head < len(calls) and _converts(calls[head], made):
        made.add(calls[head].out)
        head += 1
    back = [i for i, c in enumerate(calls) if _is_cast(c, "float32")]
    if len(back) > 1 or head >= len(calls):
        return None
    last = back[0] if back else head + 1   # int8: the quantized op returns float32 itself
    return (head, last) if last > head else None


def _meta_result(op: str, spec: TensorSpec, args: list, kwargs: dict) -> TensorSpec:
    """The spec of ``op`` applied to a tensor of ``spec`` (meta tensors: no data)."""
    t = torch.empty_strided(spec.shape, spec.stride or _contiguous(spec.shape), dtype=getattr(torch, spec.dtype),
                            device="meta")
    ns, name, overload = op.split(".")
    r = getattr(getattr(getattr(torch.ops, ns), name), overload)(t, *args, **kwargs)
    return TensorSpec(tuple(r.shape), str(r.dtype).removeprefix("torch."), tuple(r.stride()))


def split_casts(s: TacticStep, scope: str, values: dict) -> list:
    """``[AtenStep..., TacticStep, AtenStep...]`` for a lowered dispatcher step ``s`` (``chosen``
    set) of a low precision (module docstring); ``[s]`` for any other step. ``values`` (the
    program's specs) gains the new values."""
    if s.chosen is None or lowered_family(s.chosen) != DISPATCH:   # a generated kernel's launch
        return [s]
    tactic = Tactic.from_json(s.chosen)
    span = core(tactic)
    if span is None:
        return [s]
    calls = list(tactic.calls)
    out = s.outputs[0]
    prefix = f"{scope}{out}__"
    bind, shapes, inputs = dict(s.bind), dict(s.shapes), list(tactic.inputs)
    recorded = dict(s.values or {})
    before: list[AtenStep] = []
    head = 0
    while head < span[0]:   # leading conversions of bound activations
        c = calls[head]
        src = c.args[0].name
        if src not in bind:
            break
        kwargs = _torch_kwargs(c)
        name = prefix + c.out
        op = _aten_op(c.op)
        values[name] = _meta_result(op, values[bind[src]], list(c.args[1:]), kwargs)
        before.append(AtenStep(op, [Ref(bind[src]), *c.args[1:]], kwargs, [name]))
        bind[c.out] = name
        if src in shapes:
            shapes[c.out] = shapes[src]
        if not any(src in x.refs() for x in calls[head + 1:]):
            bind.pop(src)
            shapes.pop(src, None)
            inputs = [c.out if n == src else n for n in inputs]
        else:
            inputs.append(c.out)
        head += 1
    last = span[1]
    low_name = calls[last - 1].out
    spec = values[out]
    tail = calls[last:]
    # contiguous, as captured: propagate_layouts gives it (and the steps after it) the layout the
    # tactic really returns when that differs (a convolution's channels_last)
    low_value = prefix + low_name if tail else out
    low_dtype = "bfloat16" if tail and _is_cast(tail[0], "float32") else spec.dtype
    values[low_value] = TensorSpec(tuple(spec.shape), low_dtype, _contiguous(spec.shape))
    f32 = TensorSpec(tuple(spec.shape), spec.dtype, _contiguous(spec.shape))
    names = {low_name: low_value}
    after: list[AtenStep] = []
    for j, c in enumerate(tail):   # the conversion back and the rest of the epilogue, out of place
        args = [Ref(names[a.name]) if isinstance(a, TRef) and a.name in names else
                Ref(bind[a.name]) if isinstance(a, TRef) else a for a in c.args]
        result = out if j == len(tail) - 1 else prefix + c.out
        after.append(AtenStep(_aten_op(c.op), args, _torch_kwargs(c), [result]))
        names[c.out] = result
        if result != out:
            values[result] = f32
    new = dataclasses.replace(tactic, calls=tuple(calls[head:last]), output=low_name, inputs=tuple(inputs))
    read = set().union(*(c.refs() for c in [p.call for p in new.prepack] + list(new.calls)))
    bind = {k: v for k, v in bind.items() if k in read}
    shapes = {k: v for k, v in shapes.items() if k in read}
    lowered = dataclasses.replace(s, bind=bind, shapes=shapes, chosen=new.to_json(), outputs=[low_value],
                                  values=recorded)
    return [*before, lowered, *after]


#: the quantization of an int8 step's input as lowered (:func:`~ascendc_pack.tactics.dispatch.int8.quantize_calls`)
QUANTIZE_CHAIN = ("aten.mul.Scalar", "aten.round.default", "aten.add.Scalar", "aten.clamp.default",
                  "aten._to_copy.default")
#: positions of ``output_scale``, ``output_zero_point``, ``output_dtype`` in the quantized ops' arguments
REQUANTIZE_ARGS = {"onednn::qlinear_pointwise": 7, "onednn::qconv2d_pointwise": 11}


def _quantize_chain(value: str, readers: dict) -> list | None:
    """The five AtenSteps quantizing ``value`` to uint8 when they are its only reader, one after the
    other (each read by the next only), else None."""
    chain, cur = [], value
    for op in QUANTIZE_CHAIN:
        rs = readers.get(cur, [])
        if len(rs) != 1 or not isinstance(rs[0], AtenStep) or rs[0].op != op or rs[0].multi:
            return None
        chain.append(rs[0])
        cur = rs[0].outputs[0]
    cast = chain[-1]
    if cast.kwargs.get("dtype") != torch.uint8 or set(cast.kwargs) - {"dtype", "memory_format"}:
        return None
    return chain


def fold_requantize(p: Program) -> Program:
    """An int8 step whose float32 result nothing but the quantization of another int8 step's input
    reads (a convolution -> ReLU -> convolution, a GEMM -> GEMM) returns that uint8 operand itself:
    oneDNN requantizes its int32 accumulators with the next step's scale and zero point
    (``output_scale``, ``output_zero_point``, ``output_dtype=uint8``), so neither the float32 result
    is written nor the quantization pass runs. oneDNN rounds once from the accumulators where the
    chain rounded the float32 result: a value may differ by one quantization step at a tie, far
    inside the budget the bundle is verified against."""
    readers: dict[str, list] = {}
    for s in p.steps:
        for n in set(s.input_names()):
            readers.setdefault(n, []).append(s)
    dropped: set[int] = set()
    steps = []
    values = dict(p.values)
    for s in p.steps:
        if id(s) in dropped:
            continue
        if isinstance(s, TacticStep) and s.chosen is not None and lowered_family(s.chosen) == DISPATCH \
                and s.outputs[0] not in p.outputs:
            t = Tactic.from_json(s.chosen)
            last = t.calls[-1]
            chain = _quantize_chain(s.outputs[0], readers) if (
                t.param("precision") == "int8" and last.op in REQUANTIZE_ARGS and t.output == last.out) else None
            fmt = chain[-1].kwargs.get("memory_format") if chain else None
            if chain and (fmt is None or (fmt == torch.channels_last and t.kind == "conv")):
                i = REQUANTIZE_ARGS[last.op]
                scale, zero_point = 1.0 / chain[0].args[1], int(chain[2].args[1])
                args = last.args[:i] + (scale, zero_point, Dtype("uint8")) + last.args[i + 3:]
                calls = t.calls[:-1] + (dataclasses.replace(last, args=args),)
                new = dataclasses.replace(t, calls=calls, params=t.params + (("requantized", True),))
                recorded = dict(s.values or {})
                if t.output in recorded:
                    y = recorded[t.output]
                    recorded[t.output] = TensorSpec(tuple(y.shape), "uint8", y.stride)
                values.pop(s.outputs[0], None)
                for c in chain[:-1]:
                    values.pop(c.outputs[0], None)
                dropped.update(id(c) for c in chain)
                s = dataclasses.replace(s, chosen=new.to_json(), outputs=[chain[-1].outputs[0]], values=recorded)
        steps.append(s)
    return dataclasses.replace(p, steps=steps, values=values)


#: ops that move values without computing on them: a bfloat16 value goes through them unchanged
DTYPE_AGNOSTIC = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
    "aten.transpose.int", "aten.t.default", "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.expand.default", "aten.slice.Tensor", "aten.select.int", "aten.alias.default",
    "aten.clone.default"})


def cancel_round_trips(p: Program) -> Program:
    """``_to_copy(moves(_to_copy(u, float32)), bfloat16)`` -> ``moves(u)`` for a bfloat16 ``u``
    (``moves``: views and copies, :data:`DTYPE_AGNOSTIC`): a bfloat16 step's result feeding
    another bfloat16 step through views (a ``qkv`` projection's heads into attention) stays
    bfloat16 instead of being widened and narrowed again. Exact: widening bfloat16 is exact and
    narrowing an exactly representable value gives it back. The float32 chain, when nothing else
    reads it, is dead code after this (the lowering removes it)."""
    producer = {o: s for s in p.steps if isinstance(s, AtenStep) for o in s.outputs if o}
    values = dict(p.values)
    made: dict[str, str] = {}   # float32 value -> its bfloat16 twin
    steps: list = []

    def twin(name: str, out: list) -> str | None:
        """The bfloat16 twin of float32 value ``name`` (its steps appended to ``out``), or None."""
        if name in made:
            return made[name]
        s = producer.get(name)
        if s is None or s.multi or not s.args or not isinstance(s.args[0], Ref):
            return None
        src = s.args[0].name
        if s.op == "aten._to_copy.default" and set(s.kwargs) == {"dtype"} and s.kwargs["dtype"] == torch.float32 \
                and values.get(src) is not None and values[src].dtype == "bfloat16":
            made[name] = src
            return src
        if s.op not in DTYPE_AGNOSTIC or any(isinstance(a, Ref) for a in s.args[1:]) \
                or any(isinstance(v, Ref) for v in s.kwargs.values()):
            return None
        base = twin(src, out)
        if base is None:
            return None
        new = f"{name}__bf16"
        spec = values[name]
        values[new] = TensorSpec(tuple(spec.shape), "bfloat16", spec.stride)
        out.append(AtenStep(s.op, [Ref(base), *s.args[1:]], dict(s.kwargs), [new]))
        made[name] = new
        return new

    for s in p.steps:
        if isinstance(s, AtenStep) and s.op == "aten._to_copy.default" and set(s.kwargs) == {"dtype"} \
                and s.kwargs["dtype"] == torch.bfloat16 and isinstance(s.args[0], Ref):
            extra: list = []
            src = twin(s.args[0].name, extra)
            if src is not None:
                steps += extra
                steps.append(AtenStep("aten.alias.default", [Ref(src)], {}, list(s.outputs)))
                values[s.outputs[0]] = values[src]   # the twin's layout, not the cast's
                continue
        steps.append(s)
    return dataclasses.replace(p, steps=steps, values=values)


__all__ = ["DTYPE_AGNOSTIC", "cancel_round_trips", "core", "fold_requantize", "split_casts"]
