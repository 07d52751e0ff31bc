"""The parts of a loaded bundle both :class:`~ascendc_pack_runtime.model.Model` (a static bundle)
and :class:`~ascendc_pack_runtime.dynamic_model.DynamicModel` (a bundle with dynamic dims, a graph
per plan) use: the weights mapped from weights.bin, a graph.so's operators checked against the
manifest, the init of a graph state, the output structure (docs/DESIGN.md §4.1)."""

from __future__ import annotations

import json
import mmap
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .constants import GRAPH_ABI_VERSION, MANIFEST_NAME, REBUILD
from .errors import CacheIOError, GraphLoadError, KernelMismatchError, TamperedExtractionError
from .manifest import IOSpec, Manifest
from .outputs import OutputBuilder
from .tensor_meta import DTYPES
from .threads import intra_op_threads

_LOAD_LOCK = threading.Lock()


def _output_builder(m: Manifest):
    """Rebuilds the model's output structure from the graph's flat outputs: ``out_tree``
    (namedtuples, dicts, ...; validated with the manifest) when the bundle has it, else torch's
    ``out_spec`` (bundles from before it), else a flat tuple with a warning."""
    if m.out_tree is not None:
        return OutputBuilder(m.out_tree)
    try:
        spec = pytree.treespec_loads(m.out_spec)
    except Exception as e:  # noqa: BLE001 - e.g. a container type that is not importable here
        warnings.warn(f"cannot rebuild the output structure of {m.model_name!r} ({e}); calls return a "
                      "flat tuple of tensors", RuntimeWarning, stacklevel=4)
        return tuple
    return lambda flat: pytree.tree_unflatten(flat, spec)


@dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and dtype of a model input or output (``stride``: the layout the
    graph expects for inputs; other layouts are copied into it)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None

    @staticmethod
    def of(spec: IOSpec) -> TensorSpec:
        """The torch view of a manifest input/output entry."""
        return TensorSpec(spec.name, spec.shape, DTYPES[spec.dtype], spec.stride)

    @staticmethod
    def from_json(d: dict, where: str) -> TensorSpec:
        """From a manifest input/output entry (raises ManifestFieldError naming ``where``)."""
        return TensorSpec.of(IOSpec.from_json(d, where))

    def __str__(self) -> str:
        return f"{self.name}: {str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


def example_sizes(model) -> dict[str, int]:
    """Sizes of a bundle of plans' dynamic dims at its first bucket (empty for a static bundle):
    what warm-ups and random inputs use."""
    dynamic = getattr(getattr(model, "contract", None), "dynamic", None)
    plans = dynamic.plans if dynamic is not None else ()
    return next((dict(p.sizes) for p in plans if p.sizes is not None), {})


def concrete_shape(spec: TensorSpec, sizes: dict[str, int]) -> tuple[int, ...]:
    """``spec``'s shape with each named (dynamic) dim at its size in ``sizes``."""
    return tuple(sizes[d] if isinstance(d, str) else d for d in spec.shape)


