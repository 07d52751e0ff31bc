"""The one host profile every CPU cost model reads (docs/DESIGN.md §2.4).

:class:`HostProfile` holds what the cost models turn cycles and bytes into microseconds with,
measured on the build host once:

* ``ghz``: vector FMA instructions retired per nanosecond by one core, divided by the two FMA
  ports the models count with (a 12-accumulator FMA loop of the target's vector width, compiled
  with the build's ``g++ -march``; the best of 5 runs of ~5 ms);
* ``mem_gbps``: one thread's streaming bandwidth, a copy of 64 MiB (bigger than any L3 here;
  read + write bytes over the best of 5 copies);
* ``l2_gbps``: the same for a buffer of a quarter of the core's L2 (what stays in cache);
* ``omp_wake_us``: what a 2-thread OpenMP region costs when its team has slept (the master
  busy for 1 ms first; median of 41), under the wait policy the bundle will run with (the
  runtime's ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets one): the fused kernels' cost
  model charges it to every multi-thread candidate (``Target.parallel_overhead_us``). 6-8 µs on
  the AMD build host, 50-80 µs on the Intel KVM guest of 2026-12-06, where waking a halted vCPU
  is a hypervisor exit (a 2-thread elementwise kernel PGO timed at 80 µs against 7.7 µs on one
  thread was the cost model's candidate 0 at ``--topn 1``).

It is measured on first use (about 0.3 s: one small compile, then the loops) and kept in
``<cache>/ascendc/host_profile/<host>.json``, the host key being the CPU model, usable cores and
ISA (as PGO's). A measurement taken while the host was busy (load average above half its cores,
before or after) is discarded: that build plans with the documented fallbacks (:data:`FALLBACK`,
an AVX2 desktop core; deterministic, unlike a contended measurement) and the next build measures
again. Without a compiler or on any failure the fallbacks are used too, with a warning. :class:`CpuTarget` is the cost models' view of the machine: cores, caches, vector width,
registers, and the profile.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from ascendc_pack_runtime.host import host_cpu_model

from ascendc_pack.cache import atomic_write_text, stable_hash
from ascendc_pack.config import host_cores
from ascendc_pack.toolchain.compiler import host_cpu_flags, isa_features
from ascendc_pack.toolchain.cxx import DEFAULT_CXX

log = logging.getLogger("ascendc_pack")

PROFILE_VERSION = 2  # 2: omp_wake_us
PROFILE_SUBDIR = Path("ascendc") / "host_profile"

_FMA_SOURCE = r"""
#include <stdio.h>
#include <time.h>
typedef float v __attribute__((vector_size(LANES * 4)));
int main(void) {
  v a[12], m, c;
  for (int i = 0; i < LANES; ++i) { m[i] = 0.999999f; c[i] = 1e-7f; }
  for (int j = 0; j < 12; ++j) a[j] = m * (float)(j + 1);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long n = 0; n < 200000; ++n) {
#pragma GCC unroll 12
      for (int j = 0; j < 12; ++j) a[j] = a[j] * m + c;
      __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    if (ns < best) best = ns;
  }
  float s = 0;
  for (int j = 0; j < 12; ++j) s += a[j][0];
  printf("%.6f %g\n", 200000.0 * 12 / best, s);
  return 0;
}
"""


@dataclass(frozen=True)
class HostProfile:
    """Measured machine rates (module docstring); ``source`` says how they were obtained."""

    ghz: float
    mem_gbps: float
    l2_gbps: float
    source: str = "fallback"
    omp_wake_us: float = 8.0

    def to_json(self) -> dict:
        return asdict(self)


FALLBACK = HostProfile(ghz=3.0, mem_gbps=20.0, l2_gbps=60.0, source="fallback", omp_wake_us=8.0)
"""Used where nothing can be measured: an AVX2 desktop core (3 GHz of two FMA ports, 20 GB/s of
one thread's memory stream, 60 GB/s from L2, 8 µs to wake a team) - the numbers the cost models
were first written with."""


@dataclass(frozen=True)
class CpuTarget:
    """What the cost models know about the machine: cores, per-core caches, the float vector
    width of the compile target and its vector register count, and the :class:`HostProfile`."""

    cores: int
    lanes: int = 8
    registers: int = 16
    l1d: int = 32 << 10
    l2: int = 1 << 20
    l3: int = 8 << 20
    profile: HostProfile = field(default=FALLBACK)

    @property
    def ghz(self) -> float:
        return self.profile.ghz

    @property
    def mem_gbps(self) -> float:
        return self.profile.mem_gbps

    @property
    def l2_gbps(self) -> float:
        return self.profile.l2_gbps

    @staticmethod
    def detect(cores: int, march: str = "native", caches: dict[str, int] | None = None,
               cache_dir: Path | str | None = None, profile: HostProfile | None = None) -> CpuTarget:
        """The host's caches (sysfs, else ``lscpu``, else defaults), the vector width
        ``-march=<march>`` gives g++ (AVX-512: 16 floats and 32 registers, AVX: 8 and 16,
        NEON/SVE: 4 and 32, otherwise SSE: 4 and 16) and the host profile (kept under
        ``cache_dir`` when given)."""
        caches = host_caches() if caches is None else caches
        feats = set(isa_features(march))
        if "avx512f" in feats:
            lanes, regs = 16, 32
        elif "avx" in feats:
            lanes, regs = 8, 16
        else:
            lanes, regs = 4, 32 if "asimd" in feats else 16
        d = CpuTarget(cores=max(1, cores))
        l2 = caches.get("L2", d.l2)
        profile = profile or host_profile(march, lanes, l2, cache_dir)
        return CpuTarget(cores=max(1, cores), lanes=lanes, registers=regs, l1d=caches.get("L1d", d.l1d), l2=l2,
                         l3=caches.get("L3", d.l3), profile=profile)


def host_caches() -> dict[str, int]:
    """Per-core {"L1d", "L2", "L3"} bytes: sysfs (cpu0), else ``lscpu -B -C``, else empty."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
            if kind in ("Data", "Unified"):
                scale = units.get(size[-1], 1)
                out["L1d" if level == "1" else f"L{level}"] = int(size[:-1] if scale > 1 else size) * scale
        except (OSError, ValueError, KeyError):
            continue
    if out:
        return out
    try:
        text = subprocess.run(["lscpu", "-B", "-C=NAME,ONE-SIZE"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = (line.split() for line in text.splitlines()[1:])
    return {r[0]: int(r[1]) for r in rows if len(r) == 2 and r[0] in ("L1d", "L2", "L3") and r[1].isdigit()}


def host_fingerprint() -> dict:
    """What makes timings comparable: machine, CPU model, usable cores, vector ISA (the key of
    the host profile and of every PGO record)."""
    return dict(_host_fingerprint())


@lru_cache(maxsize=1)
def _host_fingerprint() -> dict:
    model = host_cpu_model() or ""
    isa = sorted(f for f in host_cpu_flags() if f.startswith(("avx", "fma", "sse4", "f16c", "amx")))
    return {"machine": platform.machine(), "cpu": model or platform.processor(), "cores": host_cores(),
            "isa": ",".join(isa)}


_MEMO: dict[str, HostProfile] = {}
"""Profiles measured in this process, by host key: a build plans many kernels."""


def host_profile(march: str, lanes: int, l2: int, cache_dir: Path | str | None = None) -> HostProfile:
    """The profile of this host for ``-march=<march>``: this process's, else the kept one,
    else measured now (module docstring)."""
    key = stable_hash(PROFILE_VERSION, json.dumps(host_fingerprint(), sort_keys=True), march, lanes, l2)[:16]
    if key in _MEMO:
        return _MEMO[key]
    path = Path(cache_dir) / PROFILE_SUBDIR / f"{key}.json" if cache_dir is not None else None
    if path is not None:
        try:
            _MEMO[key] = HostProfile(**json.loads(path.read_text()))
            return _MEMO[key]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            log.warning("host profile %s is unusable (%s); measuring again", path, exc)
    profile, quiet = measure(march, lanes, l2)
    if not quiet:
        log.info("host busy while measuring its profile (%s); planning with the fallback rates", profile.source)
        profile = FALLBACK
    elif path is not None:
        atomic_write_text(path, json.dumps(profile.to_json()))
    _MEMO[key] = profile
    return profile


def measure(march: str, lanes: int, l2: int) -> tuple[HostProfile, bool]:
    """``(profile, quiet)``: the rates measured now, and whether the host was quiet enough to
    keep them (load average under half the cores, before and after)."""
    cores = os.cpu_count() or 1
    load0 = os.getloadavg()[0]
    try:
        fma = _fma_per_ns(march, lanes)
        mem = _copy_gbps(64 << 20)
        cached = _copy_gbps(max(16 << 10, l2 // 4))
        wake = _omp_wake_us() if cores > 1 else 0.0
    except (OSError, subprocess.SubprocessError, ValueError, RuntimeError) as exc:
        log.warning("could not measure the host profile (%s: %s); the cost models use the fallback rates "
                    "(%s)", type(exc).__name__, exc, FALLBACK)
        return FALLBACK, False
    quiet = max(load0, os.getloadavg()[0]) < cores / 2
    profile = HostProfile(ghz=round(fma / 2.0, 3), mem_gbps=round(mem, 2), l2_gbps=round(cached, 2),
                          source=f"measured {time.strftime('%Y-%m-%d')} (load {load0:.1f})",
                          omp_wake_us=round(wake, 1))
    log.info("host profile: %s", profile)
    return profile, quiet


_WAKE_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
int main(void) {
  volatile int sink = 0;
  double t[41];
  for (int r = 0; r < 41; ++r) {
    double until = now_us() + 1000.0;  /* the master busy, the team asleep (or spinning) */
    while (now_us() < until) {
    }
    double t0 = now_us();
#pragma omp parallel num_threads(2)
    { sink += omp_get_thread_num(); }
    t[r] = now_us() - t0;
  }
  qsort(t, 41, sizeof(double), cmp);
  printf("%.3f %d\n", t[20], (int)sink);
  return 0;
}
"""


def _omp_wake_us() -> float:
    """Microseconds of a 2-thread OpenMP region whose team slept (module docstring), run under
    the wait policy bundles get: the environment's, else the runtime's ``PASSIVE``."""
    from ascendc_pack_runtime.threads import POLICY, USER_VARIABLES

    env = dict(os.environ)
    if not any(v in env for v in USER_VARIABLES):
        env.update(POLICY)
    with tempfile.TemporaryDirectory(prefix="ascendc_pack_profile_") as d:
        src, exe = Path(d) / "wake.c", Path(d) / "wake"
        src.write_text(_WAKE_SOURCE)
        subprocess.run([DEFAULT_CXX, "-x", "c++", "-O2", "-fopenmp", str(src), "-o", str(exe)], check=True,
                       capture_output=True, timeout=60)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60, env=env).stdout
    return float(out.split()[0])


def _fma_per_ns(march: str, lanes: int) -> float:
    """Vector FMAs per ns of one core (the best of 5 runs of a 12-accumulator loop)."""
    with tempfile.TemporaryDirectory(prefix="ascendc_pack_profile_") as d:
        src, exe = Path(d) / "fma.c", Path(d) / "fma"
        src.write_text(_FMA_SOURCE)
        subprocess.run([DEFAULT_CXX, "-x", "c++", "-O2", f"-march={march}", f"-DLANES={lanes}", str(src), "-o",
                        str(exe)], check=True, capture_output=True, timeout=60)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    return float(out.split()[0])


def _copy_gbps(nbytes: int) -> float:
    """One thread's copy bandwidth over ``nbytes`` (read + write, the best of 5 copies)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        reps = max(5, min(200, (256 << 20) // nbytes))
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                dst.copy_(src)
            best = min(best, (time.perf_counter() - t0) / reps)
    finally:
        torch.set_num_threads(threads)
    return 2 * nbytes / best / 1e9


__all__ = ["HostProfile", "CpuTarget", "FALLBACK", "host_caches", "host_fingerprint", "host_profile", "measure"]
