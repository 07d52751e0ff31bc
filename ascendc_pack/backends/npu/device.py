"""torch_npu: the SoC, the device limit, the PGO timer and the launcher of device kernels.

Everything here needs an Ascend host with torch_npu (the ``[npu]`` extra: torch-npu 2.14.0 needs
torch 2.14.0) and has **not run** on our machines, which have neither; it follows the documented
contracts:

* SoC name and vector cores: ``torch.npu.get_device_properties(device)`` (``.name``, e.g.
  ``Ascend910B2``; ``.vector_core_num``), as the seed reads them (torch_npu/_inductor/ascendc
  compiler/__init__.py: ``soc_version = torch.npu.get_device_properties().name``);
* device limit: ``torch.npu.get_device_limit(device) -> {"cube_core_num", "vector_core_num"}``
  (op-plugin docs ``torch_npu-get_device_limit``), read only when the user called
  ``torch.npu.set_device_limit`` (torch_npu's ``set_device_limit.called``, the seed's contract in
  the reference notes, section 6); -1, 0 or None mean no limit, a value is capped by the SoC;
* timing (:func:`device_measure`): each candidate's device ``Duration(us)`` from
  ``torch_npu.profiler`` (``kernel_details.csv``, ProfilerActivity.NPU, Level1), as the seed's
  ``_autotune.py`` times candidates; ``torch.npu.Event`` pairs around the launches as the
  fallback where the profiler is missing. Outputs and workspace are allocated before timing;
* launch: the kernel library's ``ap_npu_launch(stream, inputs, outputs, workspace)``
  (``<<<block_dim, nullptr, stream>>>``) on ``torch.npu.current_stream()``'s ``npu_stream``.
"""

from __future__ import annotations

import ctypes
import importlib
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack.errors import ConfigError


def torch_npu_build_flags(root: Path | None = None) -> tuple[list[str], list[str]]:
    """(compile, link) flags of C++ that uses torch_npu (a device npu graph, npu_launch.h):
    ``-DAP_WITH_TORCH_NPU``, torch_npu's ``include`` and ``include/third_party/acl/inc``, and
    ``-ltorch_npu`` from its ``lib``. ``root``: a torch_npu package directory (default: the
    imported one)."""
    root = Path(root) if root is not None else Path(torch_npu().__file__).parent
    inc = root / "include"
    return ([ "-DAP_WITH_TORCH_NPU=1", f"-I{inc}", f"-I{inc / 'third_party' / 'acl' / 'inc'}"],
            [f"-L{root / 'lib'}", "-ltorch_npu"])


class NpuUnavailableError(ConfigError):
    """The npu backend (without --emulate) needs torch_npu and an Ascend device; names what is missing."""


def torch_npu():
    """The imported ``torch_npu`` module, or NpuUnavailableError saying how to get it."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:
        raise NpuUnavailableError(
            f"torch_npu is not installed ({exc}): install the extra on an Ascend host "
            "(`pip install 'ascendc-pack[npu]'`: torch-npu 2.14.0, which requires torch 2.14.0).") from None


def require_device() -> int:
    """The current NPU device index (torch_npu imported, a device present)."""
    torch_npu()
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available() or npu.device_count() < 1:
        raise NpuUnavailableError("torch_npu is installed but sees no NPU (torch.npu.is_available() is False): "
                                  "run on an Ascend host.")
    return int(npu.current_device())


def soc_name() -> str:
    """The SoC of the current device, e.g. ``Ascend910B2`` (``get_device_properties().name``)."""
    dev = require_device()
    name = str(getattr(torch.npu.get_device_properties(dev), "name", "") or torch.npu.get_device_name(dev)).strip()
    return name if name.startswith("Ascend") else f"Ascend{name}"


def vector_cores(default: int) -> int:
    """The vector cores of the current device (``get_device_properties().vector_core_num``)."""
    props = torch.npu.get_device_properties(require_device())
    n = getattr(props, "vector_core_num", None)
    return int(n) if n else default


def device_limit(max_cores: int) -> int:
    """Vector cores kernels may use: the user's ``torch.npu.set_device_limit`` if any, else all."""
    dev = require_device()
    setter = getattr(getattr(torch_npu(), "npu", None), "set_device_limit", None)
    if not getattr(setter, "called", False):
        return max_cores
    limit = torch.npu.get_device_limit(dev).get("vector_core_num")
    if limit in (None, 0, -1):
        return max_cores
    return max(1, min(int(limit), max_cores))