def _load_weights(directory: Path, m: Manifest) -> list[torch.Tensor]:
    """Zero-copy tensors over a private copy-on-write mapping of weights.bin (the manifest was
    validated: every tensor lies inside the file's declared size, aligned and disjoint)."""
    w = m.weights
    path = directory / w.file
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != m.members[w.file].size:
                raise TamperedExtractionError(f"{path} is {size} bytes, {MANIFEST_NAME} says {m.members[w.file].size}; "
                                              "the extraction was modified: load the bundle again", member=w.file,
                                              fix="load the bundle again")
            # private copy-on-write mapping: zero-copy, and a write never reaches the file
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 0 else None
    except OSError as e:
        raise CacheIOError(f"cannot map {path}: {e}; load the bundle again (was the cache changed or deleted?)",
                           member=w.file, fix="load the bundle again") from None
    tensors = []
    for t in w.tensors:
        dtype = DTYPES[t.dtype]
        if t.nbytes == 0:
            tensors.append(torch.empty_strided(t.shape, t.stride, dtype=dtype))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flat = torch.frombuffer(buf, dtype=dtype, count=t.nbytes // dtype.itemsize, offset=t.offset)
        tensors.append(flat.as_strided(t.shape, t.stride))
    return tensors


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _graph_ops(directory: Path, m: Manifest, g=None, kernels=None, n_weights: int | None = None):
    """The operator namespace registered by a graph.so of the bundle (loaded once per process):
    the bundle's graph, or ``g`` (a dynamic bundle's plan) taking ``kernels`` and ``n_weights``
    weights, checked against its signature."""
    g = g or m.graph
    kernels = m.kernels if kernels is None else kernels
    if g.abi != GRAPH_ABI_VERSION:
        raise KernelMismatchError(f"{MANIFEST_NAME}: field 'graph.abi' is {g.abi}, this runtime speaks "
                                  f"graph ABI {GRAPH_ABI_VERSION}; rebuild the bundle or upgrade the runtime",
                                  field="graph.abi", fix="rebuild the bundle or upgrade the runtime")
    lib = directory / g.library
    with _LOAD_LOCK:
        ops = getattr(torch.ops, g.namespace)
        if not _registered(ops):
            try:
                torch.ops.load_library(str(lib))
            except OSError as e:
                cause = e.__cause__ or e
                raise GraphLoadError(f"cannot load {lib.name} of the bundle: {cause}; it was built "
                                     f"against torch {m.torch.version} (this process "
                                     f"has {torch.__version__}): rebuild the bundle with this torch",
                                     member=g.library, fix="rebuild the bundle with this torch") from None
            if not _registered(ops):
                raise GraphLoadError(f"{lib.name} does not register the operators {g.namespace}::run/init; "
                                     f"the bundle is corrupt: {REBUILD}", member=g.library, fix=REBUILD)
    try:
        sig = json.loads(ops.signature())
    except (RuntimeError, ValueError) as e:
        raise GraphLoadError(f"{lib.name}: cannot read its signature ({e}); rebuild the bundle",
                             member=g.library, fix=REBUILD) from None
    want = [{"name": k.name, "kernel_key": k.kernel_key, "file": k.file} for k in kernels]
    have = sig.get("kernels") if isinstance(sig, dict) else None
    if sorted(json.dumps(k, sort_keys=True) for k in want) != \
            sorted(json.dumps(k, sort_keys=True) for k in (have or [])):
        raise KernelMismatchError(f"{lib.name} was built for kernels {have}, the manifest lists {want}; the "
                                  f"bundle was assembled from mismatched files: {REBUILD}", member=g.library,
                                  fix=REBUILD)
    counts = {"n_inputs": len(m.inputs), "n_outputs": len(m.outputs),
              "n_weights": len(m.weights.tensors) if n_weights is None else n_weights}
    for key, n in counts.items():
        if key in sig and sig[key] != n:
            raise KernelMismatchError(f"{lib.name} was built for {sig[key]} {key[2:]}, the manifest lists {n}; the "
                                      f"bundle was assembled from mismatched files: {REBUILD}", member=g.library,
                                      field=key[2:], fix=REBUILD)
    if sig.get("graph_abi") != GRAPH_ABI_VERSION:
        raise KernelMismatchError(f"{lib.name} speaks graph ABI {sig.get('graph_abi')}, this runtime "
                                  f"{GRAPH_ABI_VERSION}; rebuild the bundle", member=g.library, fix=REBUILD)
    return ops


def _cap_kernel_threads(ops, handle: int, threads: int, name: str) -> None:
    """Cap the fused kernels' threads (graph op ``set_threads``; graphs built before it lack it)."""
    try:
        set_threads = ops.set_threads
    except (AttributeError, RuntimeError):
        warnings.warn(f"model {name!r}: its graph.so predates thread caps, so threads={threads} caps torch's "
                      "intra-op threads only and its fused kernels use their tuned block_dim; rebuild the bundle "
                      "to cap them too", RuntimeWarning, stacklevel=4)
        return
    set_threads(handle, threads)


def _registered(ops) -> bool:
    try:
        ops.run  # noqa: B018 - attribute lookup resolves the operator
        ops.signature  # noqa: B018
        return True
    except (AttributeError, RuntimeError):
        return False


def init_graph(ops, weights: list, directory: Path, threads: int | None, m: Manifest, g, path) -> int:
    """``init`` of a loaded graph (``g``) on its weights: the state's handle. A refusal (a kernel
    library that is not the one the graph was built with, ...) is a BundleError naming it."""
    try:
        # under the calls' thread count: oneDNN packs a weight for the threads it will run on
        # (packed for 2 and run on 1, a convolution took 4.6x as long)
        with intra_op_threads(threads):
            return ops.init(weights, str(directory))
    except RuntimeError as e:
        msg = _first_line(e)
        cls = KernelMismatchError if ("is not the kernel this graph was built with" in msg
                                      or "does not export" in msg) else GraphLoadError
        member = next((k.file for k in m.kernels if k.file in msg), g.library)
        raise cls(f"{path}: the graph ({g.library}) refused to load: {msg}; rebuild the bundle",
                  member=member, fix="rebuild the bundle") from None


def release_graph(ops, handle: int | None) -> None:
    """Release a graph state, outside whatever torch is tracing on this thread.

    ``release`` is a dispatcher op, and ``close()`` runs from garbage collection too, which can
    strike in the middle of someone else's ``torch.export`` / ``make_fx``: called under the tracer's
    modes, the op would land in *their* graph (a ``release`` node; between two placeholders it
    broke torch.export's dynamic-shape check) instead of running. Errors are swallowed
    (interpreter shutdown)."""
    if handle is None or ops is None:
        return
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            ops.release(handle)
    except Exception:  # noqa: BLE001 - interpreter shutdown
        pass


class Closing:
    """``with`` and garbage collection release a loaded model (its ``close()``, idempotent)."""

    def close(self) -> None:  # pragma: no cover - every model defines it
        raise NotImplementedError

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
