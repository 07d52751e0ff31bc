"""The fusion IR: every type the fuse stage builds and the kernel stages read.

Two layers, both plain frozen dataclasses:

* **Group analysis** (inside :mod:`ascendc_pack.passes.fuse`): an operand of a group's step is either
  :class:`Internal` (a value the group computes, seen through dim maps) or :class:`Load` (a
  kernel input with a strided view folded in); :class:`Analysis` is a group's iteration space.
* **Kernel spec** (fuse -> tile, codegen, cache key, tune, render): :class:`KernelSpec`, one
  fused kernel's computation over a static iteration space.

A spec's iteration space is the product of ``axes``; every node is evaluated at an index of it
(a node ignores the axes it does not vary over). Nodes are in topological order and refer to
each other by ``id`` (their position). Loads carry per-axis element strides and an offset into
their input; reductions reduce exactly ``reduce_axes``; outputs are stored contiguously in their
own shape, given as per-axis strides.

A spec is the computation only: which program values a use of the kernel reads and writes is
the :class:`~ascendc_pack.ir.program.FusedStep`'s business. So two steps computing the same thing
on the same shapes, strides and dtypes have equal specs, hence one kernel name (derived from
the spec alone), one candidate set, one compile, one PGO measurement and one library in the
bundle. Its JSON form (:meth:`KernelSpec.to_json`) is what the kernel name digest and the
compile cache key hash, so it never changes silently::

    {"version": 2, "axes": [sizes], "reduce_axes": [axis ids],
     "inputs": [{"dtype", "shape", "stride"}],
     "outputs": [{"dtype", "shape", "node", "strides"}],
     "nodes": [{"kind": "load"|"const"|"op"|"reduce", ..., "id"}], "name": ...}
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import ClassVar, Union

from ascendc_pack_runtime.tensor_meta import contiguous_strides

from ascendc_pack.ir.symbolic import to_json as sym_to_json

SPEC_VERSION = 2  # 2: no value names (kernels are shared by every step computing the same)


class SpecError(ValueError):
    """A kernel spec's JSON is malformed (a field is missing or has the wrong type)."""


class NodeKind(str, Enum):
    """What a spec node computes."""

    LOAD = "load"      # read an input at a strided index
    CONST = "const"    # a scalar constant
    OP = "op"          # a pointwise op of other nodes (ascendc_pack.ir.ops tables)
    REDUCE = "reduce"  # a reduction of one node over the spec's reduce axes


# --- group analysis (fuse stage) -------------------------------------------------------------

@dataclass(frozen=True)
class Internal:
    """An operand that is (a view of) a value computed inside the group."""

    value: str
    dim_map: tuple  # operand dim -> source value dim, or None (unit or broadcast dim)


@dataclass(frozen=True)
class Load:
    """An operand read from memory: a kernel input with a strided view applied.

    ``axes`` (operand dim -> iteration axis, None for unit dims) is known only once the
    group's iteration space is: :meth:`Fuser.analyze` fills it in its result.
    """

    base: str
    shape: tuple
    strides: tuple
    offset: int
    views: tuple = ()           # names of the view steps folded in
    axes: tuple | None = None

    @property
    def layout_key(self) -> tuple:
        """Identical loads of one input (same view) share their dims."""
        return (self.base, self.shape, self.strides, self.offset)


Operand = Union[Internal, Load]


@dataclass(frozen=True)
class Analysis:
    """The iteration space of a group and how every value maps onto it."""

    members: list[int]                  # step indices of compute steps, program order
    axis_sizes: list[int]
    reduce_axes: frozenset[int]
    value_axes: dict[str, list]         # internal value -> axis per dim (None for unit dims)
    operands: dict[tuple, Operand]      # (step index, operand position) -> Internal | Load
    outputs: list[str]                  # internal values needed outside the group
    view_steps: list[int]               # view steps used by the group (for the reference steps)


