"""Dynamo's FX graph as a module the pipeline can capture (docs/DESIGN.md §2.11).

Dynamo hands a backend a ``torch.fx.GraphModule`` whose inputs are, in one flat list, the
user's tensors, the parameters and buffers of the ``nn.Module``s it inlined, and (for dynamic
shapes) the sizes as ``SymInt``s. :func:`classify` says which is which; :class:`GraphModel`
turns one specialization of the graph into an ``nn.Module`` whose parameters and buffers are
its own buffers (so capture folds them as weights, and the tactics see GEMMs by a constant
weight) and whose ``forward`` takes the user's tensors only (the sizes baked in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GraphInputs:
    """What each input of a dynamo graph is, by position: ``weights`` parameters and buffers of
    an ``nn.Module``, ``symbols`` sizes and other Python scalars (dynamic shapes), ``tensors``
    everything else (the user's tensors). ``names`` are the placeholders' names."""

    names: tuple[str, ...]
    weights: tuple[int, ...]
    symbols: tuple[int, ...]
    tensors: tuple[int, ...]
    problem: str | None = None
    """Why the graph cannot be compiled (an input of another kind), or None."""


def classify(gm: torch.fx.GraphModule, example_inputs) -> GraphInputs:
    """The roles of ``gm``'s inputs, read from the ``grapharg`` dynamo records on each placeholder
    (a parameter without one, as another tracer passes it, is still a weight)."""
    from torch._dynamo.source import is_from_unspecialized_param_buffer_source

    names = tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")
    weights, symbols, tensors, problem = [], [], [], None
    for i, (name, value) in enumerate(zip(names, example_inputs)):
        arg = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name == name).meta.get("grapharg")
        source = getattr(arg, "source", None)
        if isinstance(value, torch.Tensor) and getattr(arg, "pass_arg_as_tensor", False):
            symbols.append(i)  # a Python number dynamo passes as a 0-d tensor (dynamic=True)
        elif isinstance(value, torch.Tensor):
            param = isinstance(value, torch.nn.Parameter) or (
                source is not None and is_from_unspecialized_param_buffer_source(source))
            (weights if param else tensors).append(i)
        elif isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            symbols.append(i)
        elif problem is None:
            problem = f"input {name!r} is a {type(value).__name__}, not a tensor or a number"
    if len(names) != len(example_inputs) and problem is None:
        problem = f"the graph has {len(names)} inputs but dynamo passed {len(example_inputs)}"
    return GraphInputs(names, tuple(weights), tuple(symbols), tuple(tensors), problem)


class GraphModel(torch.nn.Module):
    """One specialization of a dynamo graph as a module: ``forward(*user_tensors)``.

    ``weights`` (one tensor per ``inputs.weights`` position) become buffers named after their
    placeholders; ``symbols`` (one concrete value per ``inputs.symbols`` position, see
    :func:`scalar`) are passed to the graph as constants, so torch.export sees static shapes.
    """

    def __init__(self, gm: torch.fx.GraphModule, inputs: GraphInputs, weights, symbols):
        super().__init__()
        self.graph_module = gm
        self.inputs = inputs
        self.symbols = tuple(symbols)
        for i, w in zip(inputs.weights, weights):
            self.register_buffer(self._buffer_name(i), w.detach())

    def _buffer_name(self, i: int) -> str:
        return f"{self.inputs.names[i]}" if self.inputs.names[i].isidentifier() else f"weight_{i}"

    def forward(self, *tensors):
        args: list = [None] * len(self.inputs.names)
        for i, t in zip(self.inputs.tensors, tensors):
            args[i] = t
        for i in self.inputs.weights:
            args[i] = getattr(self, self._buffer_name(i))
        for i, v in zip(self.inputs.symbols, self.symbols):
            args[i] = torch.tensor(v[1], dtype=v[0]) if isinstance(v, tuple) else v
        return self.graph_module(*args)

    def capture_state(self) -> dict:
        """What ``forward`` computes, for the capture cache's key (frontend/capture_cache.py): the
        generated ``forward`` of every GraphModule in it (code, constants and the globals it
        names), the input roles and the baked-in sizes. The weights' bytes are keyed anyway."""
        graphs = {p: type(m).forward for p, m in self.graph_module.named_modules()
                  if isinstance(m, torch.fx.GraphModule)}
        return {"graphs": graphs, "inputs": self.inputs, "symbols": self.symbols}


def scalar(value):
    """A graph input of ``GraphInputs.symbols`` as a constant: an int or float, or ``(dtype,
    number)`` for a Python number dynamo passes as a 0-d tensor."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.item())
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError(f"a symbolic size {value} has no value before the graph is called")
    return value
