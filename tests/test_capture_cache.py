"""The capture cache: an unchanged model reuses its capture; any change that can change the graph
captures again (docs/DESIGN.md §2.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ascendc_pack.frontend.capture_cache import CAPTURE_SUBDIR, capture_cached, capture_key
from ascendc_pack.frontend.executor import run_model


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


# --- a reused capture is proven to be this model's (issue: the capture cache returned another
# model's graph) --------------------------------------------------------------------------------

import functools  # noqa: E402
import logging  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import torch.nn.functional as F  # noqa: E402

import ascendc_pack  # noqa: E402
from ascendc_pack.pipeline import build  # noqa: E402
from ascendc_pack_runtime import load  # noqa: E402


class Act(torch.nn.Module):
    """The issue's reproduction: the graph is decided by a callable attribute."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) * 2


ACTIVATIONS = (F.relu, F.gelu, torch.sigmoid)


def test_callable_attributes_never_share_a_capture_in_one_process(tmp_path):
    x = torch.randn(8, 16)
    for fn in ACTIVATIONS:
        m = Act(fn)
        assert torch.allclose(ascendc_pack.compile(m, (x,), topn=1, cache_dir=tmp_path)(x), m(x), atol=1e-5), fn
    assert len(list((tmp_path / CAPTURE_SUBDIR).iterdir())) == 3


def test_callable_attributes_never_share_a_capture_across_processes(tmp_path):
    script = textwrap.dedent(f"""
        import sys, torch, ascendc_pack, torch.nn.functional as F
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from tests.test_capture_cache import Act
        torch.manual_seed(0)
        x = torch.randn(8, 16)
        m = Act({{"relu": F.relu, "gelu": F.gelu, "sigmoid": torch.sigmoid}}[sys.argv[1]])
        ok = torch.allclose(ascendc_pack.compile(m, (x,), topn=1, cache_dir=sys.argv[2])(x), m(x), atol=1e-5)
        print("ok" if ok else "WRONG")
    """)
    for fn in ("relu", "gelu", "sigmoid", "relu"):
        run = subprocess.run([sys.executable, "-c", script, fn, str(tmp_path)], capture_output=True, text=True,
                             timeout=300)
        assert run.stdout.strip() == "ok", (fn, run.stdout, run.stderr[-2000:])


def test_callables_key_by_code_closure_defaults_and_partial_arguments():
    x = torch.randn(8, 16)

    def key(fn):
        return capture_key(Act(fn), (x,), "m", None)

    def scaled(k):
        return lambda t: t * k

    def shifted(t, by=1.0):
        return t + by

    keys = [key(F.relu), key(F.gelu), key(torch.sigmoid), key(torch.ops.aten.tanh.default),
            key(scaled(2.0)), key(scaled(3.0)), key(lambda t: t - 1), key(shifted),
            key(functools.partial(shifted, by=2.0)), key(functools.partial(shifted, by=3.0)),
            key(torch.nn.Tanh().forward)]
    assert None not in keys and len(set(keys)) == len(keys)
    assert key(scaled(2.0)) == keys[4] and key(F.relu) == keys[0]   # equal callables: equal keys


def test_a_module_global_read_by_forward_is_in_the_key(write_model, tmp_path):
    source = """
        import torch
        SCALE = {scale}
        def helper(t):
            return t * SCALE
        class M(torch.nn.Module):
            def forward(self, x):
                return helper(x) + 1
        def get_model(): return M()
        def get_example_inputs(): return (torch.arange(6.0).reshape(2, 3),)
    """
    outs = []
    for scale in (2.0, 5.0):
        path = write_model(source.format(scale=scale), name=f"glob_{int(scale)}.py")
        out = tmp_path / f"g{int(scale)}.ascpack"
        from ascendc_pack.frontend.loader import load_model_file
        loaded = load_model_file(path)
        build(loaded.module, loaded.example_inputs, topn=1, cache_dir=tmp_path / "c", output=out, name="glob")
        outs.append(load(out)(*loaded.example_inputs))
    assert torch.equal(outs[0], torch.arange(6.0).reshape(2, 3) * 2 + 1)
    assert torch.equal(outs[1], torch.arange(6.0).reshape(2, 3) * 5 + 1)


def test_a_global_changed_in_place_is_in_the_key():
    x = torch.randn(4, 4)
    g = {"__name__": "dyn"}   # a module with no file (a notebook's, say)
    exec(textwrap.dedent("""
        import torch
        CONFIG = {"act": "relu"}
        class M(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x) if CONFIG["act"] == "relu" else torch.tanh(x)
    """), g)
    before = capture_key(g["M"](), (x,), "m", None)
    g["CONFIG"]["act"] = "tanh"
    assert capture_key(g["M"](), (x,), "m", None) != before


