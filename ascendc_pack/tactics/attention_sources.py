"""Attention inputs read through the copy that made them contiguous.

``nn.MultiheadAttention`` splits its packed in-projection as
``proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()`` and then
views each of ``q``, ``k``, ``v`` as ``[B, H, L, Eh]`` through ``[L, B·H, Eh]``: the copy exists
only because merging batch and heads needs contiguous memory. A generated attention kernel reads
``q``/``k``/``v`` with any (batch, head, row) strides, so it can read the projection itself:
transformer_block's copy of 3 MiB took 100-130 µs of a 5 ms call (2 %).

At matching, :func:`copy_source` takes a q/k/v value back through its views to a contiguous
``clone(P)`` and writes the same tensor as a *recipe* of views of ``P`` (selects, one view that
splits dimensions, a permute, unsqueezes: views valid on ``P``'s own strides). The step records
the recipe per input (``desc["sources"]``, no value names: identical steps share it) and binds
``P`` as ``<input>_src``; the generated kernels are compiled for the recipe's strides on ``P``
and timed reading it (:func:`resolve`), the other candidates read the copy as captured. Once a
generated kernel won, :func:`read_sources_in_place` puts the recipe's views into the lowered
program and binds them: the copy has no reader left and goes with the dead steps. Valid because
the program is functional (``P`` never changes after the copy was taken; a program with an
in-place step is left alone, as copy elision leaves it).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides

from ascendc_pack.kernels.attention.generator import AttnSpec
from ascendc_pack.ir.program import AtenStep, ModelProgram, Ref, TacticStep, TensorSpec
from ascendc_pack.passes.copy_elision import in_place_step
from ascendc_pack.passes.fold import remove_dead_steps
from ascendc_pack.tactics.families import registry

CHAIN_OPS = ("aten.view.default", "aten._unsafe_view.default", "aten.permute.default", "aten.select.int",
             "aten.unsqueeze.default", "aten.squeeze.dims", "aten.transpose.int")
KERNEL_FAMILIES = ("attention", "attention_amx_bf16")
SOURCES = ("q", "k", "v")


def copy_source(mt, name: str) -> tuple[str, list, list[int]] | None:
    """``(P, recipe, chain steps)`` when value ``name`` is a chain of views of a contiguous
    ``clone(P)`` that the recipe's views of ``P`` reproduce; None otherwise."""
    chain, cur = [], name
    while True:
        s = mt.step_of(cur)
        if s is None or not isinstance(s.args[0], Ref) or s.kwargs.keys() - {"memory_format"}:
            return None
        if s.op == "aten.clone.default":
            if s.kwargs.get("memory_format", torch.contiguous_format) != torch.contiguous_format:
                return None
            break
        if s.op not in CHAIN_OPS or s.kwargs:
            return None
        chain.append(mt.index_of(cur))
        cur = s.args[0].name
    src = s.args[0].name
    ps, leaf = mt.spec(src), mt.spec(name)
    if ps is None or leaf is None or ps.stride is None or ps.dtype != leaf.dtype:
        return None
    t = torch.empty(ps.shape, device="meta")  # the clone: contiguous
    try:
        for i in reversed(chain):
            t = _apply_step(mt.g.steps[i], t)
    except (RuntimeError, IndexError, TypeError):
        return None
    recipe = _recipe(tuple(ps.shape), tuple(t.shape), tuple(t.stride()), t.storage_offset())
    if recipe is None:
        return None
    return src, recipe, chain + [mt.index_of(cur)]


def _apply_step(s: AtenStep, t: torch.Tensor) -> torch.Tensor:
    args = s.args[1:]
    if s.op in ("aten.view.default", "aten._unsafe_view.default"):
        return t.view(list(args[0]))
    if s.op == "aten.permute.default":
        return t.permute(list(args[0]))
    if s.op == "aten.select.int":
        return t.select(args[0], args[1])
    if s.op == "aten.unsqueeze.default":
        return t.unsqueeze(args[0])
    if s.op == "aten.squeeze.dims":
        return t.squeeze(tuple(args[0]))
    return t.transpose(args[0], args[1])


