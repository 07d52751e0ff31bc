"""The bundle contract: ``manifest.json`` as frozen dataclasses (docs/FORMAT.md).

One schema for the writer (``ascendc_pack.package.bundle`` builds a :class:`Manifest` and writes
:meth:`Manifest.dumps`) and every Python reader (verification, extraction, the model, the
tools). Each part has

* ``from_json(value, where)``: checks types and bounds of its fields; every problem is a typed
  :class:`~ascendc_pack_runtime.errors.ManifestFieldError` (``FormatNameError`` /
  ``FormatVersionError`` / ``UnsafeMemberNameError`` where those fit) that names the field path
  (``kernels[0].candidates[1].median_us``) and the fix. Unknown fields are ignored.
* ``to_json()``: a dict with the format's key order, so a bundle built twice is byte-identical.

:meth:`Manifest.validate` checks what spans several parts (files named by the graph, weights
and kernels are members; no member inside another; mutations and aliased outputs name real
inputs; weights inside ``weights.bin``, aligned, disjoint; ``kernel_key`` is the md5 of its
tiling). :meth:`Manifest.from_json` runs it; :func:`parse` reads the JSON bytes first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from .constants import (FORMAT_NAME, FORMAT_VERSION, FORMAT_VERSION_DYNAMIC, MANIFEST_NAME, MAX_DIM,
                        MAX_MEMBER_BYTES, MAX_MEMBERS, REBUILD, SIGNATURE_NAME)
from .errors import FormatNameError, FormatVersionError, ManifestJSONError, MemberPathConflictError
from .names import check_member_name, path_conflicts
from .outputs import count_leaves
from .outputs import validate as validate_tree
from .manifest_dynamic import BatchDims, DynDim, Dynamic, Plan, dynamic_dims
from .manifest_graph import Graph
from .manifest_kernels import Candidate, Kernel, kernel_key_of
from .manifest_tactics import CallThreads, Precision, TacticCandidate, TacticStep
from .schema import MAX_COUNT, Fields, field_error, is_int, loads, show
from .tensor_meta import itemsize, span_elems

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MD5_RE = re.compile(r"[0-9a-f]{32}")


def parse(data: bytes) -> Manifest:
    """The validated :class:`Manifest` of ``manifest.json`` bytes."""
    return Manifest.from_json(loads(data))


# ----------------------------------------------------------------------------- the parts


@dataclass(frozen=True)
class Producer:
    """The tool that wrote the bundle."""

    name: str
    version: str

    @staticmethod
    def from_json(d: object, where: str = "producer") -> Producer:
        f = Fields(d, where)
        return Producer(f.str("name", nonempty=True), f.str("version", nonempty=True))

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version}


@dataclass(frozen=True)
class Target:
    """What the native code was built for: ``arch`` (``platform.machine()``), g++ ``march``,
    ``isa`` (the ``/proc/cpuinfo`` flags that code may use: a host needs all of them) and the
    compiler's version line. npu bundles add ``soc`` (the Ascend SoC the kernels were built for)
    and ``emulated`` (kernels compiled against the CPU emulation of AscendC); both are absent on
    cpu bundles."""

    arch: str
    march: str
    isa: tuple[str, ...]
    compiler: str
    soc: str | None = None
    emulated: bool | None = None

    @staticmethod
    def from_json(d: object, where: str = "target") -> Target:
        f = Fields(d, where)
        soc = f.get("soc", lambda v: isinstance(v, str) and bool(v), "a SoC name", optional=True)
        emulated = f.get("emulated", lambda v: isinstance(v, bool), "true or false", optional=True)
        return Target(f.str("arch"), f.str("march"), f.strs("isa"), f.str("compiler"), soc, emulated)

    def to_json(self) -> dict:
        d = {"arch": self.arch, "march": self.march, "isa": list(self.isa), "compiler": self.compiler}
        if self.soc is not None:
            d["soc"] = self.soc
        if self.emulated is not None:
            d["emulated"] = self.emulated
        return d


@dataclass(frozen=True)
class TorchBuild:
    """The torch graph.so was compiled against (release and ``_GLIBCXX_USE_CXX11_ABI``)."""

    version: str
    cxx11_abi: bool | None

    @staticmethod
    def from_json(d: object, where: str = "torch") -> TorchBuild:
        f = Fields(d, where)
        return TorchBuild(f.str("version", nonempty=True), f.bool("cxx11_abi", nullable=True))

    def to_json(self) -> dict:
        return {"version": self.version, "cxx11_abi": self.cxx11_abi}


@dataclass(frozen=True)
class IOSpec:
    """A model input or flat output: name, static shape, dtype name; ``stride`` (inputs: the
    layout graph.so expects, other layouts are copied into it); ``input_index`` (outputs only:
    the output is that mutated input, returned as the caller's tensor)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] | None = None
    input_index: int | None = None

    @staticmethod
    def from_json(d: object, where: str, *, is_input: bool = False, dims: set[str] | None = None) -> IOSpec:
        """``dims``: the declared dynamic dims of a version-2 bundle; a dim of ``shape`` may then be
        one of them (an output's also a size expression's text), and a dynamic input's ``stride``
        is absent (it is contiguous)."""
        f = Fields(d, where)
        name, dtype = f.str("name"), f.dtype("dtype")
        shape = f.dims("shape") if dims is None else dynamic_dims(f, "shape", names=dims if is_input else None)
        dynamic = any(isinstance(n, str) for n in shape)
        stride = None if dynamic and "stride" not in f.d else f.dims("stride", length=len(shape),
                                                                       optional=not is_input or dynamic)
        index = None if is_input else f.int("input_index", 0, MAX_DIM, optional=True)
        return IOSpec(name, shape, dtype, stride, index)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.stride is not None:
            d["stride"] = list(self.stride)
        if self.input_index is not None:
            d["input_index"] = self.input_index
        return d


@dataclass(frozen=True)
class Mutation:
    """An input the model mutates in place: its name, its index, the program value written back."""

    input: str
    index: int
    value: str

    @staticmethod
    def from_json(d: object, where: str) -> Mutation:
        f = Fields(d, where)
        return Mutation(f.str("input"), f.int("index", 0, MAX_DIM), f.str("value"))

    def to_json(self) -> dict:
        return {"input": self.input, "index": self.index, "value": self.value}


@dataclass(frozen=True)
class WeightSpec:
    """One weight tensor: ``as_strided(shape, stride)`` over ``nbytes`` at ``offset`` of weights.bin."""

    name: str
    fqn: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    nbytes: int

    @staticmethod
    def from_json(d: object, where: str) -> WeightSpec:
        f = Fields(d, where)
        name, fqn, dtype, shape = f.str("name"), f.str("fqn"), f.dtype("dtype"), f.dims("shape")
        stride = f.dims("stride", length=len(shape))
        offset, nbytes = f.int("offset", 0, MAX_MEMBER_BYTES), f.int("nbytes", 0, MAX_MEMBER_BYTES)
        w = WeightSpec(name, fqn, dtype, shape, stride, offset, nbytes)
        if nbytes != w.span_bytes:
            raise field_error(f"{where}.nbytes", f"is {nbytes}, its shape {list(shape)} and strides {list(stride)} "
                                                 f"span {w.span_bytes} bytes")
        return w

    @property
    def span_bytes(self) -> int:
        """Bytes from the first to one past the last element its layout addresses."""
        return span_elems(self.shape, self.stride) * itemsize(self.dtype)

    def to_json(self) -> dict:
        return {"name": self.name, "fqn": self.fqn, "dtype": self.dtype, "shape": list(self.shape),
                "stride": list(self.stride), "offset": self.offset, "nbytes": self.nbytes}


@dataclass(frozen=True)
class Weights:
    """weights.bin and the index of its tensors (in the graph's weight order)."""

    file: str
    alignment: int
    tensors: tuple[WeightSpec, ...]

    @staticmethod
    def from_json(d: object, where: str = "weights") -> Weights:
        f = Fields(d, where)
        file = f.str("file")
        alignment = f.get("alignment", lambda v: is_int(v) and 0 < v <= 1 << 20 and v & (v - 1) == 0,
                          "a power of two up to 2**20")
        return Weights(file, alignment, tuple(WeightSpec.from_json(v, w) for v, w in f.list("tensors")))

    def to_json(self) -> dict:
        return {"file": self.file, "alignment": self.alignment, "tensors": [t.to_json() for t in self.tensors]}


@dataclass(frozen=True)
class Member:
    """A member's size and sha256 (hex)."""

    size: int
    sha256: str

    @staticmethod
    def from_json(d: object, where: str) -> Member:
        f = Fields(d, where)
        return Member(f.int("size", 0, MAX_MEMBER_BYTES),
                      f.str("sha256", pattern=_SHA256_RE, what="64 lowercase hex digits"))

    def to_json(self) -> dict:
        return {"size": self.size, "sha256": self.sha256}


def _format_fields(d: dict) -> int:
    """Check ``format`` and ``format_version`` (their own error classes); return the version."""
    if d.get("format") != FORMAT_NAME:
        raise FormatNameError(f"{MANIFEST_NAME}: field 'format' is {show(d.get('format'))}, expected "
                              f"{FORMAT_NAME!r}; this file is not an ascendc-pack bundle (pass a file written "
                              "by `ascendc-pack build`)", field="format", fix="pass an .ascpack bundle")
    version = d.get("format_version")
    if not is_int(version):
        raise FormatVersionError(f"{MANIFEST_NAME}: field 'format_version' is {show(version)}, not an integer; "
                                 f"the bundle is corrupt: {REBUILD}", field="format_version", fix=REBUILD)
    if version > FORMAT_VERSION_DYNAMIC:
        raise FormatVersionError(f"{MANIFEST_NAME}: field 'format_version' is {version}, newer than this "
                                 f"runtime supports ({FORMAT_VERSION_DYNAMIC}); upgrade ascendc-pack (the runtime)",
                                 field="format_version", fix="upgrade ascendc-pack")
    if version < FORMAT_VERSION:
        raise FormatVersionError(f"{MANIFEST_NAME}: field 'format_version' is {version}, older than this "
                                 f"runtime supports ({FORMAT_VERSION}); rebuild the bundle with a current "
                                 "ascendc-pack", field="format_version", fix=REBUILD)
    return version


def _members(f: Fields) -> Mapping[str, Member]:
    raw = f.get("members", lambda v: isinstance(v, dict), "a JSON object")
    if len(raw) > MAX_MEMBERS:
        raise field_error("members", f"lists {len(raw)} members, more than {MAX_MEMBERS}")
    for special in (MANIFEST_NAME, SIGNATURE_NAME):
        if special in raw:
            raise field_error("members", f"lists {special} (it is never listed: it holds or signs the list)")
    out = {}
    for name, info in raw.items():
        out[check_member_name(name)] = Member.from_json(info, f"members[{name!r}]")
    return out


def _out_tree(tree: object) -> dict | None:
    if tree is None:
        return None
    try:
        validate_tree(tree)
    except ValueError as e:
        raise field_error("out_tree", f"is malformed ({e})") from None
    return tree


@dataclass(frozen=True)
class Manifest:
    """``manifest.json`` of a format-version-1 bundle (docs/FORMAT.md lists every field)."""

    format_version: int
    producer: Producer
    model_name: str
    backend: str
    target: Target
    torch: TorchBuild
    core_limit: int | None
    cores: int
    topn: int
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    mutations: tuple[Mutation, ...]
    out_spec: str
    weights: Weights
    graph: Graph | None               # version 1; a dynamic bundle has a graph per plan
    kernels: tuple[Kernel, ...]
    members: Mapping[str, Member]
    format: str = FORMAT_NAME
    out_tree: Mapping | None = None   # the output structure (ascendc_pack_runtime.outputs); optional
    tactics: tuple[TacticStep, ...] | None = None   # the tactic steps (optional: absent before tactics)
    call_threads: CallThreads | None = None   # the tuned thread cap of a call (optional: absent before it)
    dynamic: Dynamic | None = None    # version 2: the dynamic dims and the plans (manifest_dynamic)
    precision: Precision | None = None   # low precision under an accuracy budget (optional: --precision)

    def __post_init__(self):
        # a read-only view: the manifest is frozen all the way down (members are looked up by name)
        if not isinstance(self.members, MappingProxyType):
            object.__setattr__(self, "members", MappingProxyType(dict(self.members)))

    @staticmethod
    def from_json(d: object) -> Manifest:
        """Check every field (types, bounds, cross-references) and build the manifest."""
        if not isinstance(d, dict):
            raise ManifestJSONError(f"{MANIFEST_NAME} is not a JSON object; the bundle is corrupt: {REBUILD}",
                                    member=MANIFEST_NAME, fix=REBUILD)
        version = _format_fields(d)
        f = Fields(d, "")
        members = _members(f)   # first: a bad member name is the most telling problem
        dynamic = Dynamic.from_json(f.obj("dynamic").d) if version == FORMAT_VERSION_DYNAMIC else None
        names = {dim.name for dim in dynamic.dims} if dynamic is not None else None
        if dynamic is not None and "graph" in d:
            raise field_error("graph", "is set in a dynamic bundle (each of dynamic.plans has its graph)")
        m = Manifest(
            format_version=version,
            producer=Producer.from_json(f.obj("producer").d),
            model_name=f.obj("model").str("name"),
            backend=f.str("backend", nonempty=True),
            target=Target.from_json(f.obj("target").d),
            torch=TorchBuild.from_json(f.obj("torch").d),
            core_limit=f.int("core_limit", 1, MAX_COUNT, nullable=True),
            cores=f.int("cores", 1, MAX_COUNT),
            topn=f.int("topn", 1, MAX_COUNT),
            inputs=tuple(IOSpec.from_json(v, w, is_input=True, dims=names) for v, w in f.list("inputs")),
            outputs=tuple(IOSpec.from_json(v, w, dims=names) for v, w in f.list("outputs")),
            mutations=tuple(Mutation.from_json(v, w) for v, w in f.list("mutations")),
            out_spec=f.str("out_spec"),
            weights=Weights.from_json(f.obj("weights").d),
            graph=Graph.from_json(f.obj("graph").d) if dynamic is None else None,
            kernels=tuple(Kernel.from_json(v, w) for v, w in f.list("kernels")),
            members=members,
            out_tree=_out_tree(d.get("out_tree")),
            tactics=tuple(TacticStep.from_json(v, w) for v, w in f.list("tactics")) if "tactics" in d else None,
            call_threads=CallThreads.from_json(d["call_threads"]) if "call_threads" in d else None,
            dynamic=dynamic,
            precision=Precision.from_json(d["precision"]) if "precision" in d else None,
        )
        m.validate()
        return m

    def validate(self) -> Manifest:
        """Check what spans several fields; raise ManifestFieldError / MemberPathConflictError /
        UnsafeMemberNameError. Returns ``self``."""
        members = self.members
        if len(members) > MAX_MEMBERS:
            raise field_error("members", f"lists {len(members)} members, more than {MAX_MEMBERS}")
        for name in members:
            check_member_name(name)
        for special in (MANIFEST_NAME, SIGNATURE_NAME):
            if special in members:
                raise field_error("members", f"lists {special} (it is never listed: it holds or signs the list)")
        conflict = path_conflicts(members)
        if conflict is not None:
            raise MemberPathConflictError(
                f"{MANIFEST_NAME}: member {conflict[1][:200]!r} cannot be created: {conflict[0][:200]!r} is "
                f"itself a file member; the bundle is corrupt: {REBUILD}", member=conflict[1], fix=REBUILD)
        for where, graph in self.graphs():
            for key in ("library", "source"):
                if getattr(graph, key) not in members:
                    raise field_error(f"{where}.{key}", f"is {show(getattr(graph, key))}, not one of the members")
        for where, name in (("weights.file", self.weights.file),
                            *((f"kernels[{i}].file", k.file) for i, k in enumerate(self.kernels))):
            if name not in members:
                raise field_error(where, f"is {show(name)}, not one of the members")
        self._check_version()
        self._check_io()
        self._check_weights()
        if self.precision is not None:
            missing = sorted(set(self.precision.requires) - set(self.target.isa))
            if missing:
                raise field_error("precision.requires", f"lists {missing}, which target.isa does not: the runtime "
                                  "would not refuse a host without them")
        if self.out_tree is not None and count_leaves(self.out_tree) != len(self.outputs):
            raise field_error("out_tree", f"holds {count_leaves(self.out_tree)} tensors but 'outputs' lists "
                                          f"{len(self.outputs)}")
        return self

    def graphs(self) -> list[tuple[str, Graph]]:
        """(field path, graph) of every graph: the one of a static bundle, one per plan of a
        dynamic bundle."""
        if self.dynamic is None:
            return [("graph", self.graph)]
        return [(f"dynamic.plans[{i}].graph", p.graph) for i, p in enumerate(self.dynamic.plans)]

    def _check_version(self) -> None:
        """Version 1 is a static bundle (one graph); version 2 a dynamic one (``dynamic``, a graph
        per plan whose weights and kernels are entries of ``weights`` and ``kernels``)."""
        if (self.format_version == FORMAT_VERSION_DYNAMIC) != (self.dynamic is not None):
            raise field_error("dynamic", f"is {'missing' if self.dynamic is None else 'set'} in a format_version "
                                         f"{self.format_version} bundle")
        if self.dynamic is None:
            if self.graph is None:
                raise field_error("graph", "is missing")
            return
        self.dynamic.check()
        keys = {(k.name, k.kernel_key) for k in self.kernels}
        for i, p in enumerate(self.dynamic.plans):
            bad = [w for w in p.weights if w >= len(self.weights.tensors)]
            if bad:
                raise field_error(f"dynamic.plans[{i}].weights", f"names weights {bad[:5]}, the bundle has "
                                                                 f"{len(self.weights.tensors)}")
            missing = [n for n, k in p.kernels if (n, k) not in keys]
            if missing:
                raise field_error(f"dynamic.plans[{i}].kernels", f"names kernels {missing[:3]} that 'kernels' "
                                                                 "does not list")
        names = {d.name for d in self.dynamic.dims}
        for key, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            decls = getattr(self.dynamic, key)
            if len(decls) != len(specs):
                raise field_error(f"dynamic.{key}", f"has {len(decls)} entries, the bundle has {len(specs)} {key}")
            for i, (decl, spec) in enumerate(zip(decls, specs)):
                if len(decl) != len(spec.shape) or any(d != n if n is not None else d in names
                                                       for d, n in zip(spec.shape, decl)):
                    raise field_error(f"dynamic.{key}[{i}]", f"is {list(decl)}, not the dims of {key}[{i}].shape "
                                                             f"{list(spec.shape)}")
        if self.dynamic.batch is not None:
            b = self.dynamic.batch
            for key, specs, idx in (("inputs", self.inputs, b.inputs), ("outputs", self.outputs, b.outputs)):
                bad = [i for i in idx if i >= len(specs) or not specs[i].shape or specs[i].shape[0] != b.dim]
                if bad:
                    raise field_error(f"dynamic.batch.{key}", f"lists {bad}, whose dim 0 is not {b.dim!r}")

    def _check_io(self) -> None:
        names = [s.name for s in self.inputs]
        mutated = set()
        for i, mu in enumerate(self.mutations):
            if mu.input not in names:
                raise field_error(f"mutations[{i}].input", f"is {show(mu.input)}, which names no model input")
            if mu.index >= len(names) or names[mu.index] != mu.input:
                raise field_error(f"mutations[{i}].index", f"is {mu.index}, not the position of input {mu.input!r}")
            mutated.add(mu.index)
        for i, o in enumerate(self.outputs):
            if o.input_index is None:
                continue
            if o.input_index >= len(names) or o.input_index not in mutated:
                raise field_error(f"outputs[{i}].input_index", f"is {o.input_index}, not the index of one of the "
                                                               f"inputs the model mutates ({sorted(mutated)})")
            src = self.inputs[o.input_index]
            if (src.shape, src.dtype) != (o.shape, o.dtype):
                raise field_error(f"outputs[{i}].input_index", f"names input {src.name!r} "
                                  f"({src.dtype}{list(src.shape)}), but the output is {o.dtype}{list(o.shape)}")

    def _check_weights(self) -> None:
        w = self.weights
        size = self.members[w.file].size
        spans = []
        for i, t in enumerate(w.tensors):
            where = f"weights.tensors[{i}]"
            if t.offset % w.alignment:
                raise field_error(f"{where}.offset", f"is {t.offset}, not a multiple of weights.alignment "
                                                     f"({w.alignment})")
            if t.offset + t.nbytes > size:
                raise field_error(where, f"(offset {t.offset}, {t.nbytes} bytes) does not fit inside "
                                         f"{w.file} ({size} bytes)")
            if t.nbytes:
                spans.append((t.offset, t.offset + t.nbytes, i))
        spans.sort()
        for (_, end, i), (start, _, j) in zip(spans, spans[1:]):
            if start < end:
                raise field_error(f"weights.tensors[{j}].offset", f"overlaps weights.tensors[{i}] (ends at byte "
                                                                  f"{end}); every weight has its own bytes")

    def to_json(self) -> dict:
        """The manifest as written (key order of the format)."""
        return {
            "format": self.format, "format_version": self.format_version,
            "producer": self.producer.to_json(), "model": {"name": self.model_name}, "backend": self.backend,
            "target": self.target.to_json(), "torch": self.torch.to_json(), "core_limit": self.core_limit,
            "cores": self.cores, "topn": self.topn,
            "inputs": [s.to_json() for s in self.inputs], "outputs": [s.to_json() for s in self.outputs],
            "mutations": [mu.to_json() for mu in self.mutations], "out_spec": self.out_spec,
            **({"out_tree": self.out_tree} if self.out_tree is not None else {}),
            "weights": self.weights.to_json(),
            **({"graph": self.graph.to_json()} if self.graph is not None else {}),
            "kernels": [k.to_json() for k in self.kernels],
            **({"dynamic": self.dynamic.to_json()} if self.dynamic is not None else {}),
            **({"tactics": [t.to_json() for t in self.tactics]} if self.tactics is not None else {}),
            **({"call_threads": self.call_threads.to_json()} if self.call_threads is not None else {}),
            **({"precision": self.precision.to_json()} if self.precision is not None else {}),
            "members": {name: info.to_json() for name, info in self.members.items()},
        }

    def dumps(self) -> bytes:
        """The bytes of ``manifest.json`` as ``ascendc-pack build`` writes them."""
        return (json.dumps(self.to_json(), indent=1) + "\n").encode()

    @property
    def declared_bytes(self) -> int:
        """Sum of the members' sizes."""
        return sum(info.size for info in self.members.values())

    def libraries(self) -> list[str]:
        """The members that are dlopen()ed: every graph.so and every kernel library."""
        return [*(g.library for _, g in self.graphs()), *dict.fromkeys(k.file for k in self.kernels)]


__all__ = ["Manifest", "Producer", "Target", "TorchBuild", "IOSpec", "Mutation", "WeightSpec", "Weights",
           "Graph", "Candidate", "Kernel", "Dynamic", "DynDim", "BatchDims", "Plan", "TacticCandidate", "TacticStep", "CallThreads", "Member", "loads", "parse", "field_error", "check_member_name",
           "path_conflicts", "kernel_key_of"]
