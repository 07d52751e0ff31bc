"""Apply the tactic choices to the program (after :mod:`ascendc_pack.tactics.tune`, before fusion).

* A step whose choice is the as-captured candidate (``TacticChoice.captured``) gets its ATen
  steps back, exactly as captured, so the fuser sees what it would have seen without tactics
  (the epilogue fuses as before).
* Any other choice is *lowered*: its build-stage derivations run now (BatchNorm folded into the
  weights, a ``[k, n]`` weight transposed, a channels_last weight) and their results become
  model weights; ``chosen`` keeps the load-stage derivations (oneDNN / MKL packing for this
  host's ISA, run once when the bundle is loaded) and the per-call ops; ``values`` the layouts
  its tensors had on the real inputs. Weights nothing reads any more are dropped.
* :func:`propagate_layouts` then gives every value the layout it will really have (a oneDNN
  convolution returns channels_last, and so does the pooling after it), so the fuser compiles
  kernels for those strides instead of paying a relayout; a view that cannot take the new layout
  reads one relayouted copy (the "relayout at the end" of a channels_last chain).

:class:`LoweredRunner` runs lowered steps in Python mode (the fused kernels' PGO run).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides, torch_dtype

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.frontend.executor import run_reference_tactic
from ascendc_pack.passes.fold import remove_dead_steps
from ascendc_pack.passes.meta_layouts import meta_layouts
from ascendc_pack.ir.program import AtenStep, CondStep, ModelProgram, Program, Ref, TacticStep, TensorSpec
from ascendc_pack.tactics.families import registry
from ascendc_pack.tactics.families.base import from_lowered
from ascendc_pack.tactics.families.registry import lowered_family
from ascendc_pack.tactics.lower_casts import cancel_round_trips, fold_requantize, split_casts
from ascendc_pack.tactics.rewrite import Constants, WeightSink, rewrite_cond


@dataclass(frozen=True)
class LoweringResult:
    """The program with the choices applied, its weights, and how many steps got a tactic."""

    model: ModelProgram
    weights: dict
    lowered: int
    inlined: int


def lower_tactics(model: ModelProgram, weights: dict[str, torch.Tensor], decisions: dict[int, int],
                  choices: dict) -> LoweringResult:
    """Apply ``decisions`` (candidate index by ``id(step)``; missing: the as-captured one) using the
    candidates and recorded layouts of ``choices`` (:class:`~ascendc_pack.tactics.tune.TacticChoice`
    by step name). Neither argument is modified."""
    sink = WeightSink(model, weights)
    low = _Lowerer(sink, decisions, choices)
    top = set(model.weights)
    program, _ = low.program(model.program, lambda n: (lambda: sink.tensors[n]) if n in top else None, "")
    if low.lowered:
        program = fold_requantize(remove_dead_steps(cancel_round_trips(program)))
    read = _reads(program)
    keep = [w for w in sink.order if w in read]
    program.inputs = keep + list(model.user_inputs)
    for w in sink.order:
        if w not in read:
            program.values.pop(w, None)
        else:
            program.values[w] = sink.specs[w]
    out = dataclasses.replace(model, program=program, weights=keep,
                              weight_fqns={w: sink.fqns.get(w, w) for w in keep})
    return LoweringResult(out, {w: sink.tensors[w] for w in keep}, low.lowered, low.inlined)


class _Lowerer:
    def __init__(self, sink: WeightSink, decisions: dict, choices: dict):
        self.sink, self.decisions, self.choices = sink, decisions, choices
        self.lowered = self.inlined = 0
        self.conds = 0

    def program(self, p: Program, outer, scope: str) -> tuple[Program, list[str]]:
        consts = Constants(p, outer)
        steps, needs, values = [], [], dict(p.values)
        for s in p.steps:
            if isinstance(s, TacticStep):
                ch = self.choices[s.name]
                index = self.decisions.get(id(s), ch.captured)
                if index != ch.captured and ch.results[index].values is None:
                    index = ch.captured  # never run: its layouts are unknown, keep it as captured
                if index == ch.captured:
                    self.inlined += 1
                    steps.extend(s.steps)
                    continue
                self.lowered += 1
                steps.extend(split_casts(self.lower(s, index, consts, scope, needs, values), scope, values))
            elif isinstance(s, CondStep):
                steps.append(rewrite_cond(self, s, consts, scope, needs, values))
            else:
                steps.append(s)
        return Program(list(p.inputs), steps, list(p.outputs), values), needs

    def lower(self, s: TacticStep, index: int, consts: Constants, scope: str, needs: list, values: dict) -> TacticStep:
        ch = self.choices[s.name]
        tactic = ch.candidates[index]
        recorded = ch.results[index].values or {}

        def stored(n: str, tensor) -> str:
            """A weight the lowered step reads: the model's own, or a new one made now."""
            if n in s.bind and s.bind[n] in consts.inputs and tensor is None:
                return s.bind[n]
            t = (consts.tensor(s.bind[n]) if tensor is None else tensor).detach()
            if t.layout != torch.strided or not t.is_contiguous(memory_format=_format_of(t)):
                t = t.contiguous()
            name = self.sink.add(f"{scope}{s.outputs[0]}__{n}", t.clone(memory_format=_format_of(t)),
                                 f"<{n} of tactic {tactic.name} at {s.outputs[0]}>")
            values[name] = self.sink.specs[name]
            if scope:
                needs.append(name)
            return name

        how = tactic.impl.stored_weights(tactic) if tactic.family != registry.DISPATCH else None
        if how == "made":  # the weights the kernel reads (e.g. a BatchNorm folded, packed), made now
            weights = {t: consts.tensor(v) for t, v in s.bind.items() if t in T.WEIGHTS}
            made = tactic.kernel_weights(weights)  # BatchNorm folded; [O, C] or packed
            bind = {n: v for n, v in s.bind.items() if n not in T.WEIGHTS}
            bind.update({n: stored(n, t) for n, t in made.items()})
            shapes = {n: v for n, v in s.shapes.items() if n not in T.WEIGHTS}
            shapes["weight"] = tuple(made["weight"].shape)
            return dataclasses.replace(s, bind=bind, shapes=shapes, chosen=tactic.lowered(), values=dict(recorded))
        if how == "none":  # reads the step's activations as bound
            return dataclasses.replace(s, chosen=tactic.lowered(), values=dict(recorded))
        if how == "bound":  # e.g. a GEMM's B (packed at load) and bias: the weights as bound
            bind = {n: (stored(n, None) if n in T.WEIGHTS else v) for n, v in s.bind.items()}
            return dataclasses.replace(s, bind=bind, chosen=tactic.lowered(), values=dict(recorded))
        weights = {t: consts.tensor(v) for t, v in s.bind.items() if t in T.WEIGHTS and v in consts}
        built = T.prepare(tactic, weights, stage="build")
        bind = {n: stored(n, None if n in s.bind else built[n]) for n in T.stored_weights(tactic)}
        read = set().union(*(c.refs() for c in [p.call for p in tactic.prepack if p.when == "load"] + list(tactic.calls)))
        for n in tactic.inputs:
            if n not in T.WEIGHTS and n in read:
                bind[n] = s.bind[n]
        load_only = dataclasses.replace(tactic, prepack=tuple(p for p in tactic.prepack if p.when == "load"))
        return dataclasses.replace(s, bind=bind, chosen=load_only.to_json(), values=dict(recorded))


