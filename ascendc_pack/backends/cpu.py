"""The ``cpu`` backend: generated C++ kernels compiled by g++, launched through ctypes.

Every method delegates to the stage that implements it (codegen, compiler, the runtime's kernel
launcher, autotune, verify, the runtime's host check); this class only names them for the seam
(:mod:`ascendc_pack.backends.registry`).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.host import host_problems
from ascendc_pack_runtime.kernels import KernelLibrary

import ascendc_pack.autotune.protocol as autotune
import ascendc_pack.kernels.fused.codegen as codegen
import ascendc_pack.toolchain.compiler as compiler
import ascendc_pack.autotune.verify as verify
from ascendc_pack.toolchain.compiler import CompiledKernel, KernelBuild
from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels.fused.build import FusedKernel
from ascendc_pack.kernels.fused.tiling import Target, Tiling
from ascendc_pack.kernels.fused.tiling import propose as propose_tilings
from ascendc_pack.kernels.target import CpuTarget


class CpuBackend:
    """Kernels for this machine's CPU (OpenMP threads = blocks; ``--cores`` caps them)."""

    name = "cpu"
    timing = "wall-clock"

    def target(self, config: BuildConfig) -> Target:
        profile = CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir).profile
        return Target(cores=config.effective_cores, mem_gbps_per_core=profile.mem_gbps,
                      cache_gbps_per_core=profile.l2_gbps, parallel_overhead_us=profile.omp_wake_us)

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

    def timer(self, kernels: list, args: list[torch.Tensor], pool: int | None = None) -> autotune.Measure:
        return autotune.kernel_measure(kernels, args, pool)

    def sandbox(self) -> verify.KernelSandbox:
        return verify.KernelSandbox()

    def manifest_target(self, config: BuildConfig) -> contract.Target:
        identity = compiler.compiler_identity()
        return contract.Target(platform.machine(), config.march, tuple(self.isa(config)),
                               identity.split(" ", 1)[1] if " " in identity else identity)

    def host_problems(self, manifest: contract.Manifest) -> list[Exception]:
        return list(host_problems(manifest))
