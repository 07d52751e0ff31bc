"""model.py loading (docs/DESIGN.md §2.1): the contract and every error message."""

from __future__ import annotations

import pytest
import torch

from ascendc_pack.errors import ModelFileError
from ascendc_pack.frontend.loader import load_model_file

GOOD = """
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return x * 2
def get_model():
    return M().train()
def get_example_inputs():
    return (torch.ones(2, 3),)
"""


def test_loads_functions_and_puts_model_in_eval_mode(write_model):
    lm = load_model_file(write_model(GOOD))
    assert lm.name == "model"
    assert not lm.module.training
    assert len(lm.example_inputs) == 1 and lm.calibration_inputs == []


def test_loads_module_attributes(write_model):
    lm = load_model_file(write_model("""
        import torch
        model = torch.nn.ReLU()
        example_inputs = [torch.ones(4)]
    """))
    assert isinstance(lm.example_inputs, tuple)


def test_calibration_inputs(write_model):
    lm = load_model_file(write_model(GOOD + "\ndef get_calibration_inputs():\n    return [(torch.zeros(2, 3),)]\n"))
    assert len(lm.all_input_sets) == 2


def _error(path) -> str:
    with pytest.raises(ModelFileError) as info:
        load_model_file(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_missing_file(tmp_path):
    assert "no such file" in _error(tmp_path / "nope.py")


def test_not_python(tmp_path):
    p = tmp_path / "model.txt"
    p.write_text("hello")
    assert "not a Python file" in _error(p)


def test_syntax_error(write_model):
    msg = _error(write_model("def get_model(:\n"))
    assert "is not valid Python (line 1" in msg


def test_exception_while_importing_shows_traceback(write_model):
    msg = _error(write_model("""
        def helper():
            raise RuntimeError("weights file missing")
        helper()
    """))
    assert "raised RuntimeError while importing" in msg
    assert "weights file missing" in msg and "in helper" in msg


def test_exception_in_get_model(write_model):
    msg = _error(write_model("def get_model():\n    raise KeyError('boom')\n"))
    assert "get_model() raised KeyError" in msg and "boom" in msg


def test_nothing_named_model(write_model):
    msg = _error(write_model("import torch\nexample_inputs = (torch.ones(1),)\n"))
    assert "defines neither get_model() nor `model`" in msg


def test_no_example_inputs(write_model):
    msg = _error(write_model("import torch\nmodel = torch.nn.ReLU()\n"))
    assert "defines neither get_example_inputs() nor `example_inputs`" in msg


def test_not_a_module(write_model):
    msg = _error(write_model("import torch\ndef get_model():\n    return lambda x: x\nexample_inputs = (torch.ones(1),)\n"))
    assert "not a torch.nn.Module" in msg


@pytest.mark.parametrize("inputs, expected", [
    ("torch.ones(2)", "returned a single tensor"),
    ("{'x': torch.ones(2)}", "returned dict"),
    ("(torch.ones(2), 3)", "element 1 is int, not a torch.Tensor"),
])
def test_inputs_not_a_tuple_of_tensors(write_model, inputs, expected):
    msg = _error(write_model(f"import torch\nmodel = torch.nn.ReLU()\ndef get_example_inputs():\n    return {inputs}\n"))
    assert expected in msg


@pytest.mark.parametrize("calib, expected", [
    ("[(torch.ones(2, 3), torch.ones(1))]", "has 2 inputs but the example inputs have 1"),
    ("[(torch.ones(4, 3),)]", "input 0 is float32[4, 3] but example input 0 is float32[2, 3]"),
    ("[(torch.ones(2, 3, dtype=torch.float16),)]", "input 0 is float16[2, 3] but example input 0 is float32[2, 3]"),
    ("(torch.ones(2, 3),)", "get_calibration_inputs()[0] returned a single tensor"),
    ("None", "get_calibration_inputs() returned NoneType"),
])
def test_calibration_mismatch(write_model, calib, expected):
    msg = _error(write_model(GOOD + f"\ndef get_calibration_inputs():\n    return {calib}\n"))
    assert expected in msg


def test_model_file_is_registered_for_torch_cond(write_model):
    # torch.export of torch.cond models needs the module in sys.modules (docs/DESIGN.md §8).
    import sys

    lm = load_model_file(write_model(GOOD))
    assert type(lm.module).__module__ in sys.modules
    assert torch.equal(lm.module(torch.ones(2, 3)), torch.full((2, 3), 2.0))


def test_a_static_build_refuses_calibration_inputs_of_other_shapes(tmp_path):
    """The Python API and a model file declaring dynamic dims both reach the static build with
    their own calibration sets: one at another shape is a clear error before any work (a static
    bundle runs the example's shapes), never the captured program's reshape failing inside PGO."""
    from ascendc_pack.errors import ConfigError
    from ascendc_pack.pipeline import build

    model = torch.nn.Linear(3, 4)
    with pytest.raises(ConfigError, match=r"calibration input set 1 input 0 is float32\[5, 3\], the example's "
                                          r"float32\[2, 3\].*dynamic dims"):
        build(model, (torch.ones(2, 3),), calibration_inputs=[(torch.ones(5, 3),)], output=tmp_path / "m.ascpack")
    with pytest.raises(ConfigError, match="calibration input set 2 has 2 inputs, the example inputs 1"):
        build(model, (torch.ones(2, 3),), calibration_inputs=[(torch.ones(2, 3),), (torch.ones(2, 3), torch.ones(1))],
              output=tmp_path / "m.ascpack")
    assert not (tmp_path / "m.ascpack").exists()
