"""``dynamic`` of a format-version-2 ``manifest.json`` (docs/FORMAT.md, "Dynamic shapes"): the
declared dynamic dims, the dims that form the batch, and the plans: a static plan per bucket
(the sizes it was built and tuned for) and one generic plan for every other size in the ranges.
Part of :mod:`ascendc_pack_runtime.manifest` (same conventions: ``from_json`` checks types,
bounds and cross-references and raises field errors naming the field path)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from .constants import MAX_DIM
from .manifest_graph import Graph
from .manifest_tactics import CallThreads, TacticStep
from .schema import MAX_COUNT, Fields, field_error, is_int, show

DIM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
EXPR_RE = re.compile(r"[A-Za-z0-9_*+\-/%() ]{1,256}")
"""A dynamic output size that is no single dim (``batch*seq``): shown, never evaluated."""
PLAN_KINDS = ("bucket", "generic")
_MD5_RE = re.compile(r"[0-9a-f]{32}")


def dynamic_dims(f: Fields, key: str, *, names: set[str] | None, length: int | None = None) -> tuple:
    """A shape of a version-2 manifest: per dim an integer, or a dim name (``names``: the
    declared dims; None: an output, which may also hold a size expression's text)."""
    items = f.list(key)
    if length is not None and len(items) != length:
        raise field_error(f.path(key), f"has {len(items)} entries, not one per dimension ({length})")
    out = []
    for v, where in items:
        if is_int(v) and 0 <= v < MAX_DIM:
            out.append(v)
        elif isinstance(v, str) and names is not None and v in names:
            out.append(v)
        elif isinstance(v, str) and names is None and EXPR_RE.fullmatch(v):
            out.append(v)
        else:
            what = f"one of the declared dims {sorted(names)}" if names is not None else "a size expression"
            raise field_error(where, f"is {show(v)}, not an integer in [0, 2**48) or {what}")
    return tuple(out)


@dataclass(frozen=True)
class DynDim:
    """A dynamic dim and the inclusive range of its sizes."""

    name: str
    min: int
    max: int

    @staticmethod
    def from_json(d: object, where: str) -> DynDim:
        f = Fields(d, where)
        name = f.str("name", pattern=DIM_NAME_RE, what="an identifier")
        lo, hi = f.int("min", 1, MAX_DIM), f.int("max", 1, MAX_DIM)
        if lo > hi:
            raise field_error(f"{where}.min", f"is {lo}, more than max ({hi})")
        return DynDim(name, lo, hi)

    def to_json(self) -> dict:
        return {"name": self.name, "min": self.min, "max": self.max}


@dataclass(frozen=True)
class BatchDims:
    """The dim that forms the batch: dim 0 of every input and every output is dynamic dim
    ``dim`` (what a server batches requests on)."""

    dim: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @staticmethod
    def from_json(d: object, where: str) -> BatchDims:
        f = Fields(d, where)
        ints = lambda key: tuple(f.get(key, lambda v: isinstance(v, list) and all(  # noqa: E731
            is_int(i) and 0 <= i < MAX_COUNT for i in v), "a list of indices"))
        return BatchDims(f.str("dim", pattern=DIM_NAME_RE, what="an identifier"), ints("inputs"), ints("outputs"))

    def to_json(self) -> dict:
        return {"dim": self.dim, "inputs": list(self.inputs), "outputs": list(self.outputs)}


@dataclass(frozen=True)
class Plan:
    """One plan: a ``bucket`` (static, built and tuned at ``sizes``) or the ``generic`` plan
    (any sizes in the ranges: jit kernels, sizes computed per call). ``weights``: indices into
    ``weights.tensors`` in the order its graph takes them; ``kernels``: (name, kernel_key) of the
    ``kernels`` entries its graph loads; ``tactics`` / ``call_threads`` as the top-level fields of a
    static bundle."""

    kind: str
    sizes: Mapping[str, int] | None
    graph: Graph
    weights: tuple[int, ...]
    kernels: tuple[tuple[str, str], ...]
    tactics: tuple[TacticStep, ...] | None = None
    call_threads: CallThreads | None = None

    @staticmethod
    def from_json(d: object, where: str) -> Plan:
        f = Fields(d, where)
        kind = f.get("kind", lambda v: v in PLAN_KINDS, f"one of {list(PLAN_KINDS)}")
        sizes = None
        if kind == "bucket":
            raw = f.get("sizes", lambda v: isinstance(v, dict) and bool(v) and all(
                isinstance(k, str) and is_int(n) and 1 <= n < MAX_DIM for k, n in v.items()),
                "an object of dim name -> size")
            sizes = MappingProxyType(dict(raw))
        elif "sizes" in f.d:
            raise field_error(f.path("sizes"), "is set on the generic plan (only buckets have sizes)")
        weights = tuple(f.get("weights", lambda v: isinstance(v, list) and all(
            is_int(i) and 0 <= i < MAX_COUNT for i in v), "a list of weight indices"))
        kernels = []
        for v, w in f.list("kernels"):
            g = Fields(v, w)
            kernels.append((g.str("name", nonempty=True), g.str("kernel_key", pattern=_MD5_RE,
                                                                 what="32 lowercase hex digits")))
        tactics = tuple(TacticStep.from_json(v, w) for v, w in f.list("tactics")) if "tactics" in f.d else None
        threads = CallThreads.from_json(f.d["call_threads"]) if "call_threads" in f.d else None
        return Plan(kind, sizes, Graph.from_json(f.obj("graph").d, f.path("graph")), weights, tuple(kernels),
                    tactics, threads)

    def to_json(self) -> dict:
        d = {"kind": self.kind}
        if self.sizes is not None:
            d["sizes"] = dict(self.sizes)
        d.update({"graph": self.graph.to_json(), "weights": list(self.weights),
                  "kernels": [{"name": n, "kernel_key": k} for n, k in self.kernels]})
        if self.tactics is not None:
            d["tactics"] = [t.to_json() for t in self.tactics]
        if self.call_threads is not None:
            d["call_threads"] = self.call_threads.to_json()
        return d

    def label(self) -> str:
        """``bucket batch=8 seq=128`` or ``generic``."""
        if self.sizes is None:
            return self.kind
        return f"{self.kind} " + " ".join(f"{k}={v}" for k, v in self.sizes.items())


def _decls(f: Fields, key: str) -> tuple:
    """Per tensor, per dim: the name of its dynamic dim, or null."""
    out = []
    for v, w in f.list(key):
        if not isinstance(v, list) or not all(x is None or (isinstance(x, str) and DIM_NAME_RE.fullmatch(x))
                                              for x in v):
            raise field_error(w, f"is {show(v)}, not a list with a dim name or null per dim")
        out.append(tuple(v))
    return tuple(out)


@dataclass(frozen=True)
class Dynamic:
    """The dynamic dims; ``inputs`` / ``outputs``: per model input and flat output, per dim, the
    name of the dynamic dim it is (null: static, or a size that is no single dim); ``buckets``:
    the sizes of the dims (in ``dims`` order) each bucket was tuned for; the batch dims (None: no
    dim forms a batch); the plans (the buckets in ``buckets`` order, then at most one generic plan)."""

    dims: tuple[DynDim, ...]
    inputs: tuple[tuple[str | None, ...], ...]
    outputs: tuple[tuple[str | None, ...], ...]
    buckets: tuple[tuple[int, ...], ...]
    batch: BatchDims | None
    plans: tuple[Plan, ...]

    @staticmethod
    def from_json(d: object, where: str = "dynamic") -> Dynamic:
        f = Fields(d, where)
        dims = tuple(DynDim.from_json(v, w) for v, w in f.list("dims"))
        if not dims:
            raise field_error(f.path("dims"), "is empty; a dynamic bundle declares at least one dim")
        buckets = tuple(tuple(b) for b in f.get("buckets", lambda v: isinstance(v, list) and all(
            isinstance(b, list) and all(is_int(n) and 1 <= n < MAX_DIM for n in b) for b in v),
            "a list of size lists (one size per dim)"))
        batch = BatchDims.from_json(f.d["batch"], f.path("batch")) if f.d.get("batch") is not None else None
        if "batch" not in f.d:
            raise field_error(f.path("batch"), "is missing (null when no dim forms a batch)")
        plans = tuple(Plan.from_json(v, w) for v, w in f.list("plans"))
        return Dynamic(dims, _decls(f, "inputs"), _decls(f, "outputs"), buckets, batch, plans).check(where)

    def check(self, where: str = "dynamic") -> Dynamic:
        """Cross-field rules: dim names distinct, bucket sizes in range and distinct, one generic
        plan at most and after the buckets, the batch dim declared."""
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise field_error(f"{where}.dims", f"names a dim twice ({names})")
        for key in ("inputs", "outputs"):
            unknown = sorted({n for decl in getattr(self, key) for n in decl if n is not None} - set(names))
            if unknown:
                raise field_error(f"{where}.{key}", f"names dims {unknown} that are not declared ({names})")
        if not self.plans:
            raise field_error(f"{where}.plans", "is empty")
        ranges = {d.name: d for d in self.dims}
        seen = set()
        for i, p in enumerate(self.plans):
            w = f"{where}.plans[{i}]"
            if p.kind == "generic" and i != len(self.plans) - 1:
                raise field_error(f"{w}.kind", "is generic but not the last plan (one generic plan, after the buckets)")
            if p.sizes is None:
                continue
            if set(p.sizes) != set(names):
                raise field_error(f"{w}.sizes", f"names dims {sorted(p.sizes)}, the bundle declares {sorted(names)}")
            for k, n in p.sizes.items():
                if not ranges[k].min <= n <= ranges[k].max:
                    raise field_error(f"{w}.sizes.{k}", f"is {n}, outside [{ranges[k].min}, {ranges[k].max}]")
            key = tuple(p.sizes[k] for k in names)
            if key in seen:
                raise field_error(f"{w}.sizes", f"repeats bucket {dict(p.sizes)}")
            seen.add(key)
        sizes = [tuple(p.sizes.get(n) for n in names) for p in self.plans if p.sizes is not None]
        if list(self.buckets) != sizes:
            raise field_error(f"{where}.buckets", f"is {[list(b) for b in self.buckets]}, the buckets' plans have "
                                                  f"{[list(b) for b in sizes]}")
        if self.batch is not None and self.batch.dim not in ranges:
            raise field_error(f"{where}.batch.dim", f"is {self.batch.dim!r}, not a declared dim ({names})")
        return self

    def to_json(self) -> dict:
        return {"dims": [d.to_json() for d in self.dims], "inputs": [list(d) for d in self.inputs],
                "outputs": [list(d) for d in self.outputs], "buckets": [list(b) for b in self.buckets],
                "batch": self.batch.to_json() if self.batch is not None else None,
                "plans": [p.to_json() for p in self.plans]}

    @property
    def generic(self) -> Plan | None:
        return self.plans[-1] if self.plans[-1].kind == "generic" else None

    def bucket(self, sizes: dict[str, int]) -> Plan | None:
        """The bucket plan built for exactly ``sizes`` (None: off-bucket)."""
        for p in self.plans:
            if p.sizes is not None and dict(p.sizes) == sizes:
                return p
        return None


__all__ = ["DynDim", "BatchDims", "Plan", "Dynamic", "dynamic_dims", "DIM_NAME_RE"]