def timing_kind() -> str:
    """``npu-profiler`` where torch_npu has the profiler, else ``npu-event``."""
    return "npu-profiler" if _profiler() is not None else "npu-event"


def _profiler():
    try:
        import torch_npu.profiler as prof  # type: ignore[import-not-found]
    except ImportError:
        return None
    return prof if hasattr(prof, "profile") and hasattr(prof, "ProfilerActivity") else None


def kernel_durations_us(csv_text: str, name: str) -> list[float]:
    """``Duration(us)`` of every row of a ``kernel_details.csv`` whose ``Name`` is kernel ``name``
    (the ``<<<>>>`` kernel is named after the fused kernel; the seed matches its prefix)."""
    import csv
    import io

    out = []
    for row in csv.DictReader(io.StringIO(csv_text)):
        if (row.get("Name") or "").startswith(name) and row.get("Duration(us)"):
            out.append(float(row["Duration(us)"]))
    return out


def device_measure(kernels: list, args: list[torch.Tensor]) -> Callable[[int, int], float]:
    """``measure(index, launches) -> seconds`` of device time per launch. Each candidate's outputs
    and workspace are allocated once, before timing (``bind``); the profiler's per-kernel device
    durations where torch_npu has it, NPU events on the current stream otherwise."""
    bound = [k.bind(args) for k in kernels]
    prof = _profiler()

    def by_events(i: int, number: int) -> float:
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            bound[i]()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / number

    def by_profiler(i: int, number: int) -> float:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ap_npu_prof_") as out:
            config = prof._ExperimentalConfig(profiler_level=prof.ProfilerLevel.Level1, l2_cache=False,
                                              data_simplification=False)
            torch.npu.synchronize()
            with prof.profile(activities=[prof.ProfilerActivity.NPU], on_trace_ready=prof.tensorboard_trace_handler(out),
                              record_shapes=False, profile_memory=False, with_stack=False,
                              experimental_config=config):
                for _ in range(number):
                    bound[i]()
                torch.npu.synchronize()
            found = [d for p in Path(out).rglob("kernel_details.csv")
                     for d in kernel_durations_us(p.read_text(errors="replace"), kernels[i].spec.name)]
        if not found:  # the profiler saw no kernel of that name: time with events instead
            return by_events(i, number)
        return sum(found) / len(found) / 1e6
    return by_profiler if prof is not None else by_events


class NpuKernelLibrary:
    """A CANN-built kernel library: ``ap_kernel_describe`` (kernel_abi.h) and ``ap_npu_launch``."""

    def __init__(self, path: Path, expected_key: str | None = None):
        from ascendc_pack_runtime.kernels import check_info, read_info

        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path))
        self.info = read_info(self._lib, self.path)
        check_info(self.info, self.path, expected_key)
        self.workspace = self.info["workspace"]
        self._launch = self._lib.ap_npu_launch
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def launch(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], workspace) -> int:
        return self.bind(inputs, outputs, workspace)()

    def bind(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], workspace):
        """A launch with its pointers and the current stream bound once (the build's PGO and
        verification; a bundle launches from C++, ascendc_pack/npu_launch.h). ``run() -> status``,
        the library's aclrtGetLastError."""
        stream = getattr(torch.npu.current_stream(), "npu_stream", None)
        if stream is None:
            raise NpuUnavailableError("this torch_npu exposes no npu_stream on torch.npu.current_stream(); "
                                      "upgrade torch_npu")
        ins = (ctypes.c_void_p * max(1, len(inputs)))(*[t.data_ptr() for t in inputs])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[t.data_ptr() for t in outputs])
        ws = workspace.data_ptr() if workspace is not None else None
        keep, launch, st = (list(inputs), list(outputs), workspace), self._launch, ctypes.c_void_p(stream)
        return lambda keep=keep: int(launch(st, ins, outs, ws))


