"""PGO of tactic steps: every candidate verified, then timed, on the step's real arguments.

:class:`TacticTuner` runs the model (its TacticSteps, before fusion) through the reference
executor on the real inputs. A tactic step with more than one candidate
(:func:`ascendc_pack.tactics.rewrite.candidates_for`) tunes itself on its first call, with the
protocol of fused kernels (docs/DESIGN.md §2.5):

* **verify**: every candidate runs once on the call's arguments (weights derived by its own
  build- and load-stage calls) and its output is compared with the reference (the ATen steps the
  step replaces) by the accuracy rule of ``ascendc_pack_runtime.accuracy``, with a float64 run of
  the reference as the second look; a wrong or failing candidate is disqualified (recorded with
  its error, never timed nor chosen). Tactics are torch's own operators, so they run in-process.
* **time**: the candidates that passed run in interleaved rounds (:func:`autotune.select`). Candidate
  0 is timed as today's pipeline runs it: the heavy ATen op plus its epilogue as the fused
  kernel the fuser makes of it (compiled into the kernel cache, cost-model candidate 0), not as
  separate ATen ops, so a tactic wins only if it beats what the bundle would otherwise run.
* **cache**: ``<cache>/ascendc/tactics/<step name>/<artifact_hash>/`` holds ``tuning.json``
  (every candidate's key, samples, median, disqualification, the layouts of its tensors; the
  protocol; the host fingerprint) and ``optimize_tactic`` (the key of the fastest candidate),
  written atomically under the directory's lock. A rebuild on the same host whose record timed
  every current candidate reuses it: zero profiling.

**Candidate order** (docs/TACTICS.md): a step's candidates are ordered by the cost model
(:mod:`ascendc_pack.tactics.predict`), so candidate 0 is the predicted best; the as-captured
candidate (the ATen steps) is always among them, as the fallback. With ``--topn 1`` nothing is
timed: a step's candidates are verified in order on its first call and the first that passes is
taken (the as-captured one needs no check).

Steps sharing a name share one measurement. :meth:`TacticTuner.decisions` then picks, per step:
the fastest candidate for GEMMs and attention; for a convolution chain, the configuration
(as captured vs channels_last, :mod:`ascendc_pack.tactics.rewrite`) with the smaller sum of
medians over the chain. A step no timed run reached (``--topn 1``, or an unvisited ``torch.cond``
branch even when a step of the same name elsewhere was measured) takes candidate 0 - the seed's
rule - when candidate 0 passed verification: on the arguments of the run that reached it, or,
for a step no run reached, on arbitrary arguments of its shapes, strides and dtypes (the check
needs some inputs; the reference is the step's own ATen steps on the same arguments); else the
next candidate that passed, down to the as-captured one. A chain no timed run covered compares
its two configurations by the cost model's predictions of its verified candidates.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time

import torch

from ascendc_pack_runtime.accuracy import check_tensor

import ascendc_pack.tactics.dispatch as T
import ascendc_pack.tactics.epilogue_timing as E
from ascendc_pack.autotune.protocol import AutotuneError, CandidateFailed, Protocol, contention_clock, select
from ascendc_pack.cache import KernelDir, atomic_write_text, stable_hash
from ascendc_pack.ir.choice import MeasurementQuality
from ascendc_pack.config import BuildConfig, host_cores
from ascendc_pack.frontend.executor import run_aten, run_model, run_program, run_reference_tactic
from ascendc_pack.kernels.target import host_fingerprint
from ascendc_pack.ir.program import CondStep, ModelProgram, Program, TacticStep, TensorSpec
from ascendc_pack.tactics.families import registry
from ascendc_pack.tactics.families.base import compile_kernel_tactics, plan_kernel_tactics, planned_total
from ascendc_pack.tactics.calibrate import activation_ranges
from ascendc_pack.tactics.decide import (TacticChoice, TacticResult, chain_decision, low_check, measured, median,
                                         offered_precisions, order_by_prediction, pick_by_precision, predicted,
                                         synthetic_env)
from ascendc_pack.tactics.dispatch.lowp import NATIVE, precision_of
from ascendc_pack.tactics.lower_casts import core
from ascendc_pack.tactics.predict import predict_us
from ascendc_pack.tactics.rewrite import candidates_for, in_layout_chain, is_captured
from ascendc_pack.tactics.dispatch.dispatcher import bind, execute
from ascendc_pack.autotune.timing_pool import pool_enabled, timing_pool
from ascendc_pack.toolchain.cxx import package_version

log = logging.getLogger("ascendc_pack")

TACTIC_TUNING_VERSION = 4
"""2: generated kernels are timed on the graph's task pool (``timing_pool``), not OpenMP; 3: a
bfloat16 library candidate is timed with its epilogue's fused kernels (:mod:`.epilogue_timing`);
4: one without an epilogue with the conversion of its output back to float32."""
TACTIC_CACHE_SUBDIR = "tactics"
CL = torch.channels_last


class TacticTuner:
    """Runs a model with TacticSteps on real inputs and tunes every tactic step on its first call.

    ``config``: topn (candidates per step, candidate 0 included; a GEMM step also gets up to
    topn tilings of its generated kernel, a 1x1 convolution up to ``CONV_TILINGS``, a depthwise
    one up to ``CONV_KERNEL_TILINGS``, an attention step up to topn tilings of its generated
    kernel), cache directory, cores; ``compile_epilogue``: build candidate 0's epilogue as a fused
    kernel for its timing; ``gemm``: offer the generated GEMM, convolution and attention kernels
    (timed on the graph's task pool, :mod:`ascendc_pack.autotune.timing_pool`; tests switch both off to
    stay fast; then candidate 0 is timed with the epilogue as ATen ops); ``calibration``: the input
    sets whose activation ranges give the int8 candidates their scales (:mod:`~ascendc_pack.tactics.calibrate`).
    :meth:`close` stops the verification sandbox of the generated kernels' candidates.
    """

    def __init__(self, model: ModelProgram, weights: dict[str, torch.Tensor], config: BuildConfig,
                 protocol: Protocol = Protocol(), compile_epilogue: bool = True, gemm: bool = True,
                 calibration: list | None = None):
        self.model = model
        self.weights = weights
        self.config = config
        self.protocol = protocol
        self.compile_epilogue = compile_epilogue
        self.programs: dict[int, Program] = {}
        self.instances: list[TacticStep] = []
        _index(model.program, self.programs, self.instances)
        self.reached: set[int] = set()
        self.choices: dict[str, TacticChoice] = {}
        self._sandbox = None
        self._pool: int | None = None  # the graph's task pool generated kernels are timed on
        self._compiled = False
        firsts = {}
        target = self.target = _target(config) if self.instances else None
        self.offered, self.not_offered = offered_precisions(config)
        # int8 candidates quantize with scales calibrated on the input sets' activation ranges
        ranges = activation_ranges(model, weights, calibration or []) if "int8" in self.offered else {}
        for s in self.instances:
            if s.name not in self.choices:
                cands = candidates_for(s, config.topn, target, self.offered, ranges.get(s.name))
                ch = TacticChoice(s.name, s.tactic_kind, s.desc, cands, [])
                ch.captured = next(i for i, t in enumerate(cands) if is_captured(t))
                ch.predicted_us = [predict_us(s.tactic_kind, s.desc, t.name, target) for t in cands]
                self.choices[s.name] = ch
                firsts[s.name] = s
        # the generated kernels' tilings join the steps' candidates (every registered family that
        # takes the step); candidate 0's epilogue is timed as a fused kernel: both are compiled by
        # :meth:`compile`, before any run
        values_of = {s.name: self.programs[id(s)].values for s in firsts.values()}
        self._steps = firsts
        # at --topn 1 too: each family's first tiling, ranked with the rest by its own cost model
        self._kernel_plans = plan_kernel_tactics(list(firsts.values()), values_of, config, self.offered) \
            if gemm else {}
        tuned = [s for s in firsts.values() if config.topn > 1 and
                 (len(self.choices[s.name].candidates) > 1 or s.tactic_kind == "linear" or s.name in self._kernel_plans)]
        self._epilogues = {s.name: E.epilogue_program(s, self.programs[id(s)].values)
                           for s in tuned if compile_epilogue} if tuned else {}
        self._kernels: dict = {}

    def compile_total(self) -> int:
        """Libraries :meth:`compile` goes through (GEMM tilings, candidate-0 epilogue kernels)."""
        from ascendc_pack.kernels.fused.build import total_candidates

        epi = Program([], [f for p in self._epilogues.values() for f in p.fused_steps()], [], {})
        return planned_total(self._kernel_plans) + total_candidates(epi, dataclasses.replace(self.config, topn=1))

    def compile(self, progress=None) -> None:
        """Compile (or find in the kernel cache) the GEMM candidates and the candidate-0 epilogue
        kernels, then read the tuning cache; ``progress(n)`` per library done."""
        from ascendc_pack.backends.registry import get_backend
        from ascendc_pack.kernels.fused.build import prepare_kernels

        if self._compiled:
            return
        for name, cands in compile_kernel_tactics(self._kernel_plans, self._steps, self.config, progress).items():
            ch = self.choices[name]
            ch.candidates += cands
            ch.predicted_us += [t.est_us for t in cands]  # the family's own cost model
            order_by_prediction(ch)
        if self._kernel_plans:  # timed on the pool graph.so runs them on
            self._pool = timing_pool(self.config)
        epi = Program([], [f for p in self._epilogues.values() for f in p.fused_steps()], [], {})
        backend = get_backend(self.config.backend)
        for name, kc in prepare_kernels(epi, dataclasses.replace(self.config, topn=1), progress).items():
            cc = kc.compiled.candidates[0]
            if cc.ok:  # else candidate 0 is timed with its epilogue as ATen ops
                self._kernels[name] = backend.load_kernel(kc.step.kernel, cc.so_path, cc.candidate.kernel_key)
        for ch in self.choices.values():
            ch.results = [TacticResult(i, t.key, t.name) for i, t in enumerate(ch.candidates)]
            if len(ch.candidates) > 1:
                self._load_cached(ch)
        self._compiled = True

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    # running ------------------------------------------------------------------------------------
    def __call__(self, *inputs):
        self.compile()
        return run_model(self.model, self.weights, inputs, run_tactic=self._run)

    def pending(self) -> int:
        """Distinct tactic steps that will time their candidates when a run reaches them."""
        self.compile()
        return sum(1 for ch in self.choices.values() if not ch.decided)

    @property
    def profiled(self) -> int:
        """Distinct tactic steps verified and timed in this process (0 on a warm cache)."""
        return sum(ch.profiled for ch in self.choices.values())

    @property
    def disqualified(self) -> int:
        return sum(1 for ch in self.choices.values() if ch.profiled for r in ch.results if r.disqualified)

    def reach_all(self) -> None:
        """Mark every step reached, as a run does on a program without ``torch.cond`` (every run
        reaches every step): a warm rebuild with nothing left to tune skips the runs."""
        for s in self.instances:
            self.reached.add(id(s))
            self.choices[s.name].visited = True

    def _run(self, step: TacticStep, env: dict) -> torch.Tensor:
        out = run_reference_tactic(step, env)
        self.reached.add(id(step))
        ch = self.choices[step.name]
        ch.visited = True
        if not ch.decided:
            if self.config.topn > 1:
                self._tune(ch, step, env, out)
            else:
                self._check(ch, step, env, out)
        return out

    def _check(self, ch: TacticChoice, step: TacticStep, env: dict, out: torch.Tensor) -> None:
        """``--topn 1``: verify the candidates in order, untimed, until one passes; it is ``best``
        (the as-captured candidate passes by definition: it is the reference). A convolution of a
        chain also gets its first channels_last candidate verified (the chain's layout is one
        decision over its steps), and each low precision offered its first candidate that passes
        (``low``)."""
        ch.checked = True
        named = {t: _shaped(env[v], step.shapes.get(t)) for t, v in step.bind.items()}
        ref64 = _reference64(step, env)
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(ch.candidates):
            groups.setdefault(precision_of(t), []).append(i)
        if step.tactic_kind == "conv" and step.chain:
            groups["channels_last"] = [i for i in groups.get(NATIVE, []) if in_layout_chain(ch.candidates[i])]
        for group, indices in groups.items():
            for i in indices:
                tactic = ch.candidates[i]
                if ch.verified(i) or ch.results[i].error:
                    passed = ch.verified(i)
                else:
                    try:
                        passed = self._verify(ch, i, tactic, step, named, out, ref64) is not None
                    except Exception as e:  # noqa: BLE001 - a failing candidate must not stop the build
                        ch.results[i].error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
                        log.warning("tactic %s: candidate #%d (%s) failed: %s", ch.name, i, tactic.name,
                                    ch.results[i].error)
                        passed = False
                if passed or (i == ch.captured and group == NATIVE):
                    if group == NATIVE:
                        ch.best = i
                    elif group != "channels_last":
                        ch.low[group] = i
                    log.info("Tactic %s: candidate #%d (%s) verified%s, not timed (--topn 1: the cost model's order)",
                             ch.name, i, tactic.name, " on synthetic arguments" if ch.synthetic else "")
                    break

    def _check_synthetic(self, step: TacticStep) -> None:
        """Verify the candidates of a step no run reached on arbitrary arguments of its shapes,
        strides and dtypes (:func:`_synthetic_env`), as :meth:`_check` does on real ones."""
        ch = self.choices[step.name]
        ch.synthetic = True
        env = synthetic_env(step, self.programs[id(step)].values)
        with torch.no_grad():
            out = run_reference_tactic(step, env)
        self._check(ch, step, env, out)

    def _cache_dir(self, ch: TacticChoice) -> KernelDir:
        """Where ``ch``'s PGO record lives: keyed by its candidates, and by the generated ones'
        libraries (their cache paths carry the generator's version: a kernel template edited
        within one package version is timed again instead of inheriting the old code's timings)."""
        root = self.config.kernel_cache_root
        libs = sorted(os.path.relpath(t.so_path, root) for t in ch.candidates if getattr(t, "so_path", None))
        ahash = stable_hash(TACTIC_TUNING_VERSION, ch.name, json.dumps(sorted(t.key for t in ch.candidates)),
                            json.dumps(libs), torch.__version__, package_version(), self.config.effective_cores,
                            "pool" if pool_enabled() else "openmp")[:16]
        return KernelDir(self.config.kernel_cache_root / TACTIC_CACHE_SUBDIR, ch.name, ahash)

    def _tune(self, ch: TacticChoice, step: TacticStep, env: dict, out: torch.Tensor) -> None:
        kd = self._cache_dir(ch)
        with kd.lock():
            self._load_cached(ch)  # another process may have tuned it meanwhile
            if ch.decided:
                return
            ch.profiled = True
            named = {t: _shaped(env[v], step.shapes.get(t)) for t, v in step.bind.items()}
            ref64 = _reference64(step, env)
            runners: list = [None] * len(ch.candidates)
            for i, tactic in enumerate(ch.candidates):
                try:
                    runners[i] = self._verify(ch, i, tactic, step, named, out, ref64)
                except Exception as e:  # noqa: BLE001 - a failing candidate must not stop the build
                    ch.results[i].error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
                    log.warning("tactic %s: candidate #%d (%s) failed: %s", ch.name, i, tactic.name,
                                ch.results[i].error)
            c = ch.captured
            if ch.results[c].ok and self.compile_epilogue:
                runners[c] = self._captured_runner(step, env) or runners[c]
            tail = E.epilogue_tail(step, self._epilogues.get(step.name), self._kernels, env, out) \
                if any(map(E.core_timed, ch.candidates)) else None
            if tail is not None:  # a bfloat16 library core pays its epilogue's (or cast's) pass, as lowered
                runners = [E.then(r, tail) if r is not None and E.core_timed(t) else r
                           for r, t in zip(runners, ch.candidates)]
            errors = [r.error for r in ch.results]
            try:
                sel = select(len(runners), _measure(runners, errors), self.protocol, contention=contention_clock)
            except AutotuneError:
                sel = None
            for i, r in enumerate(ch.results):
                if sel is not None and r.ok:
                    r.error = sel.errors[i]
                    r.samples_us = list(sel.samples_us[i])
                    r.median_us = sel.medians_us[i]
                log.info("Tactic %s #%d %s: %s", ch.name, i, r.name,
                         f"Timing = {r.median_us:.2f} us" if r.median_us is not None else f"failed ({r.error})")
            ch.best = sel.best if sel is not None else ch.captured
            pick_by_precision(ch)
            if sel is not None:
                ch.quality = MeasurementQuality.assess(ch.results, ch.best, os.getloadavg()[0], host_cores(),
                                                       sel.wait_share)
                if not ch.quality.stable:
                    log.warning("tactic %s: timings are unstable (%s); the choice may be noise: re-tune on a "
                                "quiet machine", ch.name, ch.quality.describe())
            log.info("Autotune completed tactic %s, best tactic index: %d (%s)", ch.name, ch.best,
                     ch.candidates[ch.best].name)
            self._persist(ch, kd, sel)

    def _verify(self, ch: TacticChoice, i: int, tactic, step: TacticStep, named: dict,
                expected: torch.Tensor, ref64):
        """Run candidate ``i`` once and compare it with the reference; returns its timed runner."""
        if tactic.family != registry.DISPATCH:
            return self._verify_kernel(ch, i, tactic, step, named, expected, ref64)
        weights, acts = T.split(named)
        acts = _arrival(tactic, step.desc, acts)
        with torch.no_grad():
            prepared = T.prepare(tactic, weights)
            calls = bind(tactic.calls)
            full = execute(calls, {**prepared, **acts})
        got = full[tactic.output]
        ch.results[i].values = {n: _spec(t) for n, t in full.items() if isinstance(t, torch.Tensor)}
        if i == ch.captured:
            return lambda: execute(calls, {**prepared, **acts})
        want = expected.reshape(got.shape) if got.numel() == expected.numel() else expected
        r64 = ref64.reshape(got.shape) if ref64 is not None and ref64.numel() == got.numel() else None
        prec = precision_of(tactic)
        check = check_tensor("output", want, got, r64) if prec == NATIVE else low_check(want, got, prec)
        span = core(tactic)
        if check.ok and span is not None:  # timed as lowered: the conversions fuse into the kernels around it
            inner = calls[span[0]:span[1]]
            fed = {**prepared, **acts, **{c.out: full[c.out] for _, c in calls[:span[0]]}}
            return lambda: execute(inner, fed)
        if not check.ok:
            ch.results[i].disqualified = {"reason": "wrong result", "detail": check.problem, "output": step.outputs[0],
                                          "max_error": check.max_error, "allowed": check.allowed}
            ch.results[i].error = f"disqualified (wrong result): {check.problem}"
            log.warning("tactic %s: candidate #%d (%s) disqualified (wrong result): %s", ch.name, i, tactic.name,
                        check.problem)
            return None
        return lambda: execute(calls, {**prepared, **acts})

    def _verify_kernel(self, ch, i, tactic, step, named, expected, ref64):
        """A generated kernel's candidate: verified in the kernel sandbox (it could crash)."""
        from ascendc_pack.backends.registry import get_backend

        runner = tactic.impl.runner(tactic, _arrival(tactic, step.desc, named), self._pool)
        if self._sandbox is None:
            self._sandbox = get_backend(self.config.backend).sandbox()
        verdict = runner.verify(expected, ref64, self._sandbox, self.protocol.verify_timeout_s)
        ch.results[i].values = runner.values()
        if verdict is not None:
            verdict["output"] = step.outputs[0]
            ch.results[i].disqualified = verdict
            ch.results[i].error = f"disqualified ({verdict['reason']}): {verdict['detail']}"
            log.warning("tactic %s: candidate #%d (%s) %s", ch.name, i, tactic.name, ch.results[i].error)
            return None
        return runner

    def _captured_runner(self, step: TacticStep, env: dict):
        """Candidate 0 as today's pipeline runs it: the heavy op, the epilogue as a fused kernel."""
        fused = self._epilogues.get(step.name)
        if fused is None or not all(f.name in self._kernels for f in fused.fused_steps()):
            return None
        args = [env[n] for n in fused.inputs]
        return lambda: run_program(fused, args, run_fused=lambda s, a: self._kernels[s.name](a))

    # the cache ----------------------------------------------------------------------------------
    def _load_cached(self, ch: TacticChoice) -> None:
        kd = self._cache_dir(ch)
        try:
            rec = json.loads(kd.tuning_json.read_text())
            key = kd.path.joinpath("optimize_tactic").read_text().strip()
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("tactic %s: corrupt tuning cache (%s); re-tuning", ch.name, e)
            return
        keys = [t.key for t in ch.candidates]
        if not isinstance(rec, dict) or rec.get("version") != TACTIC_TUNING_VERSION \
                or not set(keys) <= set(rec.get("timed_keys", [])) or rec.get("host") != host_fingerprint() \
                or key not in keys or rec.get("best_key") != key:
            log.info("tactic %s: the cached record does not cover this host and these candidates; re-tuning",
                     ch.name)
            return
        by_key = {r["key"]: r for r in rec.get("candidates", [])}
        try:
            ch.results = [dataclasses.replace(TacticResult.from_json(by_key[k]), index=i) if k in by_key else
                          TacticResult(i, k, t.name) for i, (k, t) in enumerate(zip(keys, ch.candidates))]
        except (KeyError, TypeError, ValueError) as e:
            log.warning("tactic %s: corrupt tuning cache (%s); re-tuning", ch.name, e)
            return
        ch.best = keys.index(key)
        pick_by_precision(ch)
        ch.quality = MeasurementQuality.from_json(rec.get("quality"))
        ch.from_cache = True
        log.info("tactic %s: cached choice, best tactic index: %d", ch.name, ch.best)

    def _persist(self, ch: TacticChoice, kd: KernelDir, sel) -> None:
        cands = []
        for r in ch.results:
            d = r.to_json()
            d["spread_us"] = round(statistics.pstdev(r.samples_us), 3) if len(r.samples_us) > 1 else 0.0
            cands.append(d)
        rec = {"version": TACTIC_TUNING_VERSION, "step": ch.name, "kind": ch.kind, "desc": ch.desc,
               "best_index": ch.best, "best_key": ch.candidates[ch.best].key,
               "timed_keys": [t.key for t in ch.candidates],
               "protocol": {**self.protocol.to_json(), "rounds": sel.rounds if sel else 0,
                            "launches_per_sample": sel.number if sel else 0,
                            "contended_samples_retaken": sel.retaken if sel else 0, "timing": "wall-clock",
                            "kernel_threads": "task pool" if self._pool else "OpenMP"},
               "host": host_fingerprint(), "candidates": cands,
               "tactics": [t.to_json() for t in ch.candidates]}
        if ch.quality is not None:
            rec["quality"] = ch.quality.to_json()
        atomic_write_text(kd.tuning_json, json.dumps(rec, indent=1))
        atomic_write_text(kd.path / "optimize_tactic", ch.candidates[ch.best].key + "\n")

    # decisions ----------------------------------------------------------------------------------
    def decisions(self) -> dict[int, int]:
        """The chosen candidate index of every tactic step (by ``id(step)``); also fills each
        choice's ``uses``. A step no run reached whose candidates never ran anywhere is verified
        on synthetic arguments first (:meth:`_check_synthetic`)."""
        for s in self.instances:
            ch = self.choices[s.name]
            if id(s) not in self.reached and not any(ch.verified(i) for i in range(len(ch.candidates))) \
                    and len(ch.candidates) > 1:
                try:
                    self._check_synthetic(s)
                except Exception as e:  # noqa: BLE001 - the reference cannot run on made-up inputs: as captured
                    log.info("tactic %s: no synthetic check (%s); the step stays as captured", ch.name, e)
        out: dict[int, int] = {}
        chains: dict[int, list[TacticStep]] = {}
        for s in self.instances:
            ch = self.choices[s.name]
            if s.tactic_kind == "conv" and s.chain:
                chains.setdefault(s.chain, []).append(s)
            elif measured(ch) and id(s) in self.reached:
                out[id(s)] = ch.best
            else:
                out[id(s)] = ch.first_verified()
        for chain in chains.values():
            chs = [self.choices[s.name] for s in chain]
            timed = all(id(s) in self.reached for s in chain) and all(measured(ch) for ch in chs)
            picks = chain_decision(chs, median if timed else predicted)
            for s, i in zip(chain, picks):
                out[id(s)] = i
        return self.record_uses(out)

    def record_uses(self, out: dict[int, int]) -> dict[int, int]:
        """Fill each choice's ``uses`` from ``out`` (candidate index by ``id(step)``; a candidate
        never run here has no recorded layouts and falls back to the as-captured one); returns it."""
        for s in self.instances:
            ch = self.choices[s.name]
            if ch.results[out[id(s)]].values is None:
                out[id(s)] = ch.captured
        for ch in self.choices.values():
            ch.uses = []
        for s in self.instances:
            ch = self.choices[s.name]
            ch.uses.append({"inputs": list(dict.fromkeys(s.bind.values())), "outputs": list(s.outputs),
                            "chosen_index": out[id(s)], "chain": s.chain, "visited": id(s) in self.reached})
        return out


def _target(config: BuildConfig):
    """The cost models' view of this host (:class:`~ascendc_pack.kernels.target.CpuTarget`)."""
    from ascendc_pack.kernels.target import CpuTarget

    return CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir)


