"""Compile stage: every tiling candidate of every fused kernel -> its own static kernel ``.so``.

Entry point: :func:`compile_kernels`. For each fused kernel it takes the kernel's
``compile.lock`` (docs/DESIGN.md §3.3), reuses every candidate library already in the cache (zero compiler
calls on a warm cache), and compiles the rest with ``config.jobs`` g++ processes in parallel.
A candidate that fails to compile is recorded (``CompiledCandidate.error`` and
``static_kernel/<kernel_key>/compile_error.txt``) and the build goes on.

A candidate's source must implement ``runtime/include/ascendc_pack/kernel_abi.h``: define
``ap_kernel_describe()`` returning an ``ap_kernel_info`` whose ``name`` is the fused kernel's name
and whose ``kernel_key`` is the candidate's key, and ``ap_kernel_launch()``. Every library is
checked through :func:`describe_library` before it is published into the cache or reused from it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import signal
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ascendc_pack.cache import (LOCK_TIMEOUT_S, KernelDir, atomic_write_text, check_component, stable_hash,
                    temp_path_for)
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.config import BuildConfig, host_cores
from ascendc_pack.errors import PackError
from ascendc_pack.toolchain.cxx import (DEFAULT_CXX, CompilerFailed, CompilerNotRunnable, CompilerTimeout,  # noqa: F401
                        OutputRejected, compile_atomically, compiler_identity, compiler_path, headers_hash,
                        kill_compiler,
                        host_cpu_flags, isa_features, output_tail, package_version, runtime_include_dir,
                        target_flags)

log = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 300.0
"""Wall-clock limit of one candidate's g++ run; a candidate over it is recorded as failed."""
ARTIFACT_HASH_VERSION = "ascendc-pack/artifact/v1"
DEBUG_DIRNAME = "torch_compile_debug"
_ERROR_HEADER = "# ascendc-pack compile error v1"


class KernelLibraryError(PackError):
    """A kernel library cannot be loaded, lacks the ABI symbols, or is not the promised file."""


class CompileCancelled(Exception):
    """Raised inside compile workers once the build was interrupted (Ctrl-C): the candidate is
    neither a success nor a failure and nothing about it is recorded."""


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class CandidateSource:
    """One candidate and the complete C++ source of its static kernel."""

    candidate: Candidate
    source: str


@dataclass
class KernelBuild:
    """Everything needed to compile one fused kernel's candidates (best-first order)."""

    kernel_name: str
    artifact_hash: str
    candidates: list[CandidateSource]

    def __post_init__(self):
        check_component(self.kernel_name, "kernel_name")
        check_component(self.artifact_hash, "artifact_hash")
        keys = [c.candidate.kernel_key for c in self.candidates]
        dups = sorted({k for k in keys if keys.count(k) > 1})
        if dups:
            raise ValueError(f"kernel {self.kernel_name} lists the same candidate twice "
                             f"(kernel_key {', '.join(dups)}); candidates must be distinct")


@dataclass(frozen=True)
class CompiledCandidate:
    """Outcome for one candidate. ``so_path`` is set on success, ``error`` on failure;
    ``compiled`` is False when the result (library or failure) came from the cache."""

    candidate: Candidate
    so_path: Path | None
    error: str | None
    compiled: bool

    @property
    def ok(self) -> bool:
        return self.so_path is not None and self.error is None

    def to_json(self) -> dict:
        return {"candidate": self.candidate.to_json(),
                "so_path": None if self.so_path is None else str(self.so_path),
                "error": self.error, "compiled": self.compiled}

    @staticmethod
    def from_json(d: dict) -> CompiledCandidate:
        return CompiledCandidate(Candidate.from_json(d["candidate"]),
                                 None if d["so_path"] is None else Path(d["so_path"]),
                                 d["error"], bool(d["compiled"]))


