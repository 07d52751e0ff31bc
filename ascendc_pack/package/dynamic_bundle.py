"""Bundle stage of a model with dynamic dims (docs/DESIGN.md §2.10, docs/FORMAT.md "Dynamic
shapes"): every plan's graph + the union of their kernels and weights + a format-version-2
manifest.

A dynamic bundle holds one graph per plan (``plans/<i>/graph.so``): a static plan per bucket,
built and tuned exactly as a static bundle's graph, and the generic plan (jit kernels, sizes
computed per call). Kernels and weights are stored once however many plans use them (a
kernel by its name and key; a weight by its parameter name and bytes); each plan's manifest
entry lists the ones its graph takes. The archive is written like a static bundle's
(:mod:`ascendc_pack.package.bundle`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.constants import FORMAT_VERSION_DYNAMIC, TUNING_FILE, WEIGHT_ALIGNMENT, WEIGHTS_FILE

from ascendc_pack.config import BuildConfig
from ascendc_pack.frontend.dynamic import DynamicShapes
from ascendc_pack.graph.emit import render_source
from ascendc_pack.graph.plan import plan_graph
from ascendc_pack.graph.render import compile_graph, render_graph_cached
from ascendc_pack.ir.program import ModelProgram
from ascendc_pack.ir.symbolic import is_symbolic
from ascendc_pack.package.bundle import (TUNING_FORMAT, ZSTD_LEVEL, BundleReport, BundleWriteError, _sha256,
                                         _tensor_bytes, _tuning_json, _write_archive, bundle_kernels, manifest_common,
                                         manifest_graph, model_weights, weights_blob)
from ascendc_pack.tactics.report import manifest_tactics


@dataclass
class PlanBuild:
    """One plan of a dynamic bundle, ready to be bundled: ``kind`` ``bucket`` (``sizes``: dim ->
    size) or ``generic``; its fused program (fallbacks inlined), weights, the choice of every
    fused kernel, its tactic outcomes and, for the generic plan, the dims each jit kernel takes."""

    kind: str
    sizes: dict | None
    model: ModelProgram
    weights: dict
    choices: dict
    tactics: dict = field(default_factory=dict)
    jit_dims: dict = field(default_factory=dict)

    def label(self) -> str:
        return self.kind if self.sizes is None else f"bucket {' '.join(f'{k}={v}' for k, v in self.sizes.items())}"


def build_dynamic_bundle(plans: list[PlanBuild], decl: DynamicShapes, output: Path | str, config: BuildConfig,
                         zstd_level: int = ZSTD_LEVEL, precision=None) -> BundleReport:
    """Render and compile every plan's graph and write the dynamic bundle to ``output``.

    The last plan must be the generic one: its symbolic program gives the manifest's input and
    output shapes (dims by name). ``precision``: the buckets' merged
    :class:`~ascendc_pack.tactics.precision.PrecisionReport` (None: no record). Raises
    BundleWriteError, RenderError, CompileError."""
    t0 = time.perf_counter()
    output = Path(output)
    generic = plans[-1]
    if generic.kind != "generic" or any(p.kind != "bucket" for p in plans[:-1]):
        raise BundleWriteError("a dynamic bundle holds its buckets, then one generic plan")
    union = _Union()
    plan_entries, files, graph_sources = [], [], []
    dims = tuple((d.name, d.min, d.max) for d in decl.dims)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ascpack-", dir=output.parent) as staging:
        staging = Path(staging)
        for i, plan in enumerate(plans):
            _, refs, kernel_files, kernel_entries = bundle_kernels(plan.model, plan.choices, plan.tactics,
                                                                   plan.jit_dims)
            weight_index, layouts = union.add_weights(model_weights(plan.model, plan.weights))
            if plan.kind == "generic":
                src = render_source(plan_graph(plan.model, refs, layouts, dims), config.flush_denormals)
            else:
                src = render_graph_cached(plan.model, refs, layouts, config.cache_dir, config.flush_denormals)
            lib = compile_graph(src, config)
            so, cpp = f"plans/{i}/graph.so", f"plans/{i}/graph.cpp"
            files += [(so, lib.path), (cpp, lib.source_path)]
            graph_sources.append(src)
            union.add_kernels(kernel_files, kernel_entries)
            graph = manifest_graph(so, cpp, src, config)
            plan_entries.append(contract.Plan(
                plan.kind, dict(plan.sizes) if plan.sizes is not None else None, graph, tuple(weight_index),
                tuple((e.name, e.kernel_key) for e in kernel_entries),
                manifest_tactics(plan.tactics) if plan.tactics else None))
        blob, weight_specs = union.blob()
        tuning_path = staging / TUNING_FILE
        tuning_path.write_text(_tuning(plans, config))
        files += [*union.files, (WEIGHTS_FILE, blob), (TUNING_FILE, tuning_path)]
        members = {name: contract.Member(blob.size, blob.sha256) if src is blob else
                   contract.Member(src.stat().st_size, _sha256(src)) for name, src in files}
        manifest = _manifest(generic.model, decl, config, weight_specs, union.entries, members, plan_entries,
                             precision)
        tmp = output.parent / f".{output.name}.{os.getpid()}.tmp"
        try:
            _write_archive(tmp, manifest.dumps(), files, zstd_level)
            os.replace(tmp, output)
        finally:
            tmp.unlink(missing_ok=True)
    return BundleReport(output, output.stat().st_size, {k: v.to_json() for k, v in members.items()}, lib,
                        graph_sources[-1], time.perf_counter() - t0, manifest.to_json(), manifest)


class _Union:
    """The kernels and weights of every plan, each stored once."""

    def __init__(self):
        self.files: list[tuple[str, Path]] = []
        self.entries: list[contract.Kernel] = []
        self._kernels: set[tuple[str, str]] = set()
        self.named: list[tuple[str, str, torch.Tensor]] = []
        self._weights: dict[tuple, int] = {}

    def add_kernels(self, files, entries) -> None:
        by_member = dict(files)
        for e in entries:
            if (e.name, e.kernel_key) not in self._kernels:
                self._kernels.add((e.name, e.kernel_key))
                self.entries.append(e)
                self.files.append((e.file, by_member[e.file]))

    def add_weights(self, named) -> tuple[list[int], dict]:
        """Indices of ``named`` (``(name, fqn, tensor)``) in the union, and their stored layouts."""
        from ascendc_pack.graph.render import weight_layout

        index, layouts = [], {}
        for name, fqn, t in named:
            t = t.detach().cpu()
            key = (fqn, str(t.dtype), tuple(t.shape), tuple(t.stride()), _digest(t))
            if key not in self._weights:
                self._weights[key] = len(self.named)
                self.named.append((f"w{len(self.named)}_{name}", fqn, t))
            index.append(self._weights[key])
            layouts[name] = weight_layout(t)
        return index, layouts

    def blob(self):
        blob, specs, _ = weights_blob(self.named)
        return blob, specs


def _digest(t: torch.Tensor) -> str:
    dense = t.contiguous()
    return hashlib.sha256(bytes(_tensor_bytes(dense))).hexdigest()


def _tuning(plans: list[PlanBuild], config: BuildConfig) -> str:
    docs = []
    for p in plans:
        names = sorted({s.name for s in p.model.program.fused_steps()})
        doc = json.loads(_tuning_json(p.model, p.choices, names, config, p.tactics))
        docs.append({"plan": p.label(), "kernels": doc["kernels"], **({"tactics": doc["tactics"]}
                                                                      if "tactics" in doc else {})})
    return json.dumps({"format": TUNING_FORMAT, "version": 1, "model": plans[-1].model.name, "topn": config.topn,
                       "plans": docs}, indent=1, sort_keys=True) + "\n"


def _dims_of(shape) -> tuple:
    """A manifest shape: ints, dim names, or the text of a size expression."""
    return tuple(str(s) if is_symbolic(s) else int(s) for s in shape)


def _manifest(model: ModelProgram, decl: DynamicShapes, config: BuildConfig, weights, kernels, members,
              plans, precision=None) -> contract.Manifest:
    p = model.program
    mutated_values = {v: k for k, v in model.mutations.items()}
    outputs = []
    for o, out_name in zip(model.user_outputs, model.output_names):
        index = model.user_inputs.index(mutated_values[o]) if o in mutated_values else None
        outputs.append(contract.IOSpec(out_name, _dims_of(p.values[o].shape), p.values[o].dtype, input_index=index))
    inputs = []
    for n, declared in zip(model.user_inputs, decl.inputs):
        spec = p.values[n]
        shape = tuple(d if d is not None else int(s) for d, s in zip(declared, spec.shape))
        dynamic = any(d is not None for d in declared)
        inputs.append(contract.IOSpec(n, shape, spec.dtype, None if dynamic else tuple(spec.stride)))
    out_dims = [tuple(s.name if getattr(s, "is_Symbol", False) else None for s in p.values[o].shape)
                for o in model.user_outputs]
    lead = decl.batch_dim(out_dims)
    buckets = tuple(tuple(pl.sizes[d.name] for d in decl.dims) for pl in plans if pl.sizes is not None)
    batch = contract.BatchDims(lead, tuple(range(len(inputs))), tuple(range(len(outputs)))) if lead else None
    return contract.Manifest(
        format_version=FORMAT_VERSION_DYNAMIC, **manifest_common(model, config, precision), inputs=tuple(inputs),
        outputs=tuple(outputs), weights=contract.Weights(WEIGHTS_FILE, WEIGHT_ALIGNMENT, tuple(weights)), graph=None,
        kernels=tuple(kernels), members=members,
        dynamic=contract.Dynamic(tuple(contract.DynDim(d.name, d.min, d.max) for d in decl.dims), decl.inputs,
                                 tuple(out_dims), buckets, batch, tuple(plans)),
    ).validate()


__all__ = ["PlanBuild", "build_dynamic_bundle"]
