"""Tile, render and compile every fused kernel of a Program (stages 3-4 of the pipeline).

:func:`prepare_kernels` proposes each kernel's candidates (:mod:`tiling`), renders one static
C++ source per candidate (:mod:`codegen`) and compiles them all into the cache
(:mod:`compiler`). The result maps kernel name -> :class:`KernelCandidates`. A compiled
candidate runs on torch tensors through :class:`FusedKernel` (tuning, benchmarks, tests).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ascendc_pack_runtime.kernels import KernelLibrary
from ascendc_pack_runtime.tensor_meta import DTYPES, same_layout

from ascendc_pack.backends.registry import get_backend
from ascendc_pack.cache import atomic_write_text
from ascendc_pack.kernels.family import generator_version
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.toolchain.compiler import CandidateSource, CompiledKernel, KernelBuild, debug_dir_for
from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.fusion import KernelSpec
from ascendc_pack.ir.program import FusedStep, Program
from ascendc_pack.kernels.fused.tiling import Target, Tiling


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
        spec_text = step.kernel.canonical_json()
        tilings[name] = backend.propose(step.kernel, target, config.topn)
        sources = [CandidateSource(t.candidate, backend.render_kernel(step.kernel, t, isa)) for t in tilings[name]]
        ahash = backend.artifact_hash(spec_text, generator_version("fused", "ascendc_pack.kernels.fused.codegen",
                                                                     "kernel/fused.cpp.j2"), config)
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
        name=kc.name, script_name=path.name, spec_json=json.dumps(kc.step.kernel.to_json()),
        candidates_json=json.dumps(cands))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path


def kernel_uses(program: Program) -> dict[str, list[dict]]:
    """Every use of every fused kernel, by kernel name, in program order (branches included):
    the value names each use reads and writes. Steps computing the same share one kernel (one
    name), so a kernel can have many uses."""
    uses: dict[str, list[dict]] = {}
    for s in program.fused_steps():
        uses.setdefault(s.name, []).append({"inputs": list(s.inputs), "outputs": list(s.outputs)})
    return uses


def total_candidates(program: Program, config: BuildConfig) -> int:
    """How many candidates :func:`prepare_kernels` will compile (for a progress bar)."""
    target = target_for(config)
    names = {s.name: s for s in program.fused_steps()}
    backend = get_backend(config.backend)
    return sum(len(backend.propose(s.kernel, target, config.topn)) for s in names.values())


class FusedKernel:
    """A compiled candidate plus its spec: checks inputs, allocates outputs, launches.

    Inputs whose strides differ from those the kernel was compiled for are copied into the
    expected layout first (the kernel indexes memory with strides baked in).
    """

    def __init__(self, spec: KernelSpec, library: KernelLibrary):
        self.spec = spec
        self.lib = library
        self.out_specs = [(tuple(o.shape), DTYPES[o.dtype], tuple(o.layout)) for o in spec.outputs]
        self._workspace = torch.empty(library.workspace, dtype=torch.uint8) if library.workspace else None

    def allocate_outputs(self) -> list[torch.Tensor]:
        return [torch.empty_strided(shape, stride, dtype=dtype) for shape, dtype, stride in self.out_specs]

    def prepare_inputs(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Inputs in the layout the kernel expects (a copy only when strides differ)."""
        ready = []
        for k, (t, spec) in enumerate(zip(inputs, self.spec.inputs)):
            if tuple(t.shape) != spec.shape or t.dtype != DTYPES[spec.dtype]:
                raise ValueError(f"kernel {self.spec.name}: input {k} is {t.dtype}{list(t.shape)}, expected "
                                 f"{spec.dtype}{list(spec.shape)}")
            if not same_layout(t.shape, t.stride(), t.shape, spec.stride):
                t = _relayout(t, spec.stride)
                if not same_layout(t.shape, t.stride(), t.shape, spec.stride):
                    raise ValueError(f"kernel {self.spec.name}: input {k} has strides {t.stride()} and "
                                     f"cannot be laid out as {spec.stride}")
            ready.append(t)
        return ready

    def __call__(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor] | None = None,
                 max_threads: int = 0) -> list[torch.Tensor]:
        ins = self.prepare_inputs(inputs)
        outs = self.allocate_outputs() if outputs is None else outputs
        rc = self.lib.launch(ins, outs, self._workspace, max_threads)
        if rc != 0:
            raise RuntimeError(f"kernel {self.spec.name} ({self.lib.kernel_key}) failed with status {rc}")
        return outs


def _relayout(t: torch.Tensor, stride) -> torch.Tensor:
    if any(s == 0 for s, n in zip(stride, t.shape) if n != 1):
        # broadcast (expanded) layout: materialize the distinct elements, then expand
        base_shape = [1 if (s == 0 and n != 1) else n for s, n in zip(stride, t.shape)]
        index = tuple(slice(0, 1) if b == 1 and n != 1 else slice(None) for b, n in zip(base_shape, t.shape))
        compact = t[index].contiguous()
        return compact.expand(t.shape) if math.prod(base_shape) else compact
    out = torch.empty_strided(tuple(t.shape), tuple(stride), dtype=t.dtype)
    out.copy_(t)
    return out
