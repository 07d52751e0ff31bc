"""One interface for generated-kernel tactics (docs/DESIGN.md §6.2).

A tactic step's candidates are dispatcher tactics (:class:`ascendc_pack.tactics.dispatch.Tactic`,
family ``dispatch``) followed by the candidates of every *kernel family* that takes the step: the
tilings of a generated kernel, each a :class:`KernelTactic`. A family
(:class:`KernelFamily`, listed in :mod:`.registry`) says which steps it takes and how its kernel
is planned, bound to a step's tensors, verified, lowered and launched from the graph; everything
else - planning every step, compiling every library in one call, the tactic's JSON and key,
reading a lowered step back - is here, the same for every family. The tuner, the lowering, the
report and the graph planner look families up by name (``tactic.family``,
``step.chosen["family"]``); none of them knows a family's class.

A family implements:

* ``spec_of(step, values)``: the kernel spec of a step (None: not taken), ``spec_from_json``;
* ``plan(spec, config, target)``: a :class:`~ascendc_pack.kernels.family.KernelFamilyBuild`
  (the generator's ranked candidates and their sources);
* ``runner(tactic, named, pool)``: the candidate bound to a step's tensors: ``__call__`` (what
  the graph runs), ``verify(expected, ref64, sandbox, timeout_s)``, ``values()``;
* ``lowered_runner(tactic, named)``: Python mode of a lowered step;
* ``kernel_weights(tactic, named)`` and ``stored_weights(tactic)``: what lowering stores
  (``"made"``: the weights the kernel reads, made at lowering; ``"bound"``: the step's own, as
  bound; ``"none"``: it reads activations only);
* ``graph``: the graph's launch convention (:data:`ascendc_pack.graph.tactic.LAUNCHES`:
  ``gemm``, ``conv`` or ``generic`` - inputs in the layouts ``input_layouts(chosen)`` gives, one
  output as ``output_layout(chosen)``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from ascendc_pack.cache import stable_hash
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.program import TacticStep
from ascendc_pack.kernels.target import CpuTarget
from ascendc_pack.tactics.families import registry
from ascendc_pack.toolchain.compiler import compile_kernels

log = logging.getLogger("ascendc_pack")


@dataclass(frozen=True)
class KernelTactic:
    """One tiling of a step's generated kernel, as a tactic candidate.

    ``kind``: the step's kind (``linear``, ``conv``, ``attention``); ``extra``: what the family
    records beside the spec (JSON values: a GEMM's packed-B size, a convolution's BatchNorm
    still to fold, ...)."""

    family: str
    kind: str
    spec: Any
    candidate: Candidate
    so_path: str
    rank: int
    extra: Mapping = field(default_factory=dict, compare=False)
    est_us: float | None = field(default=None, compare=False)   # the family's cost model (not in the JSON)

    @property
    def impl(self) -> KernelFamily:
        return registry.family(self.family)

    @property
    def name(self) -> str:
        return f"{self.family}#{self.rank}"

    @property
    def key(self) -> str:
        """The candidate's key among the step's: its kernel's name and key (one tiling of two
        families' kernels has one ``kernel_key``, unique within a kernel name only)."""
        return stable_hash(self.spec.name, self.candidate.kernel_key)[:32]

    def param(self, key: str, default=None):
        return self.impl.param(self, key, default)

    def to_json(self) -> dict:
        c = self.candidate
        return {"kind": self.kind, "name": self.name, "family": self.family, "spec": self.spec.to_json(),
                "kernel_key": c.kernel_key, "tiling_repr": c.tiling_repr, "workspace": c.workspace,
                "block_dim": c.block_dim, **self.extra}

    def lowered(self) -> dict:
        """What a lowered step keeps (``TacticStep.chosen``): the JSON, the kernel's name and its
        library's path in the build cache (Python mode; the bundle names its own member)."""
        return {**self.to_json(), **self.impl.lowered_extra(self), "kernel": self.spec.name, "so_path": self.so_path}

    def kernel_weights(self, named: dict) -> dict:
        return self.impl.kernel_weights(self, named)


def from_lowered(chosen: dict) -> KernelTactic:
    """The tactic a lowered step's ``chosen`` records (its library in the build cache)."""
    fam = registry.family(chosen["family"])
    cand = Candidate(chosen["tiling_repr"], chosen["workspace"], chosen["block_dim"])
    known = {"kind", "name", "family", "spec", "kernel_key", "tiling_repr", "workspace", "block_dim", "kernel",
             "so_path"}
    return KernelTactic(fam.name, chosen["kind"], fam.spec_from_json(chosen["spec"]), cand, chosen["so_path"], 0,
                        {k: v for k, v in chosen.items() if k not in known})


