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

Steps sharing a name share one measurement. :meth:`TacticTuner.decisions` then picks, per step:
the fastest candidate for GEMMs and attention; for a convolution chain, the configuration
(as captured vs channels_last, :mod:`ascendc_pack.tactics.rewrite`) with the smaller sum of
medians over the chain. A step no run reached (an unvisited ``torch.cond`` branch), or a chain
with such a step, keeps candidate 0 even when a step of the same name elsewhere was measured.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from ascendc_pack_runtime.accuracy import check_tensor

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.autotune.protocol import AutotuneError, CandidateFailed, Protocol, contention_clock, select
from ascendc_pack.cache import KernelDir, atomic_write_text, stable_hash
from ascendc_pack.ir.choice import MeasurementQuality, rel_spread
from ascendc_pack.config import BuildConfig, host_cores
from ascendc_pack.frontend.executor import run_aten, run_model, run_program, run_reference_tactic
from ascendc_pack.kernels.target import host_fingerprint
from ascendc_pack.ir.program import CondStep, ModelProgram, Program, TacticStep, TensorSpec
from ascendc_pack.tactics.families import registry
from ascendc_pack.tactics.families.base import compile_kernel_tactics, plan_kernel_tactics, planned_total
from ascendc_pack.tactics.rewrite import candidates_for, in_layout_chain
from ascendc_pack.tactics.dispatch.dispatcher import bind, execute
from ascendc_pack.autotune.timing_pool import pool_enabled, timing_pool
from ascendc_pack.toolchain.cxx import package_version

log = logging.getLogger("ascendc_pack")

TACTIC_TUNING_VERSION = 2
"""2: generated kernels are timed on the graph's task pool (``timing_pool``), not OpenMP."""
TACTIC_CACHE_SUBDIR = "tactics"
CL = torch.channels_last


@dataclass
class TacticResult:
    """One candidate's outcome: its key and name, its median and samples (µs; None/[] when not
    timed), why it failed (``error``; ``disqualified`` when verification rejected it) and the
    layouts of its tensors on the real arguments (``values``, what the graph plans with)."""

    index: int
    key: str
    name: str
    median_us: float | None = None
    samples_us: list[float] = field(default_factory=list)
    error: str | None = None
    disqualified: dict | None = None
    values: dict[str, TensorSpec] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rel_spread(self) -> float | None:
        return rel_spread(self.samples_us, self.median_us)

    def to_json(self) -> dict:
        d = {"index": self.index, "key": self.key, "name": self.name, "median_us": self.median_us,
             "samples_us": [round(x, 3) for x in self.samples_us], "error": self.error}
        if self.disqualified is not None:
            d["disqualified"] = self.disqualified
        if self.values is not None:
            d["values"] = {k: v.to_json() for k, v in self.values.items()}
        return d

    @staticmethod
    def from_json(d: dict) -> TacticResult:
        values = d.get("values")
        return TacticResult(int(d["index"]), d["key"], d["name"], d.get("median_us"), list(d.get("samples_us", [])),
                            d.get("error"), d.get("disqualified"),
                            {k: TensorSpec.from_json(v) for k, v in values.items()} if values is not None else None)


@dataclass
class TacticChoice:
    """The outcome of one distinct tactic step (all steps sharing ``name``).

    ``best`` is the fastest verified candidate; ``uses`` one entry per step with this name
    (``inputs``, ``outputs``, ``chosen_index``: after the chain decision, ``chain``, ``visited``);
    ``chosen_index`` is the first use's choice."""

    name: str
    kind: str
    desc: dict
    candidates: list[T.Tactic]
    results: list[TacticResult]
    best: int = 0
    visited: bool = False
    from_cache: bool = False
    profiled: bool = False
    quality: MeasurementQuality | None = None
    uses: list[dict] = field(default_factory=list)

    @property
    def chosen_index(self) -> int:
        return self.uses[0]["chosen_index"] if self.uses else 0

    @property
    def decided(self) -> bool:
        return self.profiled or self.from_cache or len(self.candidates) == 1

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "desc": self.desc, "best_index": self.best,
                "chosen_index": self.chosen_index, "visited": self.visited,
                "candidates": [{**r.to_json(), "tactic": t.to_json()} for r, t in zip(self.results, self.candidates)],
                "uses": self.uses, **({"quality": self.quality.to_json()} if self.quality else {})}


