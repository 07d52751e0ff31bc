"""Tactic pass: the heavy steps of a captured Program become :class:`~ascendc_pack.ir.program.TacticStep`s.

Runs on the captured (constant-folded) program, before fusion. :mod:`ascendc_pack.tactics.match`
finds each GEMM by a constant weight, convolution and attention with the pointwise ops that
follow it (bias, BatchNorm affine, residual, activation); this module replaces those steps by
one TacticStep each, whose candidates (:func:`candidates_for`, from :mod:`ascendc_pack.tactics.dispatch`)
PGO times (:mod:`ascendc_pack.tactics.tune`). A BatchNorm affine ``(y - mean) * s + b`` becomes
two new per-channel weights ``scale = s`` and ``shift = b - mean * s`` (what the tactics fold
into the convolution's weights at build).

**Layouts are chosen for chains.** Convolutions connected through their input or residual
(directly or through pooling, which keeps a layout) form a chain. Its layout is one decision
between two configurations, timed as a unit (the sum over its steps of each step's PGO median in
that configuration, :mod:`ascendc_pack.tactics.tune`):

* *as captured*: every step is candidate 0 (ATen, NCHW in and out);
* *channels_last*: the chain's entry steps take the captured NCHW input (oneDNN reads it as is,
  the other candidates relayout it once) and every step returns channels_last, so the interior
  steps get channels_last input (their candidates relayout nothing); the consumers after the
  chain read channels_last (the planner and the fused kernels follow the real layout; a view
  that cannot is given one relayout, :mod:`ascendc_pack.tactics.lower`).

The step's ``desc`` records its ``position`` in the chain (``entry``/``interior``) and the layout
its residual arrives in, so identical steps at the same position share a name and a measurement.
Why not per-step layouts: a step that alone is faster in NCHW but whose neighbours run
channels_last would pay two relayouts (bench: ``onednn`` NCHW fed channels_last input pays a
relayout per step), and a per-step greedy choice cannot see that.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass

import torch

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.cache import stable_hash
from ascendc_pack.passes.fold import is_foldable
from ascendc_pack.ir.program import AtenStep, CondStep, ModelProgram, Program, TacticStep, TensorSpec
from ascendc_pack.tactics.match import Match, Matcher
from ascendc_pack.tactics.match_attention import split_key_permutes

log = logging.getLogger("ascendc_pack")

CL = "channels_last"
# ops whose output keeps its (first) input's memory format, so a chain continues through them:
# pooling and the pointwise ops between convolutions (activations, a squeeze-excitation's scaling
# `x * gate`, residual sums). A pointwise op whose other operand imposes another layout only costs
# speed: every candidate takes either layout (docs/TACTICS.md)
LAYOUT_KEEPING = {"aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.avg_pool2d.default",
                  "aten.clone.default"} | {f"aten.{op}" for op in (
                      "relu.default", "relu6.default", "hardtanh.default", "clamp.default", "clamp_min.default",
                      "clamp_max.default", "hardswish.default", "hardsigmoid.default", "sigmoid.default",
                      "silu.default", "gelu.default", "tanh.default", "add.Tensor", "sub.Tensor", "mul.Tensor",
                      "div.Tensor", "mul.Scalar", "div.Scalar", "add.Scalar")}


@dataclass(frozen=True)
class TacticPassResult:
    """The model with its TacticSteps, its weights (plus the ones the pass made) and a count."""

    model: ModelProgram
    weights: dict
    found: int


class WeightSink:
    """The model's weights and the ones added after capture (BatchNorm affines here, derived
    weights at lowering), each named once for the whole model and passed into the cond branches
    that read it (:func:`thread_weights`)."""

    def __init__(self, model: ModelProgram, weights: dict):
        self.tensors = dict(weights)
        self.order = list(model.weights)
        self.fqns = dict(model.weight_fqns)
        self.specs = {n: model.program.values[n] for n in model.weights}

    def add(self, name: str, tensor: torch.Tensor, fqn: str) -> str:
        if name in self.tensors:
            raise ValueError(f"internal error: weight {name!r} made twice")
        self.tensors[name] = tensor
        self.order.append(name)
        self.fqns[name] = fqn
        self.specs[name] = TensorSpec.of(tensor)
        return name


class Constants:
    """Which values of one program never change (weights, deterministic steps over them), and
    their tensors; ``outer`` resolves the program's inputs (None: not constant)."""

    def __init__(self, program: Program, outer):
        self.p = program
        self.outer = outer
        self.producer: dict[str, AtenStep] = {}
        self.inputs = {n for n in program.inputs if outer(n) is not None}
        known = set(self.inputs)
        for s in program.steps:
            if isinstance(s, AtenStep) and all(n in known for n in s.input_names()) and is_foldable(s):
                for o in s.outputs:
                    known.add(o)
                    self.producer[o] = s
        self.known = known
        self._memo: dict[str, torch.Tensor] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.known

    def tensor(self, name: str) -> torch.Tensor:
        """The value of constant ``name`` (its producers run once, in program order)."""
        from ascendc_pack.frontend.executor import run_aten

        if name in self._memo:
            return self._memo[name]
        if name in self.inputs:
            return self.outer(name)()
        step = self.producer[name]
        env = {n: self.tensor(n) for n in step.input_names()}
        with torch.no_grad():
            run_aten(step, env)
        for o in step.outputs:
            self._memo[o] = env[o]
        return self._memo[name]