def _format_of(t: torch.Tensor):
    if t.layout == torch.strided and t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) \
            and not t.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def _reads(p: Program) -> set[str]:
    out = set(p.outputs)
    for s in p.steps:
        out.update(s.input_names())
        if isinstance(s, CondStep):
            out.update(s.operands)
    return out


# ----------------------------------------------------------------------------- layouts


def propagate_layouts(model: ModelProgram) -> ModelProgram:
    """Values downstream of lowered tactic steps get the layouts they will really have (see the
    module docstring); a step that cannot take a new layout reads a relayouted copy."""
    return dataclasses.replace(model, program=_propagate(model.program))


def _layout_of(values: dict, name: str) -> tuple:
    spec = values[name]
    return spec.shape, spec.stride or contiguous_strides(spec.shape), spec.dtype


def _propagate(p: Program) -> Program:
    values = dict(p.values)
    changed: set[str] = set()
    steps = []
    relayouts: dict[str, str] = {}
    for s in p.steps:
        if isinstance(s, TacticStep) and s.chosen is not None:
            out = s.outputs[0]
            spec = _output_spec(s, values[out])
            if spec != values[out]:
                values[out] = spec
                changed.add(out)
            steps.append(s)
            continue
        touched = [n for n in s.input_names() if n in changed]
        if not touched:
            steps.append(s)
            continue
        if isinstance(s, AtenStep):
            metas = meta_layouts(s, lambda n: _layout_of(values, n))
            if metas is None:  # e.g. a view the new layout does not allow: read relayouted copies
                s = _rewire(s, {n: _relayout(n, values, relayouts, steps) for n in touched})
                metas = meta_layouts(s, lambda n: _layout_of(values, n))
            for o, meta in zip(s.outputs, metas or []):
                if o is None or meta is None:
                    continue
                spec = TensorSpec(tuple(meta[0]), meta[2], tuple(meta[1]))
                if spec != values[o]:
                    values[o] = spec
                    changed.add(o)
            steps.append(s)
        elif isinstance(s, CondStep):  # branches keep the layouts they were captured with
            operands = [_relayout(n, values, relayouts, steps) if n in changed else n for n in s.operands]
            steps.append(dataclasses.replace(s, operands=operands))
        else:
            steps.append(s)
    return Program(list(p.inputs), [_propagate_branches(s) for s in steps], list(p.outputs), values)


