"""One dynamo graph compiled by the pipeline (docs/DESIGN.md §2.11).

A :class:`CompiledGraph` is what the backend returns to dynamo. It holds one
:class:`Specialization` per set of static shapes: a static graph has one, made when dynamo
compiles it (capture, fold, tactics timed on the example inputs - the first call's real
arguments -, fuse, kernels compiled); a graph with dynamic shapes makes one on the first call
with each new set of sizes (the jit path), as Inductor recompiles for a new static shape. The
fused kernels tune on their first call (:class:`~ascendc_pack.tune.python_mode.PythonModeModule`),
after which that first call's outputs are checked against eager: a mismatch makes the graph run
eagerly. In graph mode the specialization then runs its C++ graph (:mod:`.graph_mode`). Weights are read when a specialization is made; a call whose parameters are other
tensors (another instance of the same class) or were changed in place (their version counter
moved) makes a new one. Writes through ``.data`` are not seen, as with Inductor's freezing.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.dynamo.graph import GraphInputs, GraphModel, scalar
from ascendc_pack.toolchain.compiler import CompileCounts

log = logging.getLogger("ascendc_pack")


class EagerFallbackWarning(UserWarning):
    """A graph runs eagerly (as dynamo captured it) because ascendc_pack cannot compile it."""


@dataclass
class GraphCounts:
    """What the pipeline did for the graphs of one process (sums over specializations):
    ``specializations`` made, fused-kernel candidates run through the compiler
    (``kernels_compiled``) or found in the cache (``cache_hits``), fused kernels and tactic steps
    whose candidates were verified and timed (``kernels_profiled``, ``tactics_profiled``), and
    ``fallbacks`` (graphs running eagerly)."""

    graphs: int = 0
    specializations: int = 0
    kernels_compiled: int = 0
    cache_hits: int = 0
    kernels_profiled: int = 0
    tactics_profiled: int = 0
    fallbacks: int = 0

    def __add__(self, other: GraphCounts) -> GraphCounts:
        return GraphCounts(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))


@dataclass
class Specialization:
    """The graph compiled for one set of shapes and one set of weights."""

    module: object                 # the PythonModeModule
    weights: list                  # the weight tensors it was made from, by identity
    versions: list[int | None]     # and their version counters then
    prepared: object = None        # the pipeline.Prepared it was made from
    tactics_profiled: int = 0
    checked: bool = False          # its first call was compared with eager
    counts: CompileCounts = field(default_factory=CompileCounts)
    graph: object = None           # after the first call: the runtime Model of its C++ graph (graph mode)

    @property
    def run(self):
        """What runs a call: the C++ graph, or the Python-mode module."""
        return self.graph if self.graph is not None else self.module

    def current(self, args) -> bool:
        """Whether ``args`` carry the weights this specialization was made from, unchanged."""
        for a, w, v in zip(args, self.weights, self.versions):  # a plain loop: this runs on every call
            if a is not w or (v is not None and a._version != v):
                return False
        return True


class CompiledGraph:
    """Dynamo's compiled function for one FX graph: ``__call__(*args)`` with dynamo's flat inputs."""

    def __init__(self, gm: torch.fx.GraphModule, inputs: GraphInputs, config: BuildConfig, label: str,
                 protocol=None, graph: bool = True):
        self.gm = gm
        self.graph = graph
        self.inputs = inputs
        self.config = config
        self.label = label
        self.protocol = protocol
        self.fallback: str | None = None
        self._specs: dict[tuple, Specialization] = {}
        self._static = not inputs.symbols

    # running ------------------------------------------------------------------------------------
    def __call__(self, *args):
        if self.fallback is not None:
            return self.gm(*args)
        key = self._key(args)
        spec = self._specs.get(key)
        weights = [args[i] for i in self.inputs.weights]
        if spec is None or not spec.current(weights):
            if spec is not None:
                log.info("%s: its weights changed (other tensors, or updated in place); compiling again", self.label)
            spec = self.specialize(args)
            if spec is None:
                return self.gm(*args)
        tensors = [args[i] for i in self.inputs.tensors]
        if not spec.checked:
            return self._first_call(spec, args, tensors)
        return spec.run(*tensors)

    def _key(self, args) -> tuple:
        if self._static:
            return ()
        return (tuple(scalar(args[i]) for i in self.inputs.symbols),
                tuple((tuple(args[i].shape), args[i].stride(), args[i].dtype) for i in self.inputs.tensors))

    def _first_call(self, spec: Specialization, args, tensors):
        """Tune (PGO on these arguments) and compare with eager; on a mismatch run eagerly from now
        on. In graph mode, then build the C++ graph, compare it too, and run it from now on."""
        model = self._model(args)
        problem = _differs(model, tensors, spec.module, "the compiled graph")
        if problem is not None:
            self.fall_back(problem)
            return self.gm(*args)
        if self.graph:
            from ascendc_pack.dynamo.graph_mode import load_graph

            try:
                with torch.inference_mode(False):
                    runner = load_graph(spec.prepared, spec.module, self.config)
                problem = _differs(model, tensors, runner, "its C++ graph")
            except Exception as exc:  # noqa: BLE001 - Python mode still runs the tuned kernels
                runner, problem = None, f"{type(exc).__name__}: {exc}"
            if problem is None:
                spec.graph = runner
            else:
                log.warning("%s: stays in Python mode: %s", self.label, str(problem).splitlines()[0])
        spec.checked = True
        return spec.run(*tensors)

    # compiling ----------------------------------------------------------------------------------
    def _model(self, args) -> GraphModel:
        return GraphModel(self.gm, self.inputs, [args[i] for i in self.inputs.weights],
                          [scalar(args[i]) for i in self.inputs.symbols])

    def specialize(self, args) -> Specialization | None:
        """Compile the graph for the shapes and weights of ``args`` (None: it fell back to eager)."""
        from ascendc_pack.backends.registry import get_backend
        from ascendc_pack.errors import ConfigError
        from ascendc_pack.pipeline import prepare
        from ascendc_pack.autotune.timing_pool import timing_pool
        from ascendc_pack.tune.python_mode import PythonModeModule
        from ascendc_pack.autotune.protocol import Protocol

        weights = [args[i] for i in self.inputs.weights]
        try:
            with torch.inference_mode(False), torch.no_grad():
                example = tuple(args[i].clone() for i in self.inputs.tensors)
                prep = prepare(self._model(args), example, name="dynamo_graph", config=self.config,
                               input_sets=[example], protocol=self.protocol)
                module = PythonModeModule(prep.fused, prep.captured.weights, prep.kernels,
                                          self.protocol or Protocol(), backend=get_backend(self.config.backend),
                                          pool=timing_pool(self.config))
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unsupported graph runs eagerly, never breaks the model
            self.fall_back(_reason(exc))
            return None
        spec = Specialization(module, weights, [version(w) for w in weights], prep, prep.tactics_profiled,
                              counts=module.compile_counts)
        self._specs[self._key(args)] = spec
        return spec

    def fall_back(self, why: str) -> None:
        """Run this graph eagerly from now on, with one warning naming why."""
        self.fallback = why
        self.close()
        warnings.warn(f"torch.compile(backend='ascendc_pack'): {self.label} runs eagerly: {why}",
                      EagerFallbackWarning, stacklevel=2)

    def close(self) -> None:
        """Stop the verification workers of every specialization (a later call still runs)."""
        for spec in self._specs.values():
            spec.module.close()
            if spec.graph is not None:
                spec.graph.close()
                spec.graph = None

    # counts -------------------------------------------------------------------------------------
    def counts(self) -> GraphCounts:
        """What compiling and tuning this graph did in this process (:class:`GraphCounts`)."""
        specs = list(self._specs.values())
        return GraphCounts(graphs=1, specializations=len(specs),
                           kernels_compiled=sum(s.counts.compiler_calls for s in specs),
                           cache_hits=sum(s.counts.cache_hits for s in specs),
                           kernels_profiled=sum(s.module.kernels_profiled for s in specs),
                           tactics_profiled=sum(s.tactics_profiled for s in specs),
                           fallbacks=int(self.fallback is not None))


def _differs(model, tensors, run, what: str) -> str | None:
    """None when ``run`` matches eager ``model`` on ``tensors`` (the accuracy rule), else why."""
    from ascendc_pack.frontend.check import check_against_eager

    try:
        with torch.inference_mode(False):
            (check,) = check_against_eager(model, [tuple(tensors)], run)
    except Exception as exc:  # noqa: BLE001 - a failing first run falls back, never breaks the model
        return f"{what} failed on its first call: {type(exc).__name__}: {exc}"
    return None if check.problem is None else f"the outputs of {what} do not match eager ({check.problem})"


def version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (None for an inference tensor, which has none: it can only be
    changed inside inference mode, where no version is kept)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:400]}"
