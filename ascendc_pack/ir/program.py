"""Program IR: the model as an ordered list of steps, serializable to JSON and back.

A :class:`Program` is what every stage after capture works on:

* :class:`AtenStep` - one ATen (or prims) operator call, run by torch;
* :class:`FusedStep` - a fused kernel; ``steps`` holds the ATen steps it replaces, so the
  reference executor can always run it through torch, and ``kernel`` is the
  :class:`~ascendc_pack.ir.fusion.KernelSpec` the kernel stages read (filled by the fuser);
* :class:`CondStep` - ``torch.cond`` with a sub-program per branch;
* :class:`TacticStep` - a heavy step (GEMM, convolution, attention, with the pointwise ops fused
  into it) that has candidate implementations (tactics, :mod:`ascendc_pack.tactics.dispatch`); ``steps``
  holds the ATen steps it replaces, so the reference executor can always run it.

Values are named; ``Program.values`` gives every value's :class:`TensorSpec`. Arguments are
plain JSON-friendly data with :class:`Ref` for tensor values (see :func:`encode_arg`).
:class:`ModelProgram` adds what the model's signature needs: which program inputs are weights
and which are user inputs, which user inputs the model mutates, and the output structure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Union

import torch

from ascendc_pack_runtime.tensor_meta import dtype_name, torch_dtype  # noqa: F401 (re-exported)

from ascendc_pack.ir.fusion import KernelSpec

FORMAT_VERSION = 1

@dataclass(frozen=True)
class TensorSpec:
    """Static shape, strides and dtype of one tensor value."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] | None = None

    @staticmethod
    def of(t: torch.Tensor) -> TensorSpec:
        return TensorSpec(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def short(self) -> str:
        """Compact text form, e.g. ``f32[32, 1024]``."""
        abbrev = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                  "int64": "i64", "int32": "i32", "bool": "b8", "uint8": "u8", "int8": "i8"}
        return f"{abbrev.get(self.dtype, self.dtype)}[{', '.join(map(str, self.shape))}]"

    def to_json(self) -> dict:
        d: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.stride is not None:
            d["stride"] = list(self.stride)
        return d

    @staticmethod
    def from_json(d: dict) -> TensorSpec:
        stride = d.get("stride")
        return TensorSpec(tuple(d["shape"]), d["dtype"], tuple(stride) if stride is not None else None)


@dataclass(frozen=True)
class Ref:
    """A reference to a named tensor value inside an argument."""

    name: str


@dataclass
class AtenStep:
    """Call one operator, e.g. ``op="aten.addmm.default"``.

    ``outputs`` has one name per returned tensor; ``None`` marks a result nobody uses.
    ``multi`` is True when the operator returns a tuple (``var_mean``, ``max_pool2d_with_indices``).
    """

    op: str
    args: list
    kwargs: dict
    outputs: list[str | None]
    multi: bool = False

    kind = "aten"

    def input_names(self) -> list[str]:
        return _refs_in([self.args, list(self.kwargs.values())])


@dataclass
class FusedStep:
    """A fused kernel replacing ``steps``; inputs and outputs are value names of the program."""

    name: str
    inputs: list[str]
    outputs: list[str]
    steps: list[AtenStep]
    kernel: KernelSpec

    kind = "fused"

    def input_names(self) -> list[str]:
        return list(self.inputs)


@dataclass
class CondStep:
    """``torch.cond(pred, then, else, operands)``; each branch is a Program over ``operands``."""

    pred: Any  # Ref to a 0-d bool tensor, or a Python bool
    then_branch: Program
    else_branch: Program
    operands: list[str]
    outputs: list[str]

    kind = "cond"

    def input_names(self) -> list[str]:
        return _refs_in([self.pred]) + list(self.operands)


