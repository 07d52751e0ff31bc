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

from pathlib import Path

import torch

from .extract import Extracted, check_libraries, open_bundle
from .host import tuned_cap_here
from .manifest import Manifest
from .model_parts import (Closing, TensorSpec, _cap_kernel_threads, _graph_ops, _load_weights, _output_builder,  # noqa: F401
                          init_graph, release_graph)
from .tensor_meta import same_layout
from .threads import check_threads, intra_op_threads


class Model(Closing):
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
        self._handle = init_graph(self._ops, weights, self.directory, self.threads, m, m.graph, self.path)
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

    def namespace_for(self, *inputs) -> str:
        """The namespace of the graph a call with ``inputs`` runs (its profiler events'
        ``<namespace>::run``): the bundle's one graph."""
        return self.contract.graph.namespace

    def close(self) -> None:
        """Release the graph state (planned buffers, kernel libraries). Idempotent."""
        handle, self._handle = self._handle, None
        release_graph(self._ops, handle)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        outs = ", ".join(map(str, self.output_specs))
        return f"<ascendc_pack_runtime.Model {self.name!r} ({ins}) -> ({outs}), {self.path}>"


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
    A bundle with dynamic dims loads as a :class:`~ascendc_pack_runtime.dynamic_model.DynamicModel`
    (called the same way; each call runs the plan for its sizes).

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
    extracted = open_bundle(path, cache_dir=cache_dir, verify=verify, trusted_keys=trusted_keys)
    if extracted.contract is not None and extracted.contract.dynamic is not None:
        from .dynamic_model import DynamicModel

        return DynamicModel(extracted, threads)
    return Model(extracted, threads)


__all__ = ["load", "Model", "TensorSpec"]
