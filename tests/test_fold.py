"""Constant folding (ascendc_pack.passes.fold) and scatter steps in the C++ graph.

A swin-style mask rebuilt on every call by slice assignment folds into one weight; scatter steps
that do depend on the inputs copy their own buffer, not the whole arena (every planned buffer
is a storage of its own).
"""

from __future__ import annotations

import json

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.package.bundle import build_bundle, choices_from_candidate0
from ascendc_pack.config import BuildConfig
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.passes.fold import fold_constants, is_foldable
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.kernels.fused.build import prepare_kernels
from ascendc_pack.pipeline import capture_file, compare_outputs
from ascendc_pack.ir.program import AtenStep, ModelProgram, Ref

from .bundle_fixtures import clone_inputs
from .conftest import ROOT

SWIN_MASK = (ROOT / "bench" / "models" / "swin_mask.py").read_text()

SCATTER_FROM_INPUT = '''
"""A mask built by slice assignment from the input (so not constant) next to large activations."""
import torch
from torch import nn


class ScatterFromInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(256, 256)

    def forward(self, x):  # (512, 256)
        g = torch.tanh(torch.relu(self.lin(x)) * 2.0 + 1.0)
        mask = torch.zeros(64, 64)
        mask[:, :8] = x[:64, :8]
        mask[:16, :] = x[64:80, :64] * 2.0
        mask[40:48, 40:48] = 1.0
        return g.sum(0), mask.sum(1)


def get_model():
    torch.manual_seed(0)
    return ScatterFromInput()


def get_example_inputs():
    return (torch.randn(512, 256, generator=torch.Generator().manual_seed(0)),)
'''

KINDS = '''
"""What folding must leave alone: views of weights, factories, outputs, values over the cap."""
import torch
from torch import nn


class Kinds(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.register_buffer("big", torch.randn(64, 64))

    def forward(self, x):  # (4, 8)
        a = x @ self.w.t()                                  # view of a weight: stays a view
        b = a + torch.arange(8, dtype=torch.float32)        # a factory call: stays a call
        c = b * (self.w * 3.0).sum(0)                       # weight arithmetic: folded
        d = x.sum() + (self.big * 2.0).sum()                # small result of a big value: folded
        e = (self.big + 1.0) * x.sum()                      # 16 KiB, over the test's cap: computed
        return c, d, e.sum(0), self.w * 2.0                 # an output stays computed
'''


