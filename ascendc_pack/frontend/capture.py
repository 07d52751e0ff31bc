"""Capture: ``torch.export`` a model, decompose it, and convert the graph into a Program.

Decompositions lower composite ops (layer_norm, softmax, log_softmax, gelu, silu, batch norm,
var/std, ...) into pointwise ops and reductions the fuser understands; matmul, convolution,
embedding, pooling and attention stay ATen calls. ``torch.cond`` is kept with both branches
captured as sub-programs. Parameters, buffers and constants become program inputs listed in
``ModelProgram.weights``; the tensors themselves are returned separately (never serialized as
part of the program).
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ascendc_pack_runtime.outputs import check_names, count_leaves, leaf_names, tree_from_treespec

from ascendc_pack.errors import CaptureError
from ascendc_pack.ir.program import AtenStep, CondStep, ModelProgram, Program, Ref, TensorSpec

aten = torch.ops.aten

# Composite ops lowered to pointwise + reductions (torch's own decompositions).
_LOWERED = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu, aten.silu,
    aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus, aten.elu, aten.leaky_relu,
    aten.hardtanh, aten.logsumexp, aten.rms_norm,
    aten.clamp_min, aten.clamp_max, aten.addcmul, aten.addcdiv, aten.lerp, aten.masked_fill,
    aten.glu, aten.logit, aten.xlogy, aten.square, aten.relu6, aten.threshold,
]


@dataclass
class Captured:
    """A captured model: the serializable program and the weight tensors it reads."""

    model: ModelProgram
    weights: dict[str, torch.Tensor]


def decomposition_table() -> dict:
    """torch's core-ATen table, plus our lowerings to pointwise ops and reductions."""
    from torch._decomp import get_decompositions

    table = dict(torch.export.default_decompositions())
    table.update(get_decompositions([op for op in _LOWERED if op is not None]))
    table[aten._native_batch_norm_legit_no_training.default] = _batch_norm_inference
    for op in (aten.var.correction, aten.var.dim, aten.var.default):
        table[op] = _var
    for op in (aten.var_mean.correction, aten.var_mean.dim, aten.var_mean.default):
        table[op] = _var_mean
    for op in (aten.std.correction, aten.std.dim, aten.std.default):
        table[op] = _std
    for op in (aten.std_mean.correction, aten.std_mean.dim, aten.std_mean.default):
        table[op] = _std_mean
    return table


def capture(module: torch.nn.Module, example_inputs: tuple, name: str = "model",
            output_names: list[str] | None = None, dynamic_shapes=None, sizes=None, keep_ops=()) -> Captured:
    """Export ``module`` on ``example_inputs`` and return its decomposed Program and weights.

    ``output_names`` (one per output tensor) replaces the names derived from the output
    structure (dict keys, namedtuple fields, ``output_<i>``). ``dynamic_shapes`` (torch.export's
    argument) and ``sizes`` (a function of the exported program returning the converter of its
    symbolic sizes, :func:`ascendc_pack.frontend.capture_dynamic.symbolic_sizes`) capture a
    generic plan: shapes, strides and size arguments are expressions over the dynamic dims.
    ``keep_ops``: composite ops left undecomposed (one ATen call each).

    Raises:
        CaptureError: torch.export failed, or the graph holds something we cannot represent.
    """
    module.eval()
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    ep = _export(module, tuple(example_inputs), name, dynamic_shapes)
    table = decomposition_table()
    for op in keep_ops:
        table.pop(op, None)
    try:
        ep = ep.run_decompositions(table)
    except Exception as exc:
        raise CaptureError(f"decomposing model {name!r} failed: {type(exc).__name__}: {exc}") from exc
    return _from_exported(ep, name, output_names, sizes(ep) if sizes is not None else None)


def random_ops(program: Program) -> list[str]:
    """The ATen ops of ``program`` (branches included) that draw random numbers (torch's
    ``nondeterministic_seeded`` tag: ``rrelu_with_noise``, ``bernoulli``, ``rand_like``...)."""
    from ascendc_pack.frontend.executor import resolve_op

    out = []
    for step in program.walk():
        op = getattr(step, "op", None)
        if op and op not in out and torch.Tag.nondeterministic_seeded in getattr(resolve_op(op), "tags", ()):
            out.append(op)
    return out


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)\n\s+(.+)')
_TORCH_DETAIL_CHARS = 1500