def _index(p: Program, programs: dict, instances: list) -> None:
    for s in p.steps:
        if isinstance(s, TacticStep):
            programs[id(s)] = p
            instances.append(s)
        elif isinstance(s, CondStep):
            _index(s.then_branch, programs, instances)
            _index(s.else_branch, programs, instances)


def _shaped(t: torch.Tensor, shape) -> torch.Tensor:
    return t if shape is None or tuple(t.shape) == tuple(shape) else t.reshape(shape)


def _spec(t: torch.Tensor) -> TensorSpec:
    """The layout of a tensor (an opaque oneDNN / MKL packed tensor has no strides)."""
    if t.layout != torch.strided:
        return TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch."), None)
    return TensorSpec.of(t)


def _arrival(tactic: T.Tactic, desc: dict, acts: dict) -> dict:
    """The activations in the layout they arrive in when the chain runs channels_last (``tactic``:
    a dispatcher tactic or a generated GEMM's; every candidate of a max pooling after a chain's
    convolution)."""
    if desc.get("kind") == "pool" and desc.get("position") == "interior":
        return {**acts, "x": acts["x"].contiguous(memory_format=CL)}
    if not in_layout_chain(tactic):
        return acts
    acts = dict(acts)
    if desc.get("position") == "interior":
        acts["x"] = acts["x"].contiguous(memory_format=CL)
    if desc.get("other_layout") == "channels_last" and "other" in acts:
        acts["other"] = acts["other"].contiguous(memory_format=CL)
    return acts


