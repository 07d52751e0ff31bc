"""What every generated CPU kernel family shares (docs/DESIGN.md §2.4): the tiling base, a
candidate with its estimate, the plan (ranked candidates + their sources), one compile call for
many specs, and the version of the generated code.

A family's generator module (``kernels/gemm/generator.py``, ``kernels/conv/direct.py``, ...)
keeps what is its own - the spec, the tiling's fields, the cost model (``propose``) and the
template's arguments (``render``) - and describes itself with one :class:`Generator`;
:func:`plan` and :func:`compile_all` do the rest the same way for every family.

**Versions.** A generated kernel's cache key (``artifact_hash``) includes its generator's
:meth:`Generator.version`: a hash of its template, every template that template imports or
includes (``templates/kernel/_common.j2``), its generator module, and every module of
``ascendc_pack.kernels`` and ``ascendc_pack.ir`` that module imports, transitively (read from
the source, so a table in :mod:`ascendc_pack.ir.epilogue` that a render reads is covered without
being named). Editing any of them rebuilds the cached kernels of the family.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import jinja2.meta

from ascendc_pack.cache import KernelDir, atomic_write_text, stable_hash
from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.kernels.fused.tiling import PAYOFF_MARGIN
from ascendc_pack.kernels.target import CpuTarget
from ascendc_pack.toolchain.compiler import (CandidateSource, CompiledKernel, KernelBuild, artifact_hash,
                                             compile_kernels, isa_features)

log = logging.getLogger("ascendc_pack")

VERSION_SCOPES = ("ascendc_pack.kernels", "ascendc_pack.ir")
"""Packages whose modules a generator's version covers when its module imports them."""

PARALLEL_MIN_US = 100.0
"""Multi-thread candidates are proposed only for kernels whose best single-thread estimate is at
least this: waking a passive team and its closing barrier cost ~11 us (tiling.Target), and on a
busy host a second thread often is not there at all."""


class Tiling:
    """Base of a kernel's tiling (a frozen dataclass of int and str parameters): ``tiling_repr``
    (``name=value`` pairs, sorted by name, ``;``-separated: what its libraries describe) and
    :meth:`parse` back; subclasses name the error class and the kernel kind for the message."""

    error = ValueError
    kind = "kernel"

    @property
    def tiling_repr(self) -> str:
        return ";".join(f"{f.name}={getattr(self, f.name)}" for f in _sorted_fields(type(self)))

    @classmethod
    def parse(cls, tiling_repr: str):
        """The tiling of a candidate's ``tiling_repr`` (what a kernel library describes)."""
        try:
            d = dict(kv.split("=") for kv in tiling_repr.split(";"))
            return cls(**{f.name: d[f.name] if f.type in ("str", str) else int(d[f.name])
                          for f in _sorted_fields(cls)})
        except (KeyError, ValueError, TypeError):
            raise cls.error(f"not a {cls.kind} tiling: {tiling_repr!r}") from None


def _sorted_fields(cls) -> list:
    return sorted(fields(cls), key=lambda f: f.name)


@dataclass(frozen=True)
class KernelCandidate:
    """A tiling, its candidate triple (``kernel_key``) and its estimated time (µs)."""

    tiling: Any
    candidate: Candidate
    est_us: float


@dataclass
class FamilyBuild:
    """One spec's ranked candidates and the compile request for them (same order)."""

    spec: Any
    candidates: list[KernelCandidate]
    build: KernelBuild
    compiled: CompiledKernel | None = field(default=None)


@dataclass(frozen=True)
class Generator:
    """One generated kernel family's generator, as :func:`plan` uses it.

    ``propose(spec, target, topn)``: ranked :class:`KernelCandidate`\\ s; ``render(spec, cand,
    isa)``: a candidate's C++ source; ``tiling``: its tiling class (a :class:`Tiling`);
    ``workspace(spec, t)`` / ``estimate(spec, t, target)`` / ``check_tiling(spec, t, target)``:
    for tilings given explicitly; ``keep_proposal``: store the proposal in the kernel's cache
    directory (a warm rebuild skips the cost model: worth it where proposing is slow, the GEMM)."""

    name: str
    module: str
    template: str
    propose: Callable
    render: Callable
    tiling: type
    workspace: Callable | None = None
    estimate: Callable | None = None
    check_tiling: Callable | None = None
    keep_proposal: bool = False

    @property
    def version(self) -> str:
        return generator_version(self.name, self.module, self.template)


def plan(gen: Generator, spec, config: BuildConfig, target=None, tilings: list | None = None) -> FamilyBuild:
    """Propose ``config.topn`` candidates of ``spec`` (or take ``tilings`` as given, in that
    order: e.g. one fixed tiling per step) and render their sources."""
    target = target or CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir)
    isa = ",".join(isa_features(config.march))
    ahash = artifact_hash(spec.spec_text(), gen.version, config.cores, config.march)
    if tilings is not None:
        cands = []
        for t in tilings:
            if gen.check_tiling is not None:
                gen.check_tiling(spec, t, target)
            cands.append(KernelCandidate(t, Candidate(t.tiling_repr, gen.workspace(spec, t), t.bd),
                                         gen.estimate(spec, t, target)))
    elif gen.keep_proposal:
        stored = KernelDir(config.kernel_cache_root, spec.name, ahash).path / \
            f"proposal-{stable_hash(repr(target), config.topn)[:16]}.json"
        cands = _read_proposal(gen, stored)
        if cands is None:
            cands = gen.propose(spec, target, config.topn)
            atomic_write_text(stored, json.dumps([[asdict(c.tiling), c.candidate.workspace, c.est_us]
                                                  for c in cands]))
    else:
        cands = gen.propose(spec, target, config.topn)
    sources = [CandidateSource(c.candidate, gen.render(spec, c, isa)) for c in cands]
    return FamilyBuild(spec, cands, KernelBuild(spec.name, ahash, sources))