class NpuFusedKernel:
    """A device candidate on NPU tensors: outputs and workspace allocated on the input's device."""

    def __init__(self, spec, library: NpuKernelLibrary):
        from ascendc_pack_runtime.tensor_meta import DTYPES

        self.spec = spec
        self.lib = library
        self.out_specs = [(tuple(o.shape), DTYPES[o.dtype], tuple(o.layout)) for o in spec.outputs]

    def prepare_inputs(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Inputs in the strides the kernel was compiled for (a copy only when they differ)."""
        ready = []
        for t, spec in zip(inputs, self.spec.inputs):
            if tuple(t.stride()) != tuple(spec.stride):
                copy = torch.empty_strided(tuple(spec.shape), tuple(spec.stride), dtype=t.dtype, device=t.device)
                t = copy.copy_(t)
            ready.append(t)
        return ready

    def bind(self, inputs: list[torch.Tensor]):
        """``run()`` launching on ``inputs`` into outputs and a workspace allocated now (timing
        excludes allocation); raises on a non-zero status."""
        device = inputs[0].device if inputs else torch.device("npu")
        ins = self.prepare_inputs(inputs)
        outs = [torch.empty_strided(s, st, dtype=d, device=device) for s, d, st in self.out_specs]
        ws = torch.empty(self.lib.workspace, dtype=torch.uint8, device=device) if self.lib.workspace else None
        launch, name = self.lib.bind(ins, outs, ws), self.spec.name

        def run():
            rc = launch()
            if rc != 0:
                raise RuntimeError(f"npu kernel {name} failed to launch (aclrtGetLastError {rc})")
        return run

    def __call__(self, inputs: list[torch.Tensor], outputs=None, max_threads: int = 0) -> list[torch.Tensor]:
        device = inputs[0].device if inputs else torch.device("npu")
        ins = self.prepare_inputs(inputs)
        outs = outputs if outputs is not None else [torch.empty_strided(s, st, dtype=d, device=device)
                                                     for s, d, st in self.out_specs]
        ws = torch.empty(self.lib.workspace, dtype=torch.uint8, device=device) if self.lib.workspace else None
        rc = self.lib.launch(ins, outs, ws)
        if rc != 0:
            raise RuntimeError(f"npu kernel {self.spec.name} failed to launch (aclrtGetLastError {rc})")
        return outs


class DeviceSandbox:
    """Verification launches of device candidates (:mod:`ascendc_pack.autotune.verify`'s sandbox role).

    The arena's input bytes are copied to the NPU, the candidate runs on the current stream and
    its outputs are copied back into the arena. It runs in the build process: a device kernel
    cannot be killed like the CPU worker, so a hung candidate blocks in the synchronize (the
    device's own watchdog reports it); a crash is an error status or a torch_npu exception.
    """

    def __init__(self):
        self._libs: dict[str, NpuKernelLibrary] = {}

    def launch(self, so_path, arena, workspace: int, timeout_s: float) -> int:
        lib = self._libs.get(str(so_path))
        if lib is None:
            lib = self._libs[str(so_path)] = NpuKernelLibrary(Path(so_path))
        data = torch.from_file(str(arena.path), shared=True, size=arena.size, dtype=torch.uint8)
        bounds = [*arena.input_offsets, *(arena.output_offsets[:1] or [arena.size])]
        ins = [data[a:b].to("npu") for a, b in zip(bounds, bounds[1:])]
        outs = [torch.empty(o.numel() * o.element_size(), dtype=torch.uint8, device="npu") for o in arena.outputs]
        ws = torch.empty(workspace, dtype=torch.uint8, device="npu") if workspace else None
        rc = lib.launch(ins, outs, ws)
        torch.npu.synchronize()
        for dst, src in zip(arena.outputs, outs):
            dst.view(-1).view(torch.uint8).copy_(src.cpu())
        return rc

    def close(self) -> None:
        self._libs.clear()
