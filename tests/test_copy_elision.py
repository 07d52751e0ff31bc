"""Copy elision (ascendc_pack/passes/copy_elision.py): a clone into the layout its input already has
becomes a view; relayouts, outputs, clones of inputs (or their views) and programs with in-place
steps keep their copies; the program still computes what eager does; a bundle of a model with
eval-mode dropout runs no copy kernel and matches eager."""

from __future__ import annotations

import torch
from torch import nn

import ascendc_pack_runtime as rt
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.frontend.capture import capture
from ascendc_pack.passes.copy_elision import elide_copies
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.passes.fold import fold_constants
from ascendc_pack.pipeline import build
from ascendc_pack.ir.program import AtenStep, ModelProgram, Program, Ref, TensorSpec

from .bundle_fixtures import build_root
from .test_tactic_pass import Fn


def _ops(model: ModelProgram) -> list[str]:
    return [s.op for s in model.program.steps if isinstance(s, AtenStep)]


def _elided(module, *inputs) -> tuple[ModelProgram, ModelProgram]:
    """(captured, elided) programs of ``module``; the elided one must compute eager's outputs."""
    cap = capture(module.eval(), inputs)
    folded = fold_constants(cap.model, cap.weights)
    out = elide_copies(folded.model)
    with torch.no_grad():
        want = module(*inputs)
        got = run_model(out, folded.weights, inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g, w, atol=1e-6), (g - w).abs().max()
    return folded.model, out


def test_eval_dropout_and_a_redundant_contiguous_become_views():
    m = Fn(lambda s, x: s.b(s.drop(torch.relu(s.a(x)))).contiguous().clone() * 2,
           a=nn.Linear(8, 16), b=nn.Linear(16, 8), drop=nn.Dropout(0.1))
    before, after = _elided(m, torch.randn(4, 8))
    assert _ops(before).count("aten.clone.default") >= 2
    assert "aten.clone.default" not in _ops(after) and "aten.alias.default" in _ops(after)


def test_a_pad_by_nothing_becomes_a_view_and_a_real_pad_stays():
    """torchvision's swin pads each block's input to whole windows: by zero at 224² (a copy)."""
    import torch.nn.functional as F

    nothing = Fn(lambda s, x: F.pad(torch.relu(x), (0, 0, 0, 0, 0, 0)) * 2)
    before, after = _elided(nothing, torch.randn(2, 7, 7, 4))
    assert "aten.constant_pad_nd.default" in _ops(before)
    assert "aten.constant_pad_nd.default" not in _ops(after) and "aten.alias.default" in _ops(after)
    real = Fn(lambda s, x: F.pad(torch.relu(x), (0, 0, 0, 1, 0, 1)) * 2)
    _, after = _elided(real, torch.randn(2, 7, 7, 4))
    assert "aten.constant_pad_nd.default" in _ops(after)


def test_a_relayout_an_output_and_a_clone_of_an_input_stay_copies():
    relayout = Fn(lambda s, x: (torch.relu(x).transpose(0, 1).contiguous() + 1))
    _, after = _elided(relayout, torch.randn(4, 6))
    assert "aten.clone.default" in _ops(after)  # transposed -> contiguous: a real copy
    output = Fn(lambda s, x: torch.relu(x).clone())
    _, after = _elided(output, torch.randn(4, 6))
    assert "aten.clone.default" in _ops(after)  # the output owns its memory
    of_input = Fn(lambda s, x: x.view(2, 12).clone() * 3)
    _, after = _elided(of_input, torch.randn(4, 6))
    assert "aten.clone.default" in _ops(after)  # a view of the user's tensor is not handed on


def test_a_program_with_an_in_place_step_is_left_alone():
    spec = TensorSpec((4,), "float32", (1,))
    p = Program(["x"], [AtenStep("aten.relu.default", [Ref("x")], {}, ["r"]),
                        AtenStep("aten.clone.default", [Ref("r")], {}, ["c"]),
                        AtenStep("aten.add_.Tensor", [Ref("r"), 1.0], {}, ["r2"]),
                        AtenStep("aten.mul.Tensor", [Ref("c"), Ref("r2")], {}, ["y"])],
                ["y"], {n: spec for n in ("x", "r", "c", "r2", "y")})
    model = ModelProgram(name="m", program=p, weights=[], weight_fqns={}, user_inputs=["x"], mutations={},
                         user_outputs=["y"], out_tree=None, output_names=["y"])
    assert _ops(elide_copies(model)) == _ops(model)


def test_a_bundle_with_eval_dropout_runs_no_copy_kernel(tmp_path_factory, tmp_path):
    torch.manual_seed(0)
    m = Fn(lambda s, x: s.b(s.drop(torch.nn.functional.gelu(s.a(x)))) + x,
           a=nn.Linear(16, 64), b=nn.Linear(64, 16), drop=nn.Dropout(0.2)).eval()
    x = torch.randn(8, 16)
    out = tmp_path / "m.ascpack"
    # --topn 2: the linears are tactic steps, so the dropout's copy cannot hide in a fused kernel
    build(m, (x,), output=out, cache_dir=build_root(tmp_path_factory) / "build_cache", topn=2,
          protocol=Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0))
    man = rt.read_manifest(out)  # (the build verified it against eager)
    assert man.tactics and not [k for k in man.kernels if k.name.startswith("fused_copy")]
    with rt.load(out) as model, torch.no_grad():
        assert torch.allclose(model(x), m(x), atol=1e-5)
