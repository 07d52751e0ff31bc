"""The model benchmark: one model file, every contender, one run.

Protocol (docs/PERFORMANCE.md has the long form):

1. A worker runs eager once on the example inputs (and in float64 where it can) and saves the
   reference every contender is checked against.
2. Every artifact is built in its own fresh process with its own empty caches, so build times
   are cold; with ``rebuild`` the tuned bundle is built once more on the same cache (warm).
3. Every contender is loaded in its own worker process (``same_process`` turns that off), its
   first output is timed and checked against eager by the accuracy rule (in-place updates of
   inputs included). A contender whose outputs differ is reported ``wrong`` and not timed.
4. Interleaved rounds: one worker runs at a time, each round in a rotated order, 20 ms apart;
   each sample starts with :data:`LEAD_IN_MS` of untimed calls. With ``contention`` every round
   has a quiet and a busy phase (:mod:`.contention`).
5. After idle: ``idle_bursts`` times per contender, the first call after every process sat idle
   for :data:`IDLE_S` - the latency of a sporadic request.
6. Cold start of the ``.pt2`` and the ``.ascpack`` in new processes; the bundle's kernel table.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ascendc_pack.bench import extras
from ascendc_pack.bench.contention import Spinner, slowdowns
from ascendc_pack.bench.contenders import BUNDLES, BY_ID, DEFAULT_CONTENDERS, MODEL_CONTENDERS, NATIVE, PEERS, label
from ascendc_pack.bench.kernels import model_kernel_rows
from ascendc_pack.bench.machine import cpu_sample, host_cores, loadavg, other_work
from ascendc_pack.bench.stats import calls_per_sample, latency_stats, paired_ratio, rotated
from ascendc_pack.bench.workers import Local, Worker, WorkerError, cold_start

#: pause before each sample, so idle OpenMP threads of the previous worker stop spinning
PAUSE_S = 0.02
#: untimed calls before each timed sample (ms). A worker sits idle while the others run; on this
#: project's 2-vCPU VMs its threads then run at one-thread speed for ~40 ms (docs/DESIGN.md §8),
#: so without a lead-in a ~50 ms sample times mostly that wake-up
LEAD_IN_MS = 100.0
#: seconds every process sits idle before the after-idle probe times one call
IDLE_S = 0.3


class _Run:
    """State of one :func:`bench_model` call: the work directory, the result and the workers."""

    def __init__(self, model_file: Path, work: Path, topn: int, same_process: bool, timeout: float, log):
        self.model_file, self.work, self.topn = model_file, work, topn
        self.same_process, self.timeout, self.log = same_process, timeout, log
        self.res: dict[str, dict] = {}

    def env_of(self, cid: str) -> dict:
        # every process gets its own empty Inductor cache: cold builds, no cross-talk
        return {"TORCHINDUCTOR_CACHE_DIR": str(self.work / f"inductor-{cid}"),
                "ASCENDC_PACK_RUNTIME_CACHE": str(self.work / "runtime-cache")}

    def process(self, cid: str, what: str):
        if self.same_process:
            return Local()
        return Worker(self.env_of(cid), self.work / "logs" / f"{what}-{cid}.log")

    def ask(self, worker, msg: dict) -> dict:
        """A request to a worker; a dead or hung worker is an ``ok: False`` reply."""
        try:
            return worker.request(msg, self.timeout)
        except WorkerError as exc:
            return {"ok": False, "error": str(exc)}

    def once(self, cid: str, what: str, msg: dict) -> dict:
        """One request in a fresh process that is closed afterwards."""
        worker = self.process(cid, what)
        try:
            return self.ask(worker, msg)
        finally:
            worker.close()

    def fail(self, cid: str, why: str, status: str = "failed") -> None:
        self.res[cid].update(status=status, reason=why)
        self.log(f"  {self.res[cid]['label']}: {status.upper()}: {why}")

    def ok(self) -> list[str]:
        return [cid for cid, r in self.res.items() if r["status"] == "ok"]


def bench_model(model_file: str | Path, *, topn: int = 4, repeat: int = 20, cold_runs: int = 5,
                sample_ms: float = 50.0, contenders: list[str] | None = None, same_process: bool = False,
                work_dir: str | Path | None = None, timeout: float = 1800.0, contention: bool = False,
                busy_core: int | None = None, rebuild: bool = False, idle_bursts: int = 5, log=None) -> dict:
    """Benchmark one model file against every contender (see the module docstring).

    Returns a JSON-serializable dict: ``contenders`` (per id: status ``ok`` / ``wrong`` /
    ``failed`` with the reason, latency statistics with spread, build seconds and stages, artifact
    size, the check against eager), ``ratios`` (bundle ÷ each peer, paired by round),
    ``best_peer``, ``contention``, ``after_idle`` (the first call after :data:`IDLE_S` of idle,
    ``idle_bursts`` times per contender; 0 skips it), ``cold_start``, ``kernels``, ``config``, the
    load average and ``other_work`` (the cores work outside the benchmark took during the timed
    rounds, :func:`~ascendc_pack.bench.machine.other_work`).
    A contender that fails is reported with its reason; nothing here raises for it.

    Raises:
        ModelFileError: ``model_file`` is not a .py file.
        ValueError: an unknown contender id.
        MissingExtraError: a chosen contender's package (``bench`` extra) is not installed.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    model_file = Path(model_file).resolve()
    if not model_file.is_file() or model_file.suffix != ".py":
        from ascendc_pack.errors import ModelFileError

        raise ModelFileError(f"{model_file}: no such file or not a .py file. Pass the path of a model.py "
                             "file defining get_model() and get_example_inputs().")
    chosen = list(contenders or DEFAULT_CONTENDERS)
    unknown = [c for c in chosen if c not in MODEL_CONTENDERS]
    if unknown:
        raise ValueError(f"unknown contenders {unknown}; choose from {', '.join(MODEL_CONTENDERS)}")
    if topn == 1 and "bundle1" in chosen and "bundleN" in chosen:
        chosen.remove("bundleN")  # the same bundle twice
    chosen = [c for c in MODEL_CONTENDERS if c in chosen]
    extras.require(chosen, {c: label(c, topn) for c in MODEL_CONTENDERS}, DEFAULT_CONTENDERS)
    spinner = Spinner(busy_core) if contention else None
    own_dir = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="ascpack-bench-")) if own_dir else Path(work_dir)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    run = _Run(model_file, work, topn, same_process, timeout, log)
    run.res.update({cid: {"label": label(cid, topn), "status": "ok", "reason": None} for cid in chosen})
    result = {"model": str(model_file), "name": model_file.stem, "contenders": run.res, "ratios": {},
              "best_peer": {}, "contention": None, "after_idle": None, "cold_start": {}, "kernels": [],
              "config": {"topn": topn, "repeat": repeat, "cold_runs": cold_runs, "sample_ms": sample_ms,
                         "lead_in_ms": LEAD_IN_MS, "idle_s": IDLE_S, "idle_bursts": idle_bursts,
                         "same_process": same_process, "cores": host_cores(), "contention": contention,
                         "busy_core": busy_core, "rebuild": rebuild, "torch_threads": torch.get_num_threads(),
                         "torch": torch.__version__}}
    try:
        t_start = time.perf_counter()
        result["loadavg_start"] = loadavg()
        data = work / "data.pt"
        if _reference(run, data, result):
            _build_all(run, rebuild)
            workers = _setup_all(run, data)
            if repeat > 0 and workers:
                with spinner or contextlib.nullcontext():
                    if spinner is not None:
                        result["contention"] = {"busy": spinner.describe()}
                    before = cpu_sample()
                    rounds = _time_rounds(run, workers, repeat, sample_ms, spinner)
                    result["other_work"] = other_work(before, cpu_sample())
                _summarize(run, result, rounds, _after_idle(run, workers, idle_bursts))
            for worker in workers.values():
                worker.close()
            _cold_starts(run, result, str(data), cold_runs)
            _kernels(run, result, repeat)
        result["loadavg_end"] = loadavg()
        result["seconds"] = time.perf_counter() - t_start
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            result["work_dir"] = str(work)
    return result