class KernelFamily:
    """Base of a generated-kernel tactic family (see the module docstring for the hooks)."""

    name: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ()
    tilings: ClassVar[int | None] = None   # candidates compiled per step at most (None: --topn)
    weights: ClassVar[str] = "bound"       # stored_weights' default
    graph: ClassVar[str] = "generic"       # the graph's launch convention
    precision: ClassVar[str] = "fp32"      # what its kernels compute in (a low one: only when the build offers it)

    def offered(self) -> str | None:
        """Why this host gets no candidates of the family (None: it does; e.g. a CPU feature)."""
        return None

    def spec_of(self, step: TacticStep, values: dict):
        raise NotImplementedError

    def spec_from_json(self, d: dict):
        raise NotImplementedError

    def plan(self, spec, config, target):
        raise NotImplementedError

    def tilings_for(self, step: TacticStep) -> int | None:
        """Candidates compiled for ``step`` at most (None: ``--topn``)."""
        return self.tilings

    def extra(self, step: TacticStep, spec, so_path: str, kernel_key: str) -> dict:
        """What a candidate records beside its spec (JSON values)."""
        return {}

    def lowered_extra(self, tactic: KernelTactic) -> dict:
        """What a lowered step records differently from the candidate (e.g. weights now folded)."""
        return {}

    def param(self, tactic: KernelTactic, key: str, default=None):
        """The layout parameters the tactic pass reads (``layout``, ``out_layout``)."""
        return default

    def kernel_weights(self, tactic: KernelTactic, named: dict) -> dict:
        return {n: named[n] for n in ("weight", "bias") if n in named}

    def stored_weights(self, tactic: KernelTactic) -> str:
        """What lowering stores for ``tactic``: ``"made"``, ``"bound"`` or ``"none"``."""
        return self.weights

    def runner(self, tactic: KernelTactic, named: dict, pool: int | None = None):
        raise NotImplementedError

    def lowered_runner(self, tactic: KernelTactic, named: dict):
        raise NotImplementedError

    def input_layouts(self, chosen: dict) -> dict:
        """``{step tensor: (shape, strides, dtype)}`` the kernel reads (``graph = "generic"``)."""
        raise NotImplementedError

    def output_layout(self, chosen: dict) -> tuple:
        """``(shape, strides, dtype)`` of the kernel's one output (``graph = "generic"``)."""
        raise NotImplementedError


def plan_kernel_tactics(steps: list[TacticStep], values_of: dict, config,
                        offered: tuple[str, ...] = ()) -> dict[str, list[tuple[str, object]]]:
    """``[(family, build), ...]`` of every step the registered families take (by step name;
    ``values_of[name]``: the specs of its program's values), each with its family's first
    candidates rendered (``config.topn``, capped by the family's ``tilings``). A family computing
    in a low precision takes part only when the build ``offered`` it (``--precision``)."""
    out: dict[str, list] = {}
    target = None
    usable = [f for f in registry.families()
              if (f.precision == "fp32" or f.precision in offered) and f.offered() is None]
    for s in steps:
        for fam in usable:
            spec = fam.spec_of(s, values_of[s.name]) if s.tactic_kind in fam.kinds else None
            if spec is None:
                continue
            target = target or CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir)
            cap = fam.tilings_for(s)
            cfg = config if cap is None else dataclasses.replace(config, topn=min(config.topn, cap))
            out.setdefault(s.name, []).append((fam.name, fam.plan(spec, cfg, target)))
    return out


def planned_total(plans: dict) -> int:
    """Libraries :func:`compile_kernel_tactics` goes through."""
    return sum(len(b.candidates) for builds in plans.values() for _, b in builds)


def compile_kernel_tactics(plans: dict, steps: dict[str, TacticStep], config,
                           progress=None) -> dict[str, list[KernelTactic]]:
    """Compile every planned kernel (one ``compile_kernels`` call, cached like fused kernels);
    the candidates that compiled, as tactics, by step name, family by family in the cost model's
    order (``steps[name]``: the step, for what the family records)."""
    if not plans:
        return {}
    out: dict[str, list[KernelTactic]] = {name: [] for name in plans}
    flat = [(name, family, b) for name, builds in plans.items() for family, b in builds]
    compiled = compile_kernels([b.build for _, _, b in flat], config, progress)
    for (name, family, b), ck in zip(flat, compiled):
        fam, step = registry.family(family), steps[name]
        for rank, cc in enumerate(ck.candidates):
            if not cc.ok:
                log.info("%s %s candidate #%d did not compile", family, b.spec.name, rank)
                continue
            extra = fam.extra(step, b.spec, str(cc.so_path), cc.candidate.kernel_key)
            est = getattr(b.candidates[rank], "est_us", None) if rank < len(b.candidates) else None  # a plugin may have none
            out[name].append(KernelTactic(family, step.tactic_kind, b.spec, cc.candidate, str(cc.so_path), rank,
                                          extra, est))
    return out


__all__ = ["KernelTactic", "KernelFamily", "from_lowered", "plan_kernel_tactics",
           "planned_total", "compile_kernel_tactics"]