def _export(module: torch.nn.Module, example_inputs: tuple, name: str, dynamic_shapes=None) -> ExportedProgram:
    """torch.export with torch's failure noise held back: on failure torch prints the partial
    graph to stderr (~40 lines) before raising; our message leads with the fix instead."""
    noise = io.StringIO()
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(noise):
            ep = torch.export.export(module, example_inputs, strict=False, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        raise CaptureError(_export_failure(name, exc)) from exc
    finally:
        shapes_log.setLevel(level)
    sys.stderr.write(noise.getvalue())  # a successful export's warnings are the user's to see
    return ep


def _export_failure(name: str, exc: Exception) -> str:
    text = str(exc)
    frame = _USER_FRAME.search(text)
    where = f" at {Path(frame[1]).name}:{frame[2]} (`{frame[4].strip()}`)" if frame else ""
    detail = f"{type(exc).__name__}: {text.strip()}"
    if len(detail) > _TORCH_DETAIL_CHARS:
        detail = detail[:_TORCH_DETAIL_CHARS] + " ..."
    if "data-dependent" in text or "DataDependent" in type(exc).__name__:
        return (f"model {name!r} branches in Python on a tensor's value{where}, which a static graph "
                "cannot capture. Write the branch with torch.cond(pred, true_fn, false_fn, (x,)) so both "
                "sides are captured (see examples/cond_model.py), or compute the condition without "
                "reading tensor values.\n--- torch.export said ---\n" + detail.splitlines()[0])
    return (f"torch.export could not capture model {name!r}{where}. The model must be exportable with "
            f"static shapes (and, declaring dynamic dims, with those dims dynamic over their whole range)."
            f"\n--- torch.export said ---\n{detail}")


def _from_exported(ep: ExportedProgram, name: str, output_names: list[str] | None, sizes=None) -> Captured:
    sig = ep.graph_signature
    weights: dict[str, torch.Tensor] = {}
    weight_names, weight_fqns, user_inputs = [], {}, []
    for spec in sig.input_specs:
        arg_name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            user_inputs.append(arg_name)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants[spec.target]
            weights[arg_name] = t.detach()
            weight_names.append(arg_name)
            weight_fqns[arg_name] = spec.target
        else:
            raise CaptureError(f"model {name!r} has an input of kind {spec.kind.name} "
                               f"({arg_name}); only tensors, parameters and buffers are supported")
    program = _convert_graph(ep.graph_module, ep.graph_module.graph, sizes)
    mutations, user_outputs = {}, []
    for spec, out_name in zip(sig.output_specs, program.outputs):
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            mutations[spec.target] = out_name
        elif spec.kind == OutputKind.USER_OUTPUT:
            user_outputs.append(out_name)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            raise CaptureError(
                f"model {name!r} mutates buffer {spec.target!r} in forward(); a deployed model "
                "must not change its own state. Put the model in eval mode or remove the update."
            )
        else:
            raise CaptureError(f"model {name!r} has an output of kind {spec.kind.name}; not supported")
    out_tree = tree_from_treespec(ep.call_spec.out_spec)
    if count_leaves(out_tree) != len(user_outputs):
        raise CaptureError(f"model {name!r}: its output structure holds {count_leaves(out_tree)} tensors "
                           f"but the graph returns {len(user_outputs)}; return only tensors")
    if output_names is None:
        output_names = leaf_names(out_tree)
    else:
        try:
            output_names = check_names(output_names, len(user_outputs), "get_output_names()")
        except ValueError as exc:
            raise CaptureError(f"model {name!r}: {exc}") from None
    mp = ModelProgram(
        name=name, program=program, weights=weight_names, weight_fqns=weight_fqns,
        user_inputs=user_inputs, mutations=mutations, user_outputs=user_outputs,
        out_tree=out_tree, output_names=output_names,
    )
    return Captured(model=mp, weights=weights)


def _spec(val, sizes=None) -> TensorSpec:
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"graph value {val!r} is not a tensor; only static-shape tensor graphs are supported")
    if sizes is not None:  # a generic plan: sizes are expressions over the dynamic dims
        return TensorSpec(tuple(sizes(s) for s in val.shape), str(val.dtype).removeprefix("torch."),
                          tuple(sizes(s) for s in val.stride()))
    try:
        return TensorSpec(tuple(int(s) for s in val.shape), str(val.dtype).removeprefix("torch."),
                          tuple(int(s) for s in val.stride()))
    except TypeError as exc:  # symbolic sizes
        raise CaptureError("the graph has dynamic (symbolic) shapes; shapes must be static") from exc


