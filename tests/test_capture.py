"""Capture + Program IR + reference executor on every example and on targeted graphs."""

from __future__ import annotations

import json

import pytest
import torch

from ascendc_pack.frontend.capture import capture
from ascendc_pack.errors import CaptureError
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.frontend.loader import load_model_file
from ascendc_pack.pipeline import capture_file, check_reference, compare_outputs
from ascendc_pack.ir.program import AtenStep, CondStep, ModelProgram, dump

from .conftest import EXAMPLE_NAMES, EXAMPLES


@pytest.fixture(scope="module", params=EXAMPLE_NAMES)
def example(request):
    return capture_file(EXAMPLES / f"{request.param}.py")


def test_reference_executor_matches_eager_on_every_input_set(example):
    loaded, captured = example
    lines = check_reference(loaded, captured)
    assert len(lines) == len(loaded.all_input_sets)


def test_program_json_round_trip(example):
    _, captured = example
    text = captured.model.dumps()
    again = ModelProgram.loads(text)
    assert again.dumps() == text
    json.loads(text)  # plain JSON, no pickle


def test_dump_lists_every_step(example):
    _, captured = example
    text = dump(captured.model)
    for step in captured.model.program.walk():
        if isinstance(step, AtenStep):
            assert step.op in text


def test_weights_are_separated_from_user_inputs():
    _, captured = capture_file(EXAMPLES / "mlp.py")
    mp = captured.model
    assert mp.user_inputs == ["x"]
    assert set(mp.weight_fqns.values()) == {"fc1.weight", "fc1.bias", "norm1.weight", "norm1.bias",
                                            "fc2.weight", "fc2.bias", "norm2.weight", "norm2.bias"}
    assert mp.program.inputs == mp.weights + mp.user_inputs
    assert set(captured.weights) == set(mp.weights)


def test_inplace_mutation_is_recorded_and_written_back():
    loaded, captured = capture_file(EXAMPLES / "inplace.py")
    assert list(captured.model.mutations) == ["x"]
    x, b = (t.clone() for t in loaded.example_inputs)
    expected_x = x + b
    run_model(captured.model, captured.weights, [x, b])
    assert torch.equal(x, expected_x)


def test_cond_keeps_both_branches_and_runs_each():
    loaded, captured = capture_file(EXAMPLES / "cond_model.py")
    conds = [s for s in captured.model.program.steps if isinstance(s, CondStep)]
    assert len(conds) == 1
    ops_then = {s.op for s in conds[0].then_branch.steps}
    ops_else = {s.op for s in conds[0].else_branch.steps}
    assert "aten.exp.default" in ops_then and "aten.sigmoid.default" in ops_else
    taken = []
    for inputs in loaded.all_input_sets:
        run_model(captured.model, captured.weights, [t.clone() for t in inputs],
                  on_cond=lambda step, t: taken.append(t))
    assert sorted(taken) == [False, True]


def _ops(captured) -> set[str]:
    return {s.op for s in captured.model.program.walk() if isinstance(s, AtenStep)}


def test_composites_are_lowered_and_heavy_ops_stay_aten():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.ln = torch.nn.LayerNorm(8)
            self.emb = torch.nn.Embedding(10, 8)

        def forward(self, x, idx):
            h = self.ln(self.lin(x)) + self.emb(idx)
            return (torch.softmax(h, -1), torch.log_softmax(h, -1), torch.nn.functional.gelu(h),
                    torch.nn.functional.silu(h), h.var(-1), h.std(0, keepdim=True),
                    torch.nn.functional.rms_norm(h, (8,)), torch.var_mean(h, 1, correction=0))

    m = M().eval()
    inputs = (torch.randn(4, 8), torch.randint(0, 10, (4,)))
    captured = capture(m, inputs)
    ops = _ops(captured)
    for composite in ("_softmax", "_log_softmax", "native_layer_norm", "gelu", "silu", "var", "std",
                      "rms_norm", "var_mean"):
        assert not any(op.split(".")[1] == composite for op in ops), (composite, ops)
    assert "aten.addmm.default" in ops and "aten.embedding.default" in ops
    out = run_model(captured.model, captured.weights, [t.clone() for t in inputs])
    assert compare_outputs(m(*inputs), out) is None


def test_output_structure_is_kept():
    class M(torch.nn.Module):
        def forward(self, x):
            return {"a": x + 1, "b": [x * 2, (x.sum(), x - 1)]}

    x = torch.randn(3, 4)
    captured = capture(M(), (x,))
    out = run_model(captured.model, captured.weights, [x])
    assert compare_outputs(M()(x), out) is None
    assert isinstance(out["b"][1], tuple)


def test_data_dependent_python_control_flow_is_a_capture_error():
    class M(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(CaptureError, match="torch.cond"):
        capture(M(), (torch.randn(3),))


def test_buffer_mutation_is_refused():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            self.count.add_(1)
            return x + self.count

    with pytest.raises(CaptureError, match="mutates buffer 'count'"):
        capture(M(), (torch.randn(3),))


def test_loader_and_capture_of_every_example_file_by_path():
    for name in EXAMPLE_NAMES:
        lm = load_model_file(EXAMPLES / f"{name}.py")
        assert lm.name == name
