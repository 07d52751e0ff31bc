"""Dynamic dims (docs/DESIGN.md §2.10): what a model declares, its buckets, and the checks.

A model file may define ``get_dynamic_shapes()`` returning exactly what
``torch.export.export(..., dynamic_shapes=...)`` takes: per model input (a tuple/list in input
order, or a dict by ``forward`` argument name) ``None`` (every dim static) or the dynamic dims,
as a dict ``{dim index: torch.export.Dim(name, min=..., max=...)}`` or a tuple/list with a
``Dim`` or ``None`` per dim. Dims that share a name (the same ``Dim``) are one size. The CLI's
common case, ``--dynamic-batch MIN:MAX --buckets B1,B2,...``, declares dim 0 of every input as
``batch`` (:func:`batch_declaration`).

Every distinct shape among the example and calibration inputs is a **bucket**: the build tunes
a static plan for each, exactly as a static build would, plus one generic plan for every other
shape in the declared ranges. :meth:`DynamicShapes.sizes_of` binds a call's inputs to the dims
and refuses one outside the declared ranges with an error naming the input, the dim and the
range.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ascendc_pack.errors import PackError

MAX_DIM_SIZE = 1 << 31
"""Largest declared ``max`` of a dynamic dim (sizes are int64 in the kernels; this keeps every
product of two sizes well inside it)."""


class DynamicShapeError(PackError):
    """A declaration of dynamic dims is wrong, or inputs do not fit it."""


@dataclass(frozen=True)
class DynDim:
    """One dynamic dim: its name and the inclusive range of its sizes."""

    name: str
    min: int
    max: int

    def describe(self) -> str:
        return f"{self.name} in [{self.min}, {self.max}]"


@dataclass(frozen=True)
class DynamicShapes:
    """The declared dynamic dims of a model's inputs.

    ``dims``: every dynamic dim once, in first-use order; ``inputs``: per model input, per dim,
    the name of its dynamic dim or None (a static dim); ``input_names``: the model's input names
    (for messages)."""

    dims: tuple[DynDim, ...]
    inputs: tuple[tuple[str | None, ...], ...]
    input_names: tuple[str, ...]

    def dim(self, name: str) -> DynDim:
        return next(d for d in self.dims if d.name == name)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """Dim name -> (min, max)."""
        return {d.name: (d.min, d.max) for d in self.dims}

    def sizes_of(self, inputs, where: str = "inputs") -> dict[str, int]:
        """The size of every dynamic dim in ``inputs`` (tensors, or shapes), checked: each input
        has the declared rank, every dim of one name has one size, each size is in its range.

        Raises:
            DynamicShapeError: naming the input, the dim and the range.
        """
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t) for t in inputs]
        if len(shapes) != len(self.inputs):
            raise DynamicShapeError(f"{where}: {len(shapes)} inputs, the dynamic-shape declaration has "
                                    f"{len(self.inputs)}")
        sizes: dict[str, int] = {}
        seen: dict[str, str] = {}
        for i, (shape, decl) in enumerate(zip(shapes, self.inputs)):
            label = f"input {i} ({self.input_names[i]})"
            if len(shape) != len(decl):
                raise DynamicShapeError(f"{where}: {label} has {len(shape)} dims, the declaration {len(decl)}")
            for d, name in enumerate(decl):
                if name is None:
                    continue
                dim, n = self.dim(name), int(shape[d])
                if not dim.min <= n <= dim.max:
                    raise DynamicShapeError(
                        f"{where}: {label} dim {d} ({name}) is {n}, outside the declared range "
                        f"[{dim.min}, {dim.max}]; pass a size in that range (or rebuild with a wider range)")
                if name in sizes and sizes[name] != n:
                    raise DynamicShapeError(f"{where}: {label} dim {d} ({name}) is {n} but {seen[name]} is "
                                            f"{sizes[name]}; dims declared with one Dim must have one size")
                sizes.setdefault(name, n)
                seen.setdefault(name, f"{label} dim {d}")
        return sizes

    def bucket_of(self, inputs, where: str = "inputs") -> tuple[int, ...]:
        """The bucket key of ``inputs``: the size of every dim, in ``dims`` order."""
        sizes = self.sizes_of(inputs, where)
        return tuple(sizes[d.name] for d in self.dims)

    def check_static_dims(self, example, other, where: str) -> None:
        """``other`` has the example inputs' dtypes and static dims (dynamic ones may differ)."""
        for i, (a, b, decl) in enumerate(zip(example, other, self.inputs)):
            label = f"input {i} ({self.input_names[i]})"
            if a.dtype != b.dtype:
                raise DynamicShapeError(f"{where}: {label} is {b.dtype}, the example input {a.dtype}; every "
                                        "input set must have the example inputs' dtypes")
            for d, name in enumerate(decl):
                if name is None and a.shape[d] != b.shape[d]:
                    raise DynamicShapeError(
                        f"{where}: {label} dim {d} is {b.shape[d]}, the example input's is {a.shape[d]}, and "
                        "that dim is not declared dynamic; declare it in get_dynamic_shapes() or pass the "
                        "example's size")

    def torch_spec(self) -> tuple:
        """The ``dynamic_shapes`` argument of ``torch.export.export`` for this declaration."""
        dims = {d.name: torch.export.Dim(d.name, min=d.min, max=d.max) for d in self.dims}
        return tuple({k: dims[n] for k, n in enumerate(decl) if n is not None} or None for decl in self.inputs)

    def batch_dim(self, output_dims: list[tuple[str | None, ...]] | None = None) -> str | None:
        """The dim that forms the batch: dim 0 of every input (and of every output, when
        ``output_dims`` gives their dims) is one dynamic dim; None if there is none."""
        leads = {decl[0] if decl else None for decl in self.inputs}
        if output_dims is not None:
            leads |= {decl[0] if decl else None for decl in output_dims}
        if len(leads) != 1:
            return None
        (lead,) = leads
        return lead

    def to_json(self) -> dict:
        return {"dims": [{"name": d.name, "min": d.min, "max": d.max} for d in self.dims],
                "inputs": [list(decl) for decl in self.inputs]}


