"""The ``cpu`` backend: generated C++ kernels compiled by g++, launched through ctypes.

Every method delegates to the stage that implements it (codegen, compiler, the runtime's kernel
launcher, autotune, verify, the runtime's host check); this class only names them for the seam
(:mod:`ascendc_pack.backend`).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack_runtime import bundle as runtime_bundle
from ascendc_pack_runtime.kernels import KernelLibrary

from . import autotune, codegen, compiler, verify
from .compiler import CompiledKernel, KernelBuild
from .kernels import FusedKernel
from .config import BuildConfig
from .tiling import Target, Tiling
from .tiling import propose as propose_tilings


class CpuBackend:
    """Kernels for this machine's CPU (OpenMP threads = blocks; ``--cores`` caps them)."""

    name = "cpu"
    timing = "wall-clock"

    def target(self, config: BuildConfig) -> Target:
        return Target(cores=config.effective_cores)

    def unsupported(self, spec) -> str | None:
        return None  # the cpu generator expresses every fused kernel

    def propose(self, spec, target: Target, topn: int) -> list[Tiling]:
        return propose_tilings(spec, target, topn)

    def render_kernel(self, spec: dict, tiling: Tiling, isa: str) -> str:
        c = tiling.candidate
        return codegen.render_kernel(spec, tiling.params, c.kernel_key, c.tiling_repr, c.workspace,
                                     c.block_dim, isa)

    def artifact_hash(self, spec_text: str, template_version: str, config: BuildConfig) -> str:
        return compiler.artifact_hash(spec_text, template_version, config.cores, config.march)

    def compile(self, builds: list[KernelBuild], config: BuildConfig,
                progress: Callable[[int], None] | None = None) -> list[CompiledKernel]:
        return compiler.compile_kernels(builds, config, progress)

    def isa(self, config: BuildConfig) -> list[str]:
        return compiler.isa_features(config.march)

    def load_kernel(self, spec: dict, so_path: Path, kernel_key: str) -> FusedKernel:
        return FusedKernel(spec, KernelLibrary(so_path, kernel_key))

    def timer(self, kernels: list, args: list[torch.Tensor]) -> autotune.Measure:
        return autotune.kernel_measure(kernels, args)

    def sandbox(self) -> verify.KernelSandbox:
        return verify.KernelSandbox()

    def manifest_target(self, config: BuildConfig) -> dict:
        identity = compiler.compiler_identity()
        return {"arch": platform.machine(), "march": config.march, "isa": self.isa(config),
                "compiler": identity.split(" ", 1)[1] if " " in identity else identity}

    def host_problems(self, manifest: dict) -> list[Exception]:
        return list(runtime_bundle.host_problems(manifest))
