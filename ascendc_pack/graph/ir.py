"""The graph plan's types: what the planner (:mod:`ascendc_pack.graph.plan`) decides and the
emitter (:mod:`ascendc_pack.graph.emit`) renders, as frozen values: tensor values with the layout
the C++ code sees (:class:`Val`), buffers (:class:`Buf`), boxed operators (:class:`BoxedOp`), the
actions in order and the whole :class:`GraphPlan`."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from ascendc_pack_runtime.tensor_meta import itemsize, span_elems

from ascendc_pack.graph.aten import Const
from ascendc_pack.graph.memory import MemoryPlan


@dataclass(frozen=True)
class KernelRef:
    """What the graph needs to know about one chosen kernel library."""

    name: str
    kernel_key: str
    file: str          # path relative to the bundle root, e.g. kernels/<name>/<key>/kernel.so
    workspace: int
    n_inputs: int
    n_outputs: int
    dims: tuple = ()   # a jit kernel (docs/DESIGN.md §3.5): the dynamic dims it takes, in argument order

    def __post_init__(self):
        if os.path.isabs(self.file) or ".." in Path(self.file).parts:
            raise ValueError(f"kernel {self.name}: library path {self.file!r} must be relative to the "
                             "bundle root")


class ValKind(enum.Enum):
    """Where a value comes from (and so whether it can change between calls)."""

    INPUT = "input"     # a user input of the call
    WEIGHT = "weight"   # a weight (never changes)
    BUF = "buf"         # a planned buffer's full tensor
    VIEW = "view"       # a view of other values
    COND = "cond"       # the result of a torch.cond (either branch's value)
    OPAQUE = "opaque"   # returned by an allocating or in-place ATen call
    DERIVED = "derived"  # a tactic's derived weight, computed once at load (e.g. a packed weight)


class BufRole(enum.Enum):
    VALUE = "value"           # a step's output
    WORKSPACE = "workspace"   # a fused kernel's scratch
    RELAYOUT = "relayout"     # a copy into the layout a fused kernel was compiled for


class CallMode(enum.Enum):
    VIEW = "view"             # the result aliases an argument
    OUT = "out"               # the out= overload writes into planned buffers
    FUNCTIONAL = "functional"  # the op allocates its result (or writes in place)
    LOAD = "load"             # run once at load on tensors that never change (a tactic's prepack)


@dataclass(frozen=True, eq=False)
class Buf:
    """A block of memory the graph writes, created at step ``created``."""

    id: int
    label: str
    dtype: str
    shape: tuple
    stride: tuple
    role: BufRole
    created: int

    @property
    def nbytes(self) -> int:
        return span_elems(self.shape, self.stride) * itemsize(self.dtype)


@dataclass(frozen=True, eq=False)
class Val:
    """A tensor value as the C++ code will see it (actual layout, not eager's)."""

    id: int
    label: str
    shape: tuple
    stride: tuple
    dtype: str
    kind: ValKind
    index: int = -1                  # input / weight index
    buf: Buf | None = None           # kind BUF
    deps: tuple = ()                 # tensor Vals a view was computed from
    roots: frozenset = frozenset()   # ids of the buffers whose memory this value may be
    uncertain: bool = False          # layout predicted, not guaranteed (checked before kernels)


@dataclass(frozen=True)
class Arg:
    """One boxed argument: a constant, a tensor, or a list of tensors (None: a Tensor?[] hole)."""

    const: Const | None = None
    tensor: Val | None = None
    tensors: tuple | None = None
    optional_list: bool = False

    def values(self) -> list[Val]:
        if self.tensor is not None:
            return [self.tensor]
        return [v for v in self.tensors or () if v is not None]


@dataclass(frozen=True)
class BoxedOp:
    qualified: str             # aten::addmm
    overload: str              # "" for default
    template: tuple            # Arg per schema argument


@dataclass(frozen=True)
class AtenAction:
    label: str
    op_index: int
    args: tuple                # Arg per schema argument (then the out= arguments, mode OUT)
    mode: CallMode
    outs: tuple                # Val | None per result (mode OUT: the buffers' values)
    out_bufs: tuple = ()       # Buf per out= argument (mode OUT)
    list_return: bool = False  # the op returns one Tensor[]


@dataclass(frozen=True)
class FusedAction:
    label: str
    kernel_index: int
    ins: tuple                 # Val per kernel input (already in the layout it expects)
    outs: tuple                # Buf per kernel output
    workspace: Buf | None


@dataclass(frozen=True)
class RelayoutAction:
    src: Val
    dst: Buf


@dataclass(frozen=True)
class PackAction:
    """At load: ``dst`` := the constant B ``src`` packed by GEMM kernel ``kernel_index``'s
    ``ap_gemm_pack_b`` (``nbytes`` bytes, the layout of ascendc_pack/gemm_abi.h)."""

    kernel_index: int
    src: Val
    dst: Val
    nbytes: int


@dataclass(frozen=True)
class CheckAction:
    """Run-time safety net: ``dst = src`` when its strides match, else a relayouted copy."""

    src: Val
    dst: Val
    shape: tuple
    stride: tuple


@dataclass(frozen=True)
class CondAction:
    pred: Val | bool
    then_actions: tuple
    else_actions: tuple
    outs: tuple                # outer Vals
    then_outs: tuple
    else_outs: tuple


Action = AtenAction | FusedAction | RelayoutAction | CheckAction | CondAction | PackAction


@dataclass(frozen=True)
class UserOutput:
    """One model output: ``val``, or the caller's own input ``input_index`` (a mutated input
    the model returns)."""

    val: Val
    input_index: int = -1


@dataclass(frozen=True)
class Mutation:
    """Input ``input_index`` (named ``name``) gets the value of ``val`` after every call."""

    input_index: int
    name: str
    val: Val


@dataclass(frozen=True)
class GraphPlan:
    """Everything the emitter renders."""

    model_name: str
    weights: tuple             # (name, Val) per weight, in program order
    inputs: tuple              # (name, Val) per user input
    vals: tuple                # every Val, by id
    bufs: tuple                # every Buf, by id
    ops: tuple                 # BoxedOp per operator index
    actions: tuple             # top-level actions in order
    kernels: tuple             # KernelRef per kernel index
    outputs: tuple             # UserOutput per model output
    mutations: tuple           # Mutation per mutated input
    counts: dict               # steps by kind (aten_out, aten_functional, aten_view, fused, relayout, cond,
                               # tactic, tactic_load)
    memory: MemoryPlan
    aten_ops: dict = None      # the program's own ATen steps by operator (tactic calls not counted)
    dims: tuple = ()           # a generic plan (docs/DESIGN.md §2.10): (name, min, max) per dynamic dim


__all__ = ["KernelRef", "ValKind", "BufRole", "CallMode", "Buf", "Val", "Arg", "BoxedOp", "AtenAction", "FusedAction",
           "RelayoutAction", "PackAction", "CheckAction", "CondAction", "Action", "UserOutput", "Mutation",
           "GraphPlan"]