def _reference(run: _Run, data: Path, result: dict) -> bool:
    """Eager's outputs on the example inputs, in a worker: the user's code never runs in this
    process unless ``same_process``."""
    reply = run.once("eager", "reference", {"cmd": "reference", "args": {"model_file": str(run.model_file),
                                                                         "data": str(data)}})
    if not reply.get("ok"):
        for cid in list(run.res):
            run.fail(cid, f"eager reference run: {reply.get('error')}")
        return False
    result["inputs"] = reply["inputs"]
    return True


def _build_all(run: _Run, rebuild: bool) -> None:
    """Build every artifact, each in a fresh process with empty caches; then, with ``rebuild``,
    the tuned bundle once more on its own (now warm) kernel cache."""
    built: dict[str, tuple[str, dict, list]] = {}  # artifact kind -> (cid, reply, load): OpenVINO's two share one
    for cid in [c for c in run.ok() if BY_ID[c].artifact]:
        kind = BY_ID[cid].artifact
        if kind in built:
            first, reply, load = built[kind]
            run.log(f"  {run.res[cid]['label']}: the artifact of {run.res[first]['label']}")
        else:
            run.log(f"  building {run.res[cid]['label']} ...")
            load = loadavg()
            reply = run.once(cid, "build", {"cmd": "build", "args": {
                "kind": kind, "model_file": str(run.model_file), "out_dir": str(run.work / cid),
                "topn": run.topn}})
            built[kind] = (cid, dict(reply), load)
        if not reply.get("ok"):
            run.fail(cid, f"build: {reply.get('error')}")
            continue
        reply = dict(reply)
        reply.pop("ok")
        kernels = reply.pop("kernels", None)
        run.res[cid].update(reply, load_at_build=load)
        if kernels is not None:
            run.res[cid]["kernel_choices"] = kernels
    tuned = next((c for c in ("bundleN", "bundle1") if c in run.ok()), None)
    if rebuild and tuned:
        run.log(f"  rebuilding {run.res[tuned]['label']} on its warm cache ...")
        n = run.topn if tuned == "bundleN" else 1
        reply = run.once(tuned, "rebuild", {"cmd": "build", "args": {
            "kind": tuned, "model_file": str(run.model_file), "out_dir": str(run.work / tuned), "topn": run.topn,
            "cache_dir": str(run.work / tuned / f"cache-topn{n}"), "tag": ".rebuild"}})
        run.res[tuned]["rebuild"] = ({k: reply[k] for k in ("build_s", "stages", "candidate_compiles", "cache_hits")}
                                     if reply.get("ok") else {"error": reply.get("error")})


