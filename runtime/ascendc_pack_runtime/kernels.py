"""Load static kernel libraries (docs/DESIGN.md §3.5) and launch them on torch tensors via ctypes.

A kernel library describes itself (``ap_kernel_describe``); :class:`KernelLibrary` checks the
description against what the caller expects before the kernel is ever launched.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .constants import KERNEL_ABI_VERSION

class KernelLoadError(RuntimeError):
    """A kernel library is missing, lacks the ABI, or is not the file that was promised."""


class _Info(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("kernel_key", ctypes.c_char_p), ("tiling_repr", ctypes.c_char_p),
                ("workspace", ctypes.c_int64), ("block_dim", ctypes.c_int32), ("isa", ctypes.c_char_p),
                ("n_inputs", ctypes.c_int32), ("n_outputs", ctypes.c_int32)]


def read_info(lib: ctypes.CDLL, path: Path) -> dict:
    """The ``ap_kernel_info`` of a loaded kernel library as a dict (raises KernelLoadError)."""
    try:
        describe, _ = lib.ap_kernel_describe, lib.ap_kernel_launch
    except AttributeError as exc:
        raise KernelLoadError(f"{path} is not an ascendc-pack kernel library: it must define "
                              "ap_kernel_describe() and ap_kernel_launch() with C linkage "
                              "(ascendc_pack/kernel_abi.h)") from exc
    describe.restype, describe.argtypes = ctypes.POINTER(_Info), []
    ptr = describe()
    if not ptr:
        raise KernelLoadError(f"{path}: ap_kernel_describe() returned NULL")
    c = ptr.contents
    text = lambda b: None if b is None else b.decode("utf-8", "replace")  # noqa: E731
    return {"abi_version": int(c.abi_version), "name": text(c.name), "kernel_key": text(c.kernel_key),
            "tiling_repr": text(c.tiling_repr), "workspace": int(c.workspace), "block_dim": int(c.block_dim),
            "isa": text(c.isa), "n_inputs": int(c.n_inputs), "n_outputs": int(c.n_outputs)}


def check_info(info: dict, path: Path, expected_key: str | None = None, expected_name: str | None = None) -> None:
    """Raise KernelLoadError unless the library speaks our ABI and is the promised file."""
    if info["abi_version"] != KERNEL_ABI_VERSION:
        raise KernelLoadError(f"{path} was built for kernel ABI {info['abi_version']}, this runtime speaks "
                              f"{KERNEL_ABI_VERSION}; rebuild it with a matching ascendc-pack")
    for field_name, expected in (("kernel_key", expected_key), ("name", expected_name)):
        if expected is not None and info[field_name] != expected:
            raise KernelLoadError(f"{path} describes itself with {field_name} {info[field_name]!r}, expected "
                                  f"{expected!r}; the file was replaced or the cache is corrupt: delete it and rebuild")


class KernelLibrary:
    """One loaded candidate library.

    Args:
        path: the ``kernel.so``.
        expected_key: if given, the library's ``kernel_key`` must equal it.
    """

    def __init__(self, path: str | Path, expected_key: str | None = None):
        self.path = Path(path)
        try:
            self._lib = ctypes.CDLL(str(self.path), mode=getattr(ctypes, "RTLD_LOCAL", 0))
        except OSError as exc:
            raise KernelLoadError(f"cannot load kernel library {self.path}: {exc}") from exc
        self.info = read_info(self._lib, self.path)
        check_info(self.info, self.path, expected_key)
        self._launch = self._lib.ap_kernel_launch
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
        try:  # the same kernel on a caller's task pool (kernel_pool.h), where the library exports it
            self._launch_pool = self._lib.ap_kernel_launch_pool
            self._launch_pool.restype = ctypes.c_int
            self._launch_pool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                                          ctypes.c_void_p]
        except AttributeError:
            self._launch_pool = None
        self.workspace = self.info["workspace"]
        self._ptr_in = ctypes.c_void_p * max(1, self.info["n_inputs"])
        self._ptr_out = ctypes.c_void_p * max(1, self.info["n_outputs"])

    @property
    def kernel_key(self) -> str:
        return self.info["kernel_key"]

    def launch(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
               workspace: torch.Tensor | None = None, max_threads: int = 0) -> int:
        """Run the kernel; returns the kernel's status (0 = success)."""
        return self.bind(inputs, outputs, workspace, max_threads)()

    @property
    def takes_pool(self) -> bool:
        """Whether the library exports ``ap_kernel_launch_pool`` (runs its tasks on a given pool)."""
        return self._launch_pool is not None

    def bind(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
             workspace: torch.Tensor | None = None, max_threads: int = 0, pool: int | None = None):
        """A launch on these tensors with its pointers bound once: ``run() -> status``. The
        tensors are kept alive by it; timing it measures the kernel, not the Python around it.
        ``pool``: the address of an ``ap_pool`` (kernel_pool.h) to run the tasks on, used when
        the library exports ``ap_kernel_launch_pool`` (the build's PGO: what graph.so runs)."""
        ins = self._ptr_in(*[t.data_ptr() for t in inputs])
        outs = self._ptr_out(*[t.data_ptr() for t in outputs])
        ws = workspace.data_ptr() if workspace is not None else None
        keep = (list(inputs), list(outputs), workspace)
        if pool is not None and self._launch_pool is not None:
            launch_pool = self._launch_pool

            def run_pool(keep=keep) -> int:
                return launch_pool(ins, outs, ws, max_threads, pool)

            return run_pool
        launch = self._launch

        def run(keep=keep) -> int:
            return launch(ins, outs, ws, max_threads)

        return run
