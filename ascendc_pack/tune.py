"""Tune: the Python-mode module and the tuning cache (DESIGN 4.3-4.4, stage 5 of the pipeline).

:class:`PythonModeModule` runs the fused Program in Python: ATen steps through torch, fused
kernels through their compiled libraries (ctypes), ``cond`` by evaluating the predicate. A
kernel with more than one candidate tunes itself on its first call, on that call's real
arguments (:func:`autotune.select`), and keeps the winner. The choice is persisted next to the
kernel's libraries, under the kernel's ``compile.lock``:

* ``optimize_tiling`` - exactly ``tiling_repr|workspace|block_dim`` of the winner (torch_npu's
  format; ``md5`` of that text is the winner's ``kernel_key``);
* ``tuning.json`` - every candidate's samples, median and spread, the protocol, the host
  fingerprint and which candidate keys were timed.

A later build loads the choice with zero profiling when the cached run timed every current
candidate on the same host; otherwise (a larger ``--topn``, another host, a corrupt
``optimize_tiling``) the kernel re-tunes.
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack_runtime.kernels import KernelLibrary, KernelLoadError

from .autotune import STATS, AutotuneError, Protocol, kernel_measure, select
from .cache import atomic_write_text
from .candidate import Candidate
from .choice import CandidateResult, KernelChoice
from .compiler import host_cpu_flags
from .config import host_cores
from .executor import run_model
from .kernels import FusedKernel, KernelCandidates
from .program import FusedStep, ModelProgram

log = logging.getLogger("ascendc_pack")

TUNING_VERSION = 1


def host_fingerprint() -> dict:
    """What makes timings comparable: machine, CPU model, usable cores, vector ISA."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    isa = sorted(f for f in host_cpu_flags() if f.startswith(("avx", "fma", "sse4", "f16c", "amx")))
    return {"machine": platform.machine(), "cpu": model or platform.processor(), "cores": host_cores(),
            "isa": ",".join(isa)}


def summary_table(choices: dict[str, KernelChoice]) -> str:
    """The build summary: kernel, #candidates, best index, best us, candidate-0 us, speedup, visited."""
    head = f"{'kernel':<44} {'cands':>5} {'best':>4} {'best us':>9} {'cand0 us':>9} {'speedup':>7} visited"
    lines = [head, "-" * len(head)]
    for name, ch in choices.items():
        best = ch.results[ch.chosen_index].median_us if ch.results else None
        c0 = ch.results[0].median_us if ch.results else None
        speed = f"{c0 / best:.2f}x" if best and c0 else "-"
        fmt = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9}"
        lines.append(f"{name[:44]:<44} {len(ch.results):>5} {ch.chosen_index:>4} {fmt(best)} {fmt(c0)} "
                     f"{speed:>7} {'yes' if ch.visited else 'no'}")
    return "\n".join(lines)


@dataclass
class _State:
    kernel: KernelCandidates
    runners: list[FusedKernel | None]
    errors: list[str | None]
    chosen: int | None = None
    visited: bool = False
    results: list[CandidateResult] | None = None
    from_cache: bool = False