def _setup_all(run: _Run, data: Path) -> dict:
    """Start one worker per contender, one after another: load, first call (timed), check."""
    workers = {}
    for cid in run.ok():
        run.log(f"  loading {run.res[cid]['label']} ...")
        worker = run.process(cid, "run")
        args = {"cid": cid, "model_file": str(run.model_file), "data": str(data),
                "artifact": run.res[cid].get("artifact")}
        if cid == "compile_ascendc":  # a cold cache of its own, the tuned bundle's topn
            args["options"] = {"topn": run.topn, "cache_dir": str(run.work / cid / "cache")}
        reply = run.ask(worker, {"cmd": "setup", "args": args})
        if not reply.get("ok"):
            worker.close()
            run.fail(cid, f"load/run: {reply.get('error')}")
            continue
        reply.pop("ok")
        run.res[cid].update(reply)
        if cid in ("compile", "compile_freeze", "compile_ascendc"):
            run.res[cid]["build_s"] = reply["first_call_s"]  # compiles on the first call
        if reply["check"] != "ok":
            worker.close()
            run.fail(cid, reply["check"].removeprefix("wrong: "), status="wrong")
            continue
        workers[cid] = worker
    return workers


def _time_rounds(run: _Run, workers: dict, repeat: int, sample_ms: float, spinner) -> dict:
    """Interleaved rounds; returns {phase: {cid: [per-round call lists]}} for the survivors."""
    for cid in workers:
        run.res[cid]["number"] = calls_per_sample(run.res[cid]["est_us"], sample_ms * 1e3)
    phases = ("quiet", "busy") if spinner is not None else ("quiet",)
    samples = {p: {cid: [] for cid in workers} for p in phases}
    run.log(f"  timing {len(workers)} contenders, {repeat} interleaved rounds"
            + (" (quiet and busy phase each)" if spinner is not None else "") + " ...")
    for r in range(repeat):
        for phase in (phases if r % 2 == 0 else phases[::-1]):
            if spinner is not None:
                spinner.set(phase == "busy")
            for cid in rotated(list(workers), r):
                time.sleep(PAUSE_S)
                us = _time(run, workers, cid, run.res[cid]["number"], LEAD_IN_MS, f"timing round {r + 1} ({phase})")
                if us is None:
                    for p in phases:
                        samples[p].pop(cid, None)
                    continue
                samples[phase][cid].append(us)
    if spinner is not None:
        spinner.set(False)
    return samples