@dataclass(frozen=True)
class CompiledKernel:
    """One fused kernel's cache directory and its candidates, in the order they were given."""

    kernel_dir: KernelDir
    candidates: list[CompiledCandidate]

    @property
    def kernel_name(self) -> str:
        return self.kernel_dir.kernel_name

    @property
    def ok_candidates(self) -> list[CompiledCandidate]:
        """Candidates with a usable library."""
        return [c for c in self.candidates if c.ok]

    def to_json(self) -> dict:
        kd = self.kernel_dir
        return {"root": str(kd.root), "kernel_name": kd.kernel_name, "artifact_hash": kd.artifact_hash,
                "candidates": [c.to_json() for c in self.candidates]}

    @staticmethod
    def from_json(d: dict) -> CompiledKernel:
        return CompiledKernel(KernelDir(Path(d["root"]), d["kernel_name"], d["artifact_hash"]),
                              [CompiledCandidate.from_json(c) for c in d["candidates"]])


@dataclass(frozen=True)
class CompileCounts:
    """What compiling some kernels did, counted from their results (each build counts its own;
    there is no process-wide counter): ``compiler_calls`` candidates run through the compiler
    (failures included), ``cache_hits`` reused from the cache (libraries and recorded failures),
    ``failures`` candidates that failed to compile or validate in this build."""

    compiler_calls: int = 0
    cache_hits: int = 0
    failures: int = 0

    @staticmethod
    def of(kernels: Iterable[CompiledKernel]) -> CompileCounts:
        cands = [c for k in kernels for c in k.candidates]
        return CompileCounts(compiler_calls=sum(c.compiled for c in cands),
                             cache_hits=sum(not c.compiled for c in cands),
                             failures=sum(c.compiled and not c.ok for c in cands))


# ----------------------------------------------------------------------------- toolchain


def compile_flags(march: str) -> list[str]:
    """g++ flags of every kernel library (no ``-ffast-math``: it breaks -inf/NaN, docs/DESIGN.md §8;
    ``-fopenmp`` binds kernels to the libgomp torch already loaded). On an AVX-512 target the
    auto-vectorized loops (fused kernels, epilogues) use 512-bit vectors: g++ prefers 256 bits
    there by default, which left an erf-GELU epilogue at half speed (vit_s16 --topn 4 44.5 ->
    40.1 ms, efficientnet_b0 6.99 -> 6.17, bert_4l 4.24 -> 3.92, in one process)."""
    wide = ["-mprefer-vector-width=512"] if "avx512f" in isa_features(march) else []
    return ["-O3", *target_flags(march), *wide, "-std=c++17", "-fPIC", "-shared", "-fopenmp",
            "-fno-math-errno", "-fno-trapping-math", "-fno-plt", f"-I{runtime_include_dir()}"]


def _hashed_flags(march: str) -> str:
    """The flags with the (machine-specific) include path replaced by the headers' content."""
    inc = runtime_include_dir()
    flags = [f if f != f"-I{inc}" else "-I<ascendc_pack_runtime/include>" for f in compile_flags(march)]
    return " ".join(flags) + f" headers={headers_hash()}"


def artifact_hash(spec_text: str, template_version: str, core_limit: int | None, march: str,
                  cxx: str = DEFAULT_CXX) -> str:
    """The cache key of a fused kernel's directory (docs/DESIGN.md §3.3): sha256 over the kernel spec
    text, template version, compiler identity, compile flags (with the runtime headers'
    content), ISA features, core limit and the ascendc_pack version. ``core_limit=None`` (no
    limit) hashes as "all cores of this host" so hosts with different core counts don't share
    tunings."""
    cores = f"all:{host_cores()}" if core_limit is None else f"limit:{int(core_limit)}"
    return stable_hash(ARTIFACT_HASH_VERSION, package_version(), spec_text, template_version,
                       compiler_identity(cxx), _hashed_flags(march),
                       ",".join(isa_features(march, cxx)), cores)


# ----------------------------------------------------------------------------- library check


