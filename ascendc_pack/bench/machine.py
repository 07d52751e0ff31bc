"""The host a benchmark ran on: cores, load, the other work while it timed, CPU description, tool
versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ISA_PREFIXES = ("sse4", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon", "bf16", "vnni")


def host_cores() -> int:
    """Cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def load_line(load: list[float] | None = None, cores: int | None = None, verdict: bool = True) -> str:
    """One line for every report header: the load average against the usable cores, and with
    ``verdict`` a warning when it is high (then multi-threaded contenders wait at their barriers
    and the numbers mean little). Where :func:`other_work` was measured, pass ``verdict=False``:
    the load average counts the benchmark's own processes, the other-work line does not."""
    load = loadavg() if load is None else load
    cores = host_cores() if cores is None else cores
    if load is None:
        return f"load average: unavailable on this OS; {cores} usable cores"
    text = f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min) on {cores} usable cores"
    if not verdict:
        return text + " (this benchmark's processes included)"
    if load[0] > 0.5 * cores:
        text += " -- BUSY HOST: other work competes for the cores; expect noise, trust only stable rows"
    return text


QUIET_OTHER_CORES = 0.1
"""Other work below this many cores on average (steal included) leaves a run quiet."""


@dataclass(frozen=True)
class CpuSample:
    """The host's CPU clock ticks at one moment: busy (``/proc/stat``'s user, nice, system, irq,
    softirq), stolen by the hypervisor, and spent by this process and every descendant (live ones
    from ``/proc``, reaped ones through the kernel's children accounting)."""

    wall: float
    busy: int
    steal: int
    own: int


def cpu_sample() -> CpuSample | None:
    """The tick counts now, or None where ``/proc`` does not give them (not Linux)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return CpuSample(time.perf_counter(), sum(fields[i] for i in (0, 1, 2, 5, 6)),
                         fields[7] if len(fields) > 7 else 0, _tree_ticks(os.getpid()))
    except (OSError, ValueError, IndexError):
        return None


def _tree_ticks(root: int) -> int:
    """Ticks of ``root`` and its live descendants, each with its reaped children's
    (``/proc/<pid>/stat`` utime, stime, cutime, cstime)."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:  # the command name is in parentheses and may hold spaces
                rest = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # exited meanwhile
            stats[int(entry.name)] = (int(rest[1]), sum(int(v) for v in rest[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo += children.get(pid, [])
    return total


def other_work(start: CpuSample | None, end: CpuSample | None) -> dict | None:
    """What work outside this process tree took between two samples, in cores on average:
    ``{"cores": ..., "steal_cores": ..., "seconds": ...}`` (None without both samples). The
    load average cannot tell this: on a small host the benchmark's own processes are most of it."""
    if start is None or end is None or end.wall <= start.wall:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    seconds = end.wall - start.wall
    other = max(0, (end.busy - start.busy) - (end.own - start.own))
    return {"cores": round(other / hz / seconds, 3), "steal_cores": round((end.steal - start.steal) / hz / seconds, 3),
            "seconds": round(seconds, 1)}


def other_work_line(work: dict | None) -> str:
    """One report line for :func:`other_work`'s result."""
    return "other work while timing: " + describe_other_work(work)


def describe_other_work(work: dict | None) -> str:
    """:func:`other_work`'s result in words, QUIET or BUSY by :data:`QUIET_OTHER_CORES`."""
    if not work:
        return "not measured (no timed rounds, or no /proc on this OS)"
    busy = work["cores"] + work["steal_cores"] >= QUIET_OTHER_CORES
    return (f"{work['cores']:.2f} cores + {work['steal_cores']:.2f} stolen by the hypervisor, on average over "
            f"{work['seconds']:.0f} s -- " + ("BUSY HOST: expect noise, trust only stable rows" if busy else
                                             f"quiet (< {QUIET_OTHER_CORES:g} cores)"))


def machine_info() -> dict:
    """CPU model, cores, ISA flags and caches (from ``lscpu``), memory, kernel, tool versions."""
    info: dict = {"cores": host_cores(), "machine": platform.machine(), "kernel": platform.release(),
                  "python": platform.python_version(), "torch": torch.__version__, "loadavg": loadavg()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    fields = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    info["cpu"] = fields.get("Model name") or platform.processor() or "unknown"
    for key in ("CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "Hypervisor vendor",
                "L1d cache", "L1i cache", "L2 cache", "L3 cache"):
        if key in fields:
            info[key] = fields[key]
    flags = fields.get("Flags", "").split()
    info["isa"] = " ".join(f for f in flags if f.startswith(ISA_PREFIXES))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    for dist in ("onnxruntime", "onnx", "onnxscript", "openvino", "torchvision", "timm", "transformers"):
        try:  # the installed version, without importing (torchvision's import can fail, docs/DESIGN.md §8)
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    try:
        info["g++"] = subprocess.run(["g++", "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        info["g++"] = None
    return info
