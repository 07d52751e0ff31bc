"""Load a verified bundle and call it like the eager model (docs/DESIGN.md §4.1).

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
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .constants import GRAPH_ABI_VERSION, MANIFEST_NAME, REBUILD
from .errors import CacheIOError, GraphLoadError, KernelMismatchError, TamperedExtractionError
from .extract import Extracted, check_libraries, open_bundle
from .host import tuned_cap_here
from .manifest import IOSpec, Manifest
from .outputs import OutputBuilder
from .tensor_meta import DTYPES, same_layout
from .threads import check_threads, intra_op_threads

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


class Model:
    """A loaded bundle. Call it like the eager model: ``model(*inputs)``.

    Attributes:
        manifest: the bundle's manifest as JSON (dict); ``contract`` the same, typed.
        input_specs / output_specs: :class:`TensorSpec` per model input / flat output.
        directory: where the verified bundle was extracted.
        threads: the thread cap of its calls (None: none): ``load(threads=...)``, else the cap
            the build chose (manifest ``call_threads``) where this host is like the build host,
            see :func:`load`; ``threads_note`` says why a recorded cap was not applied (None: it
            was, or there is none).

    Calls are serialized per Model (the graph's planned buffers are shared by calls); load
    the bundle once per thread for parallel calls.
    """

    def __init__(self, extracted: Extracted, threads: int | None = None):
        m = extracted.contract if extracted.contract is not None else Manifest.from_json(extracted.manifest)
        # the caller's cap, else the one PGO chose for the bundle's calls on a host like this one
        tuned, self.threads_note = tuned_cap_here(m)
        self.threads = check_threads(threads) if threads is not None else tuned
        self.contract = m
        self.manifest = extracted.manifest
        self.path = extracted.path
        self.directory = extracted.directory
        self.bundle_sha256 = extracted.bundle_sha256
        self.extracted = extracted.extracted   # True when this load extracted the bundle (else reused)
        self.name = m.model_name or "model"
        self.input_specs = [TensorSpec.of(s) for s in m.inputs]
        self.output_specs = [TensorSpec.of(s) for s in m.outputs]
        self._mutated = [mu.index for mu in m.mutations]
        self._aliases = {i: o.input_index for i, o in enumerate(m.outputs) if o.input_index is not None}
        self._build_outputs = _output_builder(m)
        self._handle = None
        self._ops = None
        weights = _load_weights(self.directory, m)
        if m.backend == "npu" and not m.target.emulated:  # a device npu graph's weights live on the NPU
            from .npu_host import to_npu
            weights = to_npu(weights)
        check_libraries(self.directory, m)   # right before graph.so (and through it the kernels) is dlopen()ed
        self._ops = _graph_ops(self.directory, m)
        try:
            # under the calls' thread count: oneDNN packs a weight for the threads it will run on
            # (packed for 2 and run on 1, a convolution took 4.6x as long)
            with intra_op_threads(self.threads):
                self._handle = self._ops.init(weights, str(self.directory))
        except RuntimeError as e:
            msg = _first_line(e)
            cls = KernelMismatchError if ("is not the kernel this graph was built with" in msg
                                          or "does not export" in msg) else GraphLoadError
            lib = m.graph.library
            member = next((k.file for k in m.kernels if k.file in msg), lib)
            raise cls(f"{self.path}: the graph ({lib}) refused to load: {msg}; rebuild the bundle",
                      member=member, fix="rebuild the bundle") from None
        self._run = self._ops.run
        if self.threads is not None:
            _cap_kernel_threads(self._ops, self._handle, self.threads, self.name)
        # per input: (dtype, shape, exact stride) accepted without any copy or further check
        self._fast = [(sp.dtype, torch.Size(sp.shape), sp.stride) for sp in self.input_specs]

    # ------------------------------------------------------------------------------------
    def _fits(self, inputs: tuple) -> bool:
        """Every input exactly as the graph expects, none requiring grad: the call needs no copy,
        no check here (the graph checks dtypes, shapes and strides again) and no autograd guard.
        Part of every call: ~0.5 µs per input (``is_cpu``, not ``device.type``: 0.3 µs less)."""
        if len(inputs) != len(self._fast):
            return False
        for t, (dtype, shape, stride) in zip(inputs, self._fast):
            if (type(t) is not torch.Tensor or t.dtype is not dtype or t.shape != shape
                    or (stride is not None and t.stride() != stride) or not t.is_cpu or t.requires_grad
                    or t.is_conj() or t.is_neg() or t.layout is not torch.strided):
                return False
        return True

    def _prepare(self, inputs: tuple) -> tuple[list, dict]:
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
        if self.threads is None:  # no cap: no context manager either (1.3 µs of a small call)
            return self._run_flat(inputs)
        with intra_op_threads(self.threads):  # torch's intra-op threads on this thread, for this call
            return self._run_flat(inputs)

    def _run_flat(self, inputs: tuple) -> list[torch.Tensor]:
        if self._handle is None:
            raise RuntimeError(f"model {self.name!r} was closed")
        if self._fits(inputs):  # no copy, no autograd: skip the no_grad context too
            flat = self._run(self._handle, list(inputs))
        else:
            prepared, copies = self._prepare(inputs)
            with torch.no_grad():
                flat = list(self._run(self._handle, prepared))
                for i in self._mutated:
                    if i in copies:
                        copies[i].copy_(prepared[i])
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


def _graph_ops(directory: Path, m: Manifest):
    """The operator namespace registered by the bundle's graph.so (loaded once per process)."""
    g = m.graph
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
    want = [{"name": k.name, "kernel_key": k.kernel_key, "file": k.file} for k in m.kernels]
    have = sig.get("kernels") if isinstance(sig, dict) else None
    if sorted(json.dumps(k, sort_keys=True) for k in want) != \
            sorted(json.dumps(k, sort_keys=True) for k in (have or [])):
        raise KernelMismatchError(f"{lib.name} was built for kernels {have}, the manifest lists {want}; the "
                                  f"bundle was assembled from mismatched files: {REBUILD}", member=g.library,
                                  fix=REBUILD)
    counts = {"n_inputs": len(m.inputs), "n_outputs": len(m.outputs), "n_weights": len(m.weights.tensors)}
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


def load(path: str | Path, *, cache_dir: str | Path | None = None, verify: str = "sizes",
         trusted_keys=None, threads: int | None = None) -> Model:
    """Verify, extract (content-addressed, atomic) and load an ``.ascpack`` bundle.

    ``cache_dir`` defaults to ``$ASCENDC_PACK_RUNTIME_CACHE`` or
    ``~/.cache/ascendc_pack_runtime``; ``verify="full"`` rehashes every member of an earlier
    extraction before reusing it (libraries are always rehashed). ``trusted_keys`` (public keys
    ``ed25519:<hex>`` or key files; default ``$ASCENDC_PACK_RUNTIME_TRUSTED_KEYS``, refused when
    set but empty) refuses any bundle not signed by one of them, before anything is extracted or
    loaded, and rehashes every member of an earlier extraction (weights included). Raises a
    :class:`~ascendc_pack_runtime.errors.BundleError` subclass that names the problem and the fix.

    ``threads`` caps every call at that many threads: the fused kernels (at most their tuned
    block_dim) and torch's intra-op threads for the ATen steps, set on the calling thread for
    the call and restored after (a per-thread OpenMP setting: other threads keep theirs).
    None (default): the cap the build measured to be fastest for the whole call (manifest
    ``call_threads``: e.g. 1 for a small model on a host where waking a second core costs more
    than it saves) where this host has the build host's usable cores and CPU model (elsewhere
    the trade-off is another one: ``Model.threads_note`` says why it was not applied), or no cap
    if it chose every core or predates the choice; then the kernels use their block_dim and
    torch its current setting. On a shared host, cap each of K models
    served side by side at cores // K (:mod:`.threads`).
    """
    threads = check_threads(threads)
    return Model(open_bundle(path, cache_dir=cache_dir, verify=verify, trusted_keys=trusted_keys), threads)


__all__ = ["load", "Model", "TensorSpec"]
