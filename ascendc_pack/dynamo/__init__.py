"""``torch.compile(model, backend="ascendc_pack")``: the pipeline as a dynamo backend
(docs/DESIGN.md §2.11).

:data:`backend` is registered under the name ``ascendc_pack`` by the ``torch_dynamo_backends``
entry point; ``options={...}`` takes ``topn``, ``cores``, ``cache_dir``, ``backend``, ``jobs``,
``debug``, ``march`` (:mod:`.options`). ``backend.counts()`` says what compiling and tuning did
in this process.
"""

from __future__ import annotations

from ascendc_pack.dynamo.backend import backend, with_protocol
from ascendc_pack.dynamo.compiled import CompiledGraph, EagerFallbackWarning, GraphCounts
from ascendc_pack.dynamo.options import MAX_AUTOTUNE_TOPN, MODES, OPTIONS, resolve_config

__all__ = ["backend", "CompiledGraph", "EagerFallbackWarning", "GraphCounts", "MAX_AUTOTUNE_TOPN", "MODES",
           "OPTIONS", "resolve_config", "with_protocol"]
