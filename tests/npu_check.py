"""Test helper: fused kernels -> npu candidates -> the AscendC emulation, against eager.

:func:`check_npu` captures a function, fuses it, and for every fused kernel the npu generator
can express, renders the chosen candidates as AscendC kernels, compiles them against the
emulation (g++, :mod:`ascendc_pack.backends.npu.toolchain`) once per distinct source, runs each on the
arguments the kernel gets in a real run and compares its outputs with the kernel's reference
ATen steps; the whole program (run with each kernel's first candidate, unsupported kernels as
their ATen steps) must match eager PyTorch.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


from ascendc_pack.frontend.capture import capture
from ascendc_pack.frontend.executor import run_reference_fused
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.kernels.fused.build import FusedKernel
from ascendc_pack.backends.npu.layout import Unsupported
from ascendc_pack.backends.npu.codegen import render
from ascendc_pack.backends.npu.tiling import SOCS, NpuTarget, plan_for, propose
from ascendc_pack.backends.npu.api import DEFAULT_CANN
from ascendc_pack.backends.npu.toolchain import emulation_flags
from ascendc_pack.ir.program import dump
from ascendc_pack_runtime.kernels import KernelLibrary
from tests.kernel_check import Fn, check_program, close, describe_mismatch

FULL = os.environ.get("ASCENDC_PACK_NPU_FULL") == "1"
"""Run every candidate (topn 10) of every case instead of one per kind (mode, residency)."""


def target(cores: int = 48, soc: str = "Ascend910B2") -> NpuTarget:
    return NpuTarget(SOCS[soc], cores)


def source_of(spec, tiling, soc: str = "Ascend910B2", cann: str = DEFAULT_CANN, emulate: bool = True) -> str:
    c = tiling.candidate
    p = tiling.params
    return render(plan_for(spec, p), tile=p["tile"], buffer_num=p["buf"], block_dim=p["bd"],
                  kernel_key=c.kernel_key, tiling_repr=c.tiling_repr, workspace=c.workspace, soc=soc,
                  emulate=emulate, isa="", cann=cann)


def compile_sources(sources: list[str], cache_dir: Path, jobs: int = 2, cann: str = DEFAULT_CANN) -> list[Path | str]:
    """Compile each source (once per content) against the emulation of CANN ``cann``; a path, or the error text."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    flags = emulation_flags("native", cann)

    def one(src: str) -> Path | str:
        h = hashlib.sha256((src + " ".join(flags)).encode()).hexdigest()[:20]
        so = cache_dir / f"k_{h}.so"
        if so.exists():
            return so
        cpp = cache_dir / f"k_{h}.cpp"
        cpp.write_text(src)
        tmp = so.with_suffix(f".tmp{os.getpid()}.so")
        r = subprocess.run(["g++", *flags, str(cpp), "-o", str(tmp)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"compile failed ({cpp}):\n{r.stderr[-4000:]}"
        os.replace(tmp, so)
        return so
    uniq = list(dict.fromkeys(sources))
    with ThreadPoolExecutor(jobs) as pool:
        built = dict(zip(uniq, pool.map(one, uniq)))
    return [built[s] for s in sources]


def last_error(so: Path) -> str:
    lib = ctypes.CDLL(str(so))
    fn = lib.ap_npu_emu_last_error
    fn.restype = ctypes.c_char_p
    return (fn() or b"").decode(errors="replace")


def choose(tilings: list, full: bool) -> list:
    """All candidates (full) or the best one of each (mode, residency)."""
    if full:
        return tilings
    out, kinds = [], set()
    for t in tilings:
        kind = (t.params["mode"], t.params["resident"])
        if kind not in kinds:
            kinds.add(kind)
            out.append(t)
    return out


@dataclass
class Report:
    fused_kernels: int = 0
    npu_kernels: int = 0
    candidates_run: int = 0
    unsupported: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    program: object = None


def check_npu(fn, inputs, cache_dir: Path, *, full: bool = FULL, atol=None, rtol=None, cores: int = 48,
              expect_fused: bool | int = True, cann: str = DEFAULT_CANN) -> Report:
    module = Fn(fn)
    captured = capture(module, tuple(t.clone() for t in inputs))
    fused = fuse(captured.model)
    report = Report(program=fused)
    steps = {s.name: s for s in fused.program.fused_steps()}
    report.fused_kernels = len(steps)
    if expect_fused is True:
        assert steps, "expected at least one fused kernel, got none:\n" + dump(fused)
    elif expect_fused is not False:
        assert len(steps) == expect_fused, f"expected {expect_fused} fused kernels, got {len(steps)}:\n" + dump(fused)
    chosen, sources = {}, []
    for name, step in steps.items():
        try:
            tilings = choose(propose(step.kernel, target(cores), 10), full)
        except Unsupported as exc:
            assert str(exc).startswith("unsupported: ")
            report.unsupported[name] = str(exc)
            continue
        chosen[name] = tilings
        sources += [source_of(step.kernel, t, cann=cann) for t in tilings]
    report.npu_kernels = len(chosen)
    libs = iter(compile_sources(sources, Path(cache_dir), cann=cann))
    built = {name: [next(libs) for _ in ts] for name, ts in chosen.items()}

    def run_fused(step, args):
        reference = run_reference_fused(step, args)
        if step.name not in chosen:
            return reference
        first = None
        for tiling, so in zip(chosen[step.name], built[step.name]):
            label = tiling.candidate.tiling_repr
            if isinstance(so, str):
                report.failures.append((step.name, label, so))
                continue
            kernel = FusedKernel(step.kernel, KernelLibrary(so, tiling.candidate.kernel_key))
            try:
                outputs = kernel([a.clone() for a in args])
            except RuntimeError as exc:
                report.failures.append((step.name, label, f"{exc}: {last_error(so)}"))
                continue
            report.candidates_run += 1
            first = outputs if first is None else first
            for out_name, out, ref in zip(step.outputs, outputs, reference):
                if not close(out, ref, atol, rtol):
                    report.failures.append((step.name, label, f"{out_name}: {describe_mismatch(out, ref, atol, rtol)}"))
        return first if first is not None else reference

    check_program(report.failures, module, fused, captured.weights, inputs, run_fused, atol, rtol)
    return report
