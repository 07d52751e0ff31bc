"""The C++ toolchain shared by the kernel compile and the graph compile.

* where things are: the compiler (:func:`compiler_path`), the runtime headers
  (:func:`runtime_include_dir`), torch's headers and libraries;
* what a build depends on: :func:`compiler_identity`, :func:`headers_hash` (the runtime headers'
  content, part of the kernel artifact hash and of the graph cache keys), :func:`torch_identity`,
  :func:`package_version`;
* the target: :func:`target_flags` (``-march`` and, for ``native``, the features this host hides)
  and :func:`isa_features` (what the manifest records and a loader checks);
* :func:`compile_atomically`: run one compiler command into a temporary file next to the
  destination, validate the result and rename it into place, with a timeout, a progress
  callback and typed errors (:class:`CompilerFailed`, :class:`CompilerTimeout`,
  :class:`CompilerNotRunnable`, :class:`OutputRejected`).
"""

from __future__ import annotations

import hashlib
import os
import signal
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ascendc_pack_runtime.constants import VERSION

from ascendc_pack.cache import temp_path_for
from ascendc_pack.errors import CompileError, ConfigError

DEFAULT_CXX = "g++"
PROBE_TIMEOUT_S = 60.0
OUTPUT_TAIL_CHARS = 8000


# ----------------------------------------------------------------------------- where things are


def runtime_include_dir() -> Path:
    """Directory holding ``ascendc_pack/kernel_abi.h`` (the runtime's shared headers).

    Uses ``ascendc_pack_runtime.include_dir()`` when the distribution is installed and falls
    back to the source layout (``runtime/include`` next to ``runtime/ascendc_pack_runtime``)."""
    import ascendc_pack_runtime as rt

    candidates = []
    try:
        candidates.append(Path(rt.include_dir()))
    except (ImportError, TypeError, ValueError):
        pass
    candidates.append(Path(rt.__file__).resolve().parent.parent / "include")
    for d in candidates:
        if (d / "ascendc_pack" / "kernel_abi.h").is_file():
            return d
    raise CompileError("cannot find the runtime headers (ascendc_pack/kernel_abi.h) in "
                       f"{', '.join(map(str, candidates))}; reinstall ascendc-pack "
                       "(pip install -e . from the source tree)")


