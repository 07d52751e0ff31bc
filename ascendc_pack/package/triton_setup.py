"""Run a real Triton Inference Server from the ``nvidia-pytriton`` wheel (``pip install 'ascendc-pack[triton]'``).

The wheel (0.7.0, manylinux_2_35) carries ``tritonserver`` 2.51, the Python backend
(``libtriton_python.so``, ``triton_python_backend_utils.py``) and a backend stub per Python
version. :func:`prepare_backend` lays out the backend directory Triton wants::

    DIR/python/libtriton_python.so               copied
    DIR/python/triton_python_backend_utils.py    copied
    DIR/python/triton_python_backend_stub        a symlink to this Python's stub (a copy loses
                                                 the $ORIGIN RPATH that finds its libraries)

and :class:`TritonSetup` gives the command that serves a repository written by
``ascendc-pack export-triton``. The stub's embedded Python ignores ``PYTHONPATH`` and runs the
first ``python3`` on ``PATH``, so the command puts this Python's ``bin`` first: model.py then
imports torch, numpy (< 2: :mod:`ascendc_pack_runtime.triton_model`) and zstandard from it.
CUDA/NVML messages at start are harmless on a machine without a GPU.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ascendc_pack.errors import PackError

INSTALL = "pip install 'ascendc-pack[triton]'  (nvidia-pytriton 0.7.0: tritonserver 2.51, numpy<2)"


class TritonSetupError(PackError):
    """Triton cannot be prepared here (the wheel or this Python's stub is missing)."""


def pytriton_dir() -> Path:
    """``pytriton/tritonserver`` of the installed nvidia-pytriton wheel (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonSetupError(f"nvidia-pytriton is not installed in {sys.executable}; install it with: {INSTALL}")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise TritonSetupError(f"{root} has no bin/tritonserver; reinstall it with: {INSTALL}")
    return root


def missing_libraries(binary: Path) -> list[str]:
    """Shared libraries ``binary`` needs that the dynamic linker cannot find (``ldd``)."""
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]


@dataclass(frozen=True)
class TritonSetup:
    """A prepared backend directory and how to start tritonserver with it."""

    tritonserver: Path
    backend_dir: Path
    python_bin: Path
    """The directory of the Python the stub runs (put first on PATH)."""

    def command(self, repo: str | Path, *, host: str = "127.0.0.1", http_port: int = 8000, grpc_port: int = 8001,
                metrics_port: int | None = 8002) -> list[str]:
        """tritonserver's argument list serving ``repo`` on ``host`` (loopback by default; metrics
        off with ``metrics_port=None``)."""
        cmd = [str(self.tritonserver), "--model-repository", str(Path(repo).resolve()),
               "--backend-directory", str(self.backend_dir), "--http-address", host, "--http-port", str(http_port),
               "--grpc-address", host, "--grpc-port", str(grpc_port)]
        if metrics_port is None:
            cmd += ["--allow-metrics", "false"]
        else:
            cmd += ["--metrics-address", host, "--metrics-port", str(metrics_port)]
        return cmd

    def env(self, base: dict | None = None) -> dict:
        """The environment of the server: this Python's ``bin`` first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join([str(self.python_bin), env.get("PATH", "/usr/bin:/bin")])
        return env

    def shell(self, repo: str | Path, **kwargs) -> str:
        """The command as one line to paste into a shell."""
        return f"PATH={shlex.quote(str(self.python_bin))}:$PATH " + shlex.join(self.command(repo, **kwargs))


def prepare_backend(dest: str | Path) -> TritonSetup:
    """Lay out ``dest/python/`` for this Python (``sys.executable``) and return the setup.

    Idempotent: an existing ``dest/python/`` is brought up to date.

    Raises:
        TritonSetupError: the wheel is not installed, it has no stub for this Python version, or
        the stub cannot find a library (usually ``libpython3.X.so.1.0``: the distribution's
        ``libpython3.X`` package).
    """
    root = pytriton_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.name for p in (root / "python_backend_stubs").iterdir() if p.is_dir())
        raise TritonSetupError(f"nvidia-pytriton has no Python backend stub for Python {version} (it has {have}); "
                               "run Triton's Python from one of those versions")
    missing = missing_libraries(stub)
    if missing:
        raise TritonSetupError(f"{stub} cannot find {', '.join(missing)}; install the shared Python library "
                               f"(e.g. apt-get install libpython{version}) and run triton-setup again")
    backend = Path(dest).resolve() / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copyfile(root / "backends" / "python" / name, backend / name)
    link = backend / "triton_python_backend_stub"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(stub)
    return TritonSetup(root / "bin" / "tritonserver", backend.parent, Path(sys.executable).parent)


__all__ = ["INSTALL", "TritonSetup", "TritonSetupError", "prepare_backend", "pytriton_dir", "missing_libraries"]