# --- kernel spec ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadNode:
    """Element ``offset + sum(index[a] * strides[a])`` of input ``input``."""

    id: int
    input: int
    strides: tuple[int, ...]
    offset: int
    dtype: str
    kind: ClassVar[NodeKind] = NodeKind.LOAD
    args: ClassVar[tuple[int, ...]] = ()

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "input": self.input, "strides": list(self.strides),
                "offset": self.offset, "dtype": self.dtype, "id": self.id}


@dataclass(frozen=True)
class ConstNode:
    """A scalar. ``value`` is a bool, an int, or a float's ``repr`` (exact, ``inf``/``nan``
    included); ``dtype`` is a tensor dtype, or ``pyint``/``pyfloat`` for a Python scalar that
    takes its consumer's type."""

    id: int
    value: bool | int | str
    dtype: str
    kind: ClassVar[NodeKind] = NodeKind.CONST
    args: ClassVar[tuple[int, ...]] = ()

    @property
    def number(self) -> bool | int | float:
        """The value as a Python number."""
        return float(self.value) if isinstance(self.value, str) else self.value

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "value": self.value, "dtype": self.dtype, "id": self.id}


@dataclass(frozen=True)
class OpNode:
    """Pointwise op ``op`` (a key of the :mod:`ascendc_pack.ir.ops` tables) of nodes ``args``."""

    id: int
    op: str
    args: tuple[int, ...]
    dtype: str
    kind: ClassVar[NodeKind] = NodeKind.OP

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "op": self.op, "args": list(self.args), "dtype": self.dtype,
                "id": self.id}


@dataclass(frozen=True)
class ReduceNode:
    """Reduction ``op`` (``ops.REDUCE_COMBINE``) of node ``args[0]`` over the reduce axes;
    ``count`` (mean only) is the number of elements reduced."""

    id: int
    op: str
    args: tuple[int, ...]
    dtype: str
    count: int | None = None
    kind: ClassVar[NodeKind] = NodeKind.REDUCE

    def to_json(self) -> dict:
        d = {"kind": self.kind.value, "op": self.op, "args": list(self.args), "dtype": self.dtype}
        if self.count is not None:
            d["count"] = self.count
        d["id"] = self.id
        return d


Node = Union[LoadNode, ConstNode, OpNode, ReduceNode]


