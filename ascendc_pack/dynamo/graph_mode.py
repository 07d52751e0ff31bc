"""After its first call, a specialization runs through the C++ graph, as a bundle does
(docs/DESIGN.md §2.11).

Python mode dispatches every step from Python (tens of microseconds a step); once the first call
has tuned every kernel, the program, the winners and the weights are rendered and compiled into
a graph.so exactly as ``pipeline.build`` does (:func:`~ascendc_pack.package.bundle.build_bundle`),
written as a bundle to a temporary file in the cache, loaded with the runtime (extracted,
content-addressed, under ``<cache>/ascendc/dynamo_runtime``) and the temporary file removed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

RUNTIME_SUBDIR = "dynamo_runtime"


def load_graph(prepared, module, config):
    """The runtime ``Model`` of ``prepared`` (a :class:`~ascendc_pack.pipeline.Prepared`) with
    the choices ``module`` (its tuned PythonModeModule) made. Raises what building or loading a
    bundle raises."""
    import ascendc_pack_runtime as rt

    from ascendc_pack.package.bundle import build_bundle
    from ascendc_pack.tune.python_mode import inline_kernels

    root = config.kernel_cache_root / RUNTIME_SUBDIR
    root.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="graph-", suffix=".ascpack", dir=root)
    os.close(fd)
    path = Path(name)
    try:
        fused = inline_kernels(prepared.fused, module.fallbacks())
        build_bundle(fused, prepared.captured.weights, module.choices(), path, config, tactics=prepared.tactics)
        return rt.load(path, cache_dir=root)
    finally:
        path.unlink(missing_ok=True)
