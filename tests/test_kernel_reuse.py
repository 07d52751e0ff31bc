"""Kernel reuse: fused steps that compute the same thing on the same shapes, strides and dtypes
share one kernel name, one candidate set, one compile, one PGO measurement and one library in
the bundle, while the manifest lists every use."""

from __future__ import annotations

import torch

from ascendc_pack.frontend.capture import capture
from ascendc_pack.config import BuildConfig
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.kernels.fused.build import kernel_uses, total_candidates
from ascendc_pack.pipeline import build
from ascendc_pack_runtime import load
from ascendc_pack_runtime.bundle import read_manifest
from tests.kernel_check import Fn, close


def _fused_steps(fn, *inputs):
    return fuse(capture(Fn(fn), tuple(inputs)).model).program.fused_steps()


def test_same_computation_shares_a_kernel_name():
    x, y = torch.randn(8, 33), torch.randn(8, 33)
    a, b = _fused_steps(lambda x, y: ((x * 2).exp(), (y * 2).exp()), x, y)
    assert a.inputs != b.inputs and a.outputs != b.outputs
    assert a.name == b.name and a.kernel == b.kernel


def test_other_shapes_strides_or_dtypes_get_their_own_kernel():
    x = torch.randn(8, 33)
    cases = {
        "shape": (lambda x, y: (x.exp(), y.exp()), torch.randn(8, 32)),
        "dtype": (lambda x, y: (x.exp(), y.exp()), torch.randn(8, 33, dtype=torch.float64)),
        "strides": (lambda x, y: (x.exp(), y.t().exp()), torch.randn(33, 8)),
        "computation": (lambda x, y: (x.exp(), y.sigmoid()), torch.randn(8, 33)),
    }
    for what, (fn, y) in cases.items():
        a, b = _fused_steps(fn, x, y)
        assert a.name != b.name, what


class Stack(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
                                            for _ in range(n)])

    def forward(self, x):
        return self.layers(x)


def test_layer_stack_compiles_and_bundles_each_distinct_kernel_once(tmp_path):
    """n x (Linear + ReLU): n uses of one ReLU kernel. Its candidates compile once, PGO times it
    once, the bundle holds one kernel library, and the manifest lists all n uses."""
    n, topn = 8, 2
    torch.manual_seed(0)
    model, x = Stack(n).eval(), torch.randn(4, 32)
    fused = fuse(capture(model, (x,)).model)
    steps = fused.program.fused_steps()
    names = {s.name for s in steps}
    assert len(steps) == n and len(names) == 1
    config = BuildConfig(topn=topn, cache_dir=tmp_path / "cache", jobs=2)
    distinct_candidates = total_candidates(fused.program, config)
    assert distinct_candidates == topn  # without reuse it would be n * topn

    result = build(model, (x,), topn=topn, output=tmp_path / "stack.ascpack", cache_dir=tmp_path / "cache", jobs=2,
                   tactics=False)  # with tactics a GEMM candidate may take the ReLU in as its epilogue
    assert result.kernels_compiled == distinct_candidates
    assert result.kernels_profiled == len(names) and set(result.choices) == names

    manifest = read_manifest(result.output)
    (entry,) = manifest.kernels
    assert [dict(u) for u in entry.uses] == kernel_uses(fused.program)[entry.name]
    assert len(entry.uses) == n and len({tuple(u["outputs"]) for u in entry.uses}) == n
    libraries = [m for m in manifest.members if m.startswith("kernels/")]
    assert libraries == [entry.file]

    with torch.no_grad():
        expected = model(x)
    (actual,) = load(result.output, cache_dir=tmp_path / "runtime").run_flat(x.clone())
    assert close(actual, expected)