def _after_idle(run: _Run, workers: dict, bursts: int) -> dict:
    """``bursts`` times per contender (order rotated): every process idle for :data:`IDLE_S`,
    then one timed call, no lead-in. Returns {cid: [microseconds per burst]} for the survivors."""
    out = {cid: [] for cid in workers}
    if bursts > 0:
        run.log(f"  first call after {IDLE_S:g} s idle, {bursts} times each ...")
    for b in range(bursts):
        for cid in rotated(list(workers), b):
            time.sleep(IDLE_S)
            us = _time(run, workers, cid, 1, 0.0, f"after-idle call {b + 1}")
            if us is None:
                out.pop(cid, None)
                continue
            out[cid].append(us[0])
    return out


def _time(run: _Run, workers: dict, cid: str, number: int, lead_in_ms: float, what: str) -> list[float] | None:
    """One ``time`` request; a failed worker is closed, dropped from ``workers`` and reported
    failed (None)."""
    reply = run.ask(workers[cid], {"cmd": "time", "number": number, "lead_in_ms": lead_in_ms})
    if reply.get("ok"):
        return reply["us"]
    workers.pop(cid).close()
    run.fail(cid, f"{what}: {reply.get('error')}")
    return None


def _summarize(run: _Run, result: dict, rounds: dict, idle: dict | None = None) -> None:
    """Latency statistics, bundle ÷ peer ratios (paired by round), best peer, contention, and
    from ``idle`` ({cid: [us per burst]}) the after-idle medians and bundle ÷ best peer."""
    quiet = rounds["quiet"]
    per_round = {}
    for cid, rs in quiet.items():
        if run.res[cid]["status"] == "ok" and rs:
            run.res[cid].update(latency_stats(rs))
            per_round[cid] = run.res[cid]["round_medians_us"]
    for b in (c for c in BUNDLES if c in per_round):
        result["ratios"][b] = {}
        for other, meds in per_round.items():
            s = paired_ratio(per_round[b], meds)
            result["ratios"][b][other] = s.to_json()
            run.res[other][f"ratio_{b}"] = s.median
        peers = same_precision(run.res, b, [c for c in PEERS if c in per_round])
        if peers:
            best = min(peers, key=lambda c: run.res[c]["median_us"])
            result["best_peer"][b] = {"peer": best, **result["ratios"][b][best]}
    if "busy" in rounds:
        busy = {}
        for cid, rs in rounds["busy"].items():
            if cid in per_round and rs:
                run.res[cid]["busy"] = latency_stats(rs)
                busy[cid] = run.res[cid]["busy"]["round_medians_us"]
        result["contention"].update(slowdowns(per_round, busy, BUNDLES))
    idle = {cid: us for cid, us in (idle or {}).items() if cid in per_round and us}
    if idle:
        for cid, us in idle.items():
            run.res[cid]["after_idle"] = {"median_us": statistics.median(us), "bursts": len(us)}
        result["after_idle"] = {"idle_s": IDLE_S, "vs_best": {}}
        for b in (c for c in BUNDLES if c in idle):
            peers = same_precision(run.res, b, [c for c in PEERS if c in idle])
            if not peers:
                continue
            best = min(peers, key=lambda c: run.res[c]["after_idle"]["median_us"])
            result["after_idle"]["vs_best"][b] = {"peer": best, **paired_ratio(idle[b], idle[best]).to_json()}


