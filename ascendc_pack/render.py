"""Render stage: a fused Program plus the chosen kernels -> graph.cpp -> graph.so (docs/DESIGN.md §2.6).

The public entry of the graph stage, in three parts:

* :mod:`ascendc_pack.graph_plan` plans the graph: values with the layouts the C++ code sees,
  buffers, boxed ATen operators, actions, and (:mod:`ascendc_pack.graph_memory`) buffer
  lifetimes and arena placements, all as frozen values;
* :mod:`ascendc_pack.graph_emit` renders the plan as graph.cpp: data tables and instructions
  (``runtime/include/ascendc_pack/graph_program.h``) for the interpreter in
  ``runtime/include/ascendc_pack/graph_interp.h``;
* :mod:`ascendc_pack.graph_compile` links graph.cpp with the interpreter object (compiled once
  per toolchain) into graph.so, both cached by content under ``<cache_dir>/ascendc_graph/``.
"""

from __future__ import annotations

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides, is_dense

from .graph_aten import RenderError
from .graph_compile import (GRAPH_CACHE_SUBDIR, GraphLibrary, compile_graph, graph_cache_key, graph_flags,
                            prepare_graph_runtime, start_graph_runtime)
from .graph_emit import GRAPH_ABI_VERSION, GraphSource, render_source
from .graph_memory import MemoryPlan
from .graph_plan import GraphPlan, KernelRef, plan_graph
from .program import ModelProgram


def weight_layout(t: torch.Tensor) -> tuple[tuple, tuple]:
    """The (shape, stride) a weight is stored with in weights.bin: its own strides when they
    are non-overlapping and dense (a permutation of a contiguous layout), else contiguous."""
    shape = tuple(t.shape)
    stride = tuple(t.stride())
    if is_dense(shape, stride):
        return shape, stride
    return shape, contiguous_strides(shape)


def render_graph(model: ModelProgram, kernels: dict[str, KernelRef],
                 weight_layouts: dict[str, tuple] | None = None) -> GraphSource:
    """Render the whole fused program as graph.cpp.

    ``kernels`` maps every fused kernel name to its chosen library (path relative to the
    bundle root); ``weight_layouts`` maps weight names to the (shape, stride) they are stored
    with (default: their captured layout). Raises RenderError for a program it cannot express.
    """
    return render_source(plan_graph(model, kernels, weight_layouts))


__all__ = ["render_graph", "compile_graph", "prepare_graph_runtime", "start_graph_runtime", "plan_graph",
           "GraphSource", "GraphLibrary", "GraphPlan", "MemoryPlan", "KernelRef", "RenderError", "weight_layout",
           "graph_flags", "graph_cache_key", "GRAPH_ABI_VERSION", "GRAPH_CACHE_SUBDIR"]