@dataclass(frozen=True)
class KernelInput:
    """One kernel input: the strides it is assumed to have at run time."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "stride": list(self.stride)}


@dataclass(frozen=True)
class KernelOutput:
    """One kernel output: node ``node`` stored in ``shape`` (per-axis ``strides``); ``stride``: the
    output tensor's per-dim strides, a dense layout (None: contiguous), which whoever allocates
    the output must use (:attr:`layout`)."""

    dtype: str
    shape: tuple[int, ...]
    node: int
    strides: tuple[int, ...]
    stride: tuple[int, ...] | None = None

    @property
    def layout(self) -> tuple[int, ...]:
        """Per-dim strides of the output tensor."""
        return self.stride if self.stride is not None else contiguous_strides(self.shape)

    def to_json(self) -> dict:
        d = {"dtype": self.dtype, "shape": list(self.shape), "node": self.node, "strides": list(self.strides)}
        if self.stride is not None:
            d["stride"] = list(self.stride)
        return d


@dataclass(frozen=True)
class KernelSpec:
    """One fused kernel's computation (see the module docstring); ``name`` is empty until the
    fuser names it after :meth:`digest`."""

    axes: tuple[int, ...]
    reduce_axes: tuple[int, ...]
    inputs: tuple[KernelInput, ...]
    outputs: tuple[KernelOutput, ...]
    nodes: tuple[Node, ...]
    name: str = ""
    version: int = field(default=SPEC_VERSION)

    @property
    def loads(self) -> list[LoadNode]:
        return [n for n in self.nodes if n.kind is NodeKind.LOAD]

    @property
    def reductions(self) -> list[ReduceNode]:
        return [n for n in self.nodes if n.kind is NodeKind.REDUCE]

    def to_json(self) -> dict:
        d = {"version": self.version, "axes": list(self.axes), "reduce_axes": list(self.reduce_axes),
             "inputs": [i.to_json() for i in self.inputs], "outputs": [o.to_json() for o in self.outputs],
             "nodes": [n.to_json() for n in self.nodes]}
        if self.name:
            d["name"] = self.name
        return d

    def canonical_json(self) -> str:
        """The JSON text hashed into cache keys: sorted keys, no whitespace choices left open (a
        dynamic size, :mod:`ascendc_pack.ir.symbolic`, as ``{"sym": ...}``)."""
        return json.dumps(self.to_json(), sort_keys=True, default=sym_to_json)

    def digest(self) -> str:
        """md5 of the unnamed spec's canonical JSON (the tail of the kernel name)."""
        return hashlib.md5(replace(self, name="").canonical_json().encode()).hexdigest()

    def named(self) -> KernelSpec:
        """This spec named after what it computes: ``fused_<first ops>_<digest>``. Equal
        computations get equal names, so they share one kernel."""
        ops: list[str] = []
        for n in self.nodes:
            if n.kind in (NodeKind.OP, NodeKind.REDUCE) and _LABEL.get(n.op, n.op) not in ops:
                ops.append(_LABEL.get(n.op, n.op))
        label = "_".join(ops[:4]) + ("_etc" if len(ops) > 4 else "") or ("copy" if self.loads else "fill")
        return replace(self, name=f"fused_{label}_{self.digest()[:10]}")

    @staticmethod
    def from_json(d: dict) -> KernelSpec:
        """Parse :meth:`to_json`'s form; raises :class:`SpecError` naming the bad field."""
        if d.get("version") != SPEC_VERSION:
            raise SpecError(f"kernel spec version {d.get('version')!r}, this ascendc-pack reads version "
                            f"{SPEC_VERSION}: fuse the model again with this ascendc-pack")
        try:
            return KernelSpec(
                version=_int(d["version"]), name=str(d.get("name", "")),
                axes=_ints(d["axes"]), reduce_axes=_ints(d["reduce_axes"]),
                inputs=tuple(KernelInput(str(i["dtype"]), _ints(i["shape"]), _ints(i["stride"]))
                             for i in d["inputs"]),
                outputs=tuple(KernelOutput(str(o["dtype"]), _ints(o["shape"]), _int(o["node"]), _ints(o["strides"]),
                                           _ints(o["stride"]) if "stride" in o else None)
                              for o in d["outputs"]),
                nodes=tuple(_node_from_json(n) for n in d["nodes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"malformed kernel spec: {type(e).__name__}: {e}") from None


_LABEL = {"identity": "copy"}  # spec op names that read badly in a kernel name


def _int(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{v!r} is not an integer")
    return v


def _ints(v) -> tuple[int, ...]:
    return tuple(_int(x) for x in v)


def _node_from_json(n: dict) -> Node:
    kind = NodeKind(n["kind"])
    nid, dtype = _int(n["id"]), str(n["dtype"])
    if kind is NodeKind.LOAD:
        return LoadNode(nid, _int(n["input"]), _ints(n["strides"]), _int(n["offset"]), dtype)
    if kind is NodeKind.CONST:
        if not isinstance(n["value"], (bool, int, str)):
            raise ValueError(f"const value {n['value']!r} is not a bool, int or float text")
        return ConstNode(nid, n["value"], dtype)
    if kind is NodeKind.OP:
        return OpNode(nid, str(n["op"]), _ints(n["args"]), dtype)
    count = n.get("count")
    return ReduceNode(nid, str(n["op"]), _ints(n["args"]), dtype, None if count is None else _int(count))


__all__ = ["NodeKind", "Internal", "Load", "Operand", "Analysis", "LoadNode", "ConstNode", "OpNode",
           "ReduceNode", "Node", "KernelInput", "KernelOutput", "KernelSpec", "SpecError", "SPEC_VERSION"]
