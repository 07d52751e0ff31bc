"""Tune: the Python-mode module and the tuning cache (docs/DESIGN.md §2.5, §3.4).

:class:`PythonModeModule` runs the fused Program in Python: ATen steps through torch, fused
kernels through their compiled libraries (ctypes), tactic steps by their chosen tactic
(:class:`~ascendc_pack.tactics.lower.LoweredRunner`), ``cond`` by evaluating the predicate. A
kernel with more than one candidate tunes itself on its first call, on that call's real
arguments (:func:`autotune.select`), and keeps the winner. The choice is persisted next to the
kernel's libraries, under the kernel's ``compile.lock``:

* ``optimize_tiling`` - exactly ``tiling_repr|workspace|block_dim`` of the winner (torch_npu's
  format; ``md5`` of that text is the winner's ``kernel_key``);
* ``tuning.json`` - every candidate's samples, median and spread, the protocol, the host
  fingerprint and which candidate keys were timed.

Before timing, every candidate runs once on the same arguments in an isolated worker and its
outputs are compared with the reference (:mod:`ascendc_pack.autotune.verify`); a wrong, crashing or
hanging candidate is disqualified. When no candidate is left (or none compiled), the kernel
falls back to its ATen steps: it runs them here, the record says so, and the bundle inlines
them (:func:`inline_kernels`) - never a wrong answer.

A later build loads the choice (or the fallback) with zero profiling when the cached run timed
every current candidate on the same host with this record version; otherwise (a larger
``--topn``, another host, a corrupt ``optimize_tiling``) the kernel re-tunes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from ascendc_pack_runtime.kernels import KernelLoadError

from ascendc_pack.autotune.protocol import AutotuneError, CandidateFailed, Protocol, Selection, contention_clock, select
from ascendc_pack.backends.protocol import Backend
from ascendc_pack.backends.registry import get_backend
from ascendc_pack.cache import atomic_write_text
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.choice import CandidateResult, KernelChoice, KernelFallback, MeasurementQuality, unstable_footnote, format_us
from ascendc_pack.toolchain.compiler import CompileCounts
from ascendc_pack.config import host_cores
from ascendc_pack.kernels.target import host_fingerprint
from ascendc_pack.frontend.executor import run_model, run_reference_fused
from ascendc_pack.kernels.fused.build import FusedKernel, KernelCandidates
from ascendc_pack.ir.program import CondStep, FusedStep, ModelProgram, Program
from ascendc_pack.tactics.lower import LoweredRunner
from ascendc_pack.autotune.verify import verify_candidates

log = logging.getLogger("ascendc_pack")

TUNING_VERSION = 2
"""Version of a kernel's cached ``tuning.json``; 2 records verification (a version-1 record was
never verified, so its kernel re-tunes)."""


def summary_table(choices: dict[str, KernelChoice], fallbacks: dict[str, KernelFallback] | None = None) -> str:
    """The build summary: kernel, #candidates, best index, best us, candidate-0 us, speedup,
    visited; a kernel that fell back to ATen shows ``aten`` as its best index."""
    head = f"{'kernel':<44} {'cands':>5} {'best':>4} {'best':>10} {'cand0':>10} {'speedup':>8} visited"
    lines = [head, "-" * len(head)]
    fmt = lambda v: f"{format_us(v):>10}" if v is not None else f"{'-':>10}"  # noqa: E731
    for name, ch in choices.items():
        best = ch.results[ch.chosen_index].median_us if ch.results else None
        c0 = ch.results[0].median_us if ch.results else None
        speed = f"{c0 / best:.2f}x" if best and c0 else "-"
        if ch.quality is not None and not ch.quality.stable:
            speed += "?"
        lines.append(f"{name[:44]:<44} {len(ch.results):>5} {ch.chosen_index:>4} {fmt(best)} {fmt(c0)} "
                     f"{speed:>8} {'yes' if ch.visited else 'no'}")
    for name, fb in (fallbacks or {}).items():
        lines.append(f"{name[:44]:<44} {len(fb.results):>5} {'aten':>4} {fmt(None)} {fmt(None)} {'-':>8} "
                     f"{'yes' if fb.visited else 'no'}  (fell back to ATen: {fb.reason})")
    note = unstable_footnote([ch.quality for ch in choices.values()], "kernel")
    return "\n".join(lines + ([note] if note else []))


@dataclass
class _State:
    kernel: KernelCandidates
    runners: list[FusedKernel | None]
    errors: list[str | None]
    chosen: int | None = None
    fallback: str | None = None     # why the kernel runs as its ATen steps (no usable candidate)
    visited: bool = False
    results: list[CandidateResult] | None = None
    from_cache: bool = False
    profiled: bool = False          # verified and timed in this process
    quality: MeasurementQuality | None = None

    @property
    def decided(self) -> bool:
        return self.chosen is not None or self.fallback is not None


class PythonModeModule:
    """Callable running a fused model in Python mode, tuning each kernel on its first call.

    Args:
        model: the fused ModelProgram.
        weights: its weight tensors by program input name.
        kernels: compiled candidates per kernel (``kernels.prepare_kernels``).
        protocol: the PGO measurement protocol.
        log_progress: called with the kernel name after each kernel is tuned (progress bars).
        backend: launcher, timer and verification sandbox (default: the ``cpu`` backend).
        pool: the task pool candidates are timed on (``timing_pool(config)``: the one graph.so
            runs kernels exporting ``ap_kernel_launch_pool`` on); None: OpenMP.

    The verification worker is started on the first kernel that needs it; :meth:`close` (or
    garbage collection) stops it.
    """

    def __init__(self, model: ModelProgram, weights: dict[str, torch.Tensor],
                 kernels: dict[str, KernelCandidates], protocol: Protocol = Protocol(),
                 log_progress: Callable[[str], None] | None = None, backend: Backend | None = None,
                 pool: int | None = None):
        self.model = model
        self.pool = pool
        self.weights = weights
        self.protocol = protocol
        self.log_progress = log_progress
        self.backend = backend or get_backend()
        self.sandbox = self.backend.sandbox()
        self._finalizer = weakref.finalize(self, self.sandbox.close)
        self.states: dict[str, _State] = {name: self._load(kc) for name, kc in kernels.items()}
        self._tactics = LoweredRunner(model)

    def close(self) -> None:
        """Stop the verification worker (the module still runs; a later tuning restarts it)."""
        self.sandbox.close()

    def __enter__(self) -> PythonModeModule:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # loading ------------------------------------------------------------------------------------
    def _load(self, kc: KernelCandidates) -> _State:
        runners, errors = [], []
        for cc in kc.compiled.candidates:
            if not cc.ok:
                runners.append(None)
                errors.append(cc.error or "compile failed")
                continue
            try:
                runners.append(self.backend.load_kernel(kc.step.kernel, cc.so_path, cc.candidate.kernel_key))
                errors.append(None)
            except KernelLoadError as exc:
                runners.append(None)
                errors.append(str(exc))
        state = _State(kernel=kc, runners=runners, errors=errors)
        if all(r is None for r in runners):
            state.fallback = "no candidate compiled"
            state.results = [CandidateResult(cc.candidate, error=e) for cc, e in zip(kc.compiled.candidates, errors)]
            log.warning("kernel %s: no candidate compiled (first error: %s); it falls back to its ATen steps",
                        kc.name, (errors[0] or "").splitlines()[0])
        elif len(runners) == 1:
            state.chosen = 0  # one candidate: no PGO, candidate 0 is the choice (written now)
            state.results = [CandidateResult(kc.compiled.candidates[0].candidate)]
            with kc.compiled.kernel_dir.lock():
                self._persist(state, timed=False)
        else:
            self._load_cached_choice(state)
        return state

    def _load_cached_choice(self, state: _State) -> None:
        kd = state.kernel.compiled.kernel_dir
        keys = [cc.candidate.kernel_key for cc in state.kernel.compiled.candidates]
        name = state.kernel.name
        try:
            tuning = json.loads(kd.tuning_json.read_text())
            if not isinstance(tuning, dict):
                raise ValueError("tuning.json is not an object")
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("kernel %s: corrupt tuning cache (%s); re-tuning", name, exc)
            return
        if tuning.get("version") != TUNING_VERSION:
            log.info("kernel %s: the cached tuning record has version %s, not %d; re-tuning", name,
                     tuning.get("version"), TUNING_VERSION)
            return
        if not set(keys) <= set(tuning.get("timed_keys", [])):
            log.info("kernel %s: more candidates than the cached run timed (--topn raised); re-tuning", name)
            return
        if tuning.get("host") != host_fingerprint():
            log.info("kernel %s: cached timings come from another host; re-tuning", name)
            return
        by_key = {r["kernel_key"]: r for r in tuning.get("candidates", [])}
        results = [CandidateResult.from_json(by_key[k]) if k in by_key else CandidateResult(cc.candidate)
                   for k, cc in zip(keys, state.kernel.compiled.candidates)]
        if tuning.get("fallback"):
            state.fallback, state.results, state.from_cache = tuning.get("fallback_reason") or "cached", results, True
            log.warning("kernel %s: cached record: no candidate passed (%s); it falls back to its ATen steps",
                        name, state.fallback)
            return
        try:
            text = kd.optimize_tiling.read_text()
            cand = Candidate.parse(text)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("kernel %s: corrupt tuning cache (%s); re-tuning", name, exc)
            return
        if cand.kernel_key not in keys or tuning.get("chosen_key") != cand.kernel_key:
            log.warning("kernel %s: optimize_tiling %r names no current candidate; re-tuning", name, text)
            return
        index = keys.index(cand.kernel_key)
        if state.runners[index] is None:
            return
        state.results = results
        state.chosen = index
        state.quality = MeasurementQuality.from_json(tuning.get("quality"))
        state.visited = bool(tuning.get("visited", True))
        state.from_cache = True
        log.info("kernel %s: cached choice, best kernel index: %d", name, index)

    # running ------------------------------------------------------------------------------------
    def __call__(self, *inputs):
        return run_model(self.model, self.weights, inputs, run_fused=self._run_fused, run_tactic=self._tactics)

    def _run_fused(self, step: FusedStep, args: list[torch.Tensor]) -> list[torch.Tensor]:
        state = self.states[step.name]
        if not state.decided:
            self._tune(state, args)
        state.visited = True
        if state.fallback is not None:
            return run_reference_fused(step, args)
        return state.runners[state.chosen](list(args))

    def _tune(self, state: _State, args: list[torch.Tensor]) -> None:
        """Verify, then time the candidates that passed; keep the fastest, or fall back to ATen."""
        kc = state.kernel
        kd = kc.compiled.kernel_dir
        with kd.lock():
            self._load_cached_choice(state)  # another process may have tuned meanwhile
            if state.decided:
                return
            state.profiled = True
            verdicts = verify_candidates(kc.step, state.runners, args, self.sandbox, self.protocol.verify_timeout_s)
            errors = [e or (v.message if v is not None else None) for e, v in zip(state.errors, verdicts)]
            for i, v in enumerate(verdicts):
                if v is not None:
                    log.warning("kernel %s: candidate #%d (tiling %s) %s", kc.name, i,
                                kc.compiled.candidates[i].candidate.optimize_tiling_text, v.message)
            try:
                sel = select(len(state.runners), _skip_failed(self.backend.timer(state.runners, args, self.pool), errors),
                             self.protocol, contention=contention_clock)
                errors = [e or sel.errors[i] for i, e in enumerate(errors)]
            except AutotuneError as exc:  # the candidates that passed verification crashed when timed
                sel = None
                errors = [e or f"failed while timed ({exc})" for e in errors]
            self._record(state, sel, errors, verdicts)
            self._persist(state, timed=True, sel=sel)
        if self.log_progress:
            self.log_progress(kc.name)

    def _record(self, state: _State, sel, errors: list[str | None], verdicts: list) -> None:
        """Results per candidate, the log lines of docs/DESIGN.md §2.5, and the choice or the fallback."""
        kc = state.kernel
        kd = kc.compiled.kernel_dir
        state.results = []
        for i, cc in enumerate(kc.compiled.candidates):
            err = errors[i]
            res = CandidateResult(cc.candidate, sel.medians_us[i] if sel and err is None else None,
                                  [round(x, 3) for x in sel.samples_us[i]] if sel else [], err,
                                  verdicts[i].to_json() if verdicts[i] is not None else None)
            state.results.append(res)
            lib = kd.kernel_so(cc.candidate.kernel_key)
            if err is None:
                log.info("Kernel %s: Timing = %.2f us", lib, res.median_us)
            else:
                log.info("Kernel %s: failed (%s)", lib, err.splitlines()[0])
        if sel is None:
            state.fallback = "every candidate was disqualified or failed"
            log.warning("kernel %s: every candidate was disqualified or failed; it falls back to its ATen "
                        "steps (correct, but not a tuned kernel). Reasons are in %s", kc.name, kd.tuning_json)
        else:
            state.chosen = sel.best
            state.quality = MeasurementQuality.assess(state.results, sel.best, os.getloadavg()[0], host_cores(),
                                                      sel.wait_share)
            log.info("Autotune completed %s, best kernel index: %d", kc.name, sel.best)
            if not state.quality.stable:
                log.warning("kernel %s: timings are unstable (%s); the choice may be noise: re-tune on a "
                            "quiet machine", kc.name, state.quality.describe())

    def _persist(self, state: _State, timed: bool, sel: Selection | None = None) -> None:
        """Write tuning.json and optimize_tiling atomically (the caller holds compile.lock);
        a fallback removes optimize_tiling (there is no winner)."""
        kc = state.kernel
        kd = kc.compiled.kernel_dir
        chosen = kc.compiled.candidates[state.chosen].candidate if state.chosen is not None else None
        cands = []
        for r in state.results or []:
            d = r.to_json()
            d["spread_us"] = round(statistics.pstdev(r.samples_us), 3) if len(r.samples_us) > 1 else 0.0
            cands.append(d)
        tuning = {
            "version": TUNING_VERSION, "kernel": kc.name, "chosen_index": state.chosen,
            "chosen_key": chosen.kernel_key if chosen else None, "visited": True,
            "fallback": "aten" if state.fallback else None, "fallback_reason": state.fallback,
            "timed_keys": [cc.candidate.kernel_key for cc in kc.compiled.candidates] if timed else
            [chosen.kernel_key],
            "protocol": {**self.protocol.to_json(), "rounds": sel.rounds if sel else 0,
                         "launches_per_sample": sel.number if sel else 0,
                         "contended_samples_retaken": sel.retaken if sel else 0,
                         "timing": self.backend.timing}
            if timed else "single candidate: no profiling",
            "host": host_fingerprint(), "candidates": cands,
        }
        if state.quality is not None:
            tuning["quality"] = state.quality.to_json()
        atomic_write_text(kd.tuning_json, json.dumps(tuning, indent=1))
        if chosen is not None:
            atomic_write_text(kd.optimize_tiling, chosen.optimize_tiling_text)
        else:
            kd.optimize_tiling.unlink(missing_ok=True)

    # results ------------------------------------------------------------------------------------
    def choices(self) -> dict[str, KernelChoice]:
        """The choice of every kernel that has one (see :meth:`fallbacks` for the others);
        unvisited kernels with several candidates get candidate 0 (or the first that loaded)."""
        out = {}
        for name, st in self.states.items():
            if st.fallback is not None:
                continue
            kc = st.kernel
            index = st.chosen if st.chosen is not None else 0
            if st.runners[index] is None:  # unvisited and candidate 0 failed: first usable one
                index = next(i for i, r in enumerate(st.runners) if r is not None)
            cc = kc.compiled.candidates[index]
            results = st.results or [CandidateResult(c.candidate, error=e)
                                     for c, e in zip(kc.compiled.candidates, st.errors)]
            out[name] = KernelChoice(name=name, spec=kc.step.kernel, chosen_index=index, candidate=cc.candidate,
                                     so_path=cc.so_path, visited=st.visited or st.from_cache, results=results,
                                     quality=st.quality)
        return out

    def fallbacks(self) -> dict[str, KernelFallback]:
        """Kernels without a usable candidate: they run (and are bundled) as their ATen steps."""
        return {name: KernelFallback(name, st.fallback, list(st.results or []), st.visited or st.from_cache)
                for name, st in self.states.items() if st.fallback is not None}

    def reach_all(self) -> None:
        """Mark every kernel visited, as a run does on a program without ``torch.cond`` (every
        run reaches every step): a warm rebuild with nothing left to tune skips the runs."""
        for st in self.states.values():
            st.visited = True

    def pending(self) -> int:
        """Kernels that will time their candidates when a run first reaches them."""
        return sum(1 for st in self.states.values() if not st.decided)

    @property
    def compile_counts(self) -> CompileCounts:
        """What compiling this module's kernels did (compiler runs, cache hits, failures)."""
        return CompileCounts.of(st.kernel.compiled for st in self.states.values())

    @property
    def kernels_profiled(self) -> int:
        """Kernels whose candidates this module verified and timed (0 on a warm cache)."""
        return sum(st.profiled for st in self.states.values())

    @property
    def candidates_disqualified(self) -> int:
        """Candidates this module's verification rejected."""
        return sum(1 for st in self.states.values() if st.profiled
                   for r in st.results or [] if r.disqualified is not None)


def _skip_failed(measure, errors):
    def wrapped(i, number):
        if errors[i] is not None:
            raise CandidateFailed(errors[i].splitlines()[0] if errors[i] else "failed")
        return measure(i, number)

    return wrapped


def inline_kernels(model: ModelProgram, names) -> ModelProgram:
    """``model`` with every fused step named in ``names`` replaced by the ATen steps it fused
    (cond branches included). The original is not changed."""
    names = set(names)
    return dataclasses.replace(model, program=_inline(model.program, names)) if names else model


def _inline(program: Program, names: set[str]) -> Program:
    steps = []
    for s in program.steps:
        if isinstance(s, FusedStep) and s.name in names:
            steps.extend(s.steps)
        elif isinstance(s, CondStep):
            steps.append(dataclasses.replace(s, then_branch=_inline(s.then_branch, names),
                                             else_branch=_inline(s.else_branch, names)))
        else:
            steps.append(s)
    return dataclasses.replace(program, steps=steps)
