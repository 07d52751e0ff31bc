"""Tactics as data: a different op sequence plus derived weights, recordable in a manifest.

A :class:`Tactic` is everything needed to run one candidate implementation of a heavy step
(a GEMM, a convolution, an attention block) without knowing any Python function: the ordered
dispatcher calls that derive its weights (:class:`Prepack`, each run at build or at load) and
the calls that compute the step (:class:`Call`). Arguments refer to named tensors with
:class:`Ref` (the step's activations and weights, derived weights, earlier results) or are
literals. The Python side runs a tactic by calling those ops through the dispatcher by their
qualified names (``dispatch.execute``); the C++ graph renders the same calls as boxed
``c10::Dispatcher`` calls, so what PGO times is what the bundle runs.

JSON: ``Tactic.to_json()`` / ``Tactic.from_json()`` round-trip; tensor references are
``{"ref": name}``, memory formats ``{"memory_format": "channels_last"}``, dtypes
``{"dtype": "float32"}``, infinities ``{"float": "-inf"}``; other literals are JSON values.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

STAGES = ("build", "load")


@dataclass(frozen=True)
class Ref:
    """A named tensor: a step input, a weight, a derived weight or an earlier call's result."""

    name: str


@dataclass(frozen=True)
class MemoryFormat:
    """A ``torch.memory_format`` literal (``contiguous_format``, ``channels_last``)."""

    name: str


@dataclass(frozen=True)
class Dtype:
    """A ``torch.dtype`` literal by its attribute name (``float32``, ``bool``)."""

    name: str


Literal = Union[None, bool, int, float, str, Ref, MemoryFormat, Dtype, tuple]


@dataclass(frozen=True)
class Call:
    """One dispatcher call: ``out = op(*args, **kwargs)`` (``[index]`` when the op returns a tuple).

    ``op`` is the qualified name with an optional overload, as ``c10::Dispatcher`` finds it:
    ``"mkldnn::_linear_pointwise"``, ``"aten::add.Tensor"``.
    """

    op: str
    args: tuple = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    out: str = "out"
    index: int | None = None

    @property
    def name_and_overload(self) -> tuple[str, str]:
        """``("aten::add", "Tensor")``; the default overload is ``""``."""
        name, _, overload = self.op.partition(".")
        return name, overload

    def refs(self) -> set[str]:
        """Names of the tensors this call reads."""
        found: set[str] = set()
        _collect_refs(self.args, found)
        _collect_refs(tuple(v for _, v in self.kwargs), found)
        return found


def _collect_refs(values, found: set[str]) -> None:
    for v in values:
        if isinstance(v, Ref):
            found.add(v.name)
        elif isinstance(v, tuple):
            _collect_refs(v, found)


@dataclass(frozen=True)
class Prepack:
    """A weight derived before the first call: ``call.out`` is the derived weight's name.

    ``when``: ``"build"`` (stored in the bundle like any weight; only for derivations whose result
    does not depend on the host) or ``"load"`` (run once when the bundle is loaded, counted in
    cold start: oneDNN/MKL packed layouts depend on the host ISA and MKL's packed buffer cannot
    even be moved in memory). ``isa_dependent`` says whether the result depends on the CPU.
    """

    call: Call
    when: str
    isa_dependent: bool = False

    def __post_init__(self):
        if self.when not in STAGES:
            raise ValueError(f"Prepack.when must be one of {STAGES}, got {self.when!r}")
        if self.isa_dependent and self.when == "build":
            raise ValueError(f"{self.call.op}: an ISA-dependent derived weight must be made at load, not at build")


@dataclass(frozen=True)
class Tactic:
    """One candidate implementation of a heavy step.

    ``kind``: ``linear`` | ``conv`` | ``attention``; ``name``: the candidate (``aten`` is the step
    as captured, candidate 0); ``replaces``: the ATen op pattern of the step it stands for (the
    heavy op, then the pointwise ops fused into it); ``inputs``: the step's activation and weight
    names it reads; ``prepack``: derived weights in order; ``calls``: the per-call op sequence;
    ``output``: the name of the result; ``params``: the choices that distinguish it (sorted
    ``(key, value)`` pairs, JSON values only).
    """

    family: ClassVar[str] = "dispatch"  # tactics.families.registry.DISPATCH: not a generated kernel

    kind: str
    name: str
    replaces: tuple[str, ...]
    inputs: tuple[str, ...]
    prepack: tuple[Prepack, ...]
    calls: tuple[Call, ...]
    output: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def ops(self) -> tuple[str, ...]:
        """Every qualified op this tactic calls (prepack and per call), in first-use order."""
        seen: dict[str, None] = {}
        for c in [p.call for p in self.prepack] + list(self.calls):
            seen.setdefault(c.op, None)
        return tuple(seen)

    @property
    def load_time(self) -> bool:
        """Whether some derived weight is made at load (part of cold start)."""
        return any(p.when == "load" for p in self.prepack)

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def to_json(self) -> dict:
        return {
            "kind": self.kind, "name": self.name, "replaces": list(self.replaces),
            "inputs": list(self.inputs),
            "prepack": [{"when": p.when, "isa_dependent": p.isa_dependent, **_call_json(p.call)}
                        for p in self.prepack],
            "calls": [_call_json(c) for c in self.calls],
            "output": self.output, "params": {k: v for k, v in self.params},
        }

    @classmethod
    def from_json(cls, d: dict) -> "Tactic":
        return cls(
            kind=d["kind"], name=d["name"], replaces=tuple(d["replaces"]), inputs=tuple(d["inputs"]),
            prepack=tuple(Prepack(_call_from(p), p["when"], p["isa_dependent"]) for p in d["prepack"]),
            calls=tuple(_call_from(c) for c in d["calls"]), output=d["output"],
            params=tuple(sorted(d["params"].items())),
        )

    @property
    def key(self) -> str:
        """A stable id of this tactic (md5 of its canonical JSON), like a kernel's ``kernel_key``."""
        return hashlib.md5(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


def _enc(v):
    if isinstance(v, Ref):
        return {"ref": v.name}
    if isinstance(v, MemoryFormat):
        return {"memory_format": v.name}
    if isinstance(v, Dtype):
        return {"dtype": v.name}
    if isinstance(v, tuple):
        return [_enc(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": str(v)}  # JSON has no literal for inf / nan
    return v


def _dec(v):
    if isinstance(v, dict):
        ((tag, name),) = v.items()
        return {"ref": Ref, "memory_format": MemoryFormat, "dtype": Dtype, "float": float}[tag](name)
    if isinstance(v, list):
        return tuple(_dec(x) for x in v)
    return v


def _call_json(c: Call) -> dict:
    d = {"op": c.op, "args": [_enc(a) for a in c.args], "kwargs": {k: _enc(v) for k, v in c.kwargs},
         "out": c.out}
    if c.index is not None:
        d["index"] = c.index
    return d


def _call_from(d: dict) -> Call:
    return Call(op=d["op"], args=tuple(_dec(a) for a in d["args"]),
                kwargs=tuple((k, _dec(v)) for k, v in d["kwargs"].items()), out=d["out"],
                index=d.get("index"))
