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
bfloat16 alone).
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


def _meta_cast(spec: TensorSpec, kwargs: dict) -> TensorSpec:
    t = torch.empty_strided(spec.shape, spec.stride or _contiguous(spec.shape), dtype=getattr(torch, spec.dtype),
                            device="meta")
    r = torch.ops.aten._to_copy.default(t, **kwargs)
    return TensorSpec(tuple(r.shape), str(r.dtype).removeprefix("torch."), tuple(r.stride()))


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


def core(tactic: Tactic) -> tuple[int, int] | None:
    """``(head, last)``: a low-precision tactic's calls ``[head:last]`` are what a lowered step
    keeps (the heavy op on bfloat16 values, its leading and trailing conversions fused away); None
    for any other tactic. PGO times that core, as the bundle will run it."""
    if tactic.param("precision", "fp32") == "fp32":
        return None
    calls = list(tactic.calls)
    last = next((i for i, c in enumerate(calls) if _is_cast(c, "float32")), None)
    if last is None:
        return None
    head = 0
    while head < last and _is_cast(calls[head], "bfloat16") and calls[head].args[0].name in tactic.inputs:
        head += 1
    return head, last


def split_casts(s: TacticStep, scope: str, values: dict) -> list:
    """``[AtenStep..., TacticStep, AtenStep...]`` for a lowered dispatcher step ``s`` (``chosen``
    set) whose tactic converts to bfloat16 (module docstring); ``[s]`` for any other step.
    ``values`` (the program's specs) gains the new values."""
    if s.chosen is None or lowered_family(s.chosen) != DISPATCH:   # a generated kernel's launch
        return [s]
    tactic = Tactic.from_json(s.chosen)
    if tactic.param("precision", "fp32") == "fp32":
        return [s]
    calls = list(tactic.calls)
    last = next((i for i, c in enumerate(calls) if _is_cast(c, "float32")), None)
    if last is None or any(_is_cast(c, "float32") for c in calls[last + 1:]):
        return [s]
    out = s.outputs[0]
    prefix = f"{scope}{out}__"
    bind, shapes, inputs = dict(s.bind), dict(s.shapes), list(tactic.inputs)
    recorded = dict(s.values or {})
    before: list[AtenStep] = []
    head = 0
    while head < last and _is_cast(calls[head], "bfloat16"):   # leading conversions of bound activations
        c = calls[head]
        src = c.args[0].name
        if src not in bind:
            break
        kwargs = _torch_kwargs(c)
        name = prefix + c.out
        values[name] = _meta_cast(values[bind[src]], kwargs)
        before.append(AtenStep("aten._to_copy.default", [Ref(bind[src])], kwargs, [name]))
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
    cast = calls[last]
    low_name = cast.args[0].name
    low_value = prefix + low_name
    spec = values[out]
    # contiguous, as captured: propagate_layouts gives it (and the steps after it) the layout the
    # tactic really returns when that differs (a convolution's channels_last)
    values[low_value] = TensorSpec(tuple(spec.shape), "bfloat16", _contiguous(spec.shape))
    after = [AtenStep("aten._to_copy.default", [Ref(low_value)], {"dtype": torch.float32},
                      [out if last == len(calls) - 1 else prefix + cast.out])]
    f32 = TensorSpec(tuple(spec.shape), spec.dtype, _contiguous(spec.shape))
    names = {cast.out: after[0].outputs[0]}
    for j, c in enumerate(calls[last + 1:], start=last + 1):   # the rest of the epilogue, out of place
        args = [Ref(names[a.name]) if isinstance(a, TRef) and a.name in names else
                Ref(bind[a.name]) if isinstance(a, TRef) else a for a in c.args]
        result = out if j == len(calls) - 1 else prefix + c.out
        after.append(AtenStep(_aten_op(c.op), args, _torch_kwargs(c), [result]))
        names[c.out] = result
    for st in after:
        for o in st.outputs:
            if o != out:
                values[o] = f32
    new = dataclasses.replace(tactic, calls=tuple(calls[head:last]), output=low_name, inputs=tuple(inputs))
    read = set().union(*(c.refs() for c in [p.call for p in new.prepack] + list(new.calls)))
    bind = {k: v for k, v in bind.items() if k in read}
    shapes = {k: v for k, v in shapes.items() if k in read}
    lowered = dataclasses.replace(s, bind=bind, shapes=shapes, chosen=new.to_json(), outputs=[low_value],
                                  values=recorded)
    return [*before, lowered, *after]


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


__all__ = ["DTYPE_AGNOSTIC", "cancel_round_trips", "core", "split_casts"]
