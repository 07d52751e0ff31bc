"""PGO verification: every candidate's outputs on the real arguments are checked before it is timed.

Before a kernel's candidates are timed (:mod:`ascendc_pack.tune.python_mode`), each one runs once on the
kernel's real arguments and its outputs are compared with the reference - the fused step's own
ATen steps run by the reference executor - within the tolerances of the parity suite
(:func:`tolerance`). A candidate that computes a wrong result, returns a non-zero status, writes
into its inputs, crashes or hangs is disqualified: it is never timed nor chosen, the reason is
logged and recorded in ``tuning.json``.

Why a separate process. Kernels are launched through ctypes; a kernel that never returns cannot
be interrupted inside the build process (a watchdog thread could notice, but the spinning
threads would stay and skew every later timing), and one that crashes would take the build down.
So the verification launch runs in a worker process (:class:`KernelSandbox`) that is killed
after a timeout and started afresh for the next candidate. Measured on the shared 2-core host
(load ~10): a worker that imports torch takes ~5 s to start, one that imports only the standard
library (``autotune/kernel_worker.py``) ~80 ms; forking the multi-threaded build process instead is not
safe with torch and OpenMP. The arguments travel through one shared file per kernel
(``/dev/shm`` when it has room), written once and mapped by both sides: no tensor is pickled or
copied per candidate. Verifying transformer_block's 10 kernels x 4 candidates took ~0.7-0.9 s of
a ~11 s tune stage (within the noise of the stage's time). Candidates that pass are then timed
in-process, where they already ran safely on these inputs.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides, span_elems

from ascendc_pack.frontend.executor import run_reference_fused
from ascendc_pack.ir.program import FusedStep

log = logging.getLogger("ascendc_pack")

WORKER = Path(__file__).with_name("kernel_worker.py")
TIMEOUT_PER_REFERENCE = 100.0
"""A candidate may take this many times the reference's run time (but at least the protocol's
``verify_timeout_s``) before it counts as hung."""
_ALIGN = 64
_POISON = 0xFF  # outputs start as NaN / -1, so a kernel that writes nothing cannot pass


ROUNDING_SHARE = 1e-3
"""A rounded output (:func:`rounded_outputs`) may differ from the reference by one on at most this
share of its elements (at least one element)."""


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` a kernel output of ``dtype`` must meet against the reference (the parity
    suite's tolerances; integer and bool outputs must be exact, rounded ones nearly: :func:`compare_output`)."""
    return {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}.get(dtype, (2e-5, 2e-5))


def rounded_outputs(step: FusedStep) -> set[str]:
    """The outputs of ``step`` that round a computed float to an integer type: an int8 candidate's
    quantized activation, ``_to_copy(round(...))``. The float before the rounding carries the float
    tolerance, so where it sits within that of a .5 boundary the kernel and the reference round to
    neighbouring integers (seen here: 5 of 524288 elements after a LayerNorm + GELU)."""
    if not any(s.op == "aten.round.default" for s in step.steps):
        return set()
    return {out for s in step.steps if s.op == "aten._to_copy.default" and _is_integer(s.kwargs.get("dtype"))
            for out in s.outputs if out}


def _is_integer(dtype) -> bool:
    return isinstance(dtype, torch.dtype) and not dtype.is_floating_point and not dtype.is_complex


@dataclass(frozen=True)
class Disqualification:
    """Why a candidate was disqualified: ``reason`` is one of ``wrong result``, ``timeout``,
    ``crashed``, ``status``, ``wrote into its input``; ``max_error`` / ``allowed`` (at the worst
    element) and ``output`` are set for a wrong result."""

    reason: str
    detail: str
    output: str | None = None
    max_error: float | None = None
    allowed: float | None = None

    @property
    def message(self) -> str:
        return f"disqualified ({self.reason}): {self.detail}"

    def to_json(self) -> dict:
        return {"reason": self.reason, "detail": self.detail, "output": self.output,
                "max_error": self.max_error, "allowed": self.allowed}

    @staticmethod
    def from_json(d: dict) -> Disqualification:
        return Disqualification(d["reason"], d["detail"], d.get("output"), d.get("max_error"), d.get("allowed"))


