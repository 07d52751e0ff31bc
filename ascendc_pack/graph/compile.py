"""Graph compile: graph.cpp (data) + the interpreter object -> graph.so, both cached.

The interpreter (ascendc_pack/graph_interp.h: every torch header the graph needs) does not
depend on the model: it is compiled once per toolchain (compiler, flags, torch, runtime
headers) into ``<cache_dir>/ascendc_graph/interp/<key>/graph_interp.o``. A graph.cpp includes
no torch header, so building a graph.so is a sub-second compile of the data plus a link,
cached by content under ``<cache_dir>/ascendc_graph/<key>/``.

:func:`prepare_graph_runtime` (and :func:`start_graph_runtime`, its background form) builds the
interpreter object ahead of time, e.g. while kernels compile; :func:`compile_graph` builds it
on demand if nobody did.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack.cache import atomic_write_text, kernel_lock, stable_hash
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import CompileError
from ascendc_pack.graph.emit import GraphSource
from ascendc_pack.toolchain.cxx import (DEFAULT_CXX, CompilerRunError, compile_atomically, compiler_identity, compiler_path,
                        headers_hash, output_tail, runtime_include_dir, target_flags, torch_identity,
                        torch_include_dirs, torch_lib_dir)

log = logging.getLogger(__name__)

GRAPH_CACHE_SUBDIR = "ascendc_graph"
INTERP_SUBDIR = "interp"
INTERP_HEADER = "ascendc_pack/graph_interp.h"
GRAPH_COMPILE_TIMEOUT_S = 600.0

Progress = Callable[[float], None]
"""Called with the seconds elapsed since the graph compile started, about 4 times a second."""


@dataclass(frozen=True)
class GraphLibrary:
    """A compiled graph.so in the build cache."""

    path: Path
    source_path: Path
    compile_seconds: float    # 0.0 when it came from the cache
    cached: bool
    command: list[str]


# ----------------------------------------------------------------------------- flags and keys


def _abi_define() -> str:
    return f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def graph_flags(march: str | None = None) -> list[str]:
    """g++ flags of graph.so (graph.cpp compiled and linked with the interpreter object).

    ``march``: the build's ``-march`` (the kernels' target). graph.so is compiled for the same
    target so the ISA features the manifest records (``target.isa``, derived from that
    ``-march``) cover every instruction in the bundle, even with a compiler whose default
    ``-march`` is above the requested one. Symbols are hidden: two graphs in one process never
    bind to each other's interpreter."""
    arch = target_flags(march) if march else []
    return ["-std=c++20", "-O1", *arch, "-fPIC", "-shared", "-w", "-fvisibility=hidden", _abi_define(),
            f"-I{runtime_include_dir()}"]


def interp_flags(march: str | None = None, backend: str | None = None) -> list[str]:
    """g++ flags of the interpreter object (``-w``: libtorch header noise, g++ 12
    -Wstringop-overflow). A device npu graph (``backend == "npu"``) is compiled against torch_npu:
    NPU tensors, npu kernels launched on its stream (ascendc_pack/npu_launch.h)."""
    arch = target_flags(march) if march else []
    return ["-std=c++20", "-O1", *arch, "-fPIC", "-w", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
            _abi_define(), *[f"-I{d}" for d in torch_include_dirs()], f"-I{runtime_include_dir()}",
            *_device_flags(backend)[0]]


def link_flags(backend: str | None = None) -> list[str]:
    # no rpath: libc10/libtorch_cpu are found by SONAME among the libraries torch has loaded
    return [f"-L{torch_lib_dir()}", "-lc10", "-ltorch_cpu", "-ldl", *_device_flags(backend)[1]]


def _device_flags(backend: str | None) -> tuple[list[str], list[str]]:
    if backend != "npu":
        return [], []
    from ascendc_pack.backends.npu.device import torch_npu_build_flags

    return torch_npu_build_flags()


def _portable(flags: list[str]) -> str:
    """Flags without machine paths (headers are hashed by content instead)."""
    return " ".join(f for f in flags if not f.startswith(("-I", "-L")))


def interp_cache_key(cxx: str = DEFAULT_CXX, march: str | None = None, backend: str | None = None) -> str:
    """Content hash of the interpreter object: flags, compiler, torch and the runtime headers."""
    return stable_hash("ascendc-pack/graph-interp/v1", _portable(interp_flags(march, backend)), compiler_identity(cxx),
                       torch_identity(), headers_hash())


def graph_cache_key(source: str, cxx: str = DEFAULT_CXX, march: str | None = None) -> str:
    """Content hash of a graph build: source, flags, compiler identity, torch and the runtime
    headers (which include the interpreter's source)."""
    return stable_hash("ascendc-pack/graph/v2", source, _portable(graph_flags(march)), _portable(link_flags()),
                       compiler_identity(cxx), torch_identity(), headers_hash())