def _convert_graph(gm: torch.fx.GraphModule, graph: torch.fx.Graph, sizes=None) -> Program:
    values: dict[str, TensorSpec] = {}
    inputs, steps, outputs = [], [], []
    multi_outputs: dict[str, list] = {}  # name of a tuple-returning node -> its output list

    def arg(a):
        if isinstance(a, torch.fx.Node) and sizes is not None and isinstance(a.meta.get("val"), torch.SymInt):
            return sizes(a.meta["val"])  # a size computed from the input shapes: its expression
        if isinstance(a, torch.fx.Node):
            if a.name in multi_outputs:
                raise CaptureError(f"tuple value {a.name} used directly; expected getitem")
            return Ref(a.name)
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        return a

    for node in graph.nodes:
        if sizes is not None and node.op == "call_function" and isinstance(node.meta.get("val"), torch.SymInt):
            continue  # sym_size / arithmetic on sizes: its users read the expression
        if node.op == "placeholder":
            inputs.append(node.name)
            values[node.name] = _spec(node.meta["val"], sizes)
        elif node.op == "get_attr":
            continue  # cond branch graph modules; read at the cond node
        elif node.op == "call_function" and node.target is operator.getitem:
            src, idx = node.args
            multi_outputs[src.name][idx] = node.name
            values[node.name] = _spec(node.meta["val"], sizes)
        elif node.op == "call_function" and node.target is torch.ops.higher_order.cond:
            pred, true_gm, false_gm, operands = node.args[:4]
            then_p = _convert_graph(getattr(gm, true_gm.target), getattr(gm, true_gm.target).graph, sizes)
            else_p = _convert_graph(getattr(gm, false_gm.target), getattr(gm, false_gm.target).graph, sizes)
            outs: list = [None] * len(node.meta["val"])
            multi_outputs[node.name] = outs
            steps.append(CondStep(pred=arg(pred), then_branch=then_p, else_branch=else_p,
                                  operands=[o.name for o in operands], outputs=outs))
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            val = node.meta.get("val")
            if val is None and not node.users:
                continue  # a check such as aten._assert_tensor_metadata (from .to()): nothing to run
            kwargs = {k: arg(v) for k, v in node.kwargs.items()}
            if isinstance(val, (tuple, list)):
                outs = [None] * len(val)
                multi_outputs[node.name] = outs
                steps.append(AtenStep(str(node.target), arg(list(node.args)), kwargs, outs, multi=True))
            else:
                values[node.name] = _spec(val, sizes)
                steps.append(AtenStep(str(node.target), arg(list(node.args)), kwargs, [node.name]))
        elif node.op == "output":
            for o in node.args[0]:
                if not isinstance(o, torch.fx.Node):
                    raise CaptureError(f"model output {o!r} is not a tensor computed by the graph")
                outputs.append(o.name)
        else:
            raise CaptureError(f"unsupported graph node {node.format_node()}: "
                               "only ATen operators and torch.cond are supported")
    for s in steps:  # cond outputs that nobody reads via getitem
        if isinstance(s, CondStep) and any(o is None for o in s.outputs):
            raise CaptureError("a torch.cond output is unused; return or use every branch output")
    return Program(inputs=inputs, steps=steps, outputs=outputs, values=values)


# --- decompositions of var/std into sum-based reductions ------------------------------------------

def _reduce_dims(x: torch.Tensor, dim) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    return sorted(d % max(x.dim(), 1) for d in dim)


def _var_mean_impl(x, dim, correction, keepdim):
    dims = _reduce_dims(x, dim)
    n = 1
    for d in dims:
        n *= x.shape[d]
    c = 1 if correction is None else correction
    xf = x if x.dtype in (torch.float32, torch.float64) else aten._to_copy.default(x, dtype=torch.float32)
    mean = aten.div.Tensor(aten.sum.dim_IntList(xf, dims, True), n)
    diff = aten.sub.Tensor(xf, mean)
    var = aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(diff, diff), dims, keepdim), max(0, n - c))
    if not keepdim:
        mean = aten.squeeze.dims(mean, dims)
    if xf is not x:
        var = aten._to_copy.default(var, dtype=x.dtype)
        mean = aten._to_copy.default(mean, dtype=x.dtype)
    return var, mean


def _var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if unbiased is not None and not isinstance(unbiased, bool):  # var.dim(x, dims, unbiased, keepdim)
        dim, unbiased = unbiased, None
    if isinstance(dim, bool):  # var.default(x, unbiased)
        unbiased, dim = dim, None
    if correction is None and unbiased is not None:
        correction = 1 if unbiased else 0
    return _var_mean_impl(x, dim, correction, keepdim)[0]


def _var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        unbiased, dim = dim, None
    if correction is None and unbiased is not None:
        correction = 1 if unbiased else 0
    return _var_mean_impl(x, dim, correction, keepdim)


def _std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return aten.sqrt.default(_var(x, dim, unbiased, keepdim, correction=correction))


def _std_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    var, mean = _var_mean(x, dim, unbiased, keepdim, correction=correction)
    return aten.sqrt.default(var), mean


def _batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """Eval-mode batch norm as pointwise ops (torch's own decomposition is not functional here)."""
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    xf = x if x.dtype in (torch.float32, torch.float64) else aten._to_copy.default(x, dtype=torch.float32)
    scale = aten.rsqrt.default(aten.add.Tensor(running_var, eps))
    if weight is not None:
        scale = aten.mul.Tensor(scale, weight)
    out = aten.mul.Tensor(aten.sub.Tensor(xf, aten.view.default(running_mean, shape)),
                          aten.view.default(scale, shape))
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias, shape))
    if xf is not x:
        out = aten._to_copy.default(out, dtype=x.dtype)
    empty = aten.empty.memory_format([0], dtype=x.dtype, device=x.device)
    return out, empty, aten.empty.memory_format([0], dtype=x.dtype, device=x.device)