def parse_declaration(spec, example_inputs, input_names, where: str) -> DynamicShapes:
    """Check ``get_dynamic_shapes()``'s value (torch.export's ``dynamic_shapes`` form) against the
    example inputs and return the declaration.

    Raises:
        DynamicShapeError: naming what is wrong and the fix.
    """
    n = len(example_inputs)
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - set(input_names))
        if unknown:
            raise DynamicShapeError(f"{where}: names {unknown}, which are not inputs of forward() "
                                    f"({', '.join(input_names)}); key the dict by forward()'s argument names")
        per_input = [spec.get(name) for name in input_names]
    elif isinstance(spec, (list, tuple)):
        if len(spec) != n:
            raise DynamicShapeError(f"{where}: has {len(spec)} entries but the model takes {n} inputs; give one "
                                    "entry per input (None for an input with static dims)")
        per_input = list(spec)
    else:
        raise DynamicShapeError(f"{where}: returned {type(spec).__name__}; return a tuple with one entry per "
                                "input, e.g. ({0: Dim('batch', min=1, max=32)}, None)")
    dims: dict[str, DynDim] = {}
    inputs = []
    for i, (entry, t) in enumerate(zip(per_input, example_inputs)):
        label = f"{where} entry {i} ({input_names[i]})"
        decl: list[str | None] = [None] * t.dim()
        if entry is None:
            inputs.append(tuple(decl))
            continue
        if isinstance(entry, dict):
            items = list(entry.items())
        elif isinstance(entry, (list, tuple)):
            if len(entry) != t.dim():
                raise DynamicShapeError(f"{label}: lists {len(entry)} dims but the example input has {t.dim()}")
            items = [(d, x) for d, x in enumerate(entry) if x is not None]
        else:
            raise DynamicShapeError(f"{label}: is {type(entry).__name__}; give a dict {{dim: Dim(...)}}, a "
                                    "list with a Dim or None per dim, or None")
        for d, dim in items:
            if not isinstance(d, int) or isinstance(d, bool) or not -t.dim() <= d < t.dim():
                raise DynamicShapeError(f"{label}: dim {d!r} is not a dim of the example input "
                                        f"(shape {list(t.shape)})")
            decl[d % t.dim()] = _check_dim(dim, f"{label} dim {d}", dims)
            size = t.shape[d]
            dd = dims[decl[d % t.dim()]]
            if not dd.min <= size <= dd.max:
                raise DynamicShapeError(f"{label} dim {d}: the example input's size {size} is outside "
                                        f"{dd.describe()}; widen the range or change the example")
        inputs.append(tuple(decl))
    if not dims:
        raise DynamicShapeError(f"{where}: declares no dynamic dim; return None from get_dynamic_shapes() "
                                "(or drop it) for a static model")
    return DynamicShapes(tuple(dims.values()), tuple(inputs), tuple(input_names))


