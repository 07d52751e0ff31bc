"""A loaded bundle with dynamic dims (docs/DESIGN.md §2.10, §4.1): one graph state per plan, each
call run by the plan for its sizes.

:class:`DynamicModel` binds the call's dynamic dims from its inputs (an input outside a declared
range is a ``ValueError`` naming the input, the dim and the range), runs the static plan of the
bucket built for exactly those sizes, else the generic plan (jit kernels, sizes computed per
call), and returns what the eager model returns. ``load()`` returns one for a version-2 bundle.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from .extract import Extracted, check_libraries
from .manifest import Manifest, Plan
from .model_parts import (Closing, TensorSpec, _cap_kernel_threads, _graph_ops, _load_weights, _output_builder,
                          init_graph, release_graph)
from .threads import intra_op_threads


MEMO_SHAPES = 256
"""Input shapes whose plan a model remembers (calls at a remembered shape skip the Python checks;
graph.so checks its inputs on every call anyway)."""


@dataclass
class _PlanState:
    plan: Plan
    ops: object
    handle: int | None


class DynamicModel(Closing):
    """A loaded dynamic bundle; call it like the eager model: ``model(*inputs)``.

    Attributes (besides :class:`~ascendc_pack_runtime.model.Model`'s ``manifest``, ``contract``,
    ``input_specs``/``output_specs`` (a dynamic dim's size is its name), ``directory``, ``threads``):
        dims: dim name -> (min, max) of the declared dynamic dims.
        batch: the dim that forms the batch (dim 0 of every input and output), or None.
        plans: the label of every plan (``bucket batch=8 seq=128`` ..., ``generic``).

    Calls are serialized per model (the plans' buffers are shared by calls).
    """

    def __init__(self, extracted: Extracted, threads: int | None = None):
        m = extracted.contract if extracted.contract is not None else Manifest.from_json(extracted.manifest)
        self.contract, self.manifest = m, extracted.manifest
        self.path, self.directory = extracted.path, extracted.directory
        self.bundle_sha256, self.extracted = extracted.bundle_sha256, extracted.extracted
        self.name = m.model_name or "model"
        self.threads, self.threads_note = threads, None
        self.dims = {d.name: (d.min, d.max) for d in m.dynamic.dims}
        self.batch = m.dynamic.batch.dim if m.dynamic.batch is not None else None
        self.input_specs = [TensorSpec.of(s) for s in m.inputs]
        self.output_specs = [TensorSpec.of(s) for s in m.outputs]
        self._mutated = [mu.index for mu in m.mutations]
        self._aliases = {i: o.input_index for i, o in enumerate(m.outputs) if o.input_index is not None}
        self._build_outputs = _output_builder(m)
        self._lock = threading.Lock()
        self._states: list[_PlanState] = []
        weights = _load_weights(self.directory, m)
        check_libraries(self.directory, m)
        kernels = {(k.name, k.kernel_key): k for k in m.kernels}
        try:
            for plan in m.dynamic.plans:
                ops = _graph_ops(self.directory, m, plan.graph, [kernels[k] for k in plan.kernels], len(plan.weights))
                handle = init_graph(ops, [weights[i] for i in plan.weights], self.directory, threads, m, plan.graph,
                                    self.path)
                self._states.append(_PlanState(plan, ops, handle))
                if threads is not None:
                    _cap_kernel_threads(ops, handle, threads, self.name)
        except BaseException:
            self.close()
            raise
        names = list(self.dims)
        self._buckets = {tuple(s.plan.sizes[n] for n in names): s for s in self._states if s.plan.sizes is not None}
        self._generic = next((s for s in self._states if s.plan.kind == "generic"), None)
        self.plans = [s.plan.label() for s in self._states]
        self._dtypes = [s.dtype for s in self.input_specs]
        self._memo: dict[tuple, _PlanState] = {}   # input shapes already checked -> their plan

    # ------------------------------------------------------------------------------------
    def sizes_of(self, inputs) -> dict[str, int]:
        """The size of every dynamic dim in ``inputs``, checked (count, dtype, device, rank,
        static dims, ranges; a ``ValueError`` naming the input, the dim and the range)."""
        specs = self.input_specs
        if len(inputs) != len(specs):
            names = ", ".join(s.name for s in specs)
            raise ValueError(f"model {self.name!r} takes {len(specs)} input(s) ({names}), got {len(inputs)}")
        sizes: dict[str, int] = {}
        for i, (t, s) in enumerate(zip(inputs, specs)):
            label = f"input {i} ({s.name})"
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise ValueError(f"{label} is on {t.device}; this bundle runs on cpu, move it with .cpu()")
            if t.dtype != s.dtype:
                raise ValueError(f"{label} has dtype {t.dtype}, expected {s.dtype} (convert it with .to({s.dtype}))")
            if t.dim() != len(s.shape):
                raise ValueError(f"{label} has {t.dim()} dims ({list(t.shape)}), expected {len(s.shape)} "
                                 f"({list(s.shape)})")
            for d, (n, want) in enumerate(zip(t.shape, s.shape)):
                if not isinstance(want, str):
                    if n != want:
                        raise ValueError(f"{label} dim {d} is {n}, expected {want} (a static dim); its shape is "
                                         f"{list(t.shape)}, the model takes {list(s.shape)}")
                    continue
                lo, hi = self.dims[want]
                if not lo <= n <= hi:
                    raise ValueError(f"{label} dim {d} ({want}) is {n}, outside the declared range [{lo}, {hi}]; "
                                     f"pass a size in that range (or rebuild the bundle with a wider range)")
                if sizes.setdefault(want, n) != n:
                    raise ValueError(f"{label} dim {d} ({want}) is {n} but another input's {want} is "
                                     f"{sizes[want]}; dims declared as one must have one size")
        return sizes

    def plan_for(self, *inputs) -> str:
        """The label of the plan a call with ``inputs`` runs."""
        return self._state_for(self.sizes_of(inputs)).plan.label()

    def namespace_for(self, *inputs) -> str:
        """The namespace of the graph of the plan a call with ``inputs`` runs (its profiler
        events' ``<namespace>::run``)."""
        return self._state_for(self.sizes_of(inputs)).plan.graph.namespace

    def _state_for(self, sizes: dict[str, int]) -> _PlanState:
        state = self._buckets.get(tuple(sizes[n] for n in self.dims))
        if state is None:
            state = self._generic
        if state is None:
            raise ValueError(f"model {self.name!r} has no plan for {sizes}: it holds buckets "
                             f"{[s.plan.label() for s in self._states]} and no generic plan; pass a bucket's "
                             "sizes or rebuild it with a generic plan")
        return state

    def run_flat(self, *inputs) -> list[torch.Tensor]:
        """Call the plan for the inputs' sizes; the outputs flat (the order of ``output_specs``)."""
        state = self._fast(inputs)
        if state is None:
            state = self._state_for(self.sizes_of(inputs))
            if len(self._memo) >= MEMO_SHAPES:
                self._memo.clear()
            self._memo[tuple(t.shape for t in inputs)] = state
        return self._run(state, inputs)

    def _fast(self, inputs) -> _PlanState | None:
        """The plan of inputs whose shapes an earlier call checked, when each is a plain dense
        CPU tensor of the expected dtype (about a microsecond; else None: the full checks)."""
        if len(inputs) != len(self._dtypes):
            return None
        for t, dtype in zip(inputs, self._dtypes):
            if type(t) is not torch.Tensor or t.dtype is not dtype or not t.is_cpu:
                return None
        return self._memo.get(tuple(t.shape for t in inputs))

    def run_plan(self, which: str, *inputs):
        """Call a given plan (``"generic"`` or a bucket's label) whatever the sizes: the build's
        self-check and benchmarks. Returns the output structure."""
        self.sizes_of(inputs)
        state = next((s for s in self._states if s.plan.label() == which or s.plan.kind == which), None)
        if state is None:
            raise ValueError(f"model {self.name!r} has no plan {which!r}; its plans: {self.plans}")
        return self._build_outputs(self._run(state, inputs))

    def _run(self, state: _PlanState, inputs) -> list[torch.Tensor]:
        if state.handle is None:
            raise RuntimeError(f"model {self.name!r} was closed")
        prepared = [t if t.is_contiguous() and not t.requires_grad else t.detach().contiguous() for t in inputs]
        with torch.no_grad(), intra_op_threads(self.threads), self._lock:
            flat = list(state.ops.run(state.handle, prepared))
            for i in self._mutated:
                if prepared[i] is not inputs[i]:
                    inputs[i].copy_(prepared[i])
        for out_i, in_i in self._aliases.items():
            flat[out_i] = inputs[in_i]
        return flat

    def __call__(self, *inputs):
        return self._build_outputs(self.run_flat(*inputs))

    def close(self) -> None:
        """Release every plan's graph state. Idempotent."""
        for s in self._states:
            handle, s.handle = s.handle, None
            release_graph(s.ops, handle)

    def __repr__(self) -> str:
        dims = ", ".join(f"{n} in [{lo}, {hi}]" for n, (lo, hi) in self.dims.items())
        return f"<ascendc_pack_runtime.DynamicModel {self.name!r} ({dims}; plans: {', '.join(self.plans)}), {self.path}>"


__all__ = ["DynamicModel"]
