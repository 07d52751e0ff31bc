"""The tuned-choice entries of ``manifest.json`` beyond the fused kernels (docs/FORMAT.md):
``tactics``, the heavy steps (GEMM, convolution, attention) with candidate implementations, each
candidate's PGO median and verdict, the choice per use; and ``call_threads``, the thread cap of a
whole call chosen the same way. Part of :mod:`ascendc_pack_runtime.manifest` (same conventions: ``from_json``
checks types, bounds and cross-references and raises field errors naming the field path)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

from .schema import Fields, field_error

_MD5_RE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class TacticCandidate:
    """One candidate of a tactic step: its ``key`` (md5 of the tactic's JSON), its name
    (``aten``, ``onednn``, ``flash``...), its PGO median (None: not timed), whether it failed and
    whether verification disqualified it, and the ``precision`` its heavy op computes in (``fp32``:
    the model's own dtype; ``bf16``; absent in older bundles and for ``fp32``)."""

    index: int
    key: str
    name: str
    median_us: float | None
    failed: bool
    disqualified: bool
    precision: str = "fp32"

    @staticmethod
    def from_json(d: object, where: str) -> TacticCandidate:
        f = Fields(d, where)
        precision = f.get("precision", lambda v: v in PRECISIONS, f"one of {', '.join(PRECISIONS)}", optional=True)
        return TacticCandidate(f.int("index"), f.str("key", pattern=_MD5_RE, what="32 lowercase hex digits"),
                               f.str("name", nonempty=True), f.number("median_us"), f.bool("failed"),
                               f.bool("disqualified"), precision or "fp32")

    def to_json(self) -> dict:
        d = {"index": self.index, "key": self.key, "name": self.name, "median_us": self.median_us,
             "failed": self.failed, "disqualified": self.disqualified}
        if self.precision != "fp32":
            d["precision"] = self.precision
        return d


@dataclass(frozen=True)
class TacticStep:
    """A heavy step (GEMM, convolution, attention) with tactic candidates: its name (steps with
    the same name share one measurement), ``kind``, the chosen candidate (index and key; the
    first use's when uses differ), whether PGO reached it, every candidate, and ``uses``: per
    step of the graph, the values it reads and writes, its own chosen index and its convolution
    chain (0: none)."""

    name: str
    kind: str
    chosen_index: int
    chosen_key: str
    visited: bool
    candidates: tuple[TacticCandidate, ...]
    uses: tuple = ()

    @staticmethod
    def from_json(d: object, where: str) -> TacticStep:
        f = Fields(d, where)
        name, kind = f.str("name", nonempty=True), f.str("kind", nonempty=True)
        chosen, key, visited = f.int("chosen_index"), f.str("chosen_key", pattern=_MD5_RE,
                                                            what="32 lowercase hex digits"), f.bool("visited")
        candidates = tuple(TacticCandidate.from_json(v, w) for v, w in f.list("candidates"))
        for i, c in enumerate(candidates):
            if c.index != i:
                raise field_error(f"{where}.candidates[{i}].index", f"is {c.index}, not its position {i}")
        if chosen >= len(candidates) or candidates[chosen].key != key:
            raise field_error(f"{where}.chosen_index", f"is {chosen}, not the index of the candidate with key {key}")
        uses = []
        for u, w in f.list("uses"):
            g = Fields(u, w)
            index = g.int("chosen_index")
            if index >= len(candidates):
                raise field_error(f"{w}.chosen_index", f"is {index}; the step has {len(candidates)} candidates")
            uses.append(MappingProxyType({"inputs": list(g.strs("inputs")), "outputs": list(g.strs("outputs")),
                                          "chosen_index": index, "chain": g.int("chain")}))
        return TacticStep(name, kind, chosen, key, visited, candidates, tuple(uses))

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "chosen_index": self.chosen_index,
                "chosen_key": self.chosen_key, "visited": self.visited,
                "candidates": [c.to_json() for c in self.candidates], "uses": [dict(u) for u in self.uses]}


PRECISIONS = ("fp32", "bf16", "int8")
"""What a tactic candidate may compute in (``fp32``: the model's own dtype)."""


@dataclass(frozen=True)
class Precision:
    """``precision``: how the build chose low precision (``--precision``; absent: the model's own
    precision everywhere). ``requested`` (``bf16``, ``auto``...), ``budget`` (the largest relative
    output error allowed, by ``metric``: ``relative_l2`` = the worst output's ``||y - y_ref|| /
    ||y_ref||`` over the calibration input sets), ``error`` (what the chosen steps cost there,
    <= budget), ``computes`` (``fp32`` or the low precisions used, e.g. ``bf16``), ``requires``
    (CPU features those steps need; also in ``target.isa``, which the runtime checks) and
    ``input_sets`` (how many calibration sets measured it). ``build`` and ``run --check`` compare
    the bundle with eager by this budget instead of the float32 accuracy rule when
    ``computes`` is not ``fp32``."""

    requested: str
    budget: float
    metric: str
    error: float
    computes: str
    requires: tuple[str, ...] = ()
    input_sets: int = 0

    @staticmethod
    def from_json(d: object, where: str = "precision") -> Precision:
        f = Fields(d, where)
        budget = f.get("budget", lambda v: type(v) in (int, float) and 0 < v < 1, "a number in (0, 1)")
        metric = f.get("metric", lambda v: v == "relative_l2", "'relative_l2'")
        error = f.number("error")
        computes = f.get("computes", lambda v: isinstance(v, str) and all(p in PRECISIONS for p in v.split("+")),
                         f"'+'-joined names of {', '.join(PRECISIONS)}")
        return Precision(f.str("requested", nonempty=True), float(budget), metric, float(error or 0.0), computes,
                         f.strs("requires"), f.int("input_sets"))

    def to_json(self) -> dict:
        return {"requested": self.requested, "budget": self.budget, "metric": self.metric, "error": self.error,
                "computes": self.computes, "requires": list(self.requires), "input_sets": self.input_sets}

    @property
    def low(self) -> bool:
        """Whether some step computes in a precision below the model's own."""
        return self.computes != "fp32"


@dataclass(frozen=True)
class CallThreads:
    """``call_threads``: the thread cap of every call that PGO chose on the build host (``cap``;
    None: no cap, every core), each candidate cap's median call latency there (µs), and that
    host: ``cores`` (the cores every-core means there) and ``cpu`` (its CPU model; both None in
    bundles built before they were recorded). The runtime applies ``cap`` only on a host like
    it (:meth:`mismatch`) and unless ``load(threads=...)`` says otherwise."""

    cap: int | None
    candidates: tuple[tuple[int, float | None], ...]   # (threads, median_us)
    cores: int | None = None
    cpu: str | None = None

    @staticmethod
    def from_json(d: object, where: str = "call_threads") -> CallThreads:
        f = Fields(d, where)
        cap = f.int("cap", 1, nullable=True)
        candidates = []
        for v, w in f.list("candidates"):
            g = Fields(v, w)
            candidates.append((g.int("threads", 1), g.number("median_us")))
        if cap is not None and cap not in [t for t, _ in candidates]:
            raise field_error(f"{where}.cap", f"is {cap}, not one of the candidates' thread counts")
        cores = f.int("cores", 1, optional=True)
        cpu = f.get("cpu", lambda v: isinstance(v, str) and bool(v), "a non-empty string", optional=True)
        return CallThreads(cap, tuple(candidates), cores, cpu)

    def to_json(self) -> dict:
        d = {"cap": self.cap, "candidates": [{"threads": t, "median_us": m} for t, m in self.candidates]}
        if self.cores is not None:
            d["cores"] = self.cores
        if self.cpu is not None:
            d["cpu"] = self.cpu
        return d

    def mismatch(self, cores: int, cpu: str | None, build_cores: int) -> str | None:
        """Why the cap does not carry over to a host with ``cores`` usable cores and CPU model
        ``cpu`` (None: it does). A cap is a trade-off measured on one host (a 2-vCPU VM pays
        62-82 µs to wake a halted vCPU per parallel region, ``bench/omp_wakeup.py``); carried to
        a host with other cores or another CPU, a cap of 1 could idle all but one of 16 cores.
        ``build_cores``: the manifest's ``cores``, for records that predate ``cores``."""
        timed_on = self.cores if self.cores is not None else build_cores
        if cores != timed_on:
            return f"tuned on a {timed_on}-core host, this one has {cores} usable cores"
        if self.cpu is not None and cpu is not None and cpu != self.cpu:
            return f"tuned on a {self.cpu} host, this one is a {cpu}"
        return None

    def describe(self) -> str:
        """One line: the choice, every candidate's median call and the host they were timed on."""
        timed = ", ".join(f"{t} thread{'s' if t > 1 else ''} " + ("-" if us is None else f"{us / 1e3:.3g} ms")
                          for t, us in self.candidates)
        chosen = f"capped at {self.cap}" if self.cap is not None else "no cap"
        host = "" if self.cores is None else f"{self.cores}-core {self.cpu + ' ' if self.cpu else ''}"
        return f"{chosen}; median call on the {host}build host: {timed}; load(threads=N) overrides"


__all__ = ["TacticCandidate", "TacticStep", "CallThreads", "Precision", "PRECISIONS"]
