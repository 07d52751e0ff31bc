"""Worker processes: each contender runs in its own ``python -m ascendc_pack.bench _serve``
process that answers JSON requests on a pipe (one worker runs at a time; the others block on
their pipe), and cold-start processes (import torch, load an artifact, first output).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from ascendc_pack.bench.contenders import Contender


def serve() -> None:
    """Worker main: JSON requests on stdin, JSON replies on the original stdout. Anything else
    the process prints (torch, Inductor, ORT) goes to stderr, i.e. the worker's log file."""
    import json

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_grad_enabled(False)  # every contender runs for inference
    worker = Contender()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        reply = worker.handle(msg)
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


class WorkerError(RuntimeError):
    """A worker process died, hung or answered garbage."""


class Local:
    """A contender in this process (``--same-process``), with :class:`Worker`'s interface."""

    def __init__(self):
        self.contender = Contender()

    def request(self, msg: dict, timeout: float) -> dict:
        with torch.no_grad():
            return self.contender.handle(msg)

    def close(self) -> None:
        self.contender = None


class Worker:
    """A contender in its own process: ``python -m ascendc_pack.bench _serve``."""

    def __init__(self, env: dict, log: Path):
        import subprocess

        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "ascendc_pack.bench", "_serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log_file, env={**os.environ, **env})
        self._buf = b""

    def request(self, msg: dict, timeout: float) -> dict:
        import json
        import select

        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"worker exited ({self._tail()})") from None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerError(f"no answer within {timeout:.0f} s; killed ({self._tail()})")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.proc.wait()
                    raise WorkerError(f"worker exited with code {self.proc.returncode} ({self._tail()})")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise WorkerError(f"bad answer {line[:200]!r}") from None

    def _tail(self) -> str:
        try:
            self._log_file.flush()
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        return f"log {self.log}: {lines[-1][:200]}" if lines else f"log {self.log} is empty"

    def close(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"cmd": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


# ---- cold start --------------------------------------------------------------------------------

_COLD_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
kind, artifact, data = sys.argv[1:4]
inputs = torch.load(data, weights_only=True)["inputs"]
t2 = time.perf_counter()
if kind == "pt2":
    m = torch._inductor.aoti_load_package(artifact)
else:
    import ascendc_pack_runtime as rt
    m = rt.load(artifact)
t3 = time.perf_counter()
with torch.no_grad():
    out = m(*inputs)
t4 = time.perf_counter()
print("@@COLD " + json.dumps({"import_s": t1 - t0, "load_s": t3 - t2, "first_call_s": t4 - t3}), flush=True)
"""


def cold_start(kind: str, artifact: str, data: str, env: dict, log: Path | None = None,
               timeout: float = 600.0) -> dict:
    """One new process: import torch, load the artifact, return the first output. ``total_s`` is
    from spawning the process to reading its first output (interpreter teardown excluded)."""
    import json
    import subprocess
    import tempfile
    import threading

    err_file = open(log, "a") if log is not None else tempfile.TemporaryFile("w+")
    with err_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", _COLD_SCRIPT, kind, artifact, data],
                                stdout=subprocess.PIPE, stderr=err_file, text=True, env={**os.environ, **env})
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        result = None
        try:
            for line in proc.stdout:
                if line.startswith("@@COLD ") and result is None:
                    result = {"total_s": time.perf_counter() - t0, **json.loads(line[7:])}
            proc.wait()
        finally:
            timer.cancel()
        if result is not None:
            return result
        if proc.returncode == -9:
            raise WorkerError(f"cold start of {artifact} took over {timeout:.0f} s; killed")
        err_file.flush()
        err_file.seek(0) if log is None else None
        text = err_file.read() if log is None else Path(log).read_text(errors="replace")
    last = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raise WorkerError(f"cold start failed (exit {proc.returncode}): {last[-1][:200] if last else 'no output'}")