def find_tactics(model: ModelProgram, weights: dict[str, torch.Tensor]) -> TacticPassResult:
    """Replace the heavy steps of ``model`` (cond branches included) by TacticSteps; neither
    argument is modified."""
    sink = WeightSink(model, weights)
    state = _State(sink)
    top_inputs = set(model.weights)
    program, _ = state.program(model.program, lambda n: (lambda: sink.tensors[n]) if n in top_inputs else None,
                               "", top=True)
    program.inputs = sink.order + list(model.user_inputs)
    program.values.update(sink.specs)
    out = dataclasses.replace(model, program=program, weights=list(sink.order), weight_fqns=dict(sink.fqns))
    if state.found:
        log.info("tactic pass: %d heavy steps have tactics (%d distinct)", state.found, len(state.names))
    return TacticPassResult(out, dict(sink.tensors), state.found)


class _State:
    def __init__(self, sink: WeightSink):
        self.sink = sink
        self.found = 0
        self.names: set[str] = set()
        self.chains = 0
        self.conds = 0

    def program(self, p: Program, outer, scope: str, top: bool = False) -> tuple[Program, list[str]]:
        """``p`` with its matches replaced; also the model weights it now reads that are not its
        own inputs (added by the pass: the caller passes them in)."""
        p = split_key_permutes(p)
        consts = Constants(p, outer)
        matches = Matcher(p, consts.__contains__).run()
        needs: list[str] = []
        at_end: dict[int, TacticStep] = {}
        replaced: set[int] = set()
        for m in matches:
            ts = self.tactic_step(p, m, consts, scope, needs)
            if ts is None:
                continue
            at_end[max(m.steps)] = ts
            replaced.update(m.steps)
        steps, values = [], dict(p.values)
        for i, s in enumerate(p.steps):
            if i in at_end:
                steps.append(at_end[i])
            elif i in replaced:
                continue
            elif isinstance(s, CondStep):
                steps.append(self.cond(s, consts, scope, needs, values))
            else:
                steps.append(s)
        new = Program(list(p.inputs), steps, list(p.outputs), values)
        for ts in at_end.values():  # the weights the pass made
            new.values.update({n: self.sink.specs[n] for n in ts.bind.values() if n not in new.values})
        _assign_chains(new, self)
        for s in new.steps:
            if isinstance(s, TacticStep):
                s.name = step_name(new, s)
                self.names.add(s.name)
        if not top:
            for n in needs:
                new.values[n] = self.sink.specs[n]
        return new, needs

    def cond(self, s: CondStep, consts: Constants, scope: str, needs: list[str], values: dict) -> CondStep:
        return rewrite_cond(self, s, consts, scope, needs, values)

    def tactic_step(self, p: Program, m: Match, consts: Constants, scope: str, needs: list[str]) -> TacticStep | None:
        try:
            step = _description(m)
        except (ValueError, TypeError) as e:  # a shape the tactics do not describe
            log.debug("tactic pass: %s at %s not described (%s)", m.kind, m.output, e)
            return None
        bind = dict(m.bind)
        if m.kind == "attention":
            step = _causal(step, bind, consts)
            if "mask_bias" in bind:  # a shifted window's mask + the position bias: one constant mask
                shape = tuple(step.mask_shape)
                mask = consts.tensor(bind["mask"]).reshape(shape[0], -1, *shape[2:]) + \
                    consts.tensor(bind.pop("mask_bias")).reshape(1, *shape[1:])
                bind["mask"] = self.sink.add(f"{scope}{m.output}__mask", mask.contiguous(),
                                             f"<the window mask plus the position bias of {m.output}>")
                if scope:
                    needs.append(bind["mask"])
        if m.affine is not None:
            mean, scale, bias = (consts.tensor(n).reshape(-1) if n else None for n in m.affine)
            shift = -mean * scale if bias is None else bias - mean * scale
            for name, t in (("scale", scale), ("shift", shift)):
                w = self.sink.add(f"{scope}{m.output}__{name}", t.detach().clone().contiguous(),
                                  f"<{name} of the BatchNorm after {m.output}>")
                bind[name] = w
                if scope:
                    needs.append(w)
        self.found += 1
        desc = json.loads(json.dumps(step.to_json()))
        if m.fields.get("sources"):  # q/k/v a generated kernel reads through their copy (attention_sources)
            desc["sources"] = m.fields["sources"]
        return TacticStep(name="", tactic_kind=m.kind, desc=desc, bind=bind,
                          shapes={k: tuple(v) for k, v in step.shapes().items()}, outputs=[m.output],
                          steps=[p.steps[i] for i in m.steps])


