"""Test helper: run a function through capture -> fuse -> every candidate kernel, vs eager."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ascendc_pack.capture import capture
from ascendc_pack.config import BuildConfig
from ascendc_pack.executor import run_model, run_reference_fused
from ascendc_pack.fuse import fuse
from ascendc_pack.kernels import prepare_kernels
from ascendc_pack_runtime.kernels import FusedKernel, KernelLibrary


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


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}.get(dtype, (2e-5, 2e-5))


def close(actual: torch.Tensor, expected: torch.Tensor, atol=None, rtol=None) -> bool:
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    if not actual.dtype.is_floating_point:
        return torch.equal(actual, expected)
    a_tol, r_tol = tolerance(actual.dtype)
    return torch.allclose(actual.double(), expected.double(), atol=atol or a_tol, rtol=rtol or r_tol,
                          equal_nan=True)


def check_all_candidates(fn, inputs, cache_dir, topn: int = 10, atol=None, rtol=None, cores=None) -> Report:
    """Capture ``fn`` on ``inputs``, fuse it, and run every candidate of every fused kernel on the
    arguments it gets during a real run; each candidate's outputs must match the kernel's
    reference ATen steps, and the whole program must match eager."""
    module = Fn(fn)
    captured = capture(module, tuple(t.clone() for t in inputs))
    fused = fuse(captured.model)
    config = BuildConfig(topn=topn, cache_dir=cache_dir, jobs=2, cores=cores)
    kernels = prepare_kernels(fused.program, config)
    report = Report(program=fused)
    report.fused_kernels = len(kernels)

    def run_fused(step, args):
        reference = run_reference_fused(step, args)
        kc = kernels[step.name]
        for tiling, cc in zip(kc.tilings, kc.compiled.candidates):
            if not cc.ok:
                report.failures.append((step.name, tiling.candidate.tiling_repr, cc.error))
                continue
            kernel = FusedKernel(step.kernel, KernelLibrary(cc.so_path, cc.candidate.kernel_key))
            outputs = kernel([a.clone() for a in args])
            report.candidates_run += 1
            for name, out, ref in zip(step.outputs, outputs, reference):
                if not close(out, ref, atol, rtol):
                    diff = (out.double() - ref.double()).abs().nan_to_num(0).max().item() \
                        if out.shape == ref.shape else "shape"
                    report.failures.append((step.name, tiling.candidate.tiling_repr, f"{name}: max diff {diff}"))
        return [outputs_or_ref for outputs_or_ref in reference]

    eager_inputs = [t.clone() for t in inputs]
    with torch.no_grad():
        expected = module(*eager_inputs)
    actual = run_model(fused, captured.weights, [t.clone() for t in inputs], run_fused=run_fused)
    exp_flat = torch.utils._pytree.tree_leaves(expected)
    act_flat = torch.utils._pytree.tree_leaves(actual)
    for e, a in zip(exp_flat, act_flat):
        if not close(a, e, atol, rtol):
            report.failures.append(("program", "", "program output differs from eager"))
    return report