def describe_library(so_path: Path | str, expected_key: str | None = None,
                     expected_name: str | None = None) -> dict:
    """Load a kernel library, return its ``ap_kernel_info`` as a dict and unload it again.

    Raises KernelLibraryError if it cannot be loaded, lacks the ABI symbols, has another ABI
    version, or its kernel_key / name differ from the expected ones."""
    import _ctypes

    from ascendc_pack_runtime.kernels import KernelLoadError, check_info, read_info

    path = Path(so_path)
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise KernelLibraryError(f"cannot load kernel library {path}: {e}") from None
    try:
        info = read_info(lib, path)
        check_info(info, path, expected_key, expected_name)
    except KernelLoadError as e:
        raise KernelLibraryError(str(e)) from None
    finally:
        _ctypes.dlclose(lib._handle)
    return info


# ----------------------------------------------------------------------------- debug output


def debug_dir_for(kernel_name: str, debug_root: Path | str | None = None) -> Path:
    """Debug directory of one fused kernel: ``<debug_root>/<kernel_name>`` where ``debug_root``
    defaults to ``<cwd>/torch_compile_debug``. Candidate files go to ``<kernel_key>/`` below it;
    per-kernel extras (e.g. a standalone benchmark script) belong directly in it."""
    root = Path(debug_root) if debug_root is not None else Path.cwd() / DEBUG_DIRNAME
    return root / check_component(kernel_name, "kernel_name")


def _write_debug(ctx: _Ctx, kernel_name: str, cs: CandidateSource, cmd_text: str,
                 error: str | None) -> None:
    if ctx.debug_root is None:
        return
    d = debug_dir_for(kernel_name, ctx.debug_root) / cs.candidate.kernel_key
    try:
        atomic_write_text(d / "kernel.cpp", cs.source)
        atomic_write_text(d / "compile_cmd.txt", cmd_text)
        if error is not None:
            atomic_write_text(d / "compile_error.txt", error + "\n")
    except OSError as e:
        log.warning("cannot write debug files to %s: %s", d, e)


# ----------------------------------------------------------------------------- compiling


@dataclass
class _Ctx:
    """Settings and state shared by every compile of one compile_kernels call.

    Compiler processes run in their own session, so a Ctrl-C in the terminal reaches only the
    build: it calls :meth:`cancel`, which kills the running compilers; their workers then raise
    CompileCancelled instead of recording a (false) failure of the candidate.
    """

    cxx: str
    flags: list[str]
    timeout_s: float
    lock_timeout_s: float
    debug_root: Path | None
    progress: Callable[[int], None] | None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _running: set = field(default_factory=set)

    def tick(self) -> None:
        if self.progress is not None and not self._cancelled.is_set():
            with self._lock:
                self.progress(1)

    def command(self, cpp: Path, out: Path) -> list[str]:
        return [self.cxx, *self.flags, "-o", str(out), str(cpp)]

    def cancel(self) -> None:
        """Stop: kill the running compilers; candidates not yet started are not compiled."""
        self._cancelled.set()
        with self._lock:
            for proc in self._running:
                if proc.returncode is None:  # not reaped yet, so its pid is still its own
                    kill_compiler(proc)

    def track(self, proc: subprocess.Popen, running: bool) -> None:
        """Register a running compiler so :meth:`cancel` can kill it (compile_atomically's hook)."""
        with self._lock:
            if running:
                self._running.add(proc)
                if self._cancelled.is_set():
                    kill_compiler(proc)
            else:
                self._running.discard(proc)

    def run(self, compile_one: Callable[[], object]) -> None:
        """Run one compile unless the build was cancelled; raise CompileCancelled when the build
        was interrupted before or during it (its outcome is then not the candidate's fault)."""
        if self._cancelled.is_set():
            raise CompileCancelled()
        try:
            compile_one()
        finally:
            if self._cancelled.is_set():
                raise CompileCancelled()


def _source_sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _cached_failure(kd: KernelDir, cs: CandidateSource) -> str | None:
    """The recorded error of a deterministic failure of this exact source, if any."""
    try:
        header, _, body = kd.compile_error(cs.candidate.kernel_key).read_text().partition("\n")
    except OSError:
        return None
    if header == f"{_ERROR_HEADER} cacheable=1 source_sha256={_source_sha(cs.source)}":
        return body.rstrip("\n")
    return None


