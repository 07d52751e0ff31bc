"""Tile, render and compile every fused kernel of a Program (stages 3-4 of the pipeline).

:func:`prepare_kernels` proposes each kernel's candidates (:mod:`tiling`), renders one static
C++ source per candidate (:mod:`codegen`) and compiles them all into the cache
(:mod:`compile`). The result maps kernel name -> :class:`KernelCandidates`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .backend import get_backend
from .cache import atomic_write_text
from .codegen import TEMPLATE_VERSION, template_env
from .compiler import CandidateSource, CompiledKernel, KernelBuild, debug_dir_for
from .config import BuildConfig
from .program import FusedStep, Program
from .tiling import Target, Tiling, propose


@dataclass
class KernelCandidates:
    """One fused kernel: its spec, its ranked tilings and their compiled libraries (same order)."""

    step: FusedStep
    tilings: list[Tiling]
    compiled: CompiledKernel

    @property
    def name(self) -> str:
        return self.step.name


def target_for(config: BuildConfig) -> Target:
    return get_backend(config.backend).target(config)


def prepare_kernels(program: Program, config: BuildConfig,
                    progress: Callable[[int], None] | None = None) -> dict[str, KernelCandidates]:
    """Propose, render and compile the candidates of every fused kernel (branches included)."""
    backend = get_backend(config.backend)
    target = backend.target(config)
    isa = ",".join(backend.isa(config))
    steps = {s.name: s for s in program.fused_steps()}  # identical kernels share a name
    builds, tilings = [], {}
    for name, step in steps.items():
        spec_text = json.dumps(step.kernel, sort_keys=True)
        tilings[name] = propose(step.kernel, target, config.topn)
        sources = [CandidateSource(t.candidate, backend.render_kernel(step.kernel, t, isa)) for t in tilings[name]]
        ahash = backend.artifact_hash(spec_text, TEMPLATE_VERSION, config)
        builds.append(KernelBuild(name, ahash, sources))
    compiled = backend.compile(builds, config, progress)
    result = {b.kernel_name: KernelCandidates(steps[b.kernel_name], tilings[b.kernel_name], ck)
              for b, ck in zip(builds, compiled)}
    if config.debug:
        for kc in result.values():
            write_benchmark_script(kc)
    return result


def write_benchmark_script(kc: KernelCandidates, debug_root=None) -> Path:
    """With --debug: a standalone script timing every candidate of one kernel."""
    cands = [{"index": i, "tiling_repr": cc.candidate.tiling_repr, "kernel_key": cc.candidate.kernel_key,
              "so_path": str(cc.so_path) if cc.ok else None} for i, cc in enumerate(kc.compiled.candidates)]
    path = debug_dir_for(kc.name, debug_root) / "benchmark.py"
    text = template_env().get_template("debug/benchmark.py.j2").render(
        name=kc.name, script_name=path.name, spec_json=json.dumps(kc.step.kernel),
        candidates_json=json.dumps(cands))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path


def total_candidates(program: Program, config: BuildConfig) -> int:
    """How many candidates :func:`prepare_kernels` will compile (for a progress bar)."""
    target = target_for(config)
    names = {s.name: s for s in program.fused_steps()}
    return sum(len(propose(s.kernel, target, config.topn)) for s in names.values())
