"""The npu backends behind the seam (:mod:`ascendc_pack.backends.registry`).

* ``npu``     (:class:`NpuBackend`) - an Ascend host: kernels compiled by CANN's BiSheng,
  launched on the current NPU stream through torch_npu, timed with ``torch.npu.Event``; the
  core limit is torch_npu's device limit. Constructing it fails at once, with a message naming
  what is missing, on a host without torch_npu, an NPU or ``ASCEND_HOME_PATH``.
* ``npu-emu`` (:class:`EmulatedNpuBackend`, ``--backend npu --emulate``) - the same generated
  AscendC kernels compiled with g++ against the AscendC emulation for this CPU: they implement
  the static kernel ABI (kernel_abi.h) by calling ``ap_emu_launch``, so verification, timing
  (labelled ``emulated``: wall-clock of the emulation on the CPU, not NPU time), the graph,
  the bundle and the runtime work as for cpu kernels. The SoC profile is
  ``$ASCENDC_PACK_NPU_SOC`` (default Ascend910B2).

The target CANN release (which AscendC API the kernels may call, :mod:`.api`) is
``$ASCENDC_PACK_NPU_CANN`` (``build --cann``), else the toolkit's on an Ascend host, else the
oldest supported (8.5.0).

Both write ``manifest.backend = "npu"`` with the SoC in ``target.soc`` and ``target.emulated``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.host import host_problems
from ascendc_pack_runtime.kernels import KernelLibrary

import ascendc_pack.autotune.protocol as autotune
import ascendc_pack.toolchain.compiler as compiler
import ascendc_pack.autotune.verify as verify
from ascendc_pack.cache import stable_hash
from ascendc_pack.toolchain.compiler import CompiledKernel, KernelBuild
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import ConfigError
from ascendc_pack.kernels.fused.build import FusedKernel
from ascendc_pack.kernels.fused.tiling import Tiling
import ascendc_pack.backends.npu.device as device
import ascendc_pack.backends.npu.toolchain as toolchain
from ascendc_pack.backends.npu.codegen import TEMPLATE_VERSION, render
from ascendc_pack.backends.npu.layout import unsupported_reason
from ascendc_pack.backends.npu.api import resolve_cann
from ascendc_pack.backends.npu.tiling import DEFAULT_SOC, NpuTarget, SocProfile, plan_for, propose, soc_profile

ENV_SOC = "ASCENDC_PACK_NPU_SOC"
ENV_CANN = "ASCENDC_PACK_NPU_CANN"
ARTIFACT_VERSION = "ascendc-pack/npu-artifact/v2"


class _NpuCommon:
    """What both npu backends share: the generator, the candidates, the manifest target."""

    name = "npu"
    emulated = False

    def __init__(self, soc: SocProfile, cann: str):
        self.soc = soc
        self.cann = cann

    def target(self, config: BuildConfig) -> NpuTarget:
        limit = self.core_limit()
        if config.cores is not None and config.cores > self.soc.vector_cores:
            raise ConfigError(f"--cores {config.cores} exceeds the {self.soc.vector_cores} vector cores of "
                              f"{self.soc.name}; pass at most {self.soc.vector_cores}, or omit it to use every core")
        cores = limit if config.cores is None else min(config.cores, limit)
        return NpuTarget(self.soc, max(1, cores))

    def core_limit(self) -> int:
        return self.soc.vector_cores

    def unsupported(self, spec) -> str | None:
        """``"unsupported: <reason>"`` when the generator cannot express ``spec`` (it stays ATen)."""
        return unsupported_reason(spec)

    def propose(self, spec, target: NpuTarget, topn: int) -> list[Tiling]:
        return propose(spec, target, topn)

    def render_kernel(self, spec, tiling: Tiling, isa: str) -> str:
        c, p = tiling.candidate, tiling.params
        source = render(plan_for(spec, p), tile=p["tile"], buffer_num=p["buf"], block_dim=p["bd"],
                        kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
                        soc=self.soc.name, emulate=self.emulated, isa=isa, cann=self.cann)
        return source if self.emulated else source + _device_host(spec, tiling, self.soc.name)

    def manifest_target(self, config: BuildConfig) -> contract.Target:
        """graph.so's CPU target (and, emulated, the kernels'), plus the SoC and ``emulated``."""
        identity = compiler.compiler_identity()
        return contract.Target(platform.machine(), config.march, tuple(compiler.isa_features(config.march)),
                               identity.split(" ", 1)[1] if " " in identity else identity, self.soc.name,
                               self.emulated)

    def host_problems(self, manifest: contract.Manifest) -> list[Exception]:
        """The runtime's host check of a (typed) manifest: the common CPU checks and the npu ones."""
        return list(host_problems(manifest))


