"""What the npu generator can express: a fused kernel spec as rows x a contiguous inner range.

An AscendC Vector kernel moves data between Global Memory (GM) and the Unified Buffer (UB) with
``DataCopy``/``DataCopyPad``: runs of contiguous elements (one run per copy here). So the npu
generator sees a kernel's iteration space as ``rows x subrows x cols``: ``cols`` is the size of
the *contiguous* axis (the last reduce axis, or the last axis of a pointwise kernel) that every
access walks with stride 1; ``subrows`` flattens the other reduce axes (any strides: a row's
reduction loops over them); ``rows`` flattens the remaining (*outer*) axes. The inner range of
a row is ``subrows x cols``. Each access (a load, or a store of an output) is then either

* a **tile** access: ``gm[offset(row) + suboffset(subrow) + col]``, copied in tiles of at most
  ``cols`` elements, or
* a **row** access: invariant over the inner range (``gm[offset(row)]``, one element per row).

:func:`analyze` returns that :class:`NpuLayout`, or raises :class:`Unsupported` naming the first
thing the generator cannot express (a gather along the inner axis, a reduction over a strided
axis, an op or dtype the Vector unit lacks, ...). An unsupported kernel is never generated: the
pipeline keeps its ATen steps (torch_npu runs them on a device).

Values compute in float32 on the Vector unit (16-bit floats are Cast in and rounded back where
the graph's dtype is 16-bit; booleans are 0.0/1.0), so the dtype rules are about what can be
loaded, stored and converted, see :data:`GM_DTYPES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ascendc_pack.ir.fusion import ConstNode, KernelSpec, LoadNode, NodeKind, OpNode, ReduceNode

GM_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "int32": 4}
"""Element size of every dtype an npu kernel can read or write in GM."""
VALUE_DTYPES = {"float32", "float16", "bfloat16", "bool", "pyint", "pyfloat"}
"""Node dtypes computed on the Vector unit (as float32)."""

UNARY_OPS = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "relu", "identity", "sigmoid", "tanh",
             "erf", "floor", "ceil", "round", "trunc", "exp2", "square", "isnan", "isinf", "logical_not",
             "bool_not"}
BINARY_OPS = {"add", "sub", "mul", "div", "maximum", "minimum", "clamp_lo", "clamp_hi", "eq", "ne", "lt", "le",
              "gt", "ge", "logical_and", "logical_or", "logical_xor", "div_trunc", "pow"}
BOOL_BITWISE = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor",
                "bitwise_not": "logical_not"}
"""Bitwise ops are supported on bool operands only (as their logical forms)."""
POW_EXPONENTS = {0.0, 0.5, 1.0, 2.0, 3.0, -0.5, -1.0, -2.0}
REDUCE_OPS = {"sum", "mean", "amax", "amin", "any", "all"}


class Unsupported(Exception):
    """The npu generator cannot express a kernel; the message starts with ``unsupported:``."""

    def __init__(self, reason: str):
        super().__init__(f"unsupported: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Access:
    """One load or store: ``kind`` "tile" (contiguous over the inner range) or "row" (one element
    per row); the GM element index of (row, col) is ``offset + sum((row // div) % mod * stride)
    over row_terms`` (+ col for a tile access). ``mod`` 0 means no modulo (the first outer axis)."""

    kind: str
    index: int                   # input index (loads) or output index (stores)
    dtype: str
    offset: int
    row_terms: tuple[tuple[int, int, int], ...]
    sub_terms: tuple[tuple[int, int, int], ...] = ()   # the same over the subrow index
    along: bool = False   # a row access of a col layout that covers the column tile (else one element)

    @property
    def esize(self) -> int:
        return GM_DTYPES[self.dtype]


@dataclass(frozen=True)
class NpuLayout:
    """A kernel spec as ``rows x cols`` (see the module docstring).

    ``tile_nodes`` vary over the inner range (computed per tile); the others are row values.
    ``stage`` per node: how many reduction stages must finish before it can be computed.
    ``loads`` maps a load node id to its access; ``stores`` has one access per output.
    """

    spec: KernelSpec
    rows: int
    cols: int
    subrows: int
    tile_nodes: frozenset[int]
    stage: tuple[int, ...]
    loads: dict
    stores: tuple[Access, ...]
    consumers: tuple[tuple[int, ...], ...]
    col: bool = False   # cols is a kept axis; row values are vectors over a column tile

    @property
    def n_stages(self) -> int:
        """Reduction stages + 1 (the pass after the last reduction stores the results)."""
        return 1 + max((self.stage[r.id] for r in self.spec.reductions), default=0)

    @property
    def inner(self) -> int:
        """Elements of one row's inner range (subrows x cols)."""
        return self.subrows * self.cols

    @property
    def reductions(self) -> list[ReduceNode]:
        return self.spec.reductions

    def gm_bytes(self) -> int:
        """Bytes the kernel moves between GM and UB when every tile access is read once."""
        total = 0
        for nid, acc in self.loads.items():
            total += acc.esize * (self.rows * self.inner if acc.kind == "tile" else self.rows)
        for acc in self.stores:
            total += acc.esize * (self.rows * self.inner if acc.kind == "tile" else self.rows)
        return total


def _row_terms(strides: tuple, outer: list[int], sizes: tuple) -> tuple:
    terms, div = [], 1
    for a in reversed(outer):
        if strides[a] != 0 and sizes[a] != 1:
            first = a == outer[0]
            terms.append((div, 0 if first else sizes[a], strides[a]))
        div *= sizes[a]
    return tuple(reversed(terms))


def _access(kind_name: str, what: str, index: int, dtype: str, strides: tuple, offset: int, outer: list[int],
            sub: list[int], last: int, sizes: tuple) -> Access:
    if dtype not in GM_DTYPES:
        raise Unsupported(f"{what} has dtype {dtype}; npu kernels read and write "
                          f"{', '.join(sorted(GM_DTYPES))} only")
    rows = _row_terms(strides, outer, sizes)
    if all(strides[a] == 0 or sizes[a] == 1 for a in [*sub, last]):
        return Access("row", index, dtype, offset, rows)
    if strides[last] != 1 and sizes[last] != 1:
        what_axis = "the last reduced axis" if kind_name == "reduce" else "the vectorized (last) axis"
        raise Unsupported(f"{what} walks {what_axis} with stride {strides[last]} (expected 1); DataCopy "
                          "moves contiguous runs only, a gather has no DataCopy form")
    if sizes[last] == 1 and any(strides[a] != 0 and sizes[a] != 1 for a in sub):
        raise Unsupported(f"{what} varies over the reduced axes but not along the contiguous one")
    return Access("tile", index, dtype, offset, rows, _row_terms(strides, sub, sizes))


def _check_node(spec: KernelSpec, n, consumers) -> None:
    nodes = spec.nodes
    if isinstance(n, LoadNode):
        if n.dtype == "int32":
            bad = [c for c in consumers[n.id] if not (isinstance(nodes[c], OpNode) and nodes[c].op == "cast"
                                                        and nodes[c].dtype in ("float32", "float16", "bfloat16"))]
            if bad:
                raise Unsupported("an int32 input is used other than by a cast to a float type (int32 values "
                                  "compute as float32 on the Vector unit, exact only below 2^24)")
        elif n.dtype not in GM_DTYPES:
            raise Unsupported(f"input of dtype {n.dtype}")
        return
    if isinstance(n, ConstNode):
        return
    if n.dtype == "int32" and isinstance(n, OpNode) and n.op == "cast":
        outs = {o.node for o in spec.outputs}
        if consumers[n.id] or n.id not in outs or nodes[n.args[0]].dtype not in ("float32", "float16", "bfloat16"):
            raise Unsupported("an int32 value other than a float -> int32 cast that is only stored")
        return
    if n.dtype not in VALUE_DTYPES:
        raise Unsupported(f"op {getattr(n, 'op', '?')} computes in {n.dtype}; the npu generator computes "
                          "float32/float16/bfloat16/bool values only")
    for a in n.args:
        if nodes[a].dtype not in VALUE_DTYPES and not (nodes[a].dtype == "int32" and isinstance(nodes[a], LoadNode)):
            raise Unsupported(f"op {n.op} has a {nodes[a].dtype} operand")
    if isinstance(n, ReduceNode):
        if n.op not in REDUCE_OPS:
            raise Unsupported(f"reduction {n.op} (the Vector unit reduces with ReduceSum/ReduceMax/ReduceMin)")
        return
    op = BOOL_BITWISE.get(n.op, n.op)
    if n.op in BOOL_BITWISE and not all(nodes[a].dtype == "bool" for a in n.args):
        raise Unsupported(f"{n.op} on non-bool operands")
    if op == "cast":
        return
    if op == "where":
        return
    if op not in UNARY_OPS and op not in BINARY_OPS:
        raise Unsupported(f"op {n.op} has no lowering to the AscendC Vector API")
    if op == "pow":
        e = nodes[n.args[1]]
        if not isinstance(e, ConstNode) or float(e.number) not in POW_EXPONENTS:
            raise Unsupported("pow with an exponent other than a constant in "
                              f"{sorted(POW_EXPONENTS)}")


def analyze(spec: KernelSpec) -> NpuLayout:
    """The spec as ``rows x subrows x cols`` with its accesses; raises :class:`Unsupported`.

    A reduction whose last reduce axis is not contiguous gets a *col* layout when a kept axis
    is: ``cols`` is then that kept axis, the reduce axes are the subrows every column tile
    accumulates over (vector Add/Max across subrows, no cross-lane reduction), and the values
    invariant over the reduce axes are vectors over the column tile."""
    sizes = tuple(spec.axes) or (1,)
    if any(s == 0 for s in sizes):
        raise Unsupported("empty iteration space")
    nodes = spec.nodes
    consumers: list[list[int]] = [[] for _ in nodes]
    for n in nodes:
        for a in n.args:
            consumers[a].append(n.id)
    for n in nodes:
        _check_node(spec, n, consumers)
    red = [a for a in spec.reduce_axes if sizes[a] != 1]
    if not red and spec.reductions:
        raise Unsupported("a reduction over unit axes only (a copy)")
    inner = red if red else [len(sizes) - 1]
    try:
        return _layout(spec, sizes, consumers, inner[:-1], inner[-1], col=False)
    except Unsupported as row_error:
        if not red:
            raise
        kept = [a for a in range(len(sizes)) if a not in red and sizes[a] != 1]
        first = next((n for n in spec.loads if any(n.strides[a] for a in red)), None)
        ca = next((a for a in kept if first is not None and first.strides[a] == 1), None)
        if ca is None:
            raise row_error from None
        try:
            return _layout(spec, sizes, consumers, red, ca, col=True)
        except Unsupported:
            raise row_error from None


def _layout(spec: KernelSpec, sizes: tuple, consumers, sub: list[int], last: int, col: bool) -> NpuLayout:
    nodes = spec.nodes
    outer = [a for a in range(len(sizes)) if a not in sub and a != last]
    kind = "reduce" if spec.reduce_axes and not col else "pointwise"
    make = _col_access if col else _access
    loads = {n.id: make(kind, f"input {n.input}", n.input, n.dtype, n.strides, n.offset, outer, sub, last, sizes)
             for n in spec.loads}
    stores = tuple(make(kind, f"output {j}", j, o.dtype, o.strides, 0, outer, sub, last, sizes)
                   for j, o in enumerate(spec.outputs))
    tile: set[int] = set()
    stage: list[int] = []
    for n in nodes:
        if n.kind is NodeKind.LOAD:
            if loads[n.id].kind == "tile":
                tile.add(n.id)
            stage.append(0)
        elif n.kind is NodeKind.CONST:
            stage.append(0)
        elif n.kind is NodeKind.REDUCE:
            if n.args[0] not in tile:
                raise Unsupported(f"{n.op} of a value that does not vary over the reduced axes")
            stage.append(stage[n.args[0]] + 1)
        else:
            if any(a in tile for a in n.args):
                tile.add(n.id)
            stage.append(max((stage[a] for a in n.args), default=0))
    for j, o in enumerate(spec.outputs):
        if stores[j].kind == "row" and o.node in tile:
            raise Unsupported(f"output {j} is stored once per row but varies over the inner axes")
    return NpuLayout(spec=spec, rows=math.prod(sizes[a] for a in outer), cols=sizes[last],
                     subrows=math.prod(sizes[a] for a in sub), tile_nodes=frozenset(tile), stage=tuple(stage),
                     loads=loads, stores=stores, consumers=tuple(tuple(c) for c in consumers), col=col)


def _col_access(kind_name: str, what: str, index: int, dtype: str, strides: tuple, offset: int, outer: list[int],
                sub: list[int], last: int, sizes: tuple) -> Access:
    """An access of a col layout: contiguous over the kept column axis ``last``."""
    if dtype not in GM_DTYPES:
        raise Unsupported(f"{what} has dtype {dtype}")
    along = strides[last] != 0 and sizes[last] != 1
    if along and strides[last] != 1:
        raise Unsupported(f"{what} walks the column axis with stride {strides[last]}")
    varies = any(strides[a] != 0 and sizes[a] != 1 for a in sub)
    rows = _row_terms(strides, outer, sizes)
    if not varies:
        return Access("row", index, dtype, offset, rows, along=along)
    if not along:
        raise Unsupported(f"{what} varies over the reduced axes but not along the column axis")
    return Access("tile", index, dtype, offset, rows, _row_terms(strides, sub, sizes))


def unsupported_reason(spec: KernelSpec) -> str | None:
    """``"unsupported: <reason>"`` when the npu generator cannot express ``spec``, else None."""
    try:
        analyze(spec)
    except Unsupported as exc:
        return str(exc)
    return None