def _propagate_branches(s):
    if isinstance(s, CondStep):
        return dataclasses.replace(s, then_branch=_propagate(s.then_branch), else_branch=_propagate(s.else_branch))
    return s


def _output_spec(s: TacticStep, captured: TensorSpec) -> TensorSpec:
    """The layout of a lowered step's output: its tactic's result (recorded), reshaped as the
    captured value (a reshape that cannot be a view copies: contiguous)."""
    output = "out" if lowered_family(s.chosen) != registry.DISPATCH else T.Tactic.from_json(s.chosen).output  # a generated kernel's
    res = (s.values or {}).get(output)
    if res is None or res.stride is None:
        return captured
    t = torch.empty_strided(res.shape, res.stride, dtype=torch_dtype(res.dtype), device="meta")
    if tuple(res.shape) != tuple(captured.shape):
        t = t.reshape(captured.shape)
    return TensorSpec(tuple(t.shape), captured.dtype, tuple(t.stride()))


def _relayout(name: str, values: dict, memo: dict, steps: list) -> str:
    """A contiguous copy of ``name`` (made once, by a step appended to ``steps``)."""
    if name not in memo:
        new = f"{name}__relayout"
        steps.append(AtenStep("aten.clone.default", [Ref(name)], {"memory_format": torch.contiguous_format}, [new]))
        shape = values[name].shape
        values[new] = TensorSpec(tuple(shape), values[name].dtype, contiguous_strides(shape))
        memo[name] = new
    return memo[name]


def _rewire(s: AtenStep, names: dict[str, str]) -> AtenStep:
    def sub(a):
        if isinstance(a, Ref):
            return Ref(names.get(a.name, a.name))
        if isinstance(a, list):
            return [sub(x) for x in a]
        return a

    return dataclasses.replace(s, args=sub(s.args), kwargs={k: sub(v) for k, v in s.kwargs.items()})


# ----------------------------------------------------------------------------- Python mode


class LoweredRunner:
    """Runs lowered tactic steps in Python (their load-stage weights made once per step);
    steps not lowered run as their reference ATen steps."""

    def __init__(self, model: ModelProgram):
        self.shapes: dict[int, tuple] = {}
        self._index(model.program)
        self._ready: dict[int, tuple] = {}

    def _index(self, p: Program) -> None:
        for s in p.steps:
            if isinstance(s, TacticStep):
                self.shapes[id(s)] = tuple(p.values[s.outputs[0]].shape)
            elif isinstance(s, CondStep):
                self._index(s.then_branch)
                self._index(s.else_branch)

    def __call__(self, step: TacticStep, env: dict) -> torch.Tensor:
        if step.chosen is None:
            return run_reference_tactic(step, env)
        named = {t: _shaped(env[v], step.shapes.get(t)) for t, v in step.bind.items()}
        ready = self._ready.get(id(step))
        shape = self.shapes[id(step)]
        if lowered_family(step.chosen) != registry.DISPATCH:  # a generated kernel
            if ready is None:
                tactic = from_lowered(step.chosen)
                ready = self._ready[id(step)] = (tactic.impl.lowered_runner(tactic, named),)
            out = ready[0](named)
            return out if tuple(out.shape) == shape else out.reshape(shape)
        if ready is None:
            tactic = T.Tactic.from_json(step.chosen)
            static = {n: t for n, t in named.items() if n in T.WEIGHTS or n not in tactic.inputs}
            ready = (tactic, T.bind(tactic.calls), T.prepare(tactic, static))
            self._ready[id(step)] = ready
        tactic, calls, prepared = ready
        acts = {n: t for n, t in named.items() if n in tactic.inputs and n not in T.WEIGHTS}
        with torch.no_grad():
            out = T.execute(calls, {**prepared, **acts})[tactic.output]
        return out if tuple(out.shape) == shape else out.reshape(shape)


def _shaped(t: torch.Tensor, shape) -> torch.Tensor:
    return t if shape is None or tuple(t.shape) == tuple(shape) else t.reshape(shape)


__all__ = ["lower_tactics", "LoweringResult", "propagate_layouts", "LoweredRunner"]