class EmulatedNpuBackend(_NpuCommon):
    """``--backend npu --emulate``: AscendC kernels compiled against the emulation for this CPU."""

    emulated = True
    timing = "emulated"

    def __init__(self, env=os.environ):
        super().__init__(soc_profile(env.get(ENV_SOC, DEFAULT_SOC), ENV_SOC), resolve_cann(env.get(ENV_CANN), env))

    def artifact_hash(self, spec_text: str, template_version: str, config: BuildConfig) -> str:
        return stable_hash(ARTIFACT_VERSION, compiler.package_version(), spec_text, TEMPLATE_VERSION,
                           "emulated", self.soc.name, self.target(config).cores, self.cann,
                           toolchain.hashed_emulation_flags(config.march, self.cann), ",".join(self.isa(config)))

    def compile(self, builds: list[KernelBuild], config: BuildConfig,
                progress: Callable[[int], None] | None = None) -> list[CompiledKernel]:
        return compiler.compile_kernels(builds, config, progress,
                                        flags=toolchain.emulation_flags(config.march, self.cann))

    def isa(self, config: BuildConfig) -> list[str]:
        return compiler.isa_features(config.march)  # emulated kernels are CPU code

    def load_kernel(self, spec, so_path: Path, kernel_key: str) -> FusedKernel:
        return FusedKernel(spec, KernelLibrary(so_path, kernel_key))

    def timer(self, kernels: list, args: list[torch.Tensor], pool: int | None = None) -> autotune.Measure:
        return autotune.kernel_measure(kernels, args, pool)

    def sandbox(self) -> verify.KernelSandbox:
        return verify.KernelSandbox()


class NpuBackend(_NpuCommon):
    """``--backend npu`` on an Ascend host (torch_npu, CANN). Not run on our machines."""

    timing = "npu-profiler"

    def __init__(self, env=os.environ):
        self.env = env
        missing = []  # fail at once, naming everything this host lacks
        for check in (device.require_device, lambda: toolchain.bisheng(env)):
            try:
                check()
            except ConfigError as exc:
                missing.append(str(exc))
        if missing:
            raise device.NpuUnavailableError(
                "--backend npu compiles with CANN and runs on an Ascend NPU through torch_npu, and this host "
                "cannot: " + " ".join(f"({k}) {m}" for k, m in enumerate(missing, 1)) + " Nothing was built. "
                "To run the npu pipeline here, against the AscendC emulation on this CPU, add --emulate.")
        soc = soc_profile(device.soc_name(), "torch.npu.get_device_properties().name")
        super().__init__(soc.with_cores(device.vector_cores(soc.vector_cores)), resolve_cann(env.get(ENV_CANN), env))
        self.timing = device.timing_kind()

    def core_limit(self) -> int:
        return device.device_limit(self.soc.vector_cores)

    def artifact_hash(self, spec_text: str, template_version: str, config: BuildConfig) -> str:
        return stable_hash(ARTIFACT_VERSION, compiler.package_version(), spec_text, TEMPLATE_VERSION, "device",
                           self.soc.name, self.target(config).cores, self.cann, toolchain.bisheng(self.env),
                           " ".join(toolchain.cann_flags(self.soc.name, self.env)))

    def compile(self, builds: list[KernelBuild], config: BuildConfig,
                progress: Callable[[int], None] | None = None) -> list[CompiledKernel]:
        if config.debug:  # the command of this toolkit's layout (docs/NPU.md shows both layouts)
            import shlex
            import sys

            print(f"npu: CANN {self.cann}, SoC {self.soc.name} ({self.soc.vector_cores} vector cores): "
                  + shlex.join(toolchain.cann_command(Path("kernel.cpp"), Path("kernel.so"), self.soc.name, self.env)),
                  file=sys.stderr)
        return compiler.compile_kernels(builds, config, progress, cxx=toolchain.bisheng(self.env),
                                        flags=toolchain.cann_flags(self.soc.name, self.env))

    def isa(self, config: BuildConfig) -> list[str]:
        return []  # device code: nothing of the host CPU

    def load_kernel(self, spec, so_path: Path, kernel_key: str) -> device.NpuFusedKernel:
        return device.NpuFusedKernel(spec, device.NpuKernelLibrary(so_path, kernel_key))

    def timer(self, kernels: list, args: list[torch.Tensor], pool: int | None = None) -> autotune.Measure:
        return device.device_measure(kernels, args)  # device kernels: no host pool

    def sandbox(self) -> device.DeviceSandbox:
        return device.DeviceSandbox()


def _device_host(spec, tiling: Tiling, soc: str) -> str:
    """The host part of a device kernel library: kernel_abi.h's description and ``ap_npu_launch``."""
    from ascendc_pack.kernels.fused.codegen import template_env

    c = tiling.candidate
    return template_env().get_template("kernel/npu/device_host.cpp.j2").render(
        name=spec.name, kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace,
        block_dim=c.block_dim, soc=soc, n_inputs=len(spec.inputs), n_outputs=len(spec.outputs))