# ----------------------------------------------------------------------------- compiling


def _offset(progress: Progress | None, t0: float) -> Progress | None:
    if progress is None:
        return None
    return lambda _elapsed: progress(time.perf_counter() - t0)


def _compile_error(what: str, e: CompilerRunError, source: Path) -> CompileError:
    return CompileError(f"compiling {what} failed ({e}); this is a bug in ascendc-pack's graph stage, "
                        f"please report it with the source\nsource: {source}\ncommand: {shlex.join(e.command)}\n"
                        f"--- compiler output (tail) ---\n{output_tail(e.output)}")


def prepare_graph_runtime(config: BuildConfig, cxx: str = DEFAULT_CXX,
                          timeout_s: float = GRAPH_COMPILE_TIMEOUT_S, progress: Progress | None = None) -> Path:
    """The interpreter object every graph.so of this toolchain links, compiled into the cache
    unless it is there (safe with concurrent builds: per-directory lock, atomic rename).

    It does not depend on the model, so a pipeline may call it any time before the graph
    compile, e.g. while kernels compile; it must not run while PGO times candidates.
    Raises CompileError."""
    d = Path(config.cache_dir) / GRAPH_CACHE_SUBDIR / INTERP_SUBDIR / interp_cache_key(cxx, config.march, config.backend)
    obj, cpp = d / "graph_interp.o", d / "graph_interp.cpp"
    source = f'#include "{INTERP_HEADER}"\n'
    compiler = compiler_path(cxx)
    with kernel_lock(d, timeout=timeout_s):
        if obj.is_file() and cpp.is_file() and cpp.read_text() == source:
            return obj
        atomic_write_text(cpp, source)
        try:
            run = compile_atomically(lambda tmp: [compiler, *interp_flags(config.march, config.backend), "-c", "-o",
                                                  str(tmp), str(cpp)],
                                     obj, timeout_s=timeout_s, progress=progress)
        except CompilerRunError as e:
            raise _compile_error("the graph interpreter", e, cpp) from None
        atomic_write_text(d / "compile_cmd.txt", shlex.join(run.command) + "\n")
        log.info("compiled the graph interpreter in %.1f s (%s)", run.seconds, obj)
        return obj


def start_graph_runtime(config: BuildConfig, cxx: str = DEFAULT_CXX) -> Future:
    """:func:`prepare_graph_runtime` in a background thread; the Future holds the object's path
    (or the CompileError). Wait for it before timing anything."""
    fut: Future = Future()

    def work():
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(prepare_graph_runtime(config, cxx))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            fut.set_exception(e)

    threading.Thread(target=work, name="ap-graph-interp", daemon=True).start()
    return fut


def compile_graph(graph: GraphSource, config: BuildConfig, cxx: str = DEFAULT_CXX,
                  timeout_s: float = GRAPH_COMPILE_TIMEOUT_S, progress: Progress | None = None) -> GraphLibrary:
    """Compile ``graph`` into ``<cache_dir>/ascendc_graph/<key>/graph.so`` unless it is there.

    ``progress(seconds)`` reports the elapsed time while a compiler runs. Raises CompileError
    with the command and the compiler's output when g++ fails."""
    t0 = time.perf_counter()
    key = graph_cache_key(graph.source, cxx, config.march) + ("-npu" if config.backend == "npu" else "")
    d = Path(config.cache_dir) / GRAPH_CACHE_SUBDIR / key
    so, cpp = d / "graph.so", d / "graph.cpp"
    compiler = compiler_path(cxx)
    with kernel_lock(d, timeout=timeout_s):
        if so.is_file() and cpp.is_file() and cpp.read_text() == graph.source:
            return GraphLibrary(so, cpp, 0.0, True, [])
        interp = prepare_graph_runtime(config, cxx, timeout_s, _offset(progress, t0))
        atomic_write_text(cpp, graph.source)
        try:
            run = compile_atomically(
                lambda tmp: [compiler, *graph_flags(config.march), "-o", str(tmp), str(cpp), str(interp),
                             *link_flags(config.backend)],
                so, timeout_s=timeout_s, progress=_offset(progress, t0))
        except CompilerRunError as e:
            raise _compile_error("graph.cpp", e, cpp) from None
        seconds = time.perf_counter() - t0
        atomic_write_text(d / "compile_cmd.txt", shlex.join(run.command) + "\n")
        log.info("compiled graph.so in %.1f s (%s)", seconds, so)
        return GraphLibrary(so, cpp, seconds, False, list(run.command))