def _causal(step, bind: dict, consts: Constants):
    """An attention step whose mask is a constant causal one (``tril(ones(L, S))`` as a boolean
    mask, or 0 / -inf as an additive one, broadcast over batch and heads) as ``causal=True``
    without a mask (``bind`` loses it): flash attention and the generated kernel then skip the
    masked half instead of reading a mask. Anything else is returned as it is."""
    name = bind.get("mask")
    if step.mask is None or step.mask_windows or name is None or name not in consts:
        return step
    L, S = step.q_len, step.kv_len
    shape = tuple(step.mask_shape or ())
    if len(shape) < 2 or shape[-2:] != (L, S) or any(d != 1 for d in shape[:-2]):
        return step
    t = consts.tensor(name).reshape(L, S)
    keep = torch.ones(L, S, dtype=torch.bool).tril()
    causal = torch.equal(t, keep) if step.mask == "bool" else \
        torch.equal(t, torch.zeros(L, S, dtype=t.dtype).masked_fill(~keep, float("-inf")))
    if not causal:
        return step
    del bind["mask"]
    return dataclasses.replace(step, mask=None, mask_shape=None, causal=True)


def _description(m: Match):
    epi = T.Epilogue(**m.epilogue)
    cls = {"linear": T.LinearStep, "conv": T.ConvStep, "attention": T.AttentionStep, "pool": T.PoolStep}[m.kind]
    kw = {k: v for k, v in m.fields.items() if k != "sources"}
    if m.kind in ("linear", "conv"):
        kw["epilogue"] = epi
    return cls(**kw)


def thread_weights(then_b: Program, else_b: Program, names: list[str], sink: WeightSink) -> tuple[Program, Program]:
    """Both branches take the model weights ``names`` as extra inputs (after their own; a
    branch that does not read one ignores it): cond branches see only their operands."""
    out = []
    for br in (then_b, else_b):
        new_inputs = [n for n in names if n not in br.inputs]
        values = dict(br.values)
        values.update({n: sink.specs[n] for n in new_inputs})
        out.append(dataclasses.replace(br, inputs=list(br.inputs) + new_inputs, values=values))
    return out[0], out[1]


