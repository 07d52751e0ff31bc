"""Load a verified bundle and call it like the eager model (DESIGN 4.8).

:func:`load` verifies and extracts the bundle (:mod:`.bundle`), maps ``weights.bin`` without
copying (a private, copy-on-write ``mmap``), loads ``graph.so`` (it registers the operators
``<namespace>::init/run/release/signature``) and creates the graph state: the graph
``dlopen``-s every kernel library and checks it against the ``kernel_key`` baked into it, and
plans its intermediate buffers once. :class:`Model` checks inputs (a clear ``ValueError`` for
a wrong count, shape, dtype or device), calls the graph, writes input mutations back and
rebuilds the eager model's output structure.
"""

from __future__ import annotations

import json
import mmap
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .bundle import (GRAPH_LIBRARY, Extracted, open_bundle)
from .errors import GraphLoadError, KernelMismatchError, ManifestFieldError
from .outputs import OutputBuilder
from .tensor_meta import DTYPES, same_layout

GRAPH_ABI_VERSION = 1

_NAMESPACE_RE = re.compile(r"ascpack_[0-9a-f]{8,64}")
_LOAD_LOCK = threading.Lock()


def _dtype(name: object, where: str) -> torch.dtype:
    try:
        return DTYPES[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ManifestFieldError(f"manifest.json: field {where!r} has unsupported dtype {name!r}; rebuild the "
                                 "bundle or upgrade the runtime", field=where,
                                 fix="rebuild the bundle or upgrade the runtime") from None


@dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and dtype of a model input or output (``stride``: the layout the
    graph expects for inputs; other layouts are copied into it)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None

    @staticmethod
    def from_json(d: dict, where: str) -> TensorSpec:
        try:
            shape = tuple(int(s) for s in d["shape"])
            stride = tuple(int(s) for s in d["stride"]) if d.get("stride") is not None else None
            return TensorSpec(str(d["name"]), shape, _dtype(d["dtype"], where), stride)
        except (KeyError, TypeError, ValueError):
            raise ManifestFieldError(f"manifest.json: field {where!r} is malformed ({str(d)[:200]}); the bundle "
                                     "is corrupt: rebuild it", field=where, fix="rebuild the bundle") from None

    def __str__(self) -> str:
        return f"{self.name}: {str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


def _output_builder(manifest: dict, name: str, n_outputs: int):
    """Rebuilds the model's output structure from the flat outputs of the graph.

    ``out_tree`` (namedtuples, dicts, ...) when the bundle has it; else torch's ``out_spec``
    (bundles from before ``out_tree``); a flat tuple, with a warning, when neither can be used."""
    tree = manifest.get("out_tree")
    if tree is not None:
        try:
            builder = OutputBuilder(tree)
        except ValueError as e:
            raise ManifestFieldError(f"manifest.json: field 'out_tree' is malformed ({e}); the bundle is "
                                     "corrupt: rebuild it", field="out_tree", fix="rebuild the bundle") from None
        if builder.n_leaves != n_outputs:
            raise ManifestFieldError(f"manifest.json: field 'out_tree' holds {builder.n_leaves} tensors but "
                                     f"'outputs' lists {n_outputs}; the bundle is corrupt: rebuild it",
                                     field="out_tree", fix="rebuild the bundle")
        return builder
    try:
        spec = pytree.treespec_loads(manifest["out_spec"])
    except Exception as e:  # noqa: BLE001 - e.g. a container type that is not importable here
        warnings.warn(f"cannot rebuild the output structure of {name!r} ({e}); calls return a "
                      "flat tuple of tensors", RuntimeWarning, stacklevel=4)
        return tuple
    return lambda flat: pytree.tree_unflatten(flat, spec)


def _load_weights(directory: Path, manifest: dict) -> list[torch.Tensor]:
    info = manifest["weights"]
    path = directory / str(info.get("file", ""))
    entries = info.get("tensors")
    if not isinstance(entries, list):
        raise ManifestFieldError("manifest.json: field 'weights.tensors' is missing; the bundle is corrupt: "
                                 "rebuild it", field="weights.tensors", fix="rebuild the bundle")
    size = path.stat().st_size
    buf = None
    if size > 0:
        with open(path, "rb") as f:
            # private copy-on-write mapping: zero-copy, and a write never reaches the file
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors = []
    for k, e in enumerate(entries):
        where = f"weights.tensors[{k}]"
        dtype = _dtype(e.get("dtype"), where)
        try:
            shape = tuple(int(s) for s in e["shape"])
            stride = tuple(int(s) for s in e["stride"])
            offset, nbytes = int(e["offset"]), int(e["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise ManifestFieldError(f"manifest.json: field {where!r} is malformed; the bundle is corrupt: "
                                     "rebuild it", field=where, fix="rebuild the bundle") from None
        itemsize = dtype.itemsize
        span = 0 if any(s == 0 for s in shape) else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        if len(shape) != len(stride) or any(st < 0 for st in stride) or nbytes != span * itemsize \
                or offset < 0 or offset % itemsize or offset + nbytes > size:
            raise ManifestFieldError(f"manifest.json: field {where!r} ({e.get('name')}) does not fit weights.bin "
                                     f"(offset {offset}, {nbytes} bytes, file {size} bytes); the bundle "
                                     "is corrupt: rebuild it", field=where, fix="rebuild the bundle")
        if nbytes == 0:
            tensors.append(torch.empty_strided(shape, stride, dtype=dtype))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flat = torch.frombuffer(buf, dtype=dtype, count=span, offset=offset)
        tensors.append(flat.as_strided(shape, stride))
    return tensors


class Model:
    """A loaded bundle. Call it like the eager model: ``model(*inputs)``.

    Attributes:
        manifest: the bundle's manifest (dict).
        input_specs / output_specs: :class:`TensorSpec` per model input / flat output.
        directory: where the verified bundle was extracted.

    Calls are serialized per Model (the graph's planned buffers are shared by calls); load
    the bundle once per thread for parallel calls.
    """

    def __init__(self, extracted: Extracted):
        m = extracted.manifest
        self.manifest = m
        self.path = extracted.path
        self.directory = extracted.directory
        self.bundle_sha256 = extracted.bundle_sha256
        self.extracted = extracted.extracted   # True when this load extracted the bundle (else reused)
        self.name = str(m.get("model", {}).get("name", "model"))
        self.input_specs = [TensorSpec.from_json(d, f"inputs[{i}]") for i, d in enumerate(m["inputs"])]
        self.output_specs = [TensorSpec.from_json(d, f"outputs[{i}]") for i, d in enumerate(m["outputs"])]
        self._input_index = {s.name: i for i, s in enumerate(self.input_specs)}
        self._mutated = []
        for mu in m["mutations"]:
            if not isinstance(mu, dict) or mu.get("input") not in self._input_index:
                raise ManifestFieldError(f"manifest.json: field 'mutations': {mu!r} names no input; the bundle "
                                         "is corrupt: rebuild it", field="mutations", fix="rebuild the bundle")
            self._mutated.append(self._input_index[mu["input"]])
        self._aliases = {}
        for i, o in enumerate(m["outputs"]):
            if o.get("input_index") is not None:
                self._aliases[i] = int(o["input_index"])
        self._build_outputs = _output_builder(m, self.name, len(self.output_specs))
        self._handle = None
        self._ops = None
        weights = _load_weights(self.directory, m)
        self._ops = _graph_ops(self.directory, m)
        try:
            self._handle = self._ops.init(weights, str(self.directory))
        except RuntimeError as e:
            msg = _first_line(e)
            cls = KernelMismatchError if ("is not the kernel this graph was built with" in msg
                                          or "does not export" in msg) else GraphLoadError
            lib = str(m["graph"].get("library", GRAPH_LIBRARY))
            member = next((k["file"] for k in m["kernels"] if k.get("file") and k["file"] in msg), lib)
            raise cls(f"{self.path}: the graph ({lib}) refused to load: {msg}; rebuild the bundle",
                      member=member, fix="rebuild the bundle") from None
        self._run = self._ops.run
        # per input: (dtype, shape, exact stride) accepted without any copy or further check
        self._fast = [(sp.dtype, torch.Size(sp.shape), sp.stride) for sp in self.input_specs]

    # ------------------------------------------------------------------------------------
    def _prepare(self, inputs: tuple) -> tuple[list, dict]:
        if len(inputs) == len(self._fast):  # fast path: every input exactly as the graph expects
            for t, (dtype, shape, stride) in zip(inputs, self._fast):
                if (type(t) is not torch.Tensor or t.dtype is not dtype or t.shape != shape
                        or (stride is not None and t.stride() != stride) or t.device.type != "cpu"
                        or t.is_conj() or t.is_neg() or t.layout is not torch.strided):
                    break
            else:
                return list(inputs), {}
        specs = self.input_specs
        if len(inputs) != len(specs):
            names = ", ".join(s.name for s in specs)
            raise ValueError(f"model {self.name!r} takes {len(specs)} input(s) ({names}), got {len(inputs)}")
        prepared, copies = list(inputs), {}
        for i, (t, s) in enumerate(zip(inputs, specs)):
            label = f"input {i} ({s.name})"
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise ValueError(f"{label} is on {t.device}; this bundle runs on cpu, move it with .cpu()")
            if t.layout != torch.strided:
                raise ValueError(f"{label} has layout {t.layout}; pass a dense (strided) tensor")
            if t.dtype != s.dtype:
                raise ValueError(f"{label} has dtype {t.dtype}, expected {s.dtype} (convert it with "
                                 f".to({s.dtype}))")
            if tuple(t.shape) != s.shape:
                raise ValueError(f"{label} has shape {list(t.shape)}, expected {list(s.shape)}; the "
                                 "bundle was built for static shapes")
            stride = s.stride
            if (stride is not None and not same_layout(t.shape, t.stride(), s.shape, stride)) \
                    or t.is_conj() or t.is_neg():
                c = torch.empty_strided(s.shape, stride or t.stride(), dtype=s.dtype)
                with torch.no_grad():
                    c.copy_(t)
                prepared[i] = c
                copies[i] = t
        return prepared, copies

    def run_flat(self, *inputs) -> list[torch.Tensor]:
        """Call the graph and return its outputs flat (the order of ``output_specs``)."""
        if self._handle is None:
            raise RuntimeError(f"model {self.name!r} was closed")
        prepared, copies = self._prepare(inputs)
        if copies or any(t.requires_grad for t in prepared):
            with torch.no_grad():
                flat = list(self._run(self._handle, prepared))
                for i in self._mutated:
                    if i in copies:
                        copies[i].copy_(prepared[i])
        else:  # no autograd involved: skip the no_grad context (a measurable part of a small call)
            flat = list(self._run(self._handle, prepared))
        for out_i, in_i in self._aliases.items():
            flat[out_i] = inputs[in_i]
        return flat

    def __call__(self, *inputs):
        return self._build_outputs(self.run_flat(*inputs))

    def close(self) -> None:
        """Release the graph state (planned buffers, kernel libraries). Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None and self._ops is not None:
            try:
                self._ops.release(handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        outs = ", ".join(map(str, self.output_specs))
        return f"<ascendc_pack_runtime.Model {self.name!r} ({ins}) -> ({outs}), {self.path}>"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _graph_ops(directory: Path, manifest: dict):
    """The operator namespace registered by the bundle's graph.so (loaded once per process)."""
    g = manifest["graph"]
    ns = g.get("namespace")
    if not isinstance(ns, str) or not _NAMESPACE_RE.fullmatch(ns):
        raise ManifestFieldError(f"manifest.json: field 'graph.namespace' is {ns!r}, not a valid namespace; the "
                                 "bundle is corrupt: rebuild it", field="graph.namespace", fix="rebuild the bundle")
    if g.get("abi") != GRAPH_ABI_VERSION:
        raise KernelMismatchError(f"manifest.json: field 'graph.abi' is {g.get('abi')!r}, this runtime speaks "
                                  f"graph ABI {GRAPH_ABI_VERSION}; rebuild the bundle or upgrade the runtime",
                                  field="graph.abi", fix="rebuild the bundle or upgrade the runtime")
    lib = directory / str(g.get("library", GRAPH_LIBRARY))
    with _LOAD_LOCK:
        ops = getattr(torch.ops, ns)
        if not _registered(ops):
            try:
                torch.ops.load_library(str(lib))
            except OSError as e:
                cause = e.__cause__ or e
                raise GraphLoadError(f"cannot load {lib.name} of the bundle: {cause}; it was built "
                                     f"against torch {manifest['torch'].get('version')} (this process "
                                     f"has {torch.__version__}): rebuild the bundle with this torch",
                                     member=lib.name, fix="rebuild the bundle with this torch") from None
            if not _registered(ops):
                raise GraphLoadError(f"{lib.name} does not register the operators {ns}::run/init; "
                                     "the bundle is corrupt: rebuild it", member=lib.name, fix="rebuild the bundle")
    try:
        sig = json.loads(ops.signature())
    except (RuntimeError, ValueError) as e:
        raise GraphLoadError(f"{lib.name}: cannot read its signature ({e}); rebuild the bundle",
                             member=lib.name, fix="rebuild the bundle") from None
    want = [{"name": k.get("name"), "kernel_key": k.get("kernel_key"), "file": k.get("file")}
            for k in manifest["kernels"]]
    have = sig.get("kernels")
    if sorted(json.dumps(k, sort_keys=True) for k in want) != \
            sorted(json.dumps(k, sort_keys=True) for k in (have or [])):
        raise KernelMismatchError(f"{lib.name} was built for kernels {have}, the manifest lists {want}; the "
                                  "bundle was assembled from mismatched files: rebuild it", member=lib.name,
                                  fix="rebuild the bundle")
    counts = {"n_inputs": len(manifest["inputs"]), "n_outputs": len(manifest["outputs"]),
              "n_weights": len(manifest["weights"].get("tensors", []))}
    for key, n in counts.items():
        if key in sig and sig[key] != n:
            raise KernelMismatchError(f"{lib.name} was built for {sig[key]} {key[2:]}, the manifest lists {n}; the "
                                      "bundle was assembled from mismatched files: rebuild it", member=lib.name,
                                      field=key[2:], fix="rebuild the bundle")
    if sig.get("graph_abi") != GRAPH_ABI_VERSION:
        raise KernelMismatchError(f"{lib.name} speaks graph ABI {sig.get('graph_abi')}, this runtime "
                                  f"{GRAPH_ABI_VERSION}; rebuild the bundle", member=lib.name, fix="rebuild the bundle")
    return ops


def _registered(ops) -> bool:
    try:
        ops.run  # noqa: B018 - attribute lookup resolves the operator
        ops.signature  # noqa: B018
        return True
    except (AttributeError, RuntimeError):
        return False


def load(path: str | Path, *, cache_dir: str | Path | None = None, verify: str = "sizes") -> Model:
    """Verify, extract (content-addressed, atomic) and load an ``.ascpack`` bundle.

    ``cache_dir`` defaults to ``$ASCENDC_PACK_RUNTIME_CACHE`` or
    ``~/.cache/ascendc_pack_runtime``; ``verify="full"`` rehashes an earlier extraction
    before reusing it. Raises a :class:`~ascendc_pack_runtime.errors.BundleError` subclass
    that names the problem and the fix.
    """
    return Model(open_bundle(path, cache_dir=cache_dir, verify=verify))


__all__ = ["load", "Model", "TensorSpec"]
