"""The backend registry (docs/DESIGN.md §6.3), a leaf module: every stage may import it.

Backends are registered by name with the module that implements them (a
:class:`~ascendc_pack.backends.protocol.Backend`), imported only when selected (an npu backend
may import torch_npu, which a cpu build must never need). Adding a backend = its package under
``backends/`` + one line in :data:`BACKENDS`.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType

from ascendc_pack.errors import ConfigError

DEFAULT_BACKEND = "cpu"
BACKENDS = MappingProxyType({
    "cpu": "ascendc_pack.backends.cpu:CpuBackend",
    "npu": "ascendc_pack.backends.npu.backend:NpuBackend",
    "npu-emu": "ascendc_pack.backends.npu.backend:EmulatedNpuBackend",
})
"""Known backends: name -> ``module:class`` implementing :class:`~ascendc_pack.backends.protocol.Backend`."""


def check_backend_name(name: object, source: str = "backend") -> str:
    """``name`` if it names a known backend, else a ConfigError listing the known ones."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise ConfigError(f"{source} must be one of {', '.join(sorted(BACKENDS))}, got: {name!r}")
    return name


def backend_key(name: str | None, emulate: bool) -> str | None:
    """The registered backend for ``--backend NAME [--emulate]``: ``npu`` + emulate is
    ``npu-emu`` (AscendC kernels compiled against the CPU emulation)."""
    if not emulate:
        return name
    if name != "npu":
        raise ConfigError(f"--emulate applies to --backend npu (the AscendC emulation), got --backend {name or 'cpu'}; "
                          "use `--backend npu --emulate`")
    return "npu-emu"


def get_backend(name: str = DEFAULT_BACKEND):
    """The backend registered as ``name`` (a :class:`~ascendc_pack.backends.protocol.Backend`;
    ConfigError if there is none)."""
    module, _, cls = BACKENDS[check_backend_name(name)].partition(":")
    return getattr(importlib.import_module(module), cls)()