def rewrite_cond(rewriter, s: CondStep, consts: Constants, scope: str, needs: list[str], values: dict) -> CondStep:
    """``s`` with both branches rewritten by ``rewriter.program(branch, outer, scope)`` (the tactic
    pass and the lowering share this). The weights a branch now needs become extra operands of the
    step, threaded through both branches, and are added to ``needs`` and ``values``."""
    rewriter.conds += 1
    branches, extra = [], []
    for tag, br in (("then", s.then_branch), ("else", s.else_branch)):
        by_input = dict(zip(br.inputs, s.operands))

        def outer(n, by_input=by_input):
            o = by_input.get(n)
            return (lambda: consts.tensor(o)) if o is not None and o in consts else None

        nb, bneeds = rewriter.program(br, outer, f"{scope}cond{rewriter.conds}_{tag}__")
        branches.append(nb)
        extra += [n for n in bneeds if n not in extra]
    then_b, else_b = thread_weights(branches[0], branches[1], extra, rewriter.sink)
    needs += [n for n in extra if n not in needs]
    values.update({n: rewriter.sink.specs[n] for n in extra})
    operands = list(s.operands) + [n for n in extra if n not in s.operands]
    return CondStep(s.pred, then_b, else_b, operands, list(s.outputs))


def _source(p: Program, producers: dict, name: str):
    """The TacticStep computing ``name``, through steps that keep its layout (pooling, a max-pooling
    step included), or None."""
    seen = 0
    while seen < 16:
        s = producers.get(name)
        if isinstance(s, TacticStep) and s.tactic_kind == "pool":
            name = s.bind["x"]
            seen += 1
            continue
        if isinstance(s, TacticStep):
            return s
        if not isinstance(s, AtenStep) or s.op not in LAYOUT_KEEPING or not s.input_names():
            return None
        if s.multi and s.outputs[0] != name:
            return None
        name = s.input_names()[0]
        seen += 1
    return None


def _assign_chains(p: Program, state: _State) -> None:
    """Chain ids, positions and residual layouts of the program's convolution steps; the position
    of its max-pooling steps (``interior``: their input comes from a convolution)."""
    producers = {o: s for s in p.steps for o in s.outputs if o}
    for s in p.steps:
        if isinstance(s, TacticStep) and s.tactic_kind == "pool":
            src = _source(p, producers, s.bind["x"])
            s.desc["position"] = "interior" if src is not None and src.tactic_kind == "conv" else "entry"
    convs = [s for s in p.steps if isinstance(s, TacticStep) and s.tactic_kind == "conv"]
    parent = {id(s): id(s) for s in convs}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for s in convs:
        for role in ("x", "other"):
            if role not in s.bind:
                continue
            src = _source(p, producers, s.bind[role])
            inside = src is not None and src.tactic_kind == "conv"
            if role == "x":
                s.desc["position"] = "interior" if inside else "entry"
            else:
                s.desc["other_layout"] = CL if inside else s.desc["layout"]
            if inside:
                parent[find(id(s))] = find(id(src))
    roots: dict[int, int] = {}
    for s in convs:
        r = find(id(s))
        if r not in roots:
            state.chains += 1
            roots[r] = state.chains
        s.chain = roots[r]


def step_name(p: Program, s: TacticStep) -> str:
    """``<kind>_<shape label>_<digest>``: the digest covers the description (chain position
    included) and every bound tensor's shape, strides and dtype, so steps with one name have one
    candidate set and one set of timings."""
    io = {k: p.values[v].to_json() for k, v in sorted(s.bind.items())}
    io["out"] = p.values[s.outputs[0]].to_json()
    digest = stable_hash(json.dumps({"desc": s.desc, "io": io, "shapes": {k: list(v) for k, v in s.shapes.items()}},
                                    sort_keys=True))[:12]
    d = s.desc
    if s.tactic_kind == "linear":
        label = f"m{d['m']}k{d['k']}n{d['n']}"
    elif s.tactic_kind == "conv":
        label = f"c{d['x_shape'][1]}o{d['out_channels']}k{'x'.join(map(str, d['kernel']))}"
    elif s.tactic_kind == "pool":
        label = f"c{d['x_shape'][1]}k{'x'.join(map(str, d['kernel']))}s{'x'.join(map(str, d['stride']))}"
    else:
        label = f"h{d['heads']}l{d['q_len']}s{d['kv_len']}"
    return f"{s.tactic_kind}_{label}_{digest}"


