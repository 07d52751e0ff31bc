"""The host a benchmark ran on: cores, load, CPU description, tool versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
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


def load_line(load: list[float] | None = None, cores: int | None = None) -> str:
    """One line for every report header: the load average against the usable cores, and a
    warning when other work competes for them (then multi-threaded contenders wait at their
    barriers and the numbers mean little)."""
    load = loadavg() if load is None else load
    cores = host_cores() if cores is None else cores
    if load is None:
        return f"load average: unavailable on this OS; {cores} usable cores"
    text = f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min) on {cores} usable cores"
    if load[0] > 0.5 * cores:
        text += " -- BUSY HOST: other work competes for the cores; expect noise, trust only stable rows"
    return text


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