def _captured(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return capture_file(path)


def _ops(model: ModelProgram) -> list[str]:
    return [s.op for s in model.program.walk() if isinstance(s, AtenStep)]


def test_swin_mask_folds_into_one_weight(tmp_path):
    loaded, captured = _captured(tmp_path, "swin_mask", SWIN_MASK)
    before = _ops(captured.model)
    assert before.count("aten.slice_scatter.default") == 18 and "aten.copy.default" in before
    r = fold_constants(captured.model, captured.weights)
    after = _ops(r.model)
    assert "aten.slice_scatter.default" not in after and "aten.copy.default" not in after
    assert r.folded_steps == len(before) - len(after) > 80
    shapes = {n: tuple(r.weights[n].shape) for n in r.new_weights}
    assert (1, 4, 1, 64, 64) in shapes.values()  # the mask, broadcast over batch and heads
    m = r.model
    assert m.program.inputs == m.weights + m.user_inputs and set(m.weights) == set(r.weights)
    assert not set(r.removed_weights) & set(r.weights)
    assert ModelProgram.loads(m.dumps()).to_json() == m.to_json()
    x = clone_inputs(loaded.example_inputs)
    assert torch.equal(run_model(m, r.weights, x), run_model(captured.model, captured.weights, x))
    assert captured.model.program.steps and len(_ops(captured.model)) == len(before)  # input untouched


def test_what_folding_leaves_alone(tmp_path):
    (tmp_path / "kinds.py").write_text(KINDS + "\n\ndef get_model():\n    torch.manual_seed(0)\n"
                                       "    return Kinds()\n\n\ndef get_example_inputs():\n"
                                       "    return (torch.randn(4, 8),)\n")
    loaded, captured = capture_file(tmp_path / "kinds.py")
    r = fold_constants(captured.model, captured.weights, max_bytes=4096)
    m = r.model
    new = {n: tuple(r.weights[n].shape) for n in r.new_weights}
    assert sorted(new.values()) == [(), (8,)]                  # (w*3).sum(0) and (big*2).sum()
    ops = _ops(m)
    assert "aten.permute.default" in ops                       # w.t() stays a view of w
    assert "aten.arange.start_step" in ops or "aten.arange.default" in ops
    reads = {n: [s.op for s in m.program.steps if n in s.input_names()] for n in m.weights}
    assert reads["b_big"] == ["aten.add.Tensor"]               # big + 1 (16 KiB > 4096) per call
    producers = {o: s.op for s in m.program.steps for o in s.outputs}
    assert [producers[o] for o in m.program.outputs][-1] == "aten.mul.Tensor"  # w * 2 is returned
    assert not set(m.program.outputs) & set(r.new_weights)
    assert r.removed_weights == ()
    x = clone_inputs(loaded.example_inputs)
    assert compare_outputs(run_model(captured.model, captured.weights, x), run_model(m, r.weights, x),
                           atol=0, rtol=0) is None
    assert fold_constants(m, r.weights, max_bytes=4096).folded_steps == 0  # a fixed point


def test_is_foldable():
    w = [Ref("w")]
    assert is_foldable(AtenStep("aten.mul.Tensor", [Ref("w"), 2.0], {}, ["y"]))
    assert not is_foldable(AtenStep("aten.rand_like.default", w, {}, ["y"]))       # random
    assert not is_foldable(AtenStep("aten.bernoulli.p", [Ref("w"), 0.5], {}, ["y"]))
    assert not is_foldable(AtenStep("aten.empty_like.default", w, {}, ["y"]))      # undefined values
    assert not is_foldable(AtenStep("aten.add_.Tensor", [Ref("w"), Ref("w")], {}, ["y"]))  # in place
    assert not is_foldable(AtenStep("aten.max.dim", [Ref("w"), 0], {}, ["y", None], multi=True))


# ----------------------------------------------------------------------------- in the C++ graph


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return BuildConfig.resolve(topn=1, cache_dir=tmp_path_factory.mktemp("fold_cache"), jobs=2)


def _bundle(tmp_path, name, text, config, fold: bool):
    loaded, captured = _captured(tmp_path, name, text)
    model, weights = captured.model, captured.weights
    if fold:
        r = fold_constants(model, weights)
        model, weights = r.model, r.weights
    fused = fuse(model)
    kernels = prepare_kernels(fused.program, config)
    report = build_bundle(fused, weights, choices_from_candidate0(fused, kernels), tmp_path / f"{name}.ascpack",
                          config)
    return loaded, rt.load(report.path, cache_dir=tmp_path / "rt")


def _allocations(fn) -> list[int]:
    """Bytes of every allocation ``fn`` makes (torch profiler memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # pragma: no cover - profiler internals moved
        pytest.skip("this torch's profiler does not expose raw memory events")
    return [e.nbytes() for e in events if e.name() == "[memory]" and e.nbytes() > 0]


def _check_parity(loaded, model):
    x = clone_inputs(loaded.example_inputs)
    with torch.no_grad():
        expected = loaded.module(*clone_inputs(x))
    assert compare_outputs(expected, model(*x), atol=1e-5, rtol=1e-5) is None
    return x


def test_scatter_steps_copy_their_buffer_not_the_arena(tmp_path, config):
    loaded, model = _bundle(tmp_path, "scatter_input", SCATTER_FROM_INPUT, config, fold=False)
    x = _check_parity(loaded, model)
    memory = model.manifest["graph"]["memory"]
    arena = memory["arena_bytes"]
    assert arena >= 512 * 256 * 4 and memory["steps"]["aten_functional"] >= 6  # the scatters and copies
    model(*x)
    sizes = _allocations(lambda: model(*x))
    # each scatter clones its input's storage: a 16 KiB mask, never the arena
    assert max(sizes) < arena // 8 and sum(sizes) < arena // 2, (sizes, arena)


def test_swin_mask_bundle_folded_allocates_only_its_output(tmp_path, config):
    loaded, model = _bundle(tmp_path, "swin_mask", SWIN_MASK, config, fold=True)
    x = _check_parity(loaded, model)
    steps = model.manifest["graph"]["memory"]["steps"]
    assert steps["aten_functional"] == 0 and steps["cond"] == 0
    model(*x)
    assert len(_allocations(lambda: model(*x))) == 1
    names = [t["fqn"] for t in model.manifest["weights"]["tensors"]]
    assert any(n.startswith("<folded ") for n in names), json.dumps(names)
