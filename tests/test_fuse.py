"""Fusion structure: which steps become fused kernels, and what the kernels hold.

These tests read the fused Program (its dump and the kernel specs); they compile nothing except
where a test says it checks results with compiled kernels (``check_all_candidates``). Numerical
parity of every op family lives in ``tests/test_kernel_parity.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ascendc_pack.frontend.capture import capture
from ascendc_pack.config import BuildConfig
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.ir.fusion import KernelSpec, NodeKind, ReduceNode, SpecError
from ascendc_pack.kernels.fused.build import prepare_kernels, write_benchmark_script
from ascendc_pack.pipeline import capture_file
from ascendc_pack.ir.program import AtenStep, CondStep, FusedStep, ModelProgram, Program, dump
from tests.conftest import EXAMPLE_NAMES, EXAMPLES
from tests.kernel_check import Fn, check_all_candidates, close

REDUCTION_OPS = ("aten.sum.", "aten.mean.", "aten.amax.", "aten.amin.", "aten.prod.", "aten.any.", "aten.all.")


def _fused(fn, *inputs):
    captured = capture(Fn(fn), tuple(t.clone() for t in inputs))
    return captured, fuse(captured.model)


def _all_steps(program: Program):
    return list(program.walk())


def _aten_ops(program: Program) -> list[str]:
    return [s.op for s in program.walk() if isinstance(s, AtenStep)]


def _reduce_nodes(kernel: KernelSpec) -> list[ReduceNode]:
    return [n for n in kernel.nodes if n.kind is NodeKind.REDUCE]


def _normalizing(kernel: KernelSpec) -> bool:
    """The kernel computes reductions AND writes an output that spans the reduce axes (the
    normalized rows): reduction and normalization in one kernel."""
    red = set(kernel.reduce_axes)
    return bool(_reduce_nodes(kernel)) and any(
        red and all(o.strides[a] != 0 or kernel.axes[a] == 1 for a in red) for o in kernel.outputs)


def _check_reference(captured, fused, fn, inputs):
    """The fused program, run through its reference steps, matches eager."""
    with torch.no_grad():
        expected = fn(*[t.clone() for t in inputs])
    actual = run_model(fused, captured.weights, [t.clone() for t in inputs])
    exp, act = torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(actual)
    assert len(exp) == len(act)
    for e, a in zip(exp, act):
        assert close(a, e)


_g = torch.Generator().manual_seed(7)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=_g).to(dtype)


COMPOSITES = {
    "softmax": (lambda x: torch.softmax(x, -1), [_randn(16, 77)], 2),
    "softmax-dim0": (lambda x: torch.softmax(x, 0), [_randn(50, 21)], 2),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), [_randn(16, 77)], 2),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (96,), w, b), [_randn(4, 9, 96), _randn(96), _randn(96)], 2),
    "layer_norm-bf16": (lambda x, w, b: F.layer_norm(x, (96,), w, b),
                        [_randn(4, 96, dtype=torch.bfloat16), _randn(96, dtype=torch.bfloat16),
                         _randn(96, dtype=torch.bfloat16)], 2),
    "rms_norm": (lambda x, w: F.rms_norm(x, (64,), w, eps=1e-6), [_randn(12, 64), _randn(64)], 1),
    "rms_norm-module": (torch.nn.RMSNorm(64, eps=1e-6), [_randn(3, 5, 64)], 1),
    "layer_norm-module": (torch.nn.LayerNorm(64), [_randn(3, 5, 64)], 2),
    "add_sum": (lambda x, y: torch.add(x, y).sum(), [_randn(32, 1024), _randn(1, 1024)], 1),
}


@pytest.mark.parametrize("name", list(COMPOSITES))
def test_composite_is_one_kernel(name):
    fn, inputs, n_reductions = COMPOSITES[name]
    captured, fused = _fused(fn, *inputs)
    text = dump(fused)
    kernels = fused.program.fused_steps()
    assert len(kernels) == 1, text
    # nothing but the kernel computes: no ATen reduction or pointwise op is left
    assert not [s for s in fused.program.steps if not isinstance(s, FusedStep)], text
    assert "(1 fused kernels)" in text and f"kernel {kernels[0].name}(" in text
    spec = kernels[0].kernel
    assert len(_reduce_nodes(spec)) == n_reductions, spec
    if name != "add_sum":
        assert _normalizing(spec), spec
    assert kernels[0].outputs == fused.program.outputs
    _check_reference(captured, fused, fn, inputs)


def test_sibling_reductions_share_one_kernel():
    fn = lambda x: (x.sum(-1), x.amax(-1), x.mean(-1), x.var(-1))  # noqa: E731
    captured, fused = _fused(fn, _randn(8, 33))
    assert len(fused.program.fused_steps()) == 1, dump(fused)
    _check_reference(captured, fused, fn, [_randn(8, 33)])


@pytest.mark.parametrize("name,fn,inputs,fallback", [
    ("cumsum", lambda x: torch.cumsum(x * 2, -1) + 1, [_randn(6, 37)], "aten.cumsum.default"),
    ("mm", lambda x, w: torch.relu(x @ w) * 2, [_randn(6, 37), _randn(37, 11)], "aten.mm.default"),
    ("sort", lambda x: torch.sort(x * 3, -1).values.exp(), [_randn(5, 9)], "aten.sort.default"),
], ids=["cumsum", "mm", "sort"])
def test_unsupported_op_stays_aten(name, fn, inputs, fallback, tmp_path):
    captured, fused = _fused(fn, *inputs)
    assert fallback in _aten_ops(fused.program), dump(fused)
    assert fused.program.fused_steps(), dump(fused)  # the pointwise work around it still fuses
    for k in fused.program.fused_steps():
        assert fallback not in [s.op for s in k.steps]
    report = check_all_candidates(fn, inputs, tmp_path, topn=2)
    assert not report.failures, report.failures


def test_view_of_intermediate_reshape(tmp_path):
    """A real reshape of a value computed in a kernel is not a dim map: the value is
    materialized by one kernel and the next kernel reads it through the view (a strided load);
    results are still right."""
    fn = lambda x: ((x * 2).view(3, 14, 5) + 1).sum(-1)  # noqa: E731
    inputs = [_randn(6, 35)]
    captured, fused = _fused(fn, *inputs)
    first, second = fused.program.fused_steps()
    assert first.outputs == second.inputs, dump(fused)
    assert "aten.view.default" in [s.op for s in second.steps], dump(fused)
    assert second.kernel.inputs[0].shape == (6, 35), second.kernel
    report = check_all_candidates(fn, inputs, tmp_path, topn=2, expect_fused=2)
    assert not report.failures, report.failures


def test_view_of_intermediate_dim_map_fuses():
    """Permutes and unit-dim views of an intermediate are folded into the kernel."""
    fn = lambda x, y: ((x * 2).t().unsqueeze(0) + y).sum(-1)  # noqa: E731
    inputs = [_randn(7, 5), _randn(4, 5, 7)]
    captured, fused = _fused(fn, *inputs)
    assert len(fused.program.fused_steps()) == 1, dump(fused)
    assert not _aten_ops(fused.program), dump(fused)
    _check_reference(captured, fused, fn, inputs)


def test_views_of_inputs_fold_into_loads():
    fn = lambda x: x.t()[1:, ::2].unsqueeze(0).expand(3, 4, 5) * 2  # noqa: E731
    inputs = [_randn(10, 5)]
    captured, fused = _fused(fn, *inputs)
    (kernel,) = fused.program.fused_steps()
    assert not _aten_ops(fused.program), dump(fused)
    loads = kernel.kernel.loads
    assert len(loads) == 1 and loads[0].offset == 1 and 0 in loads[0].strides, kernel.kernel
    _check_reference(captured, fused, fn, inputs)


def test_kernels_store_eager_dense_layouts_in_memory_order():
    """A channels_last operand (e.g. after a channels_last convolution): the kernel stores its
    result channels_last, as eager does, iterating in memory order (channels innermost), so no
    load or store is transposed and the next convolution reads it without a relayout."""
    x = torch.randn(1, 40, 7, 9).contiguous(memory_format=torch.channels_last)
    _, fused = _fused(lambda x, g: x * torch.sigmoid(g), x, torch.randn(1, 40, 1, 1))
    (step,) = fused.program.fused_steps()
    (out,) = step.kernel.outputs
    assert out.layout == x.stride() and out.stride == x.stride()
    assert step.kernel.axes == (63, 40)  # H*W outer, C inner: every access is unit-stride in C
    assert out.strides == (40, 1) and {n.strides for n in step.kernel.loads} == {(40, 1), (0, 1)}
    # a permuted result is stored in its own (eager's) memory order; a contiguous one as before
    _, fused = _fused(lambda x: (torch.exp(x.permute(1, 0)), x * 2), torch.randn(33, 40))
    outs = {o.shape: o for s in fused.program.fused_steps() for o in s.kernel.outputs}
    assert outs[(40, 33)].layout == (1, 40) and outs[(33, 40)].stride is None
    for s in fused.program.fused_steps():
        assert KernelSpec.from_json(s.kernel.to_json()) == s.kernel


def test_integer_floor_division_is_not_fused():
    fn = lambda a, b: torch.div(a, b, rounding_mode="floor") + 1  # noqa: E731
    a, b = torch.randint(-9, 9, (4, 7)), torch.randint(1, 9, (4, 7))
    captured, fused = _fused(fn, a, b)
    assert "aten.div.Tensor_mode" in _aten_ops(fused.program), dump(fused)


# --- examples ----------------------------------------------------------------------------------

# per example: how many kernels normalize rows (layer_norm / softmax: reduction + normalized output)
NORMALIZING = {"add_sum": 0, "mlp": 2, "transformer_block": 3, "cond_model": 2, "inplace": 1, "conv_block": 0}


@pytest.fixture(scope="module")
def fused_examples():
    out = {}
    for name in EXAMPLE_NAMES:
        loaded, captured = capture_file(EXAMPLES / f"{name}.py")
        out[name] = (loaded, captured, fuse(captured.model))
    return out


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_fuses(name, fused_examples):
    loaded, captured, fused = fused_examples[name]
    text = dump(fused)
    kernels = fused.program.fused_steps()
    assert kernels, text
    # every reduction of the model lives in a fused kernel
    assert not [op for op in _aten_ops(fused.program) if op.startswith(REDUCTION_OPS)], text
    normalizing = [k for k in kernels if len(_reduce_nodes(k.kernel)) >= 2]
    assert len(normalizing) == NORMALIZING[name], text
    for k in normalizing:
        # one kernel holds both the row statistics and the normalized output
        assert _normalizing(k.kernel), (k.name, k.kernel)
    if name == "cond_model":
        cond = [s for s in fused.program.steps if isinstance(s, CondStep)]
        assert cond and cond[0].then_branch.fused_steps() and cond[0].else_branch.fused_steps(), text
    # the fused program (reference semantics) still matches eager
    inputs = loaded.example_inputs
    with torch.no_grad():
        expected = loaded.module(*[t.clone() for t in inputs])
    actual = run_model(fused, captured.weights, [t.clone() for t in inputs])
    for e, a in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(actual)):
        assert torch.allclose(a, e, atol=1e-5, rtol=1e-5)


def test_example_kernel_shapes(fused_examples):
    """Spot checks of what the example kernels compute."""
    _, _, fused = fused_examples["add_sum"]
    (k,) = fused.program.fused_steps()
    assert k.kernel.axes == (32, 1024) and k.kernel.reduce_axes == (0, 1)
    _, _, fused = fused_examples["mlp"]
    for k in fused.program.fused_steps():  # LayerNorm(+GELU) and residual+LayerNorm, rows of d
        assert k.kernel.reduce_axes == (1,) and len(k.kernel.outputs) == 1
    _, _, fused = fused_examples["conv_block"]
    (k,) = fused.program.fused_steps()  # BatchNorm + residual + ReLU + the spatial mean
    assert sorted(k.outputs) == ["mean", "relu"]


# ----------------------------------------------------------------------------- the kernel spec type

def test_kernel_spec_json_round_trips(fused_examples):
    """Every example kernel's spec survives to_json -> from_json unchanged, and the Program JSON
    (which carries the spec) round-trips too."""
    for name in EXAMPLE_NAMES:
        _, _, fused = fused_examples[name]
        for step in fused.program.fused_steps():
            d = step.kernel.to_json()
            assert KernelSpec.from_json(json.loads(json.dumps(d))) == step.kernel
            assert d["name"] == step.name and step.name.endswith(step.kernel.digest()[:10])
        assert ModelProgram.loads(fused.dumps()).dumps() == fused.dumps()


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("axes"), "axes"),
    (lambda d: d.update(version=1), "version 1"),
    (lambda d: d["nodes"][0].update(kind="gather"), "gather"),
    (lambda d: d["nodes"][0].update(id="0"), "not an integer"),
    (lambda d: d["inputs"][0].update(shape=[32.0, 1024]), "not an integer"),
])
def test_malformed_kernel_spec_is_a_typed_error(fused_examples, edit, field):
    _, _, fused = fused_examples["add_sum"]
    d = json.loads(json.dumps(fused.program.fused_steps()[0].kernel.to_json()))
    edit(d)
    with pytest.raises(SpecError, match=field):
        KernelSpec.from_json(d)


def test_debug_benchmark_script_runs(tmp_path):
    """The --debug benchmark script rebuilds the typed spec from its JSON and times every candidate."""
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    _, fused = _fused(fn, _randn(8, 40))
    kernels = prepare_kernels(fused.program, BuildConfig(topn=2, cache_dir=tmp_path / "cache", jobs=2))
    (kc,) = kernels.values()
    script = write_benchmark_script(kc, tmp_path / "dbg")
    run = subprocess.run([sys.executable, str(script), "--rounds", "1", "--number", "1"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("median") == len(kc.compiled.candidates), run.stdout
