"""Render stage: a fused Program plus the chosen kernels -> graph.cpp -> graph.so (docs/DESIGN.md §2.6).

The public entry of the graph stage, in three parts:

* :mod:`ascendc_pack.graph.plan` plans the graph: values with the layouts the C++ code sees,
  buffers, boxed ATen operators, actions, and (:mod:`ascendc_pack.graph.memory`) buffer
  lifetimes and arena placements, all as frozen values;
* :mod:`ascendc_pack.graph.emit` renders the plan as graph.cpp: data tables and instructions
  (``runtime/include/ascendc_pack/graph_program.h``) for the interpreter in
  ``runtime/include/ascendc_pack/graph_interp.h``;
* :mod:`ascendc_pack.graph.compile` links graph.cpp with the interpreter object (compiled once
  per toolchain) into graph.so, both cached by content under ``<cache_dir>/ascendc_graph/``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides, is_dense

from ascendc_pack.graph.aten import RenderError
from ascendc_pack.passes.meta_layouts import meta_layout_cache
from ascendc_pack.graph.compile import (GRAPH_CACHE_SUBDIR, GraphLibrary, compile_graph, graph_cache_key, graph_flags,
                            prepare_graph_runtime, start_graph_runtime)
from ascendc_pack.graph.emit import GRAPH_ABI_VERSION, GraphSource, render_source
from ascendc_pack.graph.memory import MemoryPlan
from ascendc_pack.graph.plan import GraphPlan, KernelRef, plan_graph
from ascendc_pack.cache import atomic_write_text, stable_hash
from ascendc_pack.kernels.fused.codegen import template_root
from ascendc_pack.ir.program import ModelProgram

log = logging.getLogger("ascendc_pack")


def weight_layout(t: torch.Tensor) -> tuple[tuple, tuple]:
    """The (shape, stride) a weight is stored with in weights.bin: its own strides when they
    are non-overlapping and dense (a permutation of a contiguous layout), else contiguous."""
    shape = tuple(t.shape)
    stride = tuple(t.stride())
    if is_dense(shape, stride):
        return shape, stride
    return shape, contiguous_strides(shape)


def render_graph(model: ModelProgram, kernels: dict[str, KernelRef],
                 weight_layouts: dict[str, tuple] | None = None, flush_denormals: bool = False) -> GraphSource:
    """Render the whole fused program as graph.cpp.

    ``kernels`` maps every fused kernel name to its chosen library (path relative to the
    bundle root); ``weight_layouts`` maps weight names to the (shape, stride) they are stored
    with (default: their captured layout); ``flush_denormals``: every call flushes denormals to
    zero (``--flush-denormals``). Raises RenderError for a program it cannot express.
    """
    return render_source(plan_graph(model, kernels, weight_layouts), flush_denormals)


RENDER_CACHE_SUBDIR = Path("ascendc") / "graph_render"


def render_graph_cached(model: ModelProgram, kernels: dict[str, KernelRef], weight_layouts: dict[str, tuple],
                        cache_dir: Path | str, flush_denormals: bool = False) -> GraphSource:
    """:func:`render_graph`, reusing the render of the same inputs from
    ``<cache_dir>/ascendc/graph_render/`` (a warm rebuild skips planning, which also spares it
    the import of torch's symbolic-shape machinery some meta kernels pull in).

    The key covers the program, the kernel references, the weight layouts, torch and the source
    of the graph stage itself (its modules and template), so a change to any of them renders anew.
    """
    key = stable_hash(_generator_identity(), torch.__version__, model.dumps(),
                      json.dumps([dataclasses.astuple(kernels[k]) for k in sorted(kernels)]),
                      json.dumps(sorted((k, [list(x) for x in v]) for k, v in (weight_layouts or {}).items())),
                      int(flush_denormals))
    path = Path(cache_dir) / RENDER_CACHE_SUBDIR / f"{key[:40]}.json"
    try:
        return GraphSource(**json.loads(path.read_text()))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError) as exc:
        log.warning("graph render cache entry %s is unusable (%s); rendering again", path, exc)
    with meta_layout_cache(cache_dir):
        src = render_graph(model, kernels, weight_layouts, flush_denormals)
    atomic_write_text(path, json.dumps(dataclasses.asdict(src)))
    return src


@functools.lru_cache(maxsize=1)
def _generator_identity() -> str:
    """A hash of the code that plans and renders graphs (the graph package, the IR, the templates)."""
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [here.parent / "ir" / "program.py"]
    files += sorted(Path(str(template_root())).glob("graph/*.j2"))
    return stable_hash(*[f.read_bytes() for f in files])


__all__ = ["render_graph", "render_graph_cached", "compile_graph", "prepare_graph_runtime", "start_graph_runtime", "plan_graph",
           "GraphSource", "GraphLibrary", "GraphPlan", "MemoryPlan", "KernelRef", "RenderError", "weight_layout",
           "graph_flags", "graph_cache_key", "GRAPH_ABI_VERSION", "GRAPH_CACHE_SUBDIR"]
