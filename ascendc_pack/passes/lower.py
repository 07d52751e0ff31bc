"""Lower: turn a fused group's analysis into its :class:`~ascendc_pack.ir.fusion.KernelSpec`.

Each member step becomes spec nodes (loads, constants, pointwise ops, reductions); identical
nodes are one (CSE). Adjacent axes that every access walks as one are then merged, so the
generated loops index memory without div/mod.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides, is_dense, same_layout

from ascendc_pack.ir.fusion import (Analysis, ConstNode, Internal, KernelInput, KernelOutput, KernelSpec, Load, LoadNode, Node,
                        OpNode, ReduceNode)
from ascendc_pack.ir.ops import ATEN_POINTWISE, ATEN_REDUCTIONS, FLOAT_DTYPES, reduce_dims
from ascendc_pack.ir.program import AtenStep, Ref


class _Builder:
    def __init__(self, an: Analysis, values, inputs: list[str]):
        self.an = an
        self.values = values
        self.inputs = inputs
        self.nodes: list[Node] = []
        self.node_of_value: dict[str, int] = {}
        self.memo: dict = {}
        self.n_axes = len(an.axis_sizes)

    def add(self, node: Node) -> int:
        """Append ``node`` (built with ``id=len(self.nodes)``) unless an identical one exists:
        every node is a pure function of its fields (CSE)."""
        fields = node.to_json()
        del fields["id"]
        key = tuple(sorted((k, str(v)) for k, v in fields.items()))
        if key in self.memo:
            return self.memo[key]
        self.nodes.append(node)
        self.memo[key] = node.id
        return node.id

    @property
    def next_id(self) -> int:
        return len(self.nodes)

    def const(self, value, dtype) -> int:
        if isinstance(value, bool):
            return self.add(ConstNode(self.next_id, bool(value), "bool"))
        if isinstance(value, int) and dtype not in FLOAT_DTYPES:
            return self.add(ConstNode(self.next_id, value, dtype or "pyint"))
        v = float(value)
        if dtype in ("float16", "bfloat16"):  # a 16-bit constant tensor holds the rounded value
            v = float(torch.tensor(v, dtype=getattr(torch, dtype)).float())
        text = repr(v) if math.isfinite(v) else str(v)
        return self.add(ConstNode(self.next_id, text, dtype or "pyfloat"))

    def operand(self, step_index: int, pos: int) -> int:
        op = self.an.operands[(step_index, pos)]
        if isinstance(op, Internal):
            return self.node_of_value[op.value]
        strides = [0] * self.n_axes
        for d, axis in enumerate(op.axes):
            if axis is not None:
                strides[axis] = op.strides[d]
        return self.add(LoadNode(self.next_id, self.inputs.index(op.base), tuple(strides), op.offset,
                                 self.values[op.base].dtype))

    def op(self, name, args, dtype) -> int:
        return self.add(OpNode(self.next_id, name, tuple(args), dtype))

    def step(self, i: int, step: AtenStep) -> None:
        out = step.outputs[0]
        dtype = self.values[out].dtype
        pos = 0

        def arg(a):
            nonlocal pos
            if isinstance(a, Ref):
                node = self.operand(i, pos)
                pos += 1
                return node
            return self.const(a, None)

        if step.op in ATEN_REDUCTIONS:
            self.node_of_value[out] = self.reduction(i, step, dtype)
            return
        kind = ATEN_POINTWISE[step.op]
        kw = step.kwargs
        if kind == "full":
            value = step.args[1] if step.op in ("aten.full.default", "aten.full_like.default") else (
                step.args[0] if step.op == "aten.scalar_tensor.default" else
                (0 if step.op == "aten.zeros_like.default" else 1))
            self.node_of_value[out] = self.const(value, dtype)
            return
        refs = list(step.args)
        if kind == "cast":
            self.node_of_value[out] = self.op("cast", [arg(refs[0])], dtype)
            return
        if kind in ("add", "sub", "rsub"):
            a, b = arg(refs[0]), arg(refs[1])
            alpha = kw.get("alpha", refs[2] if len(refs) > 2 else 1)
            if kind == "rsub":
                a, b = b, a
            if alpha != 1:
                b = self.op("mul", [b, self.const(alpha, None)], dtype)
            self.node_of_value[out] = self.op("sub" if kind != "add" else "add", [a, b], dtype)
            return
        if kind == "div_mode":
            mode = kw.get("rounding_mode", refs[2] if len(refs) > 2 else None)
            name = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}[mode]
            self.node_of_value[out] = self.op(name, [arg(refs[0]), arg(refs[1])], dtype)
            return
        if kind == "clamp":
            x = arg(refs[0])
            lo = kw.get("min", refs[1] if len(refs) > 1 else None)
            hi = kw.get("max", refs[2] if len(refs) > 2 else None)
            if lo is not None:
                x = self.op("clamp_lo", [x, arg(lo)], dtype)
            if hi is not None:
                x = self.op("clamp_hi", [x, arg(hi)], dtype)
            if lo is None and hi is None:
                x = self.op("identity", [x], dtype)
            self.node_of_value[out] = x
            return
        args = [arg(a) for a in refs]
        self.node_of_value[out] = self.op(kind, args, dtype)

    def reduction(self, i: int, step: AtenStep, dtype: str) -> int:
        kind = ATEN_REDUCTIONS[step.op]
        src = self.operand(i, 0)
        acc_dtype = step.kwargs.get("dtype")
        if acc_dtype is not None:
            src = self.op("cast", [src], str(acc_dtype).removeprefix("torch."))
        op = self.an.operands[(i, 0)]
        shape = op.shape if isinstance(op, Load) else self.values[op.value].shape
        count = math.prod(shape[d] for d in reduce_dims(step, len(shape))) if kind == "mean" else None
        return self.add(ReduceNode(self.next_id, kind, (src,), dtype, count))


def output_layout(spec) -> tuple[int, ...]:
    """The strides a fused kernel stores value ``spec`` with: the value's own layout when it is
    dense (a permutation of a contiguous layout, e.g. channels_last after a channels_last
    convolution: what eager returns), else contiguous. The kernel then writes memory in order and
    its consumers read the layout eager would give them (docs/DESIGN.md §2.3)."""
    shape = tuple(spec.shape)
    if spec.stride is not None and is_dense(shape, spec.stride):
        return tuple(spec.stride)
    return contiguous_strides(shape)


def build_spec(an: Analysis, member_steps: list[AtenStep], inputs: list[str], values,
               layouts: dict) -> KernelSpec:
    """The (unnamed) spec of a fused kernel from its analysis (see :class:`fuse.Fuser`).

    ``layouts`` gives the strides each input is assumed to have at run time.
    """
    b = _Builder(an, values, inputs)
    for i, step in zip(an.members, member_steps):
        b.step(i, step)
    outputs = []
    for name in an.outputs:
        shape = tuple(values[name].shape)
        layout = output_layout(values[name])
        strides = [0] * b.n_axes
        for d, axis in enumerate(an.value_axes[name]):
            if axis is not None:
                strides[axis] = layout[d]
        stride = None if same_layout(shape, layout, shape, contiguous_strides(shape)) else layout
        outputs.append(KernelOutput(values[name].dtype, shape, b.node_of_value[name], tuple(strides), stride))
    return merge_axes(KernelSpec(
        axes=tuple(an.axis_sizes), reduce_axes=tuple(sorted(an.reduce_axes)),
        inputs=tuple(KernelInput(values[n].dtype, tuple(values[n].shape), tuple(layouts[n])) for n in inputs),
        outputs=tuple(outputs), nodes=tuple(b.nodes)))


def merge_axes(spec: KernelSpec) -> KernelSpec:
    """Merge adjacent axes (both kept or both reduced) that every load and store walks as one.

    Axes a and a+1 merge when each access has ``stride[a] == stride[a+1] * size[a+1]``; the
    merged loops then index memory without div/mod. A spec without axes gets one unit axis.
    """
    axes = list(spec.axes)
    reduce = set(spec.reduce_axes)
    loads = [n for n in spec.nodes if isinstance(n, LoadNode)]
    accesses = [list(n.strides) for n in loads] + [list(o.strides) for o in spec.outputs]
    if not axes:
        axes = [1]
        for acc in accesses:
            acc.append(0)
    a = 0
    while a + 1 < len(axes):
        same_kind = (a in reduce) == (a + 1 in reduce)
        if same_kind and all(acc[a] == acc[a + 1] * axes[a + 1] for acc in accesses):
            axes[a] *= axes[a + 1]
            del axes[a + 1]
            for acc in accesses:
                acc[a] = acc[a + 1]
                del acc[a + 1]
            reduce = {r if r <= a else r - 1 for r in reduce if r != a + 1}
            continue
        a += 1
    merged = iter(tuple(acc) for acc in accesses)
    nodes = tuple(replace(n, strides=next(merged)) if isinstance(n, LoadNode) else n for n in spec.nodes)
    outputs = tuple(replace(o, strides=next(merged)) for o in spec.outputs)
    return replace(spec, axes=tuple(axes), reduce_axes=tuple(sorted(reduce)), nodes=nodes, outputs=outputs)
