"""The backend seam: what a target device (cpu today, npu next) provides to the pipeline.

A backend owns everything device-specific of a build: the device/core limit the tilings respect,
the kernel source of a candidate, the toolchain that compiles candidates into the cache, the
in-process launcher and the timer PGO uses, the isolated launcher that verifies candidates, the
manifest's ``target`` and the check of whether a host can run its bundles. Stages ask
:func:`get_backend` (``BuildConfig.backend``) for it instead of calling cpu functions directly.

Backends are registered by name with the module that implements them, imported only when
selected (an npu backend may import torch_npu, which a cpu build must never need).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from ascendc_pack.errors import ConfigError

if TYPE_CHECKING:  # types only: the implementations import the stages, this module must not
    import torch

    from ascendc_pack_runtime.manifest import Manifest
    from ascendc_pack_runtime.manifest import Target as ManifestTarget

    from ascendc_pack.toolchain.compiler import CompiledKernel, KernelBuild
    from ascendc_pack.kernels.fused.build import FusedKernel
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.kernels.fused.tiling import Target, Tiling
    from ascendc_pack.autotune.verify import KernelSandbox

DEFAULT_BACKEND = "cpu"
BACKENDS = MappingProxyType({
    "cpu": "ascendc_pack.backends.cpu:CpuBackend",
    "npu": "ascendc_pack.backends.npu.backend:NpuBackend",
    "npu-emu": "ascendc_pack.backends.npu.backend:EmulatedNpuBackend",
})
"""Known backends: name -> ``module:class`` implementing :class:`Backend`."""


@runtime_checkable
class Backend(Protocol):
    """What the pipeline needs from a target device.

    ``name`` is written to ``manifest.backend``; ``timing`` says what PGO samples measure
    (``"wall-clock"`` on cpu; an emulating backend says ``"emulated"``).
    """

    name: str
    timing: str

    def target(self, config: BuildConfig) -> Target:
        """The device and its core limit (``--cores``, or the device's own limit) for tiling."""

    def unsupported(self, spec) -> str | None:
        """``"unsupported: <reason>"`` when this backend cannot generate ``spec`` (the kernel then
        runs as its ATen steps), else None."""

    def propose(self, spec, target: Target, topn: int) -> list[Tiling]:
        """The kernel's candidate tilings, best first (at most ``topn``)."""

    def render_kernel(self, spec: dict, tiling: Tiling, isa: str) -> str:
        """The complete source of one candidate's static kernel."""

    def artifact_hash(self, spec_text: str, template_version: str, config: BuildConfig) -> str:
        """The cache key of a fused kernel's directory (toolchain identity and flags included)."""

    def compile(self, builds: list[KernelBuild], config: BuildConfig,
                progress: Callable[[int], None] | None = None) -> list[CompiledKernel]:
        """Compile every candidate into the kernel cache (the toolchain)."""

    def isa(self, config: BuildConfig) -> list[str]:
        """Features the compiled kernels need from the host (recorded in the manifest)."""

    def load_kernel(self, spec: dict, so_path: Path, kernel_key: str) -> FusedKernel:
        """The in-process launcher of one compiled candidate."""

    def timer(self, kernels: list, args: list[torch.Tensor]) -> Callable[[int, int], float]:
        """``measure(index, launches) -> seconds`` for PGO (:func:`ascendc_pack.autotune.protocol.select`)."""

    def sandbox(self) -> KernelSandbox:
        """An isolated launcher that verification can stop when a candidate hangs."""

    def manifest_target(self, config: BuildConfig) -> ManifestTarget:
        """The manifest's ``target`` (arch, march, ISA features, compiler)."""

    def host_problems(self, manifest: Manifest) -> list[Exception]:
        """Why this host cannot run a bundle with ``manifest`` (empty when it can)."""


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


def get_backend(name: str = DEFAULT_BACKEND) -> Backend:
    """The backend registered as ``name`` (ConfigError if there is none)."""
    module, _, cls = BACKENDS[check_backend_name(name)].partition(":")
    return getattr(importlib.import_module(module), cls)()