def _looks_like_kernel(so: Path, kernel_key: str) -> bool:
    """Cheap file check before dlopen: an ELF file that contains its kernel_key. (dlopen of a
    path this process already loaded returns the loaded library, not the file now on disk.)"""
    try:
        data = so.read_bytes()
    except OSError:
        return False
    return data.startswith(b"\x7fELF") and kernel_key.encode() in data


def _cached_result(kd: KernelDir, kernel_name: str, cs: CandidateSource) -> CompiledCandidate | None:
    """A valid cached library (or cached failure) for this exact source, else None."""
    key = cs.candidate.kernel_key
    so, cpp = kd.kernel_so(key), kd.kernel_cpp(key)
    try:
        same_source = cpp.read_text() == cs.source
    except OSError:
        same_source = False
    if not same_source:
        return None
    if _looks_like_kernel(so, key):
        try:
            describe_library(so, expected_key=key, expected_name=kernel_name)
        except KernelLibraryError as e:
            log.warning("cached kernel library is invalid, recompiling: %s", e)
            return None
        return CompiledCandidate(cs.candidate, so, None, compiled=False)
    error = _cached_failure(kd, cs)
    if error is not None:
        return CompiledCandidate(cs.candidate, None, error, compiled=False)
    return None


def _failure_text(kd: KernelDir, cs: CandidateSource, reason: str, cmd: list[str], output: str) -> str:
    c = cs.candidate
    return (f"failed to compile candidate {c.kernel_key} (tiling {c.optimize_tiling_text}) of kernel "
            f"{kd.kernel_name}: {reason}\nsource: {kd.kernel_cpp(c.kernel_key)}\n"
            f"command: {shlex.join(cmd)}\n--- compiler output (tail) ---\n{output_tail(output)}")


def _compile_candidate(kd: KernelDir, cs: CandidateSource, ctx: _Ctx) -> CompiledCandidate:
    """Compile one candidate into a temp file, validate it, then publish it with os.replace.
    Must be called with the kernel's lock held."""
    key = cs.candidate.kernel_key
    cpp, so = kd.kernel_cpp(key), kd.kernel_so(key)
    atomic_write_text(cpp, cs.source)
    cmd = ctx.command(cpp, temp_path_for(so))  # replaced by the command actually run

    def command(tmp: Path) -> list[str]:
        nonlocal cmd
        cmd = ctx.command(cpp, tmp)
        return cmd

    error, cacheable = None, False
    try:
        ctx.run(lambda: compile_atomically(
            command, so, timeout_s=ctx.timeout_s, track=ctx.track,
            validate=lambda tmp: describe_library(tmp, expected_key=key, expected_name=kd.kernel_name)))
    except OutputRejected as e:
        error = _failure_text(kd, cs, f"the library failed validation: {e.__cause__}", cmd, e.output)
        cacheable = True
    except CompilerFailed as e:
        if e.returncode < 0:  # killed by a signal (not by us: that is CompileCancelled): not its fault
            reason = f"the compiler was killed by {signal.Signals(-e.returncode).name}"
            error = _failure_text(kd, cs, reason, cmd, e.output)
        else:
            error = _failure_text(kd, cs, str(e), cmd, e.output)
            cacheable = True
    except (CompilerTimeout, CompilerNotRunnable) as e:
        error = _failure_text(kd, cs, str(e), cmd, e.output)
    cmd_text = (f"# cwd: {os.getcwd()}\n# output is written to a temporary name, then renamed "
                f"onto {so}\n{shlex.join(cmd)}\n")
    _write_debug(ctx, kd.kernel_name, cs, cmd_text, error)
    if error is None:
        kd.compile_error(key).unlink(missing_ok=True)
        return CompiledCandidate(cs.candidate, so, None, compiled=True)
    log.warning("%s", error.splitlines()[0])
    header = f"{_ERROR_HEADER} cacheable={int(cacheable)} source_sha256={_source_sha(cs.source)}"
    atomic_write_text(kd.compile_error(key), f"{header}\n{error}\n")
    return CompiledCandidate(cs.candidate, None, error, compiled=True)


