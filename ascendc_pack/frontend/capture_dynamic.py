"""Capture of a generic plan (docs/DESIGN.md §2.10): ``torch.export`` with the declared dynamic
dims, every symbolic size of the exported program an expression over those dims.

torch.export names its size symbols (``s27``, ``s31``); each declared dim is the symbol of the
input dims that carry it, renamed to the dim's name (``batch``, ``seq``:
:func:`ascendc_pack.ir.symbolic.dim_symbol`). A symbol no input carries (a size computed from
tensor data, e.g. ``nonzero``) has no value the runtime could bind, so such a model is refused.
"""

from __future__ import annotations

import torch

from ascendc_pack.errors import CaptureError
from ascendc_pack.frontend.capture import Captured, capture
from ascendc_pack.frontend.dynamic import DynamicShapes
from ascendc_pack.ir.symbolic import dim_symbol, simplify


def symbolic_sizes(decl: DynamicShapes, name: str):
    """A function of an exported program returning its converter: a ``torch.SymInt`` (or int)
    -> an int or an expression over ``decl``'s dims."""

    def of_program(ep) -> callable:
        user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        rename = {}
        for i, (arg_name, dims) in enumerate(zip(user, decl.inputs)):
            shape = placeholders[arg_name].meta["val"].shape
            for d, dim in enumerate(dims):
                if dim is None:
                    continue
                s = shape[d]
                expr = s.node.expr if isinstance(s, torch.SymInt) else None
                if expr is None or not expr.is_Symbol:
                    raise CaptureError(
                        f"model {name!r}: input {i} ({decl.input_names[i]}) dim {d} is declared dynamic ({dim}) but "
                        f"torch.export made it {s}; the model fixes that size (a reshape to a constant, a "
                        "check, ...). Remove the dim from get_dynamic_shapes() or make the model size-generic")
                rename.setdefault(expr, dim_symbol(dim))

        def convert(v):
            if not isinstance(v, torch.SymInt):
                return int(v)
            expr = v.node.expr
            unknown = expr.free_symbols - set(rename)
            if unknown:
                raise CaptureError(
                    f"model {name!r}: a size depends on {sorted(map(str, unknown))}, which no declared dynamic "
                    "dim carries (a size computed from tensor values, e.g. nonzero or a data-dependent slice); "
                    "a generic plan cannot bind it. Such a model can be built with static shapes only")
            return simplify(expr.xreplace(rename))

        return convert

    return of_program


KEEP_OPS = (torch.ops.aten.scaled_dot_product_attention.default,)
"""Composite ops a generic plan calls as one ATen op: attention runs ATen's fused kernel (the
static plans' ``flash`` dispatcher tactic), which takes any sequence length, rather than the
math decomposition (bmm, softmax, bmm) the static plans' tactic pass matches."""


def capture_symbolic(module: torch.nn.Module, example_inputs: tuple, decl: DynamicShapes, name: str = "model",
                     output_names: list[str] | None = None) -> Captured:
    """The generic plan's capture: a Program whose sizes are expressions over ``decl``'s dims."""
    return capture(module, tuple(t.clone() for t in example_inputs), name=name, output_names=output_names,
                   dynamic_shapes=decl.torch_spec(), sizes=symbolic_sizes(decl, name), keep_ops=KEEP_OPS)


def value_dims(shape) -> tuple[str | None, ...]:
    """Per dim of a captured value, the name of the dynamic dim it is exactly (None otherwise)."""
    return tuple(s.name if getattr(s, "is_Symbol", False) else None for s in shape)