@dataclass
class TacticStep:
    """A heavy step with candidate implementations (tactics), found by :mod:`ascendc_pack.tactics.rewrite`.

    ``name`` is derived from everything that makes its candidates and their timings (the
    description, the input layouts): identical tactic steps share it, and with it one candidate
    set and one PGO measurement. ``tactic_kind``: ``linear`` | ``conv`` | ``attention``;
    ``desc``: the step description JSON (``tactics.LinearStep/ConvStep/AttentionStep.to_json()``);
    ``bind``: tactic tensor name (``x``, ``weight``, ``other``, ``q``...) -> program value name;
    ``shapes``: tactic tensor name -> the shape the tactic reads it with (a reshape of the value
    when they differ, e.g. a 3-D residual read as ``[m, n]``); ``outputs``: the one program value
    it computes; ``steps``: the ATen steps it replaces (the reference; when candidate 0 wins they
    are put back as they were); ``chain``: the convolution chain whose layout it shares (0: none).

    Once lowered (a tactic other than candidate 0 won), ``chosen`` is that tactic's JSON without
    its build-stage derivations (their results are bound as weights in ``bind``) and ``values``
    the spec of each of its tensors as observed on the real inputs (the layouts the graph plans).
    """

    name: str
    tactic_kind: str
    desc: dict
    bind: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    outputs: list[str]
    steps: list[AtenStep]
    chain: int = 0
    chosen: dict | None = None
    values: dict[str, TensorSpec] | None = None

    kind = "tactic"

    def reference_inputs(self) -> list[str]:
        """Values the reference steps read that they do not compute, in first-use order."""
        made = {o for s in self.steps for o in s.outputs if o}
        return list(dict.fromkeys(n for s in self.steps for n in s.input_names() if n not in made))

    def input_names(self) -> list[str]:
        """What the step reads: its bindings, and (until lowered) what the reference reads."""
        bound = list(self.bind.values())
        if self.chosen is not None:
            return list(dict.fromkeys(bound))
        return list(dict.fromkeys(self.reference_inputs() + bound))


Step = Union[AtenStep, FusedStep, CondStep, TacticStep]


@dataclass
class Program:
    """An ordered list of steps from named inputs to named outputs."""

    inputs: list[str]
    steps: list[Step]
    outputs: list[str]
    values: dict[str, TensorSpec]

    def walk(self):
        """Yield every step, recursing into cond branches (branch steps after the cond)."""
        for step in self.steps:
            yield step
            if isinstance(step, CondStep):
                yield from step.then_branch.walk()
                yield from step.else_branch.walk()

    def has_branches(self) -> bool:
        """Whether the program holds a ``torch.cond``: only then may a run skip some of its steps."""
        return any(isinstance(s, CondStep) for s in self.steps)

    def fused_steps(self) -> list[FusedStep]:
        """Every fused kernel of the program, branches included."""
        return [s for s in self.walk() if isinstance(s, FusedStep)]

    def tactic_steps(self) -> list[TacticStep]:
        """Every tactic step of the program, branches included."""
        return [s for s in self.walk() if isinstance(s, TacticStep)]

    def to_json(self) -> dict:
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "values": {k: v.to_json() for k, v in self.values.items()},
            "steps": [_step_to_json(s) for s in self.steps],
        }

    @staticmethod
    def from_json(d: dict) -> Program:
        return Program(
            inputs=list(d["inputs"]),
            outputs=list(d["outputs"]),
            values={k: TensorSpec.from_json(v) for k, v in d["values"].items()},
            steps=[_step_from_json(s) for s in d["steps"]],
        )


