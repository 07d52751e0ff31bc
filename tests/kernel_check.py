"""Test helper: run a function through capture -> fuse -> every candidate kernel, vs eager."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ascendc_pack.frontend.capture import capture
from ascendc_pack.config import BuildConfig
from ascendc_pack.frontend.executor import run_model, run_reference_fused
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.kernels.fused.build import FusedKernel, prepare_kernels
from ascendc_pack.ir.program import dump
from ascendc_pack.autotune.verify import tolerance  # the tolerances PGO verification uses too
from ascendc_pack_runtime.kernels import KernelLibrary


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@dataclass
class Report:
    fused_kernels: int = 0
    candidates_run: int = 0
    failures: list = field(default_factory=list)
    program: object = None


def close(actual: torch.Tensor, expected: torch.Tensor, atol=None, rtol=None) -> bool:
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    if not actual.dtype.is_floating_point:
        return torch.equal(actual, expected)
    a_tol, r_tol = tolerance(actual.dtype)
    return torch.allclose(actual.double(), expected.double(), atol=atol or a_tol, rtol=rtol or r_tol,
                          equal_nan=True)


def describe_mismatch(actual: torch.Tensor, expected: torch.Tensor, atol=None, rtol=None) -> str:
    """Where two tensors differ: shapes/dtypes, or the count and first mismatching element."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"{actual.dtype}{list(actual.shape)} vs expected {expected.dtype}{list(expected.shape)}"
    if actual.dtype.is_floating_point:
        a_tol, r_tol = tolerance(actual.dtype)
        a, e = actual.double(), expected.double()
        bad = ~torch.isclose(a, e, atol=atol or a_tol, rtol=rtol or r_tol, equal_nan=True)
    else:
        a, e = actual, expected
        bad = actual != expected
    idx = bad.nonzero()
    if not len(idx):
        return "no mismatch"
    first = tuple(idx[0].tolist())
    return f"{len(idx)} mismatches, first at {list(first)}: got {a[first].item()}, expected {e[first].item()}"


def check_all_candidates(fn, inputs, cache_dir, topn: int = 10, atol=None, rtol=None, cores=None,
                         expect_fused: bool | int = True) -> Report:
    """Capture ``fn`` on ``inputs``, fuse it, and run every candidate of every fused kernel on the
    arguments it gets during a real run; each candidate's outputs must match the kernel's
    reference ATen steps, and the whole program - run with each kernel's first candidate - must
    match eager.

    ``expect_fused``: True asserts that at least one kernel was fused, an int that exactly that
    many were, False checks nothing about fusion (an op the fuser leaves to ATen)."""
    module = Fn(fn)
    captured = capture(module, tuple(t.clone() for t in inputs))
    fused = fuse(captured.model)
    config = BuildConfig(topn=topn, cache_dir=cache_dir, jobs=2, cores=cores)
    kernels = prepare_kernels(fused.program, config)
    report = Report(program=fused)
    report.fused_kernels = len(kernels)
    if expect_fused is True:
        assert kernels, "expected at least one fused kernel, got none:\n" + dump(fused)
    elif expect_fused is not False:
        assert len(kernels) == expect_fused, \
            f"expected {expect_fused} fused kernels, got {len(kernels)}:\n" + dump(fused)

    def run_fused(step, args):
        reference = run_reference_fused(step, args)
        kc = kernels[step.name]
        first = None
        for tiling, cc in zip(kc.tilings, kc.compiled.candidates):
            if not cc.ok:
                report.failures.append((step.name, tiling.candidate.tiling_repr, cc.error))
                continue
            kernel = FusedKernel(step.kernel, KernelLibrary(cc.so_path, cc.candidate.kernel_key))
            outputs = kernel([a.clone() for a in args])
            report.candidates_run += 1
            first = outputs if first is None else first
            for name, out, ref in zip(step.outputs, outputs, reference):
                if not close(out, ref, atol, rtol):
                    report.failures.append((step.name, tiling.candidate.tiling_repr,
                                            f"{name}: {describe_mismatch(out, ref, atol, rtol)}"))
        return first if first is not None else reference

    check_program(report.failures, module, fused, captured.weights, inputs, run_fused, atol, rtol)
    return report


def check_program(failures: list, module, fused, weights, inputs, run_fused, atol=None, rtol=None) -> None:
    """Run the fused program (``run_fused`` launches its kernels) and append to ``failures`` every
    output that differs from eager ``module`` on the same inputs."""
    with torch.no_grad():
        expected = module(*[t.clone() for t in inputs])
    actual = run_model(fused, weights, [t.clone() for t in inputs], run_fused=run_fused)
    exp_flat = torch.utils._pytree.tree_leaves(expected)
    act_flat = torch.utils._pytree.tree_leaves(actual)
    if len(exp_flat) != len(act_flat):
        failures.append(("program", "", f"{len(act_flat)} outputs, eager has {len(exp_flat)}"))
    for k, (e, a) in enumerate(zip(exp_flat, act_flat)):
        if not close(a, e, atol, rtol):
            failures.append(("program", "", f"output {k} differs from eager: {describe_mismatch(a, e, atol, rtol)}"))