class PythonModeModule:
    """Callable running a fused model in Python mode, tuning each kernel on its first call.

    Args:
        model: the fused ModelProgram.
        weights: its weight tensors by program input name.
        kernels: compiled candidates per kernel (``kernels.prepare_kernels``).
        protocol: the PGO measurement protocol.
        log_progress: called with the kernel name after each kernel is tuned (progress bars).
    """

    def __init__(self, model: ModelProgram, weights: dict[str, torch.Tensor],
                 kernels: dict[str, KernelCandidates], protocol: Protocol = Protocol(),
                 log_progress: Callable[[str], None] | None = None):
        self.model = model
        self.weights = weights
        self.protocol = protocol
        self.log_progress = log_progress
        self.states: dict[str, _State] = {name: self._load(kc) for name, kc in kernels.items()}

    # loading ------------------------------------------------------------------------------------
    def _load(self, kc: KernelCandidates) -> _State:
        runners, errors = [], []
        for cc in kc.compiled.candidates:
            if not cc.ok:
                runners.append(None)
                errors.append(cc.error or "compile failed")
                continue
            try:
                runners.append(FusedKernel(kc.step.kernel, KernelLibrary(cc.so_path, cc.candidate.kernel_key)))
                errors.append(None)
            except KernelLoadError as exc:
                runners.append(None)
                errors.append(str(exc))
        state = _State(kernel=kc, runners=runners, errors=errors)
        if all(r is None for r in runners):
            raise AutotuneError(f"kernel {kc.name}: no candidate compiled; first error:\n{errors[0]}")
        if len(runners) == 1:
            state.chosen = 0  # one candidate: no PGO, candidate 0 is the choice (written now)
            state.results = [CandidateResult(kc.compiled.candidates[0].candidate)]
            with kc.compiled.kernel_dir.lock():
                self._persist(state, timed=False)
        else:
            self._load_cached_choice(state)
        return state

    def _load_cached_choice(self, state: _State) -> None:
        kd = state.kernel.compiled.kernel_dir
        if not kd.optimize_tiling.exists():
            return
        keys = [cc.candidate.kernel_key for cc in state.kernel.compiled.candidates]
        name = state.kernel.name
        try:
            text = kd.optimize_tiling.read_text()
            cand = Candidate.parse(text)
            tuning = json.loads(kd.tuning_json.read_text())
        except (OSError, ValueError) as exc:
            log.warning("kernel %s: corrupt tuning cache (%s); re-tuning", name, exc)
            return
        if cand.kernel_key not in keys or tuning.get("chosen_key") != cand.kernel_key:
            log.warning("kernel %s: optimize_tiling %r names no current candidate; re-tuning", name, text)
            return
        if not set(keys) <= set(tuning.get("timed_keys", [])):
            log.info("kernel %s: more candidates than the cached run timed (--topn raised); re-tuning", name)
            return
        if tuning.get("host") != host_fingerprint():
            log.info("kernel %s: cached timings come from another host; re-tuning", name)
            return
        index = keys.index(cand.kernel_key)
        if state.runners[index] is None:
            return
        by_key = {r["kernel_key"]: r for r in tuning.get("candidates", [])}
        state.results = [CandidateResult.from_json(by_key[k]) if k in by_key else
                         CandidateResult(cc.candidate) for k, cc in zip(keys, state.kernel.compiled.candidates)]
        state.chosen = index
        state.visited = bool(tuning.get("visited", True))
        state.from_cache = True
        log.info("kernel %s: cached choice, best kernel index: %d", name, index)

    # running ------------------------------------------------------------------------------------
    def __call__(self, *inputs):
        return run_model(self.model, self.weights, inputs, run_fused=self._run_fused)

    def _run_fused(self, step: FusedStep, args: list[torch.Tensor]) -> list[torch.Tensor]:
        state = self.states[step.name]
        if state.chosen is None:
            self._tune(state, args)
        state.visited = True
        return state.runners[state.chosen](list(args))

    def _tune(self, state: _State, args: list[torch.Tensor]) -> None:
        kc = state.kernel
        kd = kc.compiled.kernel_dir
        with kd.lock():
            self._load_cached_choice(state)  # another process may have tuned meanwhile
            if state.chosen is not None:
                return
            STATS.kernels_profiled += 1
            sel = select(len(state.runners), _skip_failed(kernel_measure(state.runners, args), state.errors),
                         self.protocol)
            state.chosen = sel.best
            state.results = []
            for i, cc in enumerate(kc.compiled.candidates):
                err = state.errors[i] or sel.errors[i]
                res = CandidateResult(cc.candidate, sel.medians_us[i] if err is None else None,
                                      [round(s, 3) for s in sel.samples_us[i]], err)
                state.results.append(res)
                lib = kd.kernel_so(cc.candidate.kernel_key)
                if err is None:
                    log.info("Kernel %s: Timing = %.2f us", lib, res.median_us)
                else:
                    log.info("Kernel %s: failed (%s)", lib, err.splitlines()[0] if err else "")
            log.info("Autotune completed %s, best kernel index: %d", kc.name, sel.best)
            self._persist(state, timed=True, rounds=sel.rounds, number=sel.number)
        if self.log_progress:
            self.log_progress(kc.name)

    def _persist(self, state: _State, timed: bool, rounds: int = 0, number: int = 0) -> None:
        """Write optimize_tiling and tuning.json atomically (under the kernel's compile.lock)."""
        kc = state.kernel
        kd = kc.compiled.kernel_dir
        chosen = kc.compiled.candidates[state.chosen].candidate
        cands = []
        for r in state.results or []:
            d = r.to_json()
            ok = [s for s in r.samples_us]
            d["spread_us"] = round(statistics.pstdev(ok), 3) if len(ok) > 1 else 0.0
            cands.append(d)
        tuning = {
            "version": TUNING_VERSION, "kernel": kc.name, "chosen_index": state.chosen,
            "chosen_key": chosen.kernel_key, "visited": True,
            "timed_keys": [cc.candidate.kernel_key for cc in kc.compiled.candidates] if timed else
            [chosen.kernel_key],
            "protocol": {**self.protocol.to_json(), "rounds": rounds, "launches_per_sample": number}
            if timed else "single candidate: no profiling",
            "host": host_fingerprint(), "candidates": cands,
        }
        # the caller holds the kernel's compile.lock
        atomic_write_text(kd.tuning_json, json.dumps(tuning, indent=1))
        atomic_write_text(kd.optimize_tiling, chosen.optimize_tiling_text)

    # results ------------------------------------------------------------------------------------
    def choices(self) -> dict[str, KernelChoice]:
        """The choice of every kernel; unvisited kernels with several candidates get candidate 0."""
        out = {}
        for name, st in self.states.items():
            kc = st.kernel
            index = st.chosen if st.chosen is not None else 0
            if st.runners[index] is None:  # unvisited and candidate 0 failed: first usable one
                index = next(i for i, r in enumerate(st.runners) if r is not None)
            cc = kc.compiled.candidates[index]
            results = st.results or [CandidateResult(c.candidate, error=e)
                                     for c, e in zip(kc.compiled.candidates, st.errors)]
            out[name] = KernelChoice(name=name, spec=kc.step.kernel, chosen_index=index, candidate=cc.candidate,
                                     so_path=cc.so_path, visited=st.visited or st.from_cache, results=results)
        return out


def _skip_failed(measure, errors):
    def wrapped(i, number):
        if errors[i] is not None:
            from .autotune import CandidateFailed

            raise CandidateFailed(errors[i].splitlines()[0] if errors[i] else "failed")
        return measure(i, number)

    return wrapped
