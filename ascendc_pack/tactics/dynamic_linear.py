"""oneDNN linear for the GEMMs of a generic plan (docs/DESIGN.md §2.10): a dispatcher tactic
that takes any number of rows.

A generic plan's GEMMs by a weight (``addmm(bias, x, permute(weight, [1, 0]))`` / ``mm``, what
capture leaves of ``nn.Linear``) have a row count that is an expression over the dynamic dims.
The static plans' tactic pass times candidates at one shape; here there is no shape to time, so
every such GEMM takes the ``onednn`` tactic (``tactics/dispatch/gemm.py``): the weight reordered
once at load by ``mkldnn::_reorder_linear_weight`` for a representative row count (``hint``), then
``mkldnn::_linear_pointwise`` per call, which runs any row count on that packed weight. The
lowered step is what ``tactics/lower.py`` makes of a chosen dispatcher tactic, so the graph
plans it as it plans a bucket's (``graph/tactic.py``).
"""

from __future__ import annotations

import dataclasses

from ascendc_pack.ir.program import AtenStep, ModelProgram, Ref, TacticStep, TensorSpec
from ascendc_pack.ir.symbolic import is_symbolic
from ascendc_pack.tactics.dispatch.gemm import LinearStep, onednn_supports, onednn_tactic

GEMMS = {"aten.addmm.default": 3, "aten.mm.default": 2}


def onednn_linears(model: ModelProgram, hint: int) -> tuple[ModelProgram, int]:
    """``model`` (a generic plan's Program, before fusion) with every float32 GEMM by a 2-D weight
    whose row count is dynamic lowered to oneDNN linear; and how many were. ``hint``: the row
    count the weights are reordered for (the generic example's)."""
    if not onednn_supports("float32"):
        return model, 0
    p = model.program
    producer = {o: s for s in p.steps for o in s.outputs if o is not None}
    weights = set(model.weights)
    steps, n = [], 0
    for s in p.steps:
        found = _match(s, producer, weights, p.values)
        if found is None:
            steps.append(s)
            continue
        x, w, bias = found
        k, cols = p.values[x].shape[1], p.values[w].shape[0]
        step = LinearStep(hint, k, cols, bias=bias is not None)
        tactic = onednn_tactic(step)
        load_only = dataclasses.replace(tactic, prepack=tuple(q for q in tactic.prepack if q.when == "load"))
        out = s.outputs[0]
        steps.append(TacticStep(
            name=f"linear_dynamic_k{k}n{cols}", tactic_kind="linear", desc=step.to_json(),
            bind={"x": x, "weight": w, **({"bias": bias} if bias else {})}, shapes={}, outputs=[out], steps=[s],
            chosen=load_only.to_json(),
            values={"weight_packed": TensorSpec((cols, k), "float32", None), "y": p.values[out]}))
        n += 1
    return dataclasses.replace(model, program=dataclasses.replace(p, steps=steps)), n


def _match(s, producer: dict, weights: set, values: dict):
    """``(x, weight, bias or None)`` of a GEMM by a [n, k] float32 weight with a dynamic row count."""
    if not isinstance(s, AtenStep) or s.op not in GEMMS or s.kwargs or len(s.args) != GEMMS[s.op] or s.multi:
        return None
    if not all(isinstance(a, Ref) for a in s.args):
        return None
    names = [a.name for a in s.args]
    bias, x, wt = names if len(names) == 3 else (None, *names)
    perm = producer.get(wt)
    if not (isinstance(perm, AtenStep) and perm.op == "aten.permute.default" and list(perm.args[1]) == [1, 0]
            and isinstance(perm.args[0], Ref) and perm.args[0].name in weights):
        return None
    w = perm.args[0].name
    wv, xv = values[w], values[x]
    if wv.dtype != "float32" or xv.dtype != "float32" or len(wv.shape) != 2 or len(xv.shape) != 2 \
            or not is_symbolic(xv.shape[0]) or xv.shape[1] != wv.shape[1]:
        return None
    if bias is not None and (bias not in weights or tuple(values[bias].shape) != (wv.shape[0],)
                             or values[bias].dtype != "float32"):
        return None
    return x, w, bias


__all__ = ["onednn_linears"]