@lru_cache(maxsize=None)
def headers_hash() -> str:
    """sha256 over every runtime header (relative path and content): the part of a cache key
    that stands for ``-I<runtime include dir>``, so keys do not depend on where it lives
    (computed once per process: every kernel's cache key holds it)."""
    inc = runtime_include_dir()
    h = hashlib.sha256()
    for p in sorted(inc.rglob("*.h")):
        h.update(p.relative_to(inc).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def torch_include_dirs() -> list[Path]:
    """libtorch's C++ include directories."""
    import torch

    root = Path(torch.__file__).resolve().parent
    return [root / "include", root / "include" / "torch" / "csrc" / "api" / "include"]


def torch_lib_dir() -> Path:
    """Directory of libc10 / libtorch_cpu."""
    import torch

    return Path(torch.__file__).resolve().parent / "lib"


def torch_identity() -> str:
    """The torch release and commit code compiled against its headers depends on, plus its C++ ABI."""
    import torch

    return f"{torch.__version__} {torch.version.git_version} cxx11abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def package_version() -> str:
    """The version of ``ascendc_pack`` (and of the runtime and the distribution): the one
    definition, ``ascendc_pack_runtime.constants.VERSION`` (read there, not from the package
    ``__init__``, which imports this module's users: docs/DESIGN.md §1.2, no import cycle)."""
    return VERSION


# ----------------------------------------------------------------------------- the compiler


def compiler_path(cxx: str) -> str:
    """Absolute path of ``cxx`` on PATH; CompileError naming the fix when it is missing."""
    path = shutil.which(cxx)
    if path is None:
        raise CompileError(f"C++ compiler {cxx!r} not found on PATH; install g++ "
                           "(e.g. apt-get install g++) or put it on PATH")
    return path


def compiler_env() -> dict[str, str]:
    """The environment of every compiler run: ours, with plain ASCII diagnostics."""
    return {**os.environ, "LC_ALL": "C"}


def run_probe(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run a quick compiler query (``--version``, ``-dM -E``); CompileError if it cannot run."""
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=PROBE_TIMEOUT_S, env=compiler_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"cannot run the C++ compiler ({shlex.join(cmd)}): {e}") from e


@lru_cache(maxsize=None)
def compiler_identity(cxx: str = DEFAULT_CXX) -> str:
    """``"<realpath of cxx> <first line of cxx --version>"`` (memoized: it is a fact about the
    installed compiler, asked once per kernel)."""
    real = os.path.realpath(compiler_path(cxx))
    out = run_probe([real, "--version"])
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise CompileError(f"{real} --version failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    return f"{real} {lines[0].strip()}"


# ----------------------------------------------------------------------------- the target


# Compiler macro -> Linux /proc/cpuinfo flag name, so a loader's host check is a subset test.
_X86_FEATURES = {
    "__SSE__": "sse", "__SSE2__": "sse2", "__SSE3__": "pni", "__SSSE3__": "ssse3",
    "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2", "__SSE4A__": "sse4a", "__POPCNT__": "popcnt",
    "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__FMA4__": "fma4", "__F16C__": "f16c",
    "__BMI__": "bmi1", "__BMI2__": "bmi2", "__LZCNT__": "abm", "__MOVBE__": "movbe",
    "__AES__": "aes", "__PCLMUL__": "pclmulqdq", "__SHA__": "sha_ni", "__ADX__": "adx",
    "__RDRND__": "rdrand", "__RDSEED__": "rdseed", "__VAES__": "vaes",
    "__VPCLMULQDQ__": "vpclmulqdq", "__GFNI__": "gfni",
    "__AVX512F__": "avx512f", "__AVX512CD__": "avx512cd", "__AVX512BW__": "avx512bw",
    "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl", "__AVX512IFMA__": "avx512ifma",
    "__AVX512VBMI__": "avx512vbmi", "__AVX512VBMI2__": "avx512_vbmi2",
    "__AVX512VNNI__": "avx512_vnni", "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq", "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16", "__AVXVNNI__": "avx_vnni",
    "__AMXTILE__": "amx_tile", "__AMXBF16__": "amx_bf16", "__AMXINT8__": "amx_int8",
    "__AMX_TILE__": "amx_tile", "__AMX_BF16__": "amx_bf16", "__AMX_INT8__": "amx_int8",
}
_ARM_FEATURES = {
    "__ARM_NEON": "asimd", "__ARM_FEATURE_SVE": "sve", "__ARM_FEATURE_SVE2": "sve2",
    "__ARM_FEATURE_DOTPROD": "asimddp", "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
    "__ARM_FEATURE_FP16_SCALAR_ARITHMETIC": "fphp", "__ARM_FEATURE_BF16": "bf16",
    "__ARM_FEATURE_MATMUL_INT8": "i8mm", "__ARM_FEATURE_SVE_BF16": "svebf16",
    "__ARM_FEATURE_SVE_MATMUL_INT8": "svei8mm", "__ARM_FEATURE_ATOMICS": "atomics",
    "__ARM_FEATURE_CRC32": "crc32", "__ARM_FEATURE_AES": "aes", "__ARM_FEATURE_SHA2": "sha2",
}

# g++ option enabling an x86 feature macro, where it is not the macro's name in lower case.
_X86_OPTION = {"__SSE4_1__": "sse4.1", "__SSE4_2__": "sse4.2", "__AMX_TILE__": "amx-tile",
               "__AMX_BF16__": "amx-bf16", "__AMX_INT8__": "amx-int8", "__AMXTILE__": "amx-tile",
               "__AMXBF16__": "amx-bf16", "__AMXINT8__": "amx-int8"}


def _macros(flags: tuple[str, ...], cxx: str) -> set[str]:
    cmd = [compiler_path(cxx), *flags, "-dM", "-E", "-x", "c++", "-"]
    out = run_probe(cmd)
    if out.returncode != 0:
        raise ConfigError(f"{cxx} rejected {' '.join(flags)}: {out.stderr.strip()[-500:]}. Pass a "
                          "-march value this compiler supports (e.g. native, x86-64-v3)")
    return {line.split()[1] for line in out.stdout.splitlines()
            if line.startswith("#define ") and len(line.split()) >= 2}


def _feature_table(macros: set[str]) -> dict[str, str]:
    if "__x86_64__" in macros or "__i386__" in macros:
        return _X86_FEATURES
    if "__aarch64__" in macros or "__arm__" in macros:
        return _ARM_FEATURES
    return {}


@lru_cache(maxsize=None)
def _target_flags(march: str, cxx: str) -> tuple[str, ...]:
    flags = (f"-march={march}",)
    if march != "native":
        return flags
    # g++ reads -march=native from CPUID; a hypervisor may hide a feature from /proc/cpuinfo
    # that CPUID still reports (seen here: rdseed). Turn such features off so the code never
    # uses what the OS does not promise and the manifest's ISA list stays a subset of cpuinfo.
    host = host_cpu_flags()
    macros = _macros(flags, cxx)
    table = _feature_table(macros)
    if not host or table is not _X86_FEATURES:
        return flags
    hidden = sorted(_X86_OPTION.get(m, m.strip("_").lower()) for m, name in table.items()
                    if m in macros and name not in host)
    return flags + tuple(f"-mno-{opt}" for opt in dict.fromkeys(hidden))


def target_flags(march: str, cxx: str = DEFAULT_CXX) -> list[str]:
    """The ``-march`` flags of kernels and graph.so: ``-march=<march>``, and for ``native`` a
    ``-mno-<feature>`` for every feature the compiler would enable that this host's
    ``/proc/cpuinfo`` does not list."""
    return list(_target_flags(march, cxx))


@lru_cache(maxsize=None)
def _isa_features(march: str, cxx: str) -> tuple[str, ...]:
    macros = _macros(_target_flags(march, cxx), cxx)
    table = _feature_table(macros)
    return tuple(sorted({name for macro, name in table.items() if macro in macros}))


def isa_features(march: str, cxx: str = DEFAULT_CXX) -> list[str]:
    """ISA features code built with ``-march=<march>`` may use, read from the compiler's
    predefined macros, as sorted Linux ``/proc/cpuinfo`` flag names (``avx2``, ``fma``,
    ``avx512f``, ``avx512_bf16``, ... on x86-64; ``asimd``, ``sve``, ``bf16``, ... on aarch64).
    A host can run the kernels iff these are a subset of its cpuinfo flags."""
    return list(_isa_features(march, cxx))


def host_cpu_flags() -> set[str]:
    """This host's CPU flags from ``/proc/cpuinfo`` (``ascendc_pack_runtime.host``, the one
    parser); empty when unavailable."""
    from ascendc_pack_runtime.host import host_cpu_flags as runtime_host_cpu_flags

    return set(runtime_host_cpu_flags() or ())


# ----------------------------------------------------------------------------- compiling


class CompilerRunError(CompileError):
    """A compiler run did not produce a usable file; ``command`` and ``output`` say why."""

    def __init__(self, message: str, command: list[str], output: str):
        super().__init__(message)
        self.command = list(command)
        self.output = output


class CompilerNotRunnable(CompilerRunError):
    """The compiler could not be started (missing, not executable, out of resources)."""


class CompilerFailed(CompilerRunError):
    """The compiler exited with a non-zero status (``returncode``)."""

    def __init__(self, message: str, command: list[str], output: str, returncode: int):
        super().__init__(message, command, output)
        self.returncode = returncode


class CompilerTimeout(CompilerRunError):
    """The compiler ran longer than the timeout (``timeout_s``) and was killed."""

    def __init__(self, message: str, command: list[str], output: str, timeout_s: float):
        super().__init__(message, command, output)
        self.timeout_s = timeout_s


class OutputRejected(CompilerRunError):
    """The compiler succeeded but ``validate`` refused its output (the cause is chained)."""


@dataclass(frozen=True)
class CompileRun:
    """A successful compiler run: the command (with the temporary output name), its wall
    time and its output (warnings)."""

    command: tuple[str, ...]
    seconds: float
    output: str


def output_tail(text: str) -> str:
    """The last OUTPUT_TAIL_CHARS characters of a compiler's output."""
    text = text.strip()
    return text if len(text) <= OUTPUT_TAIL_CHARS else "..." + text[-OUTPUT_TAIL_CHARS:]


def compile_atomically(command: Callable[[Path], list[str]], output: Path, *, timeout_s: float,
                       validate: Callable[[Path], object] | None = None,
                       progress: Callable[[float], None] | None = None,
                       track: Callable[[subprocess.Popen, bool], None] | None = None,
                       poll_s: float = 0.25) -> CompileRun:
    """Run ``command(tmp)`` (a compiler writing to ``tmp``, a fresh name next to ``output``),
    call ``validate(tmp)``, then rename ``tmp`` onto ``output`` (readers never see a partial file).

    The compiler leads its own session, so a Ctrl-C in the terminal reaches only the build, and
    stopping it kills the programs it started too (cc1plus, as, ld). ``progress(elapsed_seconds)``
    is called about every ``poll_s`` while it runs; ``track(proc, running)`` is called when it
    starts (True) and ends (False), so a caller can :func:`kill_compiler` it from another thread.
    Raises CompilerNotRunnable, CompilerFailed (``returncode`` < 0: killed by that signal),
    CompilerTimeout or OutputRejected (all CompileError, with ``command`` and ``output``); the
    temporary file is removed in every case, and on KeyboardInterrupt the compiler is killed
    before the interrupt propagates.
    """
    output = Path(output)
    tmp = temp_path_for(output)
    cmd = command(tmp)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryFile() as log:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=compiler_env(), start_new_session=True)
            except OSError as e:
                raise CompilerNotRunnable(f"cannot run the compiler: {e}", cmd, "") from None
            if track is not None:
                track(proc, True)
            try:
                rc = _wait(proc, t0, timeout_s, progress, poll_s)
            finally:
                if proc.poll() is None:  # timeout or interrupt: never leave a compiler behind
                    kill_compiler(proc)
                    proc.wait()
                if track is not None:
                    track(proc, False)
            log.seek(0)
            text = log.read().decode(errors="replace")
        seconds = time.perf_counter() - t0
        if rc is None:
            raise CompilerTimeout(f"timed out after {timeout_s:g} s", cmd, text, timeout_s)
        if rc != 0:
            raise CompilerFailed(f"exit code {rc}", cmd, text, rc)
        if validate is not None:
            try:
                validate(tmp)
            except Exception as e:
                raise OutputRejected(f"the output failed validation: {e}", cmd, text) from e
        os.replace(tmp, output)
        return CompileRun(tuple(cmd), seconds, text)
    finally:
        tmp.unlink(missing_ok=True)


def kill_compiler(proc: subprocess.Popen) -> None:
    """Kill a compiler started by :func:`compile_atomically` and every program it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(proc: subprocess.Popen, t0: float, timeout_s: float, progress, poll_s: float) -> int | None:
    """The exit status, or None when ``timeout_s`` passed first."""
    while True:
        elapsed = time.perf_counter() - t0
        left = timeout_s - elapsed
        if left <= 0:
            return None
        try:
            return proc.wait(timeout=min(poll_s, left) if progress is not None else left)
        except subprocess.TimeoutExpired:
            if progress is not None:
                progress(time.perf_counter() - t0)


__all__ = ["DEFAULT_CXX", "runtime_include_dir", "headers_hash", "torch_include_dirs", "torch_lib_dir",
           "torch_identity", "package_version", "compiler_path", "compiler_env", "run_probe",
           "compiler_identity", "target_flags", "isa_features", "host_cpu_flags", "compile_atomically", "kill_compiler",
           "CompileRun", "CompilerRunError", "CompilerNotRunnable", "CompilerFailed", "CompilerTimeout",
           "OutputRejected", "output_tail"]