def _recipe(src_shape: tuple, shape: tuple, stride: tuple, offset: int) -> list | None:
    """Views of a tensor of ``src_shape`` giving the view (``shape``, ``stride``, ``offset``) of
    its contiguous copy: a select of every source dimension no result dimension walks, a view
    that splits each walked one into the result dimensions walking it (which must cover it
    exactly), a permute into the result's order, an unsqueeze per size-1 result dimension.
    None when the view is not of that form (a slice, a step, a broadcast)."""
    cs = contiguous_strides(src_shape)
    index, rem = [], offset
    for c in cs:
        index.append(rem // c)
        rem %= c
    walks: dict[int, list] = {}
    for i, (n, s) in enumerate(zip(shape, stride)):
        if n == 1:
            continue
        j = next((j for j, (m, c) in enumerate(zip(src_shape, cs)) if m > 1 and c <= s < c * m and s % c == 0), None)
        if j is None:
            return None
        walks.setdefault(j, []).append((s // cs[j], n, i))
    # the unwalked source dimensions go, the last first (the others keep their indices)
    recipe = [["select", [j, index[j]]] if src_shape[j] > 1 else ["squeeze", [j]]
              for j in reversed(range(len(src_shape))) if j not in walks]
    split, order = [], []
    for j in sorted(walks):
        dims = sorted(walks[j], reverse=True)
        if index[j] != 0 or dims[0][0] * dims[0][1] != src_shape[j] or \
                any(a != math.prod(n for _, n, _ in dims[k + 1:]) for k, (a, _, _) in enumerate(dims)):
            return None
        split += [n for _, n, _ in dims]
        order += [i for _, _, i in dims]
    recipe.append(["view", split])
    recipe.append(["permute", sorted(range(len(order)), key=lambda k: order[k])])
    recipe += [["unsqueeze", [i]] for i, n in enumerate(shape) if n == 1]
    copy = torch.empty(src_shape, device="meta")
    got = apply_recipe(copy, recipe)
    same = tuple(got.shape) == tuple(shape) and got.storage_offset() == offset and \
        all(n == 1 or a == b for n, a, b in zip(shape, got.stride(), stride))
    return recipe if same else None


def apply_recipe(src: torch.Tensor, recipe: list) -> torch.Tensor:
    """The recipe's views of ``src`` (a tensor, meta or real)."""
    t = src
    for op, args in recipe:
        if op == "select":
            t = t.select(args[0], args[1])
        elif op == "squeeze":
            t = t.squeeze(args[0])
        elif op == "view":
            t = t.view(list(args))
        elif op == "permute":
            t = t.permute(list(args))
        else:
            t = t.unsqueeze(args[0])
    return t


def source_spec(recipe: list, src: TensorSpec) -> TensorSpec | None:
    """The layout the recipe gives on ``src``'s recorded layout (None: its views are not valid there)."""
    if src.stride is None:
        return None
    try:
        t = apply_recipe(torch.empty_strided(src.shape, src.stride, device="meta"), recipe)
    except RuntimeError:
        return None
    return TensorSpec(tuple(t.shape), src.dtype, tuple(t.stride()))


def resolve(named: dict, sources: dict | None) -> dict:
    """``named`` with each input that has a recipe taken from its source (a view of it)."""
    if not sources:
        return named
    out = dict(named)
    for t, recipe in sources.items():
        src = named.get(f"{t}_src")
        if src is not None:
            out[t] = apply_recipe(src, recipe)
    return out


def read_sources_in_place(model: ModelProgram) -> ModelProgram:
    """Lowered attention steps run by a generated kernel read their inputs through their recipes
    (see the module docstring); the copies left without readers are removed."""
    p = model.program
    if any(in_place_step(s) for s in p.steps):
        return model
    steps, values, changed = [], dict(p.values), False
    for s in p.steps:
        if isinstance(s, TacticStep) and s.chosen is not None and s.desc.get("sources") \
                and registry.lowered_family(s.chosen) in KERNEL_FAMILIES:
            s, made = _rebind(s, values)
            steps += made
            changed |= bool(made)
        steps.append(s)
    if not changed:
        return model
    return dataclasses.replace(model, program=remove_dead_steps(dataclasses.replace(p, steps=steps, values=values)))


def _rebind(s: TacticStep, values: dict) -> tuple[TacticStep, list[AtenStep]]:
    """The step with each input whose recipe gives the strides its kernel was compiled for bound
    to the recipe's views (new steps, returned), its ``<input>_src`` bindings dropped."""
    spec = AttnSpec.from_json(s.chosen["spec"])
    bind, made = dict(s.bind), []
    for t, recipe in s.desc["sources"].items():
        src = bind.pop(f"{t}_src", None)
        got = source_spec(recipe, values[src]) if src is not None else None
        want = spec.input_layouts()[t]
        if got is None or tuple(got.shape) != tuple(want[0]) or \
                any(n != 1 and a != b for n, a, b in zip(got.shape, got.stride, want[1])):
            continue
        cur = src
        for k, (op, args) in enumerate(recipe):
            out = f"{s.outputs[0]}__{t}_src{k}"
            call = {"select": ("aten.select.int", args), "squeeze": ("aten.squeeze.dims", [args]),
                    "view": ("aten.view.default", [list(args)]), "permute": ("aten.permute.default", [list(args)]),
                    "unsqueeze": ("aten.unsqueeze.default", args)}[op]
            made.append(AtenStep(call[0], [Ref(cur), *call[1]], {}, [out]))
            values[out] = source_spec(recipe[:k + 1], values[src])
            cur = out
        bind[t] = cur
    return dataclasses.replace(s, bind=bind), made


__all__ = ["copy_source", "apply_recipe", "source_spec", "resolve", "read_sources_in_place", "SOURCES"]
