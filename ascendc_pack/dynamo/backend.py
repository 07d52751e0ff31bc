"""The dynamo backend ``ascendc_pack`` (docs/DESIGN.md §2.11).

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so after ``pip
install`` ``torch.compile(model, backend="ascendc_pack")`` finds it with no import of ours.
Dynamo calls it once per FX graph (a graph break gives several graphs, Python runs between
them; a guard failure - a new static shape, grad mode switched - gives a new graph). Each graph
goes through the pipeline (:mod:`.compiled`); a graph the pipeline cannot take runs eagerly with
one :class:`~ascendc_pack.dynamo.compiled.EagerFallbackWarning` naming why. Training graphs (grad
enabled and an input or parameter that requires grad) always run eagerly: the compiled kernels
have no backward.
"""

from __future__ import annotations

import logging
import re
import weakref

import torch

from ascendc_pack.dynamo.compiled import CompiledGraph, EagerFallbackWarning, GraphCounts
from ascendc_pack.dynamo.graph import classify
from ascendc_pack.dynamo.options import graph_mode, resolve_config

log = logging.getLogger("ascendc_pack")

TRAINING = ("it is a training graph (grad is enabled and {what} requires grad); ascendc_pack compiles "
            "inference graphs: call the compiled model under torch.no_grad() or torch.inference_mode() "
            "(or set requires_grad_(False) on the parameters)")


class _AscendcPackBackend:
    """``torch.compile(backend="ascendc_pack", mode=..., options={...})``: call it with dynamo's
    FX graph and example inputs; it returns a :class:`CompiledGraph`. :meth:`reset` is what
    ``torch._dynamo.reset()`` calls; :meth:`counts` sums what the live graphs did."""

    __name__ = "ascendc_pack"

    def __init__(self, protocol=None):
        self.protocol = protocol
        self._graphs: list[weakref.ref] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options=None):
        config = resolve_config(mode, options)  # a bad setting is the user's error: raised, with the fix
        _follow_torch_logs()
        label = _label(gm)
        graph = CompiledGraph(gm, classify(gm, example_inputs), config, label, self.protocol, graph_mode(options))
        self._graphs = [r for r in self._graphs if r() is not None] + [weakref.ref(graph)]
        why = _unsupported(graph.inputs, example_inputs)
        if why is not None:
            graph.fall_back(why)
        elif not graph.inputs.symbols:  # static shapes: compile now, on the first call's real arguments
            graph.specialize(list(example_inputs))
        log.info("%s: %s", label, "runs eagerly" if graph.fallback else "compiled")
        return graph

    def graphs(self) -> list[CompiledGraph]:
        """The compiled graphs alive in this process (since the last reset)."""
        return [g for g in (r() for r in self._graphs) if g is not None]

    def counts(self) -> GraphCounts:
        """What compiling and tuning the live graphs did in this process (sums)."""
        total = GraphCounts()
        for g in self.graphs():
            total = total + g.counts()
        return total

    def reset(self) -> None:
        """Forget every compiled graph (``torch._dynamo.reset()``); their verification workers
        stop. The kernel and tuning caches on disk stay, as Inductor's do."""
        for g in self.graphs():
            g.close()
        self._graphs.clear()


backend = _AscendcPackBackend()
"""The backend object the ``torch_dynamo_backends`` entry point names."""


def with_protocol(protocol) -> _AscendcPackBackend:
    """A backend of its own whose PGO times candidates with ``protocol`` (an
    :class:`~ascendc_pack.autotune.protocol.Protocol`); pass it as ``torch.compile(backend=...)``."""
    return _AscendcPackBackend(protocol)


def _unsupported(inputs, example_inputs) -> str | None:
    if inputs.problem is not None:
        return inputs.problem
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    devices = sorted({t.device.type for t in tensors} - {"cpu"})
    if devices:
        return (f"it has tensors on {', '.join(devices)}; the pipeline captures and runs CPU tensors "
                "(an npu build is made from CPU tensors too)")
    if torch.is_grad_enabled():
        needs = [inputs.names[i] for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        if needs:
            return TRAINING.format(what=f"{needs[0]!r}" + (f" and {len(needs) - 1} more" if len(needs) > 1 else ""))
    return None


def _label(gm: torch.fx.GraphModule) -> str:
    """``graph <dynamo's compile id> (<function> at <file>:<line>)``, the place from the first
    node that records where the user's code created it."""
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    where = ""
    for node in gm.graph.nodes:
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        if frames:
            file, line, fn = frames[-1]
            where = f" ({fn} at {file.rsplit('/', 1)[-1]}:{line})"
            break
    return f"graph {cid if cid is not None else '?'}{where}"


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _follow_torch_logs() -> None:
    """``TORCH_LOGS="+ascendc_pack"`` (or ``ascendc_pack``, ``-ascendc_pack``) sets our logger's
    level through torch's own parsing of module names. ``TORCH_LOGS`` naming ``inductor`` (how
    torch_npu's AscendC backend is made verbose) also sets it, when nothing set it already."""
    ours = logging.getLogger("ascendc_pack")
    inductor = logging.getLogger("torch._inductor")
    if ours.level == logging.NOTSET and inductor.level != logging.NOTSET:
        ours.setLevel(inductor.level)
        if not ours.handlers:
            for h in inductor.handlers:
                ours.addHandler(h)


__all__ = ["backend", "with_protocol", "EagerFallbackWarning", "GraphCounts"]