def compare_output(name: str, actual: torch.Tensor, expected: torch.Tensor,
                   rounded: bool = False) -> Disqualification | None:
    """None when ``actual`` matches ``expected`` within :func:`tolerance`, else what differs:
    the largest error (at the element that exceeds its allowance most) and that allowance.
    ``rounded`` (an integer output of :func:`rounded_outputs`): off by one is allowed on at most
    :data:`ROUNDING_SHARE` of the elements; a kernel that truncates instead of rounding, or is off
    by two anywhere, still fails."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return Disqualification("wrong result", f"output {name} is {actual.dtype}{list(actual.shape)}, the "
                                f"reference {expected.dtype}{list(expected.shape)}", name)
    if actual.dtype.is_floating_point:
        atol, rtol = tolerance(actual.dtype)
        # the common case first, in a few passes (torch.isclose took 50 ms where this takes 0.6 ms
        # on a 512k-element output here); NaN/inf and mismatches go on to the exact report in float64
        fast = torch.float32 if actual.element_size() < 4 else actual.dtype
        a, e = actual.to(fast), expected.to(fast)
        if bool(((a - e).abs_() <= e.abs().mul_(rtol).add_(atol)).all()):
            return None
        a, e = actual.double(), expected.double()
        same = (a == e) | (a.isnan() & e.isnan())   # equal infinities and NaN positions match
        err = torch.where(same, torch.zeros_like(a), (a - e).abs().nan_to_num(nan=float("inf")))
        allowed = atol + rtol * e.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        how = f"atol {atol:g} + rtol {rtol:g} x |expected|"
    else:
        a, e = actual.to(torch.int64), expected.to(torch.int64)  # bool as 0/1
        err = (a - e).abs().double()
        allowed = torch.zeros_like(err)
        how = "exact"
        if rounded:
            off_by_one = int((err == 1).sum())
            if off_by_one <= max(1, int(ROUNDING_SHARE * err.numel())):
                allowed.fill_(1.0)
                how = f"rounded: off by one on at most {ROUNDING_SHARE:g} of the elements"
            else:
                how = f"rounded: off by one on {off_by_one} elements, more than {ROUNDING_SHARE:g} of them"
    bad = err > allowed
    count = int(bad.sum())
    if not count:
        return None
    worst = int(torch.argmax(torch.where(bad, err - allowed, torch.full_like(err, -1.0)).flatten()))
    index = list(torch.unravel_index(torch.tensor(worst), actual.shape)) if actual.dim() else []
    index = [int(i) for i in index]
    max_err, allow = float(err.flatten()[worst]), float(allowed.flatten()[worst])
    got, want = a.flatten()[worst].item(), e.flatten()[worst].item()
    return Disqualification(
        "wrong result", f"output {name}: max error {max_err:.3g} at {index} (got {got!r}, expected {want!r}) "
        f"exceeds the allowed {allow:.3g} ({how}); {count} of {actual.numel()} elements differ",
        name, max_err, allow)


class SandboxHung(Exception):
    """The kernel did not return within the timeout (the worker was killed)."""


class SandboxCrashed(Exception):
    """The worker died while running the kernel (e.g. a segmentation fault)."""


class _Arena:
    """One shared file holding a kernel's inputs (in the layout the kernel expects) and its outputs.

    Each input is stored as the storage span its strides address, so expanded (stride-0) and
    strided inputs keep their exact memory layout; outputs are dense, as the launcher allocates
    them. Offsets are 64-byte aligned.
    """

    def __init__(self, inputs: list[torch.Tensor], out_specs: list[tuple]):
        """``out_specs``: ``(shape, dtype)`` or ``(shape, dtype, stride)`` per output (a dense
        layout; contiguous when absent)."""
        spans, offset = [], 0
        for t in inputs:
            n = span_elems(t.shape, t.stride()) * t.element_size()
            spans.append((offset, n))
            offset += -(-n // _ALIGN) * _ALIGN
        outs = []
        for shape, dtype, *_ in out_specs:
            n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            outs.append((offset, n))
            offset += -(-n // _ALIGN) * _ALIGN
        self.size = max(offset, _ALIGN)
        fd, name = tempfile.mkstemp(prefix="ascendc-pack-verify-", dir=_shared_dir(self.size))
        self.path = Path(name)
        try:
            os.ftruncate(fd, self.size)
            self._bytes = torch.from_file(name, shared=True, size=self.size, dtype=torch.uint8)
        finally:
            os.close(fd)
        self._output_spans = outs
        self.input_offsets = [o for o, _ in spans]
        self.output_offsets = [o for o, _ in outs]
        self._sources = [_span_view(t) for t in inputs]
        self._inputs = [self._bytes[o:o + n].view(t.dtype) for (o, n), t in zip(spans, inputs)]
        self.outputs = [self._bytes[o:o + n].view(spec[1]).as_strided(spec[0], spec[2] if len(spec) > 2 else
                                                                      contiguous_strides(spec[0]))
                        for (o, n), spec in zip(outs, out_specs)]
        self.restore_inputs()

    def restore_inputs(self) -> None:
        for dst, src in zip(self._inputs, self._sources):
            dst.copy_(src)

    def inputs_intact(self) -> bool:
        return all(torch.equal(dst, src) for dst, src in zip(self._inputs, self._sources))

    def poison_outputs(self) -> None:
        for o, n in self._output_spans:
            self._bytes[o:o + n].fill_(_POISON)

    def close(self) -> None:
        self.outputs, self._inputs, self._bytes = [], [], None
        self.path.unlink(missing_ok=True)


Arena = _Arena
"""The shared input/output file of one sandboxed launch (also used for GEMM tactic candidates)."""


def _span_view(t: torch.Tensor) -> torch.Tensor:
    """The 1-D run of ``t``'s storage its strides address (what the kernel reads)."""
    return torch.as_strided(t, (span_elems(t.shape, t.stride()),), (1,), t.storage_offset())