#: the names of the candidate that is the step as captured (ATen), per kind
CAPTURED = {"linear": "aten", "conv": "aten", "attention": "unfused", "pool": "aten"}


def is_captured(t) -> bool:
    """Whether ``t`` is its step's as-captured candidate (the ATen steps, the fallback)."""
    return t.family == "dispatch" and t.name == CAPTURED.get(t.kind)


def candidates_for(s: TacticStep, topn: int, target=None, precisions: tuple[str, ...] = (),
                   x_range: tuple[float, float] | None = None) -> list[T.Tactic]:
    """The candidates of a tactic step, at most ``topn`` plus the as-captured one.

    A convolution inside a chain gets the channels_last candidates that read channels_last input
    as is (``onednn_cl``, ``aten_cl``); an entry step also ``onednn``, which reads NCHW and
    returns channels_last. With a ``target`` (:class:`~ascendc_pack.kernels.target.CpuTarget`) the
    candidates are ordered by the cost model's prediction (:mod:`ascendc_pack.tactics.predict`),
    so candidate 0 is the predicted best and a small ``--topn`` keeps the likely winners; without
    one, the as-captured candidate comes first, then the expected merit. The as-captured candidate
    is always there (appended when the cap cut it): it is the fallback of a candidate that fails
    verification (docs/TACTICS.md "Candidate order"). ``precisions`` (``("bf16",)``) adds the
    low-precision candidates of those precisions after them (:mod:`ascendc_pack.tactics.dispatch.lowp`;
    a convolution's: those of its chain position), at most ``topn`` each; int8 ones need
    ``x_range``, the step's input range on the calibration inputs."""
    from ascendc_pack.tactics.dispatch.lowp import low_precision_tactics

    step = T.step_from_json(s.desc)
    low: list[T.Tactic] = []
    if s.tactic_kind == "conv":
        if s.desc.get("position") == "interior":
            inner = dataclasses.replace(step, layout=CL)
            by_name = {t.name: t for t in T.candidates(inner)}
            order = ["onednn_cl", "aten_cl"]
            low = [t for t in low_precision_tactics(inner, precisions, x_range)
                   if t.name in ("onednn_cl_bf16", "onednn_int8")]
        else:
            by_name = {t.name: t for t in T.candidates(step)}
            order = ["onednn", "onednn_cl", "aten_cl"]
            low = low_precision_tactics(step, precisions, x_range)
        cands = [T.candidates(step)[0]] + [by_name[n] for n in order if n in by_name]
    else:
        cands = T.candidates(step)
        low = low_precision_tactics(step, precisions, x_range)
    low = [t for t in low if not T.unreachable_ops(t)]
    if target is not None:
        from ascendc_pack.tactics.predict import by_prediction

        cands = [t for _, t in by_prediction(s.tactic_kind, s.desc, cands, target)]
        low = [t for _, t in by_prediction(s.tactic_kind, s.desc, low, target)]
    kept = cands[:max(1, topn)]
    kept += [t for t in cands[len(kept):] if is_captured(t)]
    by_precision: dict[str, list[T.Tactic]] = {}
    for t in low:
        by_precision.setdefault(t.param("precision"), []).append(t)
    return kept + [t for ts in by_precision.values() for t in ts[:max(1, topn)]]


def in_layout_chain(t: T.Tactic) -> bool:
    """A convolution candidate of the channels_last configuration (it returns channels_last)."""
    return t.kind == "conv" and t.param("out_layout") == CL


__all__ = ["find_tactics", "TacticPassResult", "WeightSink", "Constants", "candidates_for", "step_name", "CAPTURED",
           "is_captured",
           "thread_weights", "rewrite_cond", "in_layout_chain", "LAYOUT_KEEPING"]