def test_a_config_file_read_by_get_model_gets_its_own_capture(write_model, tmp_path):
    config = tmp_path / "act.txt"
    path = write_model(f"""
        import pathlib, torch
        ACTS = {{"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}}
        class M(torch.nn.Module):
            def __init__(self, act):
                super().__init__()
                self.act = act
            def forward(self, x):
                return self.act(x) * 3
        def get_model(): return M(ACTS[pathlib.Path({str(config)!r}).read_text().strip()])
        def get_example_inputs(): return (torch.linspace(-3, 3, 12).reshape(3, 4),)
    """)
    from click.testing import CliRunner

    from ascendc_pack.cli.main import main as cli
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    for act, fn in (("relu", torch.relu), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("relu", torch.relu)):
        config.write_text(act)
        out = tmp_path / f"{act}.ascpack"
        done = CliRunner().invoke(cli, ["build", str(path), "--topn", "1", "--cache-dir", str(tmp_path / "c"),
                                        "-o", str(out)])
        assert done.exit_code == 0, done.output
        assert torch.allclose(load(out)(x), fn(x) * 3, atol=1e-6), act


class OpSample(torch.nn.Module):
    """One op wrapped in a module defined in one place, as an OpInfo conformance run does."""

    def __init__(self, op, kwargs):
        super().__init__()
        self.call = lambda *xs: op(*xs, **kwargs)

    def forward(self, *xs):
        return self.call(*xs)


def test_many_ops_wrapped_by_one_class_in_a_loop_each_match_eager(tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(5, 6), torch.randn(5, 6)
    cases = [(torch.add, {}), (torch.sub, {}), (torch.mul, {}), (torch.sub, {"alpha": 2}),
             (torch.clamp_min, {}), (torch.maximum, {}), (torch.sum, {"dim": 1}), (torch.amax, {"dim": 0}),
             (torch.mean, {"dim": 1, "keepdim": True})]
    for op, kwargs in cases:
        m = OpSample(op, kwargs)
        got = ascendc_pack.compile(m, (a, b) if op not in (torch.sum, torch.amax, torch.mean) else (a,),
                                   topn=1, cache_dir=tmp_path)
        args = (a, b) if op not in (torch.sum, torch.amax, torch.mean) else (a,)
        assert torch.allclose(got(*args), m(*args), atol=1e-5), (op.__name__, kwargs)
    zero_d = (torch.tensor(3.0), torch.tensor(5.0))   # the issue's `sub` on two 0-d tensors
    for op in (torch.mul, torch.sub):
        assert torch.equal(ascendc_pack.compile(OpSample(op, {}), zero_d, topn=1, cache_dir=tmp_path)(*zero_d),
                           op(*zero_d))


class Opaque:
    """An object with no readable state (no __dict__, no __slots__ of its own)."""

    __slots__ = ()


class WithOpaque(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.thing = (Opaque(), object())

    def forward(self, x):
        return x + 1


def test_an_attribute_that_cannot_be_fingerprinted_disables_reuse_and_says_why(tmp_path, caplog):
    x = torch.randn(3)
    assert capture_key(WithOpaque(), (x,), "m", None) is None
    with caplog.at_level(logging.DEBUG, logger="ascendc_pack"):
        first = capture_cached(WithOpaque(), (x,), name="m", cache_dir=tmp_path)
        second = capture_cached(WithOpaque(), (x,), name="m", cache_dir=tmp_path)
    assert (first[1], second[1]) == (False, False)
    assert "captured every time: model.thing[0] is a tests.test_capture_cache.Opaque" in caplog.text
    assert not (tmp_path / CAPTURE_SUBDIR).exists()
    assert capture_key(torch.nn.Sequential(WithOpaque()), (x,), "m", None) is None   # nested, too
    plain = WithOpaque()
    plain.thing = (object(),)
    assert capture_key(plain, (x,), "m", None) is None
    plain.thing = {torch.nn.Identity(), torch.nn.Identity()}   # a set of objects: no stable order
    assert capture_key(plain, (x,), "m", None) is None
    deep = []
    for _ in range(5000):                                       # a chain too deep to walk
        deep = [deep]
    plain.thing = deep
    assert capture_key(plain, (x,), "m", None) is None
    plain.thing = torch.eye(3).to_sparse()
    assert capture_key(plain, (x,), "m", None) is None
    plain.thing = {"b": 1, "a": (2, "x")}                       # plain keys: order-free
    same = capture_key(plain, (x,), "m", None)
    plain.thing = {"a": (2, "x"), "b": 1}
    assert same is not None and capture_key(plain, (x,), "m", None) == same


class ReadsEnv(torch.nn.Module):
    """Depends on something no fingerprint sees: an environment variable read in forward."""

    def forward(self, x):
        import os
        return x * float(os.environ.get("CAPTURE_TEST_SCALE", "1"))


def test_a_stored_capture_that_differs_from_eager_is_captured_again_and_replaced(tmp_path, monkeypatch, caplog):
    x = torch.randn(4, 4)
    monkeypatch.setenv("CAPTURE_TEST_SCALE", "2")
    first, hit = capture_cached(ReadsEnv(), (x,), name="m", cache_dir=tmp_path)
    assert not hit
    monkeypatch.setenv("CAPTURE_TEST_SCALE", "7")   # same key, another graph
    second, hit = capture_cached(ReadsEnv(), (x,), name="m", cache_dir=tmp_path)
    assert not hit and "does not match eager" in caplog.text
    assert torch.allclose(run_model(second.model, second.weights, (x,)), x * 7)
    third, hit = capture_cached(ReadsEnv(), (x,), name="m", cache_dir=tmp_path)   # the entry was replaced
    assert hit and torch.allclose(run_model(third.model, third.weights, (x,)), x * 7)