def _check_dim(dim, where: str, dims: dict[str, DynDim]) -> str:
    from torch.export.dynamic_shapes import Dim, _DerivedDim, _DimHint

    if isinstance(dim, _DerivedDim):
        raise DynamicShapeError(f"{where}: a derived dim ({dim.__name__}) is not supported; declare the dim "
                                "itself with torch.export.Dim(name, min=..., max=...)")
    if isinstance(dim, _DimHint):
        raise DynamicShapeError(f"{where}: {dim} has no declared range; use torch.export.Dim(name, min=..., "
                                "max=...): the range bounds the plans' memory and the sizes a call may pass")
    if not isinstance(dim, Dim):
        raise DynamicShapeError(f"{where}: is {type(dim).__name__}, not a torch.export.Dim; declare "
                                "torch.export.Dim(name, min=..., max=...)")
    name, lo, hi = dim.__name__, dim.min, dim.max
    if not name.isidentifier():
        raise DynamicShapeError(f"{where}: dim name {name!r} is not an identifier; name it like `batch`")
    if not isinstance(hi, int) or hi > MAX_DIM_SIZE:
        raise DynamicShapeError(f"{where}: Dim {name!r} has no finite max (max={hi}); declare "
                                f"torch.export.Dim({name!r}, min=..., max=...) with max <= {MAX_DIM_SIZE}")
    if not isinstance(lo, int) or lo < 1:
        raise DynamicShapeError(f"{where}: Dim {name!r} has min={lo}; declare min >= 1 (a dim of size 0 holds "
                                "no data)")
    if lo > hi:
        raise DynamicShapeError(f"{where}: Dim {name!r} has min {lo} > max {hi}")
    if name in dims and (dims[name].min, dims[name].max) != (lo, hi):
        raise DynamicShapeError(f"{where}: Dim {name!r} is declared twice with different ranges "
                                f"({dims[name].describe()} and [{lo}, {hi}]); declare it once and reuse it")
    dims.setdefault(name, DynDim(name, lo, hi))
    return name


def parse_range(text: str, option: str = "--dynamic-batch") -> tuple[int, int]:
    """``MIN:MAX`` (both >= 1) of the CLI."""
    lo, sep, hi = text.partition(":")
    try:
        lo_n, hi_n = int(lo), int(hi)
    except ValueError:
        lo_n = hi_n = -1
    if not sep or lo_n < 1 or hi_n < lo_n or hi_n > MAX_DIM_SIZE:
        raise DynamicShapeError(f"{option} {text!r}: expected MIN:MAX with 1 <= MIN <= MAX <= {MAX_DIM_SIZE}, "
                                "e.g. --dynamic-batch 1:32")
    return lo_n, hi_n


def parse_buckets(text: str, lo: int, hi: int, option: str = "--buckets") -> list[int]:
    """``B1,B2,...`` of the CLI: distinct sizes inside ``[lo, hi]``, sorted."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        sizes = []
    if not sizes:
        raise DynamicShapeError(f"{option} {text!r}: expected a comma-separated list of sizes, e.g. --buckets 1,8,32")
    bad = [s for s in sizes if not lo <= s <= hi]
    if bad:
        raise DynamicShapeError(f"{option}: {bad} outside the dynamic range [{lo}, {hi}]; give bucket sizes "
                                "inside --dynamic-batch's range")
    return sizes


def batch_declaration(example_inputs, input_names, lo: int, hi: int) -> DynamicShapes:
    """The CLI's declaration: dim 0 of every input is the dynamic dim ``batch`` in ``[lo, hi]``."""
    for i, t in enumerate(example_inputs):
        if t.dim() == 0:
            raise DynamicShapeError(f"--dynamic-batch: input {i} ({input_names[i]}) is a scalar and has no batch "
                                    "dim; declare the dynamic dims in the model file (get_dynamic_shapes())")
    if len({t.shape[0] for t in example_inputs}) != 1:
        raise DynamicShapeError("--dynamic-batch: the example inputs' dim 0 differ "
                                f"({[t.shape[0] for t in example_inputs]}); it is not one batch dim. Declare the "
                                "dynamic dims in the model file (get_dynamic_shapes())")
    if not lo <= example_inputs[0].shape[0] <= hi:
        raise DynamicShapeError(f"--dynamic-batch {lo}:{hi}: the example inputs' batch "
                                f"{example_inputs[0].shape[0]} is outside it")
    return DynamicShapes((DynDim("batch", lo, hi),),
                         tuple(("batch",) + (None,) * (t.dim() - 1) for t in example_inputs), tuple(input_names))


def resize_batch(inputs, size: int) -> tuple[torch.Tensor, ...]:
    """``inputs`` with dim 0 made ``size`` (rows repeated cyclically, or the first ``size`` rows):
    the CLI's input sets at bucket sizes, made from the example inputs."""
    out = []
    for t in inputs:
        idx = torch.arange(size) % t.shape[0]
        out.append(t.index_select(0, idx).contiguous())
    return tuple(out)


def forward_input_names(module: torch.nn.Module, n: int) -> list[str]:
    """The names of ``forward``'s first ``n`` positional parameters (``input_<i>`` if unknown)."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input_{i}" for i in range(n)]


def group_buckets(decl: DynamicShapes, input_sets) -> dict[tuple[int, ...], list[tuple]]:
    """Input sets by bucket (the sizes of the dynamic dims), in first-seen order."""
    out: dict[tuple[int, ...], list[tuple]] = {}
    for k, inputs in enumerate(input_sets):
        where = "example inputs" if k == 0 else f"calibration input set {k - 1}"
        out.setdefault(decl.bucket_of(inputs, where), []).append(tuple(inputs))
    return out