def _shared_dir(size: int) -> str:
    """``/dev/shm`` (memory) when it has room for ``size`` bytes with margin, else the temp dir
    (containers often cap ``/dev/shm`` at 64 MiB; writing past the cap would be a SIGBUS)."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > 2 * size + (16 << 20) and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


class KernelSandbox:
    """A persistent launch worker (``autotune/kernel_worker.py``) for one build, started on first use.

    :meth:`launch` runs one kernel library on an arena and returns its status; it raises
    :class:`SandboxHung` after ``timeout_s`` (the worker is killed; the next launch starts a new
    one) and :class:`SandboxCrashed` when the worker dies. The worker runs in its own session,
    so a Ctrl-C in the terminal reaches only the build, which stops the worker in :meth:`close`.
    """

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self.starts = 0

    def _start(self) -> subprocess.Popen:
        self._stderr = tempfile.TemporaryFile()
        # OpenMP threads of the worker sleep as soon as a kernel returns instead of spinning on
        # the cores the build needs next (it compares outputs while the worker waits)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        self._proc = subprocess.Popen([sys.executable, "-I", str(WORKER), str(os.getpid())],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      bufsize=0, start_new_session=True, env=env)
        self.starts += 1
        return self._proc

    def launch(self, so_path: Path | str, arena: _Arena, workspace: int, timeout_s: float) -> int:
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        req = {"so": str(so_path), "file": str(arena.path), "size": arena.size, "inputs": arena.input_offsets,
               "outputs": arena.output_offsets, "workspace": int(workspace)}
        try:
            proc.stdin.write((json.dumps(req) + "\n").encode())
        except BrokenPipeError:
            raise SandboxCrashed(self._death_note()) from None
        line = self._read_line(proc, time.monotonic() + timeout_s)
        if line is None:
            self.close()
            raise SandboxHung(f"no result after {timeout_s:.3g} s; the kernel was stopped")
        if not line:
            raise SandboxCrashed(self._death_note())
        reply = json.loads(line)
        if "error" in reply:  # the record goes into bundles: no path of the build machine in it
            raise SandboxCrashed(f"cannot launch: {reply['error'].replace(str(so_path), 'kernel.so')}")
        return int(reply["rc"])

    @staticmethod
    def _read_line(proc: subprocess.Popen, deadline: float) -> bytes | None:
        """The worker's next reply line; b"" when it died, None on timeout."""
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not buf.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    return b""
                buf += chunk
        return buf

    def _death_note(self) -> str:
        proc = self._proc
        rc = proc.wait() if proc is not None else None
        tail = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            tail = self._stderr.read()[-500:].decode(errors="replace").strip()
        self.close()
        how = f"killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        if tail:  # logged, not recorded: it may hold paths of this machine
            log.warning("the kernel verification worker died (%s); its last output:\n%s", how, tail)
        return f"the kernel crashed ({how})"

    def close(self) -> None:
        """Stop the worker (if running)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                f.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def verify_candidates(step: FusedStep, runners: list, args: list[torch.Tensor], sandbox: KernelSandbox,
                      min_timeout_s: float) -> list[Disqualification | None]:
    """Run every loaded candidate (``runners[i]``, a ``FusedKernel`` or None) once on ``args`` in
    ``sandbox`` and compare its outputs with the reference; one verdict per candidate (None =
    passed, or not loaded). The timeout of each launch is ``max(min_timeout_s,
    TIMEOUT_PER_REFERENCE x the reference's run time)``."""
    verdicts: list[Disqualification | None] = [None] * len(runners)
    loaded = [r for r in runners if r is not None]
    if not loaded:
        return verdicts
    with _one_thread(), torch.no_grad():
        t0 = time.perf_counter()
        reference = run_reference_fused(step, list(args))
        timeout = max(min_timeout_s, TIMEOUT_PER_REFERENCE * (time.perf_counter() - t0))
        arena = _Arena(loaded[0].prepare_inputs(list(args)), loaded[0].out_specs)
        try:
            for i, runner in enumerate(runners):
                if runner is not None:
                    verdicts[i] = _verify_one(step, runner, arena, reference, sandbox, timeout)
        finally:
            arena.close()
    return verdicts


@contextmanager
def _one_thread():
    """Run torch single-threaded meanwhile (restored after). The comparisons are a few passes
    over each output; on a busy 2-core host each multi-threaded pass waited 10-100 ms for its
    second thread to be scheduled (2.4 ms single-threaded for a 512k-element output)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def launch_checked(sandbox: KernelSandbox, so_path, arena: _Arena, workspace: int,
                   timeout: float) -> Disqualification | None:
    """Launch one compiled candidate in ``sandbox`` on ``arena`` (outputs poisoned first): why it
    must be disqualified (a hang, a crash, a non-zero status, a write into an input, whose inputs
    are then restored), or None when it ran cleanly and its outputs are ready to compare."""
    arena.poison_outputs()
    try:
        rc = sandbox.launch(so_path, arena, workspace, timeout)
    except SandboxHung as exc:
        return Disqualification("timeout", str(exc))
    except SandboxCrashed as exc:
        return Disqualification("crashed", str(exc))
    if rc != 0:
        return Disqualification("status", f"returned status {rc}")
    if not arena.inputs_intact():
        arena.restore_inputs()
        return Disqualification("wrote into its input", "the kernel changed one of its input tensors")
    return None


def verify_in_sandbox(sandbox: KernelSandbox, so_path, workspace: int, inputs: list[torch.Tensor], out_spec: tuple,
                      timeout: float, expected: torch.Tensor, ref64: torch.Tensor | None, as_output=None,
                      check=None) -> dict | None:
    """One generated kernel's candidate run once in ``sandbox`` on ``inputs`` (its one output
    ``out_spec``: ``(shape, dtype[, stride])``) and compared with ``expected`` by the accuracy
    rule (``ref64``: the float64 second look; ``as_output`` maps both to the output's form), or
    by ``check(expected, got)`` (an ``OutputCheck``: a low-precision candidate's step tolerance).
    None when it passed, else the disqualification record of a tactic candidate."""
    from ascendc_pack_runtime.accuracy import check_tensor

    arena = _Arena(inputs, [out_spec])
    try:
        bad = launch_checked(sandbox, so_path, arena, workspace, timeout)
        if bad is not None:
            return _record(bad.reason, bad.detail)
        got = arena.outputs[0].clone()
    finally:
        arena.close()
    view = as_output or (lambda t: t.reshape(got.shape))
    if check is None:
        check = check_tensor("output", view(expected), got, view(ref64) if ref64 is not None else None)
    else:
        check = check(view(expected), got)
    if not check.ok:
        return {**_record("wrong result", check.problem), "max_error": check.max_error, "allowed": check.allowed}
    return None


def _record(reason: str, detail: str) -> dict:
    return {"reason": reason, "detail": detail, "output": None, "max_error": None, "allowed": None}


def _verify_one(step: FusedStep, runner, arena: _Arena, reference: list[torch.Tensor], sandbox: KernelSandbox,
                timeout: float) -> Disqualification | None:
    bad = launch_checked(sandbox, runner.lib.path, arena, runner.lib.workspace, timeout)
    if bad is not None:
        return bad
    rounded = rounded_outputs(step)
    for name, out, ref in zip(step.outputs, arena.outputs, reference):
        bad = compare_output(name, out, ref, rounded=name in rounded)
        if bad is not None:
            return bad
    return None
