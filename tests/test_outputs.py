"""Output structures and names: namedtuple/dict/nested outputs survive capture, the reference
executor, the bundle and the runtime; names come from keys and fields or get_output_names()."""

from __future__ import annotations

import collections
import textwrap

import pytest
import torch

from ascendc_pack.frontend.capture import capture
from ascendc_pack.errors import CaptureError, ModelFileError
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.frontend.loader import load_model_file
from ascendc_pack.pipeline import capture_file, check_reference, compare_outputs
from ascendc_pack_runtime import outputs as O

Out = collections.namedtuple("Out", ["logits", "hidden"])


class NestedOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        return {"out": Out(h.relu(), h), "aux": [h * 2, (h.sum(),)]}


def test_tree_names_and_rebuild():
    obj = {"out": Out(1, 2), "aux": [3, (4,)]}
    tree = O.tree_of(obj)
    assert O.leaf_names(tree) == ["out.logits", "out.hidden", "aux.0", "aux.1.0"]
    rebuilt = O.OutputBuilder(tree)([1, 2, 3, 4])
    assert rebuilt == obj and type(rebuilt["out"]).__name__ == "Out" and rebuilt["out"].hidden == 2
    assert O.leaf_names(O.tree_of(torch.ones(1))) == ["output_0"]
    assert O.leaf_names(O.tree_of((1, 2))) == ["output_0", "output_1"]
    assert O.leaf_names(O.tree_of(((1, 2), 3))) == ["output_0.0", "output_0.1", "output_1"]
    with pytest.raises(ValueError, match="expected 4 output tensors, got 3"):
        O.OutputBuilder(tree)([1, 2, 3])


@pytest.mark.parametrize("bad", [[], {"kind": "set", "items": []}, {"kind": "dict", "keys": ["a"], "items": []},
                                 {"kind": "namedtuple", "type": 3, "fields": [], "items": []}])
def test_malformed_tree_refused(bad):
    with pytest.raises(ValueError):
        O.validate(bad)


def test_deep_tree_refused():
    tree = {"kind": "leaf"}
    for _ in range(100):
        tree = {"kind": "tuple", "items": [tree]}
    with pytest.raises(ValueError, match="nested more than 64"):
        O.validate(tree)


def test_namedtuple_output_captures_and_runs():
    m, x = NestedOut().eval(), torch.randn(3, 8)
    cap = capture(m, (x,), name="nested")
    assert cap.model.output_names == ["out.logits", "out.hidden", "aux.0", "aux.1.0"]
    got = run_model(cap.model, cap.weights, (x,))
    assert type(got["out"]).__name__ == "Out" and got["out"]._fields == ("logits", "hidden")
    assert compare_outputs(m(x), got) is None
    text = O.plain_treespec(cap.model.out_tree)  # the manifest's out_spec: torch can read it
    assert "namedtuple" not in text


def test_user_output_names(tmp_path):
    f = tmp_path / "named.py"
    f.write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                return x + 1, x * 2
        def get_model(): return M()
        def get_example_inputs(): return (torch.randn(2, 3),)
        def get_output_names(): return ["plus", "times"]
    """))
    loaded, cap = capture_file(f)
    assert loaded.output_names == ["plus", "times"] and cap.model.output_names == ["plus", "times"]
    f.write_text(f.read_text().replace('["plus", "times"]', '["plus"]'))
    with pytest.raises(CaptureError, match="returned 1 names but the model has 2 output tensors"):
        capture_file(f)
    f.write_text(f.read_text().replace('["plus"]', '["a b", "c"]'))
    with pytest.raises(CaptureError, match="'a b' is not a valid name"):
        capture_file(f)
    f.write_text(f.read_text().replace('["a b", "c"]', '["c", "c"]'))
    with pytest.raises(CaptureError, match="must be unique"):
        capture_file(f)
    f.write_text(f.read_text().replace('["c", "c"]', '"c"'))
    with pytest.raises(ModelFileError, match=r"get_output_names\(\) returned str; return a list of strings"):
        load_model_file(f)


def test_python_if_on_tensor_leads_with_the_torch_cond_hint(tmp_path, capfd):
    f = tmp_path / "branchy.py"
    f.write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    return x * 2
                return x - 1
        def get_model(): return M()
        def get_example_inputs(): return (torch.randn(4, 4),)
    """))
    with pytest.raises(CaptureError) as info:
        capture_file(f)
    msg = str(info.value)
    assert msg.startswith("model 'branchy' branches in Python on a tensor's value at branchy.py:5 "
                          "(`if x.sum() > 0:`)")
    assert "torch.cond(" in msg.splitlines()[0] and len(msg.splitlines()) <= 3
    assert "def forward" not in capfd.readouterr().err  # torch's partial graph dump is held back


def test_capture_check_tolerates_rounding_but_not_errors():
    m, x = NestedOut().eval(), torch.randn(3, 8)
    cap = capture(m, (x,), name="nested")

    class Loaded:  # the parts of LoadedModel check_reference reads
        module = m
        example_inputs = (x,)
        all_input_sets = [(x,)]

    assert check_reference(Loaded, cap)[0].startswith("reference executor matches eager on example inputs")
    cap.weights["p_lin_bias"] = cap.weights["p_lin_bias"] + 1e-3  # a real difference
    with pytest.raises(Exception, match=r"out.logits: max error 0.001 .* exceeds the allowed .*--atol/--rtol"):
        check_reference(Loaded, cap)
    assert check_reference(Loaded, cap, atol=0.1)  # the user's override