def _build_kernel(build: KernelBuild, root: Path, ctx: _Ctx,
                  pool: ThreadPoolExecutor | None) -> CompiledKernel:
    """Under the kernel's lock: reuse cached candidates, compile the others (in ``pool`` if
    given, else serially in this thread)."""
    kd = KernelDir(root, build.kernel_name, build.artifact_hash)
    results: list[CompiledCandidate | None] = [None] * len(build.candidates)
    with kd.lock(ctx.lock_timeout_s):
        kd.static_kernel_dir.mkdir(parents=True, exist_ok=True)
        todo: list[int] = []
        for i, cs in enumerate(build.candidates):
            hit = _cached_result(kd, build.kernel_name, cs)
            if hit is None:
                todo.append(i)
                continue
            so = kd.kernel_so(cs.candidate.kernel_key)
            cmd_text = f"# cache hit: {so} was reused; this command rebuilds it\n" \
                       f"{shlex.join(ctx.command(kd.kernel_cpp(cs.candidate.kernel_key), so))}\n"
            _write_debug(ctx, build.kernel_name, cs, cmd_text, hit.error)
            results[i] = hit
            ctx.tick()
        futures: dict[int, Future] = {}
        for i in todo:
            if pool is None:
                results[i] = _compile_candidate(kd, build.candidates[i], ctx)
                ctx.tick()
            else:
                futures[i] = pool.submit(_compile_candidate, kd, build.candidates[i], ctx)
        for i, fut in futures.items():
            results[i] = fut.result()
            ctx.tick()
    return CompiledKernel(kd, [r for r in results if r is not None])


def compile_kernels(builds: list[KernelBuild], config: BuildConfig,
                    progress: Callable[[int], None] | None = None, *, cxx: str = DEFAULT_CXX,
                    debug_root: Path | str | None = None, timeout_s: float = COMPILE_TIMEOUT_S,
                    lock_timeout_s: float = LOCK_TIMEOUT_S, flags: list[str] | None = None) -> list[CompiledKernel]:
    """Compile every candidate of every kernel into the cache and return the results in order.

    ``progress(1)`` is called once per candidate as it is done (cached, compiled or failed).
    Runs up to ``config.jobs`` compiler processes at once (``jobs == 1``: serially in this
    thread). With ``config.debug``, each candidate's source and compile command go to
    ``debug_dir_for(kernel_name, debug_root)/<kernel_key>/``. Raises CompileError when the
    compiler is missing, LockTimeoutError when another build holds a kernel's lock too long;
    a candidate that fails to compile is recorded in its CompiledCandidate, never raised.
    ``flags``: the compiler flags (default :func:`compile_flags`; another backend's toolchain
    passes its own)."""
    if not builds:
        return []
    ctx = _Ctx(cxx=compiler_path(cxx), flags=compile_flags(config.march) if flags is None else list(flags),
               timeout_s=timeout_s,
               lock_timeout_s=lock_timeout_s, progress=progress,
               debug_root=(Path(debug_root) if debug_root is not None else Path.cwd() / DEBUG_DIRNAME)
               if config.debug else None)
    root = config.kernel_cache_root
    if config.jobs == 1:
        return [_build_kernel(b, root, ctx, None) for b in builds]
    with ThreadPoolExecutor(config.jobs, thread_name_prefix="ap-compile") as pool, \
            ThreadPoolExecutor(min(config.jobs, len(builds)), thread_name_prefix="ap-kernel") as kernels:
        futures = [kernels.submit(_build_kernel, b, root, ctx, pool) for b in builds]
        try:
            return [f.result() for f in futures]
        except BaseException:  # Ctrl-C (or a lock timeout): stop every compile, record nothing
            ctx.cancel()
            for f in futures:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
