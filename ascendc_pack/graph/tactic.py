"""A lowered tactic step in the graph plan (used by :mod:`ascendc_pack.graph.plan`'s planner).

A dispatcher tactic becomes ATen-style steps the planner renders as boxed calls
(:func:`tactic_plan`, :func:`plan_tactic`); a generated GEMM becomes a kernel launch with its B
packed at load (:func:`plan_gemm`), a generated convolution or attention kernel a launch too
(:func:`plan_conv_kernel`, :func:`plan_attention_kernel`).

A tactic (:class:`ascendc_pack.tactics.dispatch.Tactic`) is data: dispatcher calls by qualified name. The
planner (:mod:`ascendc_pack.graph.plan`) renders each as a boxed call like any ATen step:

* ``load``: the load-stage derivations (``mkldnn::_reorder_linear_weight``...), run once when the
  bundle is loaded (their results are static tensors of the graph state, counted in cold start;
  never stored in the bundle, since oneDNN/MKL packed layouts depend on the host's ISA);
* ``calls``: reshapes of the step's inputs to the shapes the tactic reads, the per-call ops, and
  a reshape of the result to the value the program expects.

Names: the tactic's own tensors become ``<output>#<name>`` (unique: the program's value names are).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides

from ascendc_pack.frontend.executor import resolve_op
from ascendc_pack.graph.aten import RenderError
from ascendc_pack.graph.ir import BufRole, FusedAction, PackAction, Val, ValKind
from ascendc_pack.ir.program import AtenStep, Ref, TacticStep, TensorSpec
from ascendc_pack.tactics.dispatch import Call, Dtype, MemoryFormat, Tactic
from ascendc_pack.tactics.dispatch import Ref as TRef
from ascendc_pack.tactics.families import registry


@dataclass(frozen=True)
class TacticPlan:
    """What the planner renders for one lowered tactic step (see the module docstring);
    ``values``: the recorded layout of every tensor the steps make."""

    load: tuple
    calls: tuple
    values: dict
    reshape_in: tuple = ()     # (program value, shape, name) per input read with another shape
    reshape_out: tuple = ()    # (result, shape) when the result has another shape than the value


def op_name(qualified: str) -> str:
    """``"mkldnn::_linear_pointwise.binary"`` -> ``"mkldnn._linear_pointwise.binary"``
    (the program's spelling; the default overload is ``default``)."""
    ns, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    return f"{ns}.{name}.{overload or 'default'}"


def tactic_plan(step: TacticStep, program_values: dict) -> TacticPlan:
    """The load-time and per-call steps of a lowered tactic step (``program_values``: the specs
    of the program's values)."""
    out_spec = program_values[step.outputs[0]]
    tactic = Tactic.from_json(step.chosen)
    prefix = f"{step.outputs[0]}#"
    recorded = step.values or {}
    names: dict[str, str] = {}
    values: dict[str, TensorSpec] = {}
    calls: list[AtenStep] = []
    reshape_in = []
    for t, v in step.bind.items():
        shape = step.shapes.get(t)
        if shape is not None and tuple(program_values[v].shape) != tuple(shape):
            names[t] = prefix + t
            reshape_in.append((v, tuple(shape), prefix + t))
        else:
            names[t] = v

    def convert(c: Call) -> AtenStep:
        for n in c.refs():
            names.setdefault(n, prefix + n)
        names[c.out] = prefix + c.out
        if c.out in recorded:
            values[prefix + c.out] = recorded[c.out]
        # aten::contiguous returns its input or a copy: as a "view" of a planned buffer it would be
        # made once at load (a stale copy); a clone is a copy on every call (what the relayout is)
        op = "aten.clone.default" if c.op == "aten::contiguous" else op_name(c.op)
        args = [_arg(a, names) for a in c.args]
        kwargs = {k: _arg(v, names) for k, v in c.kwargs}
        if c.index is None:
            return AtenStep(op, args, kwargs, [prefix + c.out])
        outs: list = [None] * len(resolve_op(op)._schema.returns)
        outs[c.index] = prefix + c.out
        return AtenStep(op, args, kwargs, outs, multi=True)

    load = [convert(p.call) for p in tactic.prepack if p.when == "load"]
    calls += [convert(c) for c in tactic.calls]
    result = names[tactic.output]
    spec = values.get(result)
    reshape_out = ()
    if spec is None or tuple(spec.shape) != tuple(out_spec.shape):
        reshape_out = (result, tuple(out_spec.shape))
    else:  # the last call writes the program's value itself
        last = calls[-1]
        calls[-1] = AtenStep(last.op, last.args, last.kwargs,
                             [step.outputs[0] if o == result else o for o in last.outputs], last.multi)
        values[step.outputs[0]] = spec
    return TacticPlan(tuple(load), tuple(calls), values, tuple(reshape_in), reshape_out)


@dataclass(frozen=True)
class _Values:
    """Specs by value name: the program's, plus those of a tactic step's own tensors."""

    values: dict


def plan_tactic(planner, step: TacticStep, env: dict, program, scope: str) -> list:
    """A lowered dispatcher tactic: its derivations at load, then its calls (boxed, like ATen
    steps; their results take the layouts the tactic really returns, e.g. channels_last)."""
    tp = tactic_plan(step, program.values)
    view = _Values({**program.values, **tp.values})
    actions = [a for src, shape, dst in tp.reshape_in for a in reshape(planner, env, view, src, shape, dst, scope)]
    actions += [planner.aten_load(s, env, view, scope) for s in tp.load]
    actions += [planner.aten(s, env, view, scope, recorded=tp.values) for s in tp.calls]
    if tp.reshape_out:
        actions += reshape(planner, env, view, tp.reshape_out[0], tp.reshape_out[1], step.outputs[0], scope)
    return actions


def reshape(planner, env: dict, view, src: str, shape: tuple, dst: str, scope: str) -> list:
    """``dst`` := ``src`` reshaped: a view when its layout allows one, else a view of a contiguous
    copy. Not ``aten.reshape``: it copies *or* aliases, and the planner must know which (a view of
    a planned buffer is made once at load; a copy must run on every call)."""
    v = env[src]
    acts = []
    if not _viewable(v.shape, v.stride, shape):
        acts.append(planner.aten(AtenStep("aten.clone.default", [Ref(src)], {"memory_format": torch.contiguous_format},
                                          [f"{dst}#contiguous"]), env, view, scope))
        src = f"{dst}#contiguous"
    elif v.uncertain:  # a predicted layout that allows the view: checked per call (copied if wrong)
        env[f"{dst}#checked"] = planner.checked(v, f"{scope}{dst}#checked", v.shape, v.stride, acts)
        src = f"{dst}#checked"
    acts.append(planner.aten(AtenStep("aten.view.default", [Ref(src), list(shape)], {}, [dst]), env, view, scope))
    return acts


def _viewable(shape, stride, new_shape) -> bool:
    try:
        torch.empty_strided(shape, stride, device="meta").view(new_shape)
        return True
    except RuntimeError:
        return False


def plan_gemm(planner, step: TacticStep, env: dict, program, scope: str) -> list:
    """A lowered GEMM step: its generated kernel launched like a fused kernel, B packed once at
    load by the library's ``ap_gemm_pack_b`` when the candidate reads it packed. A 1x1
    convolution's operands are read as NHWC rows (views of channels_last tensors, else one copy)
    and its output is a channels_last view of C."""
    g, out = step.chosen, step.outputs[0]
    spec, name = g["spec"], g["kernel"]
    m, n, k, dt = spec["m"], spec["n"], spec["k"], spec["dtype"]
    ref = planner.kernels.get(name)
    if ref is None:
        raise RenderError(f"no library for GEMM kernel {name} of tactic step {step.name}")
    if name not in planner.kernel_order:
        planner.kernel_order.append(name)
    index, actions, view = planner.kernel_order.index(name), [], _Values(program.values)
    conv = g.get("conv")  # a 1x1 convolution: its [N, C, H, W] operands are read as NHWC rows

    def operand(t: str, shape: tuple) -> Val:
        src = step.bind[t]
        if conv:
            nhwc = f"{out}#{t}_nhwc"
            actions.append(planner.aten(AtenStep("aten.permute.default", [Ref(src), [0, 2, 3, 1]], {}, [nhwc]),
                                        env, view, scope))
            src = nhwc
        if env[src].shape != shape:
            actions.extend(reshape(planner, env, view, src, shape, f"{out}#{t}", scope))
            src = f"{out}#{t}"
        return planner.kernel_input(name, t, env[src], (shape, contiguous_strides(shape), dt), actions)

    ins = [operand("x", (m, k))]
    w = env[step.bind["weight"]]
    held = (0, w.stride[1], w.stride[0]) if step.desc.get("weight_layout", "nk") == "nk" else (0, *w.stride)
    if w.kind is not ValKind.WEIGHT or held != tuple(spec["b_strides"]):
        raise RenderError(f"GEMM {name}: B is not the weight it was generated for ({held} != {spec['b_strides']})")
    if g["b_packed"]:
        packed = planner.new_val(f"{scope}{out} packed B (at load)", (g["packed_b_bytes"] // 4,), (1,), "float32",
                                 ValKind.DERIVED)
        actions.append(PackAction(index, w, packed, g["packed_b_bytes"]))
        w = packed
    ins.append(w)
    if spec["bias"]:
        ins.append(env[step.bind["bias"]])
    if any(op in ("add", "mul") for op in spec["epilogue"]):  # its residual input
        ins.append(operand("other", (m, n)))
    if ref.n_inputs != len(ins) or ref.n_outputs != 1:
        raise RenderError(f"GEMM {name}: library takes {ref.n_inputs} inputs, the step passes {len(ins)}")
    c = planner.new_buf(f"{scope}{out} (GEMM)", (m, n), (n, 1), dt)
    ws = planner.new_buf(f"workspace of {name}", (ref.workspace,), (1,), "uint8", BufRole.WORKSPACE) \
        if ref.workspace > 0 else None
    actions.append(FusedAction(f"{scope}{out} = {name}", index, tuple(ins), (c,), ws))
    planner.counts["fused"] += 1
    shape = tuple(program.values[out].shape)
    target = out if shape == (m, n) else f"{out}#c"
    env[target] = planner.buf_val(c, f"{scope}{out}")
    if conv:  # C is the channels_last output's rows: view them as [N, H, W, O], permute to NCHW
        nb, _, h, w_ = conv["x_shape"]
        actions.append(planner.aten(AtenStep("aten.view.default", [Ref(target), [nb, h, w_, n]], {},
                                             [f"{out}#nhwc"]), env, view, scope))
        actions.append(planner.aten(AtenStep("aten.permute.default", [Ref(f"{out}#nhwc"), [0, 3, 1, 2]], {},
                                             [out]), env, view, scope))
    elif target != out:
        actions.extend(reshape(planner, env, view, target, shape, out, scope))
    return actions


def plan_conv_kernel(planner, step: TacticStep, env: dict, program, scope: str) -> list:
    """A lowered convolution step run by a generated kernel (``tactic_convkernel``): it reads
    ``x`` and the residual in the kernel's layouts (NHWC, or NCHW for an entry step's in-place
    kernel: views, else one relayouted copy, shared when the residual is ``x``) and a weight
    packed at build, and writes the channels_last output into a planned buffer."""
    g, out = step.chosen, step.outputs[0]
    name = g["kernel"]
    ref = planner.kernels.get(name)
    if ref is None:
        raise RenderError(f"no library for kernel {name} of tactic step {step.name}")
    if name not in planner.kernel_order:
        planner.kernel_order.append(name)
    index, actions = planner.kernel_order.index(name), []
    layouts = {"x": g["spec"].get("x_layout", "nhwc"), "other": g["spec"].get("residual_layout", "nhwc")}

    def stored(t: str, shape: tuple) -> Val:
        strides = _cl_strides(shape) if layouts[t] == "nhwc" else contiguous_strides(shape)
        return planner.kernel_input(name, t, env[step.bind[t]], (shape, strides, "float32"), actions)

    x_shape, out_shape = tuple(program.values[step.bind["x"]].shape), tuple(program.values[out].shape)
    ins = [stored("x", x_shape)]
    for t in ("weight", "bias"):
        if t in step.bind:
            w = env[step.bind[t]]
            if w.kind is not ValKind.WEIGHT:
                raise RenderError(f"kernel {name}: its {t} is not a stored weight")
            ins.append(planner.kernel_input(name, t, w, (w.shape, contiguous_strides(w.shape), w.dtype), actions))
    if "other" in step.bind:
        same = step.bind["other"] == step.bind["x"] and layouts["other"] == layouts["x"]
        ins.append(ins[0] if same else stored("other", out_shape))
    if ref.n_inputs != len(ins) or ref.n_outputs != 1:
        raise RenderError(f"kernel {name}: library takes {ref.n_inputs} inputs, the step passes {len(ins)}")
    y = planner.new_buf(f"{scope}{out} ({name})", out_shape, _cl_strides(out_shape), "float32")
    ws = planner.new_buf(f"workspace of {name}", (ref.workspace,), (1,), "uint8", BufRole.WORKSPACE) \
        if ref.workspace > 0 else None
    actions.append(FusedAction(f"{scope}{out} = {name}", index, tuple(ins), (y,), ws))
    planner.counts["fused"] += 1
    env[out] = planner.buf_val(y, f"{scope}{out}")
    return actions


def plan_generic_kernel(planner, step: TacticStep, env: dict, program, scope: str) -> list:
    """A lowered step run by a generated kernel of the ``generic`` launch convention (attention,
    a family registered by a plugin): every input its family's ``input_layouts(chosen)`` names,
    read in that layout (as it arrives, else one relayouted copy; reshaped to the kernel's shape
    first), the one output written into a planned buffer as ``output_layout(chosen)`` and
    reshaped to the step's output."""
    g, out = step.chosen, step.outputs[0]
    name = g["kernel"]
    family = registry.family(g["family"])
    ref = planner.kernels.get(name)
    if ref is None:
        raise RenderError(f"no library for kernel {name} of tactic step {step.name}")
    if name not in planner.kernel_order:
        planner.kernel_order.append(name)
    index, actions, view = planner.kernel_order.index(name), [], _Values(program.values)
    ins = []
    for t, (shape, strides, dtype) in family.input_layouts(g).items():
        src = step.bind[t]
        if env[src].shape != tuple(shape):
            actions.extend(reshape(planner, env, view, src, tuple(shape), f"{out}#{t}", scope))
            src = f"{out}#{t}"
        ins.append(planner.kernel_input(name, t, env[src], (tuple(shape), tuple(strides), dtype), actions))
    if ref.n_inputs != len(ins) or ref.n_outputs != 1:
        raise RenderError(f"kernel {name}: library takes {ref.n_inputs} inputs, the step passes {len(ins)}")
    out_shape, out_strides, out_dtype = family.output_layout(g)
    out_shape = tuple(out_shape)
    y = planner.new_buf(f"{scope}{out} ({name})", out_shape, tuple(out_strides), out_dtype)
    ws = planner.new_buf(f"workspace of {name}", (ref.workspace,), (1,), "uint8", BufRole.WORKSPACE) \
        if ref.workspace > 0 else None
    actions.append(FusedAction(f"{scope}{out} = {name}", index, tuple(ins), (y,), ws))
    planner.counts["fused"] += 1
    shape = tuple(program.values[out].shape)
    target = out if shape == out_shape else f"{out}#o"
    env[target] = planner.buf_val(y, f"{scope}{out}")
    if target != out:
        actions.extend(reshape(planner, env, view, target, shape, out, scope))
    return actions


LAUNCHES = {"gemm": plan_gemm, "conv": plan_conv_kernel, "generic": plan_generic_kernel}
"""The graph's launch conventions of generated kernels, by a family's ``graph`` attribute."""


def _cl_strides(shape: tuple) -> tuple:
    return tuple(torch.empty(shape, device="meta").contiguous(memory_format=torch.channels_last).stride())


def _arg(a, names: dict):
    if isinstance(a, TRef):
        return Ref(names[a.name])
    if isinstance(a, (MemoryFormat, Dtype)):
        return getattr(torch, a.name)
    if isinstance(a, tuple):
        return [_arg(x, names) for x in a]
    return a


__all__ = ["tactic_plan", "TacticPlan", "op_name", "plan_tactic", "plan_gemm", "plan_conv_kernel",
           "plan_generic_kernel", "LAUNCHES"]