class TacticTuner:
    """Runs a model with TacticSteps on real inputs and tunes every tactic step on its first call.

    ``config``: topn (candidates per step, candidate 0 included; a GEMM step also gets up to
    topn tilings of its generated kernel, a 1x1 convolution up to ``CONV_TILINGS``, a depthwise
    one up to ``CONV_KERNEL_TILINGS``, an attention step up to topn tilings of its generated
    kernel), cache directory, cores; ``compile_epilogue``: build candidate 0's epilogue as a fused
    kernel for its timing; ``gemm``: offer the generated GEMM, convolution and attention kernels
    (timed on the graph's task pool, :mod:`ascendc_pack.autotune.timing_pool`; tests switch both off to
    stay fast; then candidate 0 is timed with the epilogue as ATen ops). :meth:`close` stops the verification sandbox of the generated kernels' candidates.
    """

    def __init__(self, model: ModelProgram, weights: dict[str, torch.Tensor], config: BuildConfig,
                 protocol: Protocol = Protocol(), compile_epilogue: bool = True, gemm: bool = True):
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
        for s in self.instances:
            if s.name not in self.choices:
                cands = candidates_for(s, config.topn)
                self.choices[s.name] = TacticChoice(s.name, s.tactic_kind, s.desc, cands, [])
                firsts[s.name] = s
        # the generated kernels' tilings join the steps' candidates (every registered family that
        # takes the step); candidate 0's epilogue is timed as a fused kernel: both are compiled by
        # :meth:`compile`, before any run
        values_of = {s.name: self.programs[id(s)].values for s in firsts.values()}
        self._steps = firsts
        self._kernel_plans = plan_kernel_tactics([s for s in firsts.values() if config.topn > 1], values_of,
                                                 config) if gemm else {}
        tuned = [s for s in firsts.values() if config.topn > 1 and
                 (len(self.choices[s.name].candidates) > 1 or s.tactic_kind == "linear" or s.name in self._kernel_plans)]
        self._epilogues = {s.name: _epilogue_program(s, self.programs[id(s)].values)
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
            self.choices[name].candidates += cands
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
            self._tune(ch, step, env, out)
        return out

    def _cache_dir(self, ch: TacticChoice) -> KernelDir:
        ahash = stable_hash(TACTIC_TUNING_VERSION, ch.name, json.dumps([t.key for t in ch.candidates]),
                            torch.__version__, package_version(), self.config.effective_cores,
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
            if ch.results[0].ok and self.compile_epilogue:
                runners[0] = self._captured_runner(step, env) or runners[0]
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
            ch.best = sel.best if sel is not None else 0
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
        if i == 0:
            return lambda: execute(calls, {**prepared, **acts})
        want = expected.reshape(got.shape) if got.numel() == expected.numel() else expected
        r64 = ref64.reshape(got.shape) if ref64 is not None and ref64.numel() == got.numel() else None
        check = check_tensor("output", want, got, r64)
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
        choice's ``uses``."""
        out: dict[int, int] = {}
        chains: dict[int, list[TacticStep]] = {}
        for s in self.instances:
            ch = self.choices[s.name]
            if s.tactic_kind == "conv" and s.chain:
                chains.setdefault(s.chain, []).append(s)
            else:
                out[id(s)] = ch.best if _measured(ch) and id(s) in self.reached else 0
        for chain in chains.values():
            if not all(id(s) in self.reached for s in chain):  # a step no run reached: as captured
                picks = [0] * len(chain)
            else:
                picks = _chain_decision([self.choices[s.name] for s in chain])
            for s, i in zip(chain, picks):
                out[id(s)] = i
        for s in self.instances:  # a candidate never run here has no recorded layouts: as captured
            if self.choices[s.name].results[out[id(s)]].values is None:
                out[id(s)] = 0
        for ch in self.choices.values():
            ch.uses = []
        for s in self.instances:
            ch = self.choices[s.name]
            ch.uses.append({"inputs": list(dict.fromkeys(s.bind.values())), "outputs": list(s.outputs),
                            "chosen_index": out[id(s)], "chain": s.chain, "visited": id(s) in self.reached})
        return out


def _measured(ch: TacticChoice) -> bool:
    return (ch.profiled or ch.from_cache) and ch.results[0].median_us is not None


def _chain_decision(chs: list[TacticChoice]) -> list[int]:
    """Per step of one convolution chain: all candidate 0 (as captured), or each step's fastest
    channels_last candidate, whichever sums to less (every step must have been measured)."""
    if not all(_measured(ch) for ch in chs):
        return [0] * len(chs)
    best_cl = []
    for ch in chs:
        timed = [(r.median_us, i) for i, (r, t) in enumerate(zip(ch.results, ch.candidates))
                 if i > 0 and r.median_us is not None and in_layout_chain(t)]
        if not timed:
            return [0] * len(chs)
        best_cl.append(min(timed))
    captured = sum(ch.results[0].median_us for ch in chs)
    channels_last = sum(m for m, _ in best_cl)
    if channels_last < captured:
        return [i for _, i in best_cl]
    return [0] * len(chs)


def _epilogue_program(step: TacticStep, values: dict) -> Program:
    """The step's ATen steps with their pointwise tail fused (what the fuser makes of them)."""
    from ascendc_pack.passes.fuse import fuse_program

    return fuse_program(Program(step.reference_inputs(), list(step.steps), list(step.outputs), values))


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
    a dispatcher tactic or a generated GEMM's)."""
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


def _measure(runners: list, errors: list):
    def measure(i: int, number: int) -> float:
        if runners[i] is None:
            raise CandidateFailed((errors[i] or "failed").splitlines()[0])
        run = runners[i]
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(number):
                run()
            return time.perf_counter() - t0

    return measure


__all__ = ["TacticTuner", "TacticChoice", "TacticResult", "TACTIC_TUNING_VERSION", "TACTIC_CACHE_SUBDIR"]
