"""This host against a bundle's target: CPU architecture, ISA features, torch release, C++ ABI.

The one home of CPU-feature parsing: ``ascendc_pack.toolchain.compiler`` (which decides which features a
``-march=native`` build may use) imports :func:`host_cpu_flags` from here, so the compiler and
the loader read ``/proc/cpuinfo`` the same way.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from .constants import MANIFEST_NAME
from .errors import (ArchMismatchError, BackendUnavailableError, CxxAbiMismatchError, IncompatibleBundleError,
                     MissingCpuFeaturesError, TorchVersionMismatchError)
from .manifest import Manifest

CPUINFO = Path("/proc/cpuinfo")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str] | None:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` text (``flags`` on x86,
    ``Features`` on arm), None when the text lists none."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def host_cpu_flags(cpuinfo: Path | str = CPUINFO) -> frozenset[str] | None:
    """This host's CPU feature flags from ``/proc/cpuinfo``; None when unknown (not Linux, or
    the file lists none): callers then skip the ISA check rather than guess."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    return parse_cpu_flags(text)


def parse_cpu_model(cpuinfo: str) -> str | None:
    """The ``model name`` of the first CPU in ``/proc/cpuinfo`` text; None when it has none."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None


def host_cpu_model(cpuinfo: Path | str = CPUINFO) -> str | None:
    """This host's CPU model name (``/proc/cpuinfo``); None when unknown."""
    try:
        return parse_cpu_model(Path(cpuinfo).read_text(errors="replace"))
    except OSError:
        return None


def usable_cores() -> int:
    """Number of CPU cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def tuned_cap_here(m: Manifest) -> tuple[int | None, str | None]:
    """The build's thread cap (manifest ``call_threads``) if it carries over to this host
    (:meth:`~ascendc_pack_runtime.manifest.CallThreads.mismatch`), and why not otherwise:
    ``(cap, None)``, or ``(None, reason)``; ``(None, None)`` where the build recorded no cap."""
    rec = m.call_threads
    if rec is None or rec.cap is None:
        return None, None
    why = rec.mismatch(usable_cores(), host_cpu_model(), m.cores)
    if why is not None:
        return None, f"the build's cap of {rec.cap} not applied: {why}"
    return rec.cap, None


def normalize_arch(arch: str) -> str:
    """``AMD64``/``x64`` -> ``x86_64``, ``arm64`` -> ``aarch64``, else lower case."""
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch.lower())


def host_problems(m: Manifest, *, cpu_flags: frozenset[str] | set[str] | None = None
                  ) -> list[IncompatibleBundleError]:
    """Every reason this host cannot run the bundle of ``m``: backend, architecture, ISA
    features, torch release, C++ ABI (graph.so uses one torch's C++ API).

    ``cpu_flags`` replaces :func:`host_cpu_flags` (to check a bundle against another host)."""
    import torch

    problems: list[IncompatibleBundleError] = []
    if m.backend == "npu":  # an emulated npu bundle runs here; a device one needs torch_npu and its SoC
        from .npu_host import npu_host_problems

        problems.extend(npu_host_problems(m))
    elif m.backend != "cpu":
        fix = "rebuild it with the cpu backend or run it with a runtime for that backend"
        problems.append(BackendUnavailableError(
            f"{MANIFEST_NAME}: field 'backend' is {m.backend!r}; this runtime runs 'cpu' bundles only: {fix}",
            field="backend", fix=fix))
    target = m.target
    want_arch = normalize_arch(target.arch)
    host_arch = normalize_arch(platform.machine())
    if want_arch and want_arch != host_arch:
        fix = "rebuild the bundle on (or for) this architecture"
        problems.append(ArchMismatchError(
            f"{MANIFEST_NAME}: field 'target.arch': bundle was built for {want_arch}, this host is {host_arch}; "
            f"{fix}", field="target.arch", fix=fix))
    elif want_arch:
        flags = host_cpu_flags() if cpu_flags is None else frozenset(cpu_flags)
        missing = sorted(set(target.isa) - flags) if flags is not None else []
        precision = getattr(m, "precision", None)   # absent before --precision
        low = sorted(set(missing) & set(precision.requires)) if precision is not None else []
        if low:
            fix = (f"rebuild without --precision {precision.requested} (float32 steps), or run it on a host with "
                   f"{', '.join(low)}")
            problems.append(MissingCpuFeaturesError(
                f"{MANIFEST_NAME}: field 'target.isa': the bundle's {precision.computes} steps (built with "
                f"--precision {precision.requested}) need CPU features this host lacks: {', '.join(low)} "
                f"(emulated, they would run slower than float32): {fix}", field="target.isa", fix=fix))
            missing = [f for f in missing if f not in low]
        if missing:
            fix = ("rebuild with a portable target this host supports, e.g. `ascendc-pack build "
                   "--march x86-64-v2`" if host_arch == "x86_64" else
                   "rebuild with a -march this host supports (`ascendc-pack build --march ...`)")
            problems.append(MissingCpuFeaturesError(
                f"{MANIFEST_NAME}: field 'target.isa': the bundle's code was compiled with "
                f"-march={target.march} and needs CPU features this host lacks: "
                f"{', '.join(missing)}; running it would crash with an illegal instruction: {fix}",
                field="target.isa", fix=fix))
    want, have = m.torch.version, torch.__version__
    if want.split("+")[0] != have.split("+")[0]:
        fix = f"install torch=={want.split('+')[0]} or rebuild the bundle with this torch"
        problems.append(TorchVersionMismatchError(
            f"{MANIFEST_NAME}: field 'torch.version': graph.so was built against torch {want}, this process "
            f"has torch {have}; {fix}", field="torch.version", fix=fix))
    abi = m.torch.cxx11_abi
    host_abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if abi is not None and abi != host_abi:
        fix = "use a torch build with the same C++ ABI or rebuild the bundle with this torch"
        problems.append(CxxAbiMismatchError(
            f"{MANIFEST_NAME}: field 'torch.cxx11_abi': graph.so was built with _GLIBCXX_USE_CXX11_ABI="
            f"{int(abi)}, this torch uses {int(host_abi)}; {fix}", field="torch.cxx11_abi", fix=fix))
    return problems


def check_host(m: Manifest, *, cpu_flags: frozenset[str] | set[str] | None = None) -> None:
    """Raise the first :func:`host_problems` problem (an IncompatibleBundleError subclass)."""
    problems = host_problems(m, cpu_flags=cpu_flags)
    if problems:
        raise problems[0]


__all__ = ["parse_cpu_flags", "host_cpu_flags", "parse_cpu_model", "host_cpu_model", "usable_cores",
           "tuned_cap_here", "normalize_arch", "host_problems", "check_host"]
