"""The backend protocol (docs/DESIGN.md §6.3): what a target device (cpu, npu) provides to the
pipeline.

A backend owns everything device-specific of a build: the device/core limit the tilings respect,
the kernel source of a candidate, the toolchain that compiles candidates into the cache, the
in-process launcher and the timer PGO uses, the isolated launcher that verifies candidates, the
manifest's ``target`` and the check of whether a host can run its bundles. Stages ask
:func:`ascendc_pack.backends.registry.get_backend` for one instead of calling cpu functions
directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:  # types only: implementations import the stages; the stages import this module
    import torch

    from ascendc_pack_runtime.manifest import Manifest
    from ascendc_pack_runtime.manifest import Target as ManifestTarget

    from ascendc_pack.autotune.verify import KernelSandbox
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.kernels.fused.build import FusedKernel
    from ascendc_pack.kernels.fused.tiling import Target, Tiling
    from ascendc_pack.toolchain.compiler import CompiledKernel, KernelBuild


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

    def timer(self, kernels: list, args: list[torch.Tensor], pool: int | None = None) -> Callable[[int, int], float]:
        """``measure(index, launches) -> seconds`` for PGO (:func:`ascendc_pack.autotune.protocol.select`);
        ``pool``: the host task pool the graph runs kernels on (:mod:`ascendc_pack.autotune.timing_pool`), if any."""

    def sandbox(self) -> KernelSandbox:
        """An isolated launcher that verification can stop when a candidate hangs."""

    def manifest_target(self, config: BuildConfig) -> ManifestTarget:
        """The manifest's ``target`` (arch, march, ISA features, compiler)."""

    def host_problems(self, manifest: Manifest) -> list[Exception]:
        """Why this host cannot run a bundle with ``manifest`` (empty when it can)."""


__all__ = ["Backend"]
