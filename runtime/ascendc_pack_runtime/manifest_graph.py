"""``graph`` of ``manifest.json`` (docs/FORMAT.md): a graph.so member, its source and what the
runtime checks about it. Part of :mod:`ascendc_pack_runtime.manifest` (a static bundle's one
graph) and :mod:`ascendc_pack_runtime.manifest_dynamic` (a graph per plan of a dynamic bundle)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .schema import MAX_COUNT, Fields, is_int

_NAMESPACE_RE = re.compile(r"ascpack_[0-9a-f]{8,64}")


@dataclass(frozen=True)
class Graph:
    """graph.so: its member, source member, operator namespace, graph ABI, g++ flags, the
    memory plan report (``memory``: informational JSON, not read by the runtime) and, optionally,
    ``aten_ops``: how many times each ATen operator runs as a plain call per model call (the
    steps neither fused nor a tactic; operator name -> count) and ``flush_denormals`` (true: every
    call runs with denormals flushed to zero, ``build --flush-denormals``; absent: false)."""

    library: str
    source: str
    namespace: str
    abi: int
    flags: tuple[str, ...]
    memory: Mapping[str, Any] = field(default_factory=dict)
    aten_ops: Mapping[str, int] | None = None
    flush_denormals: bool = False

    @staticmethod
    def from_json(d: object, where: str = "graph") -> Graph:
        f = Fields(d, where)
        ops = f.get("aten_ops", lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and is_int(n) and 0 <= n < MAX_COUNT for k, n in v.items()),
            "an object of operator name -> count", optional=True)
        return Graph(f.str("library"), f.str("source"),
                     f.str("namespace", pattern=_NAMESPACE_RE, what="'ascpack_' followed by 8-64 hex digits"),
                     f.int("abi", 0, MAX_COUNT), f.strs("flags"),
                     f.get("memory", lambda v: isinstance(v, dict), "a JSON object"),
                     MappingProxyType(dict(ops)) if ops is not None else None,
                     f.get("flush_denormals", lambda v: isinstance(v, bool), "true or false", optional=True) or False)

    def to_json(self) -> dict:
        d = {"library": self.library, "source": self.source, "namespace": self.namespace, "abi": self.abi,
             "flags": list(self.flags), "memory": self.memory}
        if self.aten_ops is not None:
            d["aten_ops"] = dict(self.aten_ops)
        if self.flush_denormals:
            d["flush_denormals"] = True
        return d
