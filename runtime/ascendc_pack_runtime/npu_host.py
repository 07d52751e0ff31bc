"""Host check of ``npu`` bundles: can this host run a bundle built with ``--backend npu``?

:func:`npu_host_problems` is the npu part of the runtime's host check
(:func:`ascendc_pack_runtime.host.host_problems` calls it for a manifest whose ``backend`` is
``"npu"``, besides the checks every bundle gets: CPU architecture and ISA of graph.so, torch
release, C++ ABI).

* An **emulated** bundle (``target.emulated`` true, ``--backend npu --emulate``) holds AscendC
  kernels compiled against the CPU emulation: it runs on this CPU like a cpu bundle and needs
  nothing more (its ``target.isa`` is checked by the common part).
* A **device** bundle needs ``torch_npu`` (the ``[npu]`` extra), an NPU device, and that
  device's SoC must be the one the kernels were built for (``target.soc``; an Ascend910B2
  kernel binary is not guaranteed to run on another SoC).

Every problem is a typed :class:`~ascendc_pack_runtime.errors.IncompatibleBundleError` naming
what is missing and the fix. The module imports ``torch_npu`` only to check a device bundle.
"""

from __future__ import annotations

import importlib

from .errors import BackendUnavailableError, IncompatibleBundleError
from .manifest import Manifest

MANIFEST = "manifest.json"


class TorchNpuMissingError(BackendUnavailableError):
    """A device npu bundle on a host without ``torch_npu``."""


class NpuDeviceMissingError(BackendUnavailableError):
    """A device npu bundle on a host whose torch_npu sees no NPU."""


class NpuSocMismatchError(IncompatibleBundleError):
    """The host's NPU is another SoC than the one the bundle's kernels were compiled for."""


def _host_soc() -> str:
    """The NPU's SoC as the build recorded it (``get_device_properties().name``, e.g. Ascend910B2)."""
    import torch

    dev = torch.npu.current_device()
    props = getattr(torch.npu, "get_device_properties", None)
    name = str(getattr(props(dev), "name", "") if props else "") or str(torch.npu.get_device_name(dev))
    name = name.strip()
    return name if name.startswith("Ascend") else f"Ascend{name}"


def npu_host_problems(manifest: Manifest, import_module=importlib.import_module) -> list[IncompatibleBundleError]:
    """Why this host cannot run the npu bundle described by ``manifest`` (empty when it can);
    ``import_module`` imports torch_npu (a parameter so a test can stand in for it)."""
    if manifest.target.emulated:
        return []
    soc = manifest.target.soc or ""
    try:
        import_module("torch_npu")
    except ImportError as exc:
        fix = ("install torch_npu on an Ascend host (`pip install 'ascendc-pack[npu]'`: torch-npu 2.14.0 "
               "requires torch 2.14.0, plus CANN), or rebuild the model with `--backend npu --emulate` "
               "(CPU emulation) or `--backend cpu`")
        return [TorchNpuMissingError(
            f"{MANIFEST}: field 'backend' is 'npu' (kernels for {soc or 'an Ascend SoC'}) but torch_npu cannot "
            f"be imported here ({exc}): {fix}", field="backend", fix=fix)]
    import torch

    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available() or npu.device_count() < 1:
        fix = "run the bundle on a host with an Ascend NPU (check `npu-smi info`), or rebuild for cpu"
        return [NpuDeviceMissingError(
            f"{MANIFEST}: field 'backend' is 'npu' but torch_npu sees no NPU device on this host: {fix}",
            field="backend", fix=fix)]
    host = _host_soc()
    if soc and host != soc:
        fix = f"run it on a {soc} host, or rebuild the bundle on this host (`ascendc-pack build --backend npu`)"
        return [NpuSocMismatchError(
            f"{MANIFEST}: field 'target.soc': the kernels were compiled for {soc}, this host's NPU is {host}: {fix}",
            field="target.soc", fix=fix)]
    return []


def to_npu(tensors: list) -> list:
    """``tensors`` copied to the current NPU (a device npu bundle's weights: its graph.so runs on
    the NPU and refuses cpu tensors). Never run on our machines (no NPU)."""
    import torch

    device = torch.device("npu", torch.npu.current_device())
    return [t.to(device) for t in tensors]