@dataclass
class ModelProgram:
    """A captured model: its Program plus the model's calling convention.

    ``program.inputs`` is ``weights`` followed by ``user_inputs``. ``mutations`` maps a user input
    to the program output holding its new value (written back after each call);
    ``user_outputs`` are the program outputs that form the model's result, ``out_tree`` the
    structure that rebuilds it (``ascendc_pack_runtime.outputs``: tuples, lists, dicts,
    namedtuples) and ``output_names`` one name per user output (dict keys, namedtuple fields,
    ``output_<i>``, or the model file's ``get_output_names()``).
    """

    name: str
    program: Program
    weights: list[str]
    weight_fqns: dict[str, str]
    user_inputs: list[str]
    mutations: dict[str, str]
    user_outputs: list[str]
    out_tree: dict
    output_names: list[str]

    def input_specs(self) -> list[TensorSpec]:
        return [self.program.values[n] for n in self.user_inputs]

    def output_specs(self) -> list[TensorSpec]:
        return [self.program.values[n] for n in self.user_outputs]

    def to_json(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "weights": list(self.weights),
            "weight_fqns": dict(self.weight_fqns),
            "user_inputs": list(self.user_inputs),
            "mutations": dict(self.mutations),
            "user_outputs": list(self.user_outputs),
            "out_tree": self.out_tree,
            "output_names": list(self.output_names),
            "program": self.program.to_json(),
        }

    @staticmethod
    def from_json(d: dict) -> ModelProgram:
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"program format version {d.get('format_version')!r} is not {FORMAT_VERSION}; "
                "re-capture the model with this version of ascendc-pack"
            )
        return ModelProgram(
            name=d["name"],
            program=Program.from_json(d["program"]),
            weights=list(d["weights"]),
            weight_fqns=dict(d["weight_fqns"]),
            user_inputs=list(d["user_inputs"]),
            mutations=dict(d["mutations"]),
            user_outputs=list(d["user_outputs"]),
            out_tree=d["out_tree"],
            output_names=list(d["output_names"]),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @staticmethod
    def loads(text: str) -> ModelProgram:
        return ModelProgram.from_json(json.loads(text))


# --- arguments -------------------------------------------------------------------------------

def encode_arg(a: Any) -> Any:
    """Encode an argument as JSON data; tensors refs, dtypes and non-finite floats are tagged."""
    if isinstance(a, Ref):
        return {"ref": a.name}
    if isinstance(a, bool) or a is None or isinstance(a, (int, str)):
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if isinstance(a, (list, tuple)):
        return [encode_arg(x) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": dtype_name(a)}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    raise TypeError(f"cannot encode argument of type {type(a).__name__}: {a!r}")


def decode_arg(a: Any) -> Any:
    """Inverse of :func:`encode_arg`."""
    if isinstance(a, list):
        return [decode_arg(x) for x in a]
    if isinstance(a, dict):
        (tag, val), = a.items()
        if tag == "ref":
            return Ref(val)
        if tag == "float":
            return float(val)
        if tag == "dtype":
            return torch_dtype(val)
        if tag == "device":
            return torch.device(val)
        if tag == "layout":
            return getattr(torch, val)
        if tag == "memory_format":
            return getattr(torch, val)
        raise ValueError(f"unknown argument tag {tag!r}")
    return a


def _refs_in(obj) -> list[str]:
    out: list[str] = []
    if isinstance(obj, Ref):
        out.append(obj.name)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            out.extend(_refs_in(x))
    return out


def _step_to_json(s: Step) -> dict:
    if isinstance(s, AtenStep):
        d = {"kind": "aten", "op": s.op, "args": encode_arg(s.args),
             "kwargs": {k: encode_arg(v) for k, v in s.kwargs.items()}, "outputs": s.outputs}
        if s.multi:
            d["multi"] = True
        return d
    if isinstance(s, FusedStep):
        return {"kind": "fused", "name": s.name, "inputs": s.inputs, "outputs": s.outputs,
                "steps": [_step_to_json(x) for x in s.steps], "kernel": s.kernel.to_json()}
    if isinstance(s, TacticStep):
        d = {"kind": "tactic", "name": s.name, "tactic_kind": s.tactic_kind, "desc": s.desc, "bind": dict(s.bind),
             "shapes": {k: list(v) for k, v in s.shapes.items()}, "outputs": list(s.outputs),
             "steps": [_step_to_json(x) for x in s.steps], "chain": s.chain}
        if s.chosen is not None:
            d["chosen"] = s.chosen
        if s.values is not None:
            d["values"] = {k: v.to_json() for k, v in s.values.items()}
        return d
    return {"kind": "cond", "pred": encode_arg(s.pred), "operands": s.operands, "outputs": s.outputs,
            "then": s.then_branch.to_json(), "else": s.else_branch.to_json()}


def _step_from_json(d: dict) -> Step:
    kind = d["kind"]
    if kind == "aten":
        return AtenStep(op=d["op"], args=decode_arg(d["args"]),
                        kwargs={k: decode_arg(v) for k, v in d["kwargs"].items()},
                        outputs=list(d["outputs"]), multi=bool(d.get("multi", False)))
    if kind == "fused":
        return FusedStep(name=d["name"], inputs=list(d["inputs"]), outputs=list(d["outputs"]),
                         steps=[_step_from_json(x) for x in d["steps"]], kernel=KernelSpec.from_json(d["kernel"]))
    if kind == "cond":
        return CondStep(pred=decode_arg(d["pred"]), then_branch=Program.from_json(d["then"]),
                        else_branch=Program.from_json(d["else"]), operands=list(d["operands"]),
                        outputs=list(d["outputs"]))
    if kind == "tactic":
        values = d.get("values")
        return TacticStep(name=d["name"], tactic_kind=d["tactic_kind"], desc=d["desc"], bind=dict(d["bind"]),
                          shapes={k: tuple(v) for k, v in d["shapes"].items()}, outputs=list(d["outputs"]),
                          steps=[_step_from_json(x) for x in d["steps"]], chain=int(d.get("chain", 0)),
                          chosen=d.get("chosen"),
                          values={k: TensorSpec.from_json(v) for k, v in values.items()} if values else None)
    raise ValueError(f"unknown step kind {kind!r}")


# --- text dump -------------------------------------------------------------------------------

def _fmt_arg(a: Any) -> str:
    if isinstance(a, Ref):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt_arg(x) for x in a) + "]"
    if isinstance(a, torch.dtype):
        return dtype_name(a)
    return repr(a)


def _fmt_aten(s: AtenStep) -> str:
    args = [_fmt_arg(a) for a in s.args] + [f"{k}={_fmt_arg(v)}" for k, v in s.kwargs.items()]
    outs = ", ".join(f"%{o}" if o else "_" for o in s.outputs)
    return f"{outs} = {s.op}({', '.join(args)})"


def dump_program(p: Program, indent: str = "  ") -> list[str]:
    """Readable lines for a program: one per step, value types at the right."""
    lines = []

    def typ(names):
        return ", ".join(p.values[n].short() for n in names if n and n in p.values)

    for s in p.steps:
        if isinstance(s, AtenStep):
            lines.append(f"{indent}{_fmt_aten(s):<78} # {typ(s.outputs)}")
        elif isinstance(s, FusedStep):
            outs = ", ".join(f"%{o}" for o in s.outputs)
            ins = ", ".join(f"%{i}" for i in s.inputs)
            lines.append(f"{indent}{outs} = kernel {s.name}({ins})  # {typ(s.outputs)}")
            for inner in s.steps:
                lines.append(f"{indent}  | {_fmt_aten(inner)}")
        elif isinstance(s, TacticStep):
            outs = ", ".join(f"%{o}" for o in s.outputs)
            ins = ", ".join(f"{k}=%{v}" for k, v in s.bind.items())
            what = f" chosen {s.chosen['name']}" if s.chosen is not None else ""
            chain = f" chain {s.chain}" if s.chain else ""
            lines.append(f"{indent}{outs} = tactic {s.name}({ins}){what}{chain}  # {typ(s.outputs)}")
            for inner in s.steps:
                lines.append(f"{indent}  | {_fmt_aten(inner)}")
        else:
            outs = ", ".join(f"%{o}" for o in s.outputs)
            ops = ", ".join(f"%{o}" for o in s.operands)
            lines.append(f"{indent}{outs} = cond({_fmt_arg(s.pred)}, [{ops}])  # {typ(s.outputs)}")
            for label, br in (("then", s.then_branch), ("else", s.else_branch)):
                lines.append(f"{indent}  {label} ({', '.join('%' + i for i in br.inputs)}):")
                lines.extend(dump_program(br, indent + "    "))
    lines.append(f"{indent}return ({', '.join('%' + o for o in p.outputs)})")
    return lines


def aten_op_counts(program: Program) -> dict[str, int]:
    """How many times each ATen operator is called as its own step (not inside a fused kernel),
    branches included, most frequent first."""
    counts: dict[str, int] = {}
    for s in program.walk():
        if isinstance(s, AtenStep):
            counts[s.op] = counts.get(s.op, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def fusion_summary(fused: ModelProgram) -> str:
    """One paragraph: fused kernels and the ATen calls that remain, with counts."""
    kernels = fused.program.fused_steps()
    n_fused_ops = sum(len(k.steps) for k in kernels)
    ops = aten_op_counts(fused.program)
    left = ", ".join(f"{op.removeprefix('aten.')} x{n}" for op, n in ops.items()) or "none"
    return (f"after fusion: {len(kernels)} fused kernels ({n_fused_ops} ops), "
            f"{sum(ops.values())} ATen calls: {left}")


def dump(mp: ModelProgram) -> str:
    """The whole model program as text (what ``ascendc-pack capture`` prints)."""
    v = mp.program.values
    head = [
        f"model {mp.name}",
        "  inputs:  " + (", ".join(f"%{n}: {v[n].short()}" for n in mp.user_inputs) or "(none)"),
        f"  weights: {len(mp.weights)} tensors, "
        f"{sum(v[n].numel * torch_dtype(v[n].dtype).itemsize for n in mp.weights):,} bytes",
    ]
    if mp.mutations:
        head.append("  mutates: " + ", ".join(f"%{i} <- %{o}" for i, o in mp.mutations.items()))
    fused = mp.program.fused_steps()
    tactic = mp.program.tactic_steps()
    n_steps = sum(1 for _ in mp.program.walk())
    distinct = len({s.name for s in fused})  # steps computing the same share a kernel
    shared = f", {distinct} distinct" if distinct != len(fused) else ""
    parts = ([f"{len(fused)} fused kernels{shared}"] if fused else []) + \
        ([f"{len(tactic)} tactic steps, {len({s.name for s in tactic})} distinct"] if tactic else [])
    head.append(f"  steps:   {n_steps}" + (f" ({'; '.join(parts)})" if parts else ""))
    head.append("  outputs: " + ", ".join(f"{n}: {v[o].short()}" for n, o in zip(mp.output_names, mp.user_outputs)))
    return "\n".join(head + ["program:"] + dump_program(mp.program)) + "\n"