def _reference64(step: TacticStep, env: dict) -> torch.Tensor | None:
    """The reference run in float64 (the accuracy rule's second look), or None."""
    local = {n: (env[n].double() if env[n].is_floating_point() else env[n]) for n in step.reference_inputs()}
    try:
        with torch.no_grad():
            for s in step.steps:
                run_aten(s, local)
        return local[step.outputs[0]]
    except Exception:  # noqa: BLE001 - an op without float64: no second look
        return None


WARM_UP_S = 0.003
"""Untimed launches of a candidate before each of its samples (at least one)."""


def _measure(runners: list, errors: list):
    """The timing callback of :func:`autotune.select`. Every sample follows ``WARM_UP_S`` of
    untimed launches of the same candidate: the rounds rotate through the candidates (a step's
    slowest, often ATen's, sets one launch a sample), and a candidate's first launches after the
    others ran are not what the graph runs. A generated AMX GEMM (transformer_4x512's q/k/v
    projection, 0.65 ms in the graph) took 1.9, 1.8 and then 1.0 ms in three launches right after
    float32 GEMMs (`/tmp` loop, OMP_WAIT_POLICY=PASSIVE; oneDNN's bfloat16 GEMM did not slow
    down), and PGO gave that step to oneDNN."""
    def measure(i: int, number: int) -> float:
        if runners[i] is None:
            raise CandidateFailed((errors[i] or "failed").splitlines()[0])
        run = runners[i]
        with torch.no_grad():
            warm = time.perf_counter()
            run()
            while time.perf_counter() - warm < WARM_UP_S:
                run()
            t0 = time.perf_counter()
            for _ in range(number):
                run()
            return time.perf_counter() - t0

    return measure


__all__ = ["TacticTuner", "TacticChoice", "TacticResult", "TACTIC_TUNING_VERSION", "TACTIC_CACHE_SUBDIR"]
