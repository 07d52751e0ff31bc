"""The capture cache: an unchanged model reuses its capture; any change that can change the graph
captures again (docs/DESIGN.md §2.1)."""

from __future__ import annotations

import torch

from ascendc_pack.capture_cache import CAPTURE_SUBDIR, capture_cached, capture_key
from ascendc_pack.executor import run_model


class WithConstant(torch.nn.Module):
    def __init__(self, scale: float = 0.5):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.scale = scale
        self.register_buffer("shift", torch.ones(4), persistent=False)

    def forward(self, x):
        table = torch.tensor([1.0, 2.0, 3.0, 4.0])   # a tensor constant export lifts
        return self.lin(x) * self.scale + table + self.shift


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return WithConstant(**kw).eval()


def test_unchanged_model_reuses_its_capture_and_matches(tmp_path):
    m, x = _model(), torch.randn(3, 8)
    first, hit1 = capture_cached(m, (x,), name="m", cache_dir=tmp_path)
    second, hit2 = capture_cached(_model(), (x,), name="m", cache_dir=tmp_path)  # a fresh, equal module
    assert (hit1, hit2) == (False, True)
    assert second.model.dumps() == first.model.dumps()
    assert set(second.weights) == set(first.weights)
    for k in first.weights:
        assert torch.equal(second.weights[k], first.weights[k])
    assert torch.allclose(run_model(second.model, second.weights, (x,)), m(x))
    assert len(list((tmp_path / CAPTURE_SUBDIR).iterdir())) == 1


def test_what_changes_the_graph_changes_the_key():
    x = torch.randn(3, 8)
    base = capture_key(_model(), (x,), "m", None)
    assert capture_key(_model(), (x,), "m", None) == base
    assert capture_key(_model(seed=1), (x,), "m", None) != base           # weights
    assert capture_key(_model(scale=0.25), (x,), "m", None) != base       # a plain attribute forward reads
    assert capture_key(_model(), (torch.randn(5, 8),), "m", None) != base  # input shape
    assert capture_key(_model(), (x.double(),), "m", None) != base        # input dtype
    assert capture_key(_model(), (x.t().contiguous().t(),), "m", None) != base  # input strides
    assert capture_key(_model(), (x,), "other", None) != base
    assert capture_key(_model(), (x,), "m", ["y"]) != base
    training = _model()
    training.train()
    assert capture_key(training, (x,), "m", None) != base


def test_a_corrupt_entry_is_captured_again(tmp_path, caplog):
    m, x = _model(), torch.randn(3, 8)
    capture_cached(m, (x,), name="m", cache_dir=tmp_path)
    (entry,) = (tmp_path / CAPTURE_SUBDIR).iterdir()
    (entry / "program.json").write_text("{not json")
    captured, hit = capture_cached(m, (x,), name="m", cache_dir=tmp_path)
    assert not hit and "unusable" in caplog.text
    assert torch.allclose(run_model(captured.model, captured.weights, (x,)), m(x))
    assert capture_cached(m, (x,), name="m", cache_dir=tmp_path)[1]   # rewritten: a hit again
