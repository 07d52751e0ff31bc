"""The task pool the build's PGO times generated kernels on: the graph's own (task_pool.h).

In a bundle, graph.so launches a generated GEMM, convolution or attention kernel through
``ap_kernel_launch_pool`` on its task pool (docs/DESIGN.md §4.8); a candidate timed through
``ap_kernel_launch`` runs its tasks on OpenMP instead and pays a passive team's wake-up (~45 µs
per parallel region on an idle KVM guest): 2-thread candidates looked slower than they run in the
graph, and PGO picked 1-thread ones that lose there. So the tuner times those candidates on the
same pool: a tiny library (``task_pool.h`` behind one C function) compiled once per toolchain
into ``<cache_dir>/ascendc_graph/pool/<key>/`` and loaded into the build process.
``ASCENDC_PACK_TASK_POOL=0`` (which makes graph.so run OpenMP) makes PGO time OpenMP too.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import lru_cache
from pathlib import Path

from ascendc_pack.cache import atomic_write_text, kernel_lock, stable_hash
from ascendc_pack.errors import CompileError
from ascendc_pack.toolchain.cxx import (DEFAULT_CXX, CompilerRunError, compile_atomically, compiler_identity, compiler_path,
                        headers_hash, runtime_include_dir)

log = logging.getLogger("ascendc_pack")

POOL_SUBDIR = "ascendc_graph/pool"
SOURCE = """// The graph's task pool for the build's PGO (ascendc_pack/autotune/timing_pool.py)
#include <ascendc_pack/task_pool.h>
extern "C" __attribute__((visibility("default"))) const ap_pool *ap_timing_pool(void) {
  return ::ascendc_pack::TaskPool::instance().abi();
}
"""
TIMEOUT_S = 120.0


def _flags() -> list[str]:
    return ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", f"-I{runtime_include_dir()}"]


def pool_enabled() -> bool:
    """False when ``ASCENDC_PACK_TASK_POOL=0`` (graph.so then runs every kernel on OpenMP)."""
    return os.environ.get("ASCENDC_PACK_TASK_POOL") != "0"


@lru_cache(maxsize=None)
def _load(cache_dir: str, cxx: str) -> int:
    compiler = compiler_path(cxx)
    key = stable_hash("ascendc-pack/timing-pool/v1", SOURCE, " ".join(_flags()[:-1]), headers_hash(),
                      compiler_identity(cxx))[:16]
    d = Path(cache_dir) / POOL_SUBDIR / key
    so, cpp = d / "libap_timing_pool.so", d / "timing_pool.cpp"
    with kernel_lock(d, timeout=TIMEOUT_S):
        if not (so.is_file() and cpp.is_file() and cpp.read_text() == SOURCE):
            atomic_write_text(cpp, SOURCE)
            try:
                compile_atomically(lambda tmp: [compiler, *_flags(), "-o", str(tmp), str(cpp)], so, timeout_s=TIMEOUT_S)
            except CompilerRunError as e:
                raise CompileError(f"cannot compile the PGO task pool ({cpp}): {e}") from None
    lib = ctypes.CDLL(str(so), mode=getattr(ctypes, "RTLD_LOCAL", 0))
    fn = lib.ap_timing_pool
    fn.restype = ctypes.c_void_p
    _keep.append(lib)
    return fn()


_keep: list = []  # the loaded library: its pool lives as long as the process


def timing_pool(config, cxx: str = DEFAULT_CXX) -> int | None:
    """The address of the pool's ``ap_pool`` (for ``KernelLibrary.bind(pool=...)``), or None with
    ``ASCENDC_PACK_TASK_POOL=0`` or when the pool library cannot be built (then PGO times
    OpenMP, as before; logged), or for another backend than ``cpu`` (its kernels run on a device)."""
    if not pool_enabled() or config.backend != "cpu":
        return None
    try:
        return _load(str(config.cache_dir), cxx)
    except (CompileError, OSError) as e:
        log.warning("PGO times generated kernels on OpenMP: the task pool library failed (%s)", e)
        return None


__all__ = ["timing_pool", "pool_enabled"]