def _read_proposal(gen: Generator, path: Path) -> list[KernelCandidate] | None:
    """A proposal :func:`plan` stored (the cache key covers spec, generator, target and topn)."""
    try:
        out = []
        for tiling, workspace, est_us in json.loads(path.read_text()):
            t = gen.tiling(**tiling)
            out.append(KernelCandidate(t, Candidate(t.tiling_repr, int(workspace), t.bd), float(est_us)))
        return out or None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("%s proposal %s is unusable (%s); proposing again", gen.tiling.kind, path, exc)
        return None


def compile_all(gen: Generator, specs: list, config: BuildConfig, target=None, **compile_kwargs) -> list[FamilyBuild]:
    """Plan every spec and compile all their candidates in one ``compile_kernels`` call
    (parallel across specs, cached like fused kernels)."""
    builds = [plan(gen, s, config, target) for s in specs]
    for b, ck in zip(builds, compile_kernels([b.build for b in builds], config, **compile_kwargs)):
        b.compiled = ck
    return builds


def scored(spec, target, space, workspace, estimate) -> list[KernelCandidate]:
    """The distinct tilings of ``space`` as estimated candidates (``workspace(spec, t)`` bytes,
    ``estimate(spec, t, target)`` µs), lowest estimate first; multi-thread ones only where the
    best single-thread estimate is at least :data:`PARALLEL_MIN_US` and they are within
    ``PAYOFF_MARGIN`` of it."""
    out, seen = [], set()
    for t in space:
        cand = Candidate(t.tiling_repr, workspace(spec, t), t.bd)
        if cand.kernel_key not in seen:
            seen.add(cand.kernel_key)
            out.append(KernelCandidate(t, cand, estimate(spec, t, target)))
    single = min(c.est_us for c in out if c.tiling.bd == 1)
    out = [c for c in out if c.tiling.bd == 1 or (single >= PARALLEL_MIN_US and c.est_us <= PAYOFF_MARGIN * single)]
    return sorted(out, key=lambda c: (c.est_us, c.candidate.tiling_repr))


def varied(cands: list[KernelCandidate], kinds, best: int = 3) -> list[KernelCandidate]:
    """``cands`` (sorted by estimate) reordered for PGO: for each ``kind(tiling)`` in ``kinds``,
    the ``best`` best of its distinct values first, then the rest by estimate (the cost models
    rank register and cache blocks within ~10-20 %; measured candidates differ by more)."""
    ranked: dict[int, KernelCandidate] = {}  # by id: insertion-ordered, no deep comparisons
    for kind in kinds:
        firsts: dict = {}
        for c in cands:
            firsts.setdefault(kind(c.tiling), c)
        for c in sorted(firsts.values(), key=lambda c: c.est_us)[:best]:
            ranked.setdefault(id(c), c)
    for c in cands:
        ranked.setdefault(id(c), c)
    return list(ranked.values())


# ----------------------------------------------------------------------------- versions


@lru_cache(maxsize=None)
def generator_version(name: str, module: str, template: str) -> str:
    """``<name>-v1-<hash>`` of the template closure and the module closure (module docstring)."""
    env = template_env()
    parts: list[str | bytes] = []
    for t in sorted(template_closure(env, template)):
        parts += [t, env.loader.get_source(env, t)[0]]
    for m in sorted(module_closure(module)):
        parts += [m, Path(importlib.util.find_spec(m).origin).read_bytes()]
    return f"{name}-v1-" + stable_hash(*parts)[:16]


def template_closure(env: jinja2.Environment, template: str) -> set[str]:
    """``template`` and every template it imports, includes or extends, transitively."""
    seen, todo = set(), [template]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            ast_ = env.parse(env.loader.get_source(env, t)[0])
            todo += [r for r in jinja2.meta.find_referenced_templates(ast_) if r]
    return seen


def module_closure(module: str, scopes: tuple[str, ...] = VERSION_SCOPES) -> set[str]:
    """``module`` and every module of ``scopes`` it imports (anywhere in its source), transitively."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        tree = ast.parse(Path(importlib.util.find_spec(m).origin).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] + [f"{node.module}.{a.name}" for a in node.names] \
                if isinstance(node, ast.ImportFrom) and node.module else []
            todo += [n for n in names if n.startswith(scopes) and _is_module(n)]
    return seen


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):   # "pkg.module.NAME": a name in a module, not a module
        return False


__all__ = ["Tiling", "KernelCandidate", "FamilyBuild", "Generator", "plan", "compile_all", "scored", "varied",
           "generator_version", "template_closure", "module_closure", "PARALLEL_MIN_US", "VERSION_SCOPES"]