def same_precision(res: dict, bundle: str, peers: list[str]) -> list[str]:
    """The ``peers`` that computed in the precision ``bundle`` computed in (the best peer is taken
    at equal precision: OpenVINO's bfloat16 default is no float32 bundle's peer)."""
    want = res[bundle].get("precision", NATIVE)
    return [c for c in peers if res[c].get("precision", NATIVE) == want]


def _cold_starts(run: _Run, result: dict, data: str, cold_runs: int) -> None:
    """New processes: import torch, load the artifact, first output; alternating artifacts."""
    res = run.res
    cold_of = [("pt2", "aoti"), ("ascpack", "bundleN" if "bundleN" in res else "bundle1")]
    env = {"TORCHINDUCTOR_CACHE_DIR": str(run.work / "inductor-cold"),
           "ASCENDC_PACK_RUNTIME_CACHE": str(run.work / "runtime-cache-cold")}
    if cold_runs <= 0:
        return
    for kind, cid in cold_of:
        if cid in res and res[cid]["status"] != "ok":
            result["cold_start"][kind] = {"of": cid, "label": res[cid]["label"], "runs": [],
                                          "error": f"not run: {res[cid]['label']} {res[cid]['status']}"}
    active = [(k, cid) for k, cid in cold_of if cid in res and res[cid]["status"] == "ok"]
    if active:
        run.log(f"  cold start, {cold_runs} runs each ...")
    runs: dict[str, list[dict]] = {}
    errors: dict[str, str] = {}
    for i in range(cold_runs):
        for kind, cid in (active if i % 2 == 0 else active[::-1]):
            if kind not in errors:
                try:
                    runs.setdefault(kind, []).append(cold_start(kind, res[cid]["artifact"], data, env,
                                                                run.work / "logs" / f"cold-{kind}.log"))
                except WorkerError as exc:
                    errors[kind] = str(exc)
    for kind, cid in active:
        entry = {"of": cid, "label": res[cid]["label"], "runs": runs.get(kind, [])}
        if kind in errors:
            entry["error"] = errors[kind]
        if entry["runs"]:
            for key in ("total_s", "import_s", "load_s", "first_call_s"):
                entry[f"median_{key}"] = statistics.median(r[key] for r in entry["runs"])
            entry["first_total_s"] = entry["runs"][0]["total_s"]
        result["cold_start"][kind] = entry


def _kernels(run: _Run, result: dict, repeat: int) -> None:
    """The tuned bundle's fused kernels: PGO winner vs candidate 0 vs a memory copy timed now."""
    kcid = "bundleN" if run.res.get("bundleN", {}).get("kernel_choices") else "bundle1"
    choices = run.res.get(kcid, {}).get("kernel_choices") or {}
    if choices:
        result["kernels"] = model_kernel_rows(choices, repeat)
        result["kernels_of"] = kcid
