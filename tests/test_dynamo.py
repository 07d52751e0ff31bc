"""torch.compile(backend="ascendc_pack") (docs/DESIGN.md §2.11): the entry point, graph breaks,
recompiles, weights that change, fallbacks, training graphs, modes and options, reset, and a
second process that compiles and profiles nothing (counted)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.dynamo import MAX_AUTOTUNE_TOPN, EagerFallbackWarning, backend, resolve_config, with_protocol
from ascendc_pack.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FAST = Protocol(warmup=1, min_rounds=3, max_rounds=6, time_cap_s=0.3, min_sample_us=20.0, verify_timeout_s=5.0)


class Block(torch.nn.Module):
    """Linear + LayerNorm + GELU, a Python print between two graphs, then softmax."""

    def __init__(self, width=32, graph_break=True):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.ln = torch.nn.LayerNorm(width)
        self.graph_break = graph_break

    def forward(self, x):
        y = torch.nn.functional.gelu(self.ln(self.fc(x)))
        if self.graph_break:
            torch._dynamo.graph_break()
        return (y * 2.0 + 1.0).softmax(-1)


@pytest.fixture
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "dynamo_cache"


@pytest.fixture(autouse=True)
def fast():
    """A backend of this test's own, timing with FAST; dynamo starts empty."""
    torch._dynamo.reset()
    fast = with_protocol(FAST)
    yield fast
    torch._dynamo.reset()


@pytest.fixture
def compiled(fast):
    def compile(model, cache, topn=1, dynamic=None):
        return torch.compile(model, backend=fast, dynamic=dynamic, options={"topn": topn, "cache_dir": str(cache)})

    return compile


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_entry_point_names_the_backend():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert [ep.value for ep in eps if ep.name == "ascendc_pack"] == ["ascendc_pack.dynamo:backend"]
    assert "ascendc_pack" in torch._dynamo.list_backends(exclude_tags=())


def test_graph_break_two_graphs_match_eager(cache, compiled, fast):
    m = Block().eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        want = m(x)
        f = compiled(m, cache, topn=2)
        close(f(x), want)
        close(f(x), want)  # tuned kernels now
    counts = fast.counts()
    assert counts.graphs == 2 and counts.fallbacks == 0 and counts.specializations == 2
    specs = [s for g in fast.graphs() for s in g._specs.values()]
    assert all(s.checked and s.graph is not None and s.run is s.graph for s in specs)  # C++ graphs now


def test_graph_false_keeps_python_mode(cache, fast):
    m = Block(graph_break=False).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        f = torch.compile(m, backend=fast, options={"cache_dir": str(cache), "graph": False})
        close(f(x), m(x))
        close(f(x), m(x))
    (spec,) = [s for g in fast.graphs() for s in g._specs.values()]
    assert spec.checked and spec.graph is None and spec.run is spec.module


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_new_static_shape_compiles_again(cache, compiled, fast, dynamic):
    """dynamic=False: dynamo makes one static graph per shape; dynamic=True: one graph with
    symbolic sizes, which compiles a specialization per shape on its first call with it."""
    m = Block(graph_break=False).eval()
    with torch.no_grad():
        f = compiled(m, cache, dynamic=dynamic)
        for rows in (4, 6, 10, 6):
            x = torch.randn(rows, 32)
            close(f(x), m(x))
    counts = fast.counts()
    assert (counts.graphs, counts.specializations, counts.fallbacks) == ((1, 3, 0) if dynamic else (3, 3, 0))
    assert all(bool(g.inputs.symbols) == dynamic for g in fast.graphs())


def test_changed_weights_are_never_served_stale(cache, compiled, fast):
    """Weights are read when a graph is compiled: changing them in place, or calling another
    instance of the class (dynamo reuses the graph), must not reuse the old ones."""
    m = Block(graph_break=False).eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        f = compiled(m, cache)
        close(f(x), m(x))
        m.fc.weight.mul_(-2.0)
        close(f(x), m(x))
        other = Block(graph_break=False).eval()
        close(compiled(other, cache)(x), other(x))
        close(f(x), m(x))


def test_inference_mode_and_no_grad(cache, compiled, fast):
    m = Block().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = m(x)
    with torch.inference_mode():
        close(compiled(m, cache)(x), want)
    with torch.no_grad():
        close(compiled(m, cache)(x), want)
    assert fast.counts().fallbacks == 0


def test_a_training_graph_runs_eagerly_with_one_warning(cache, compiled, fast):
    m = Block(graph_break=False)
    x = torch.randn(4, 32)
    with pytest.warns(EagerFallbackWarning, match=r"training graph.*torch\.no_grad\(\)") as record:
        out = compiled(m, cache)(x)
        out.sum().backward()  # autograd works: the graph ran as dynamo captured it
    assert len([w for w in record if issubclass(w.category, EagerFallbackWarning)]) == 1
    assert m.fc.weight.grad is not None
    assert fast.counts().fallbacks == 1


class Counter(torch.nn.Module):
    """Updates its own buffer in forward: dynamo compiles it, our capture refuses it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x * self.calls


def test_an_unsupported_graph_falls_back_with_one_warning(cache, compiled, fast):
    m = Counter()
    x = torch.ones(3)
    with torch.no_grad(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        f = compiled(m, cache)
        outs = [f(x) for _ in range(3)]
    ours = [w for w in record if issubclass(w.category, EagerFallbackWarning)]
    assert len(ours) == 1 and "mutates buffer" in str(ours[0].message)
    assert [o.tolist() for o in outs] == [[1.0] * 3, [2.0] * 3, [3.0] * 3] and m.calls.item() == 3.0


def test_modes_and_options_resolve_like_the_cli(tmp_path):
    env = {}
    assert resolve_config(None, None, env=env).topn == 1
    assert resolve_config("max-autotune", None, env=env).topn == MAX_AUTOTUNE_TOPN
    assert resolve_config("max-autotune", None, env={"TORCHINDUCTOR_ASCENDC_AUTOTUNE_TOPN": "7"}).topn == 7
    assert resolve_config("reduce-overhead", None, env=env).topn == 1
    c = resolve_config(None, {"topn": "3", "cores": 1, "cache_dir": str(tmp_path)}, env=env)
    assert (c.topn, c.cores, c.cache_dir) == (3, 1, tmp_path)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) 'top_n'; the options are topn, cores"):
        resolve_config(None, {"top_n": 2}, env=env)
    with pytest.raises(ConfigError, match="unknown mode; use one of default"):
        resolve_config("fastest", None, env=env)
    with pytest.raises(ConfigError, match="must be >= 1"):
        resolve_config(None, {"topn": 0}, env=env)
    with pytest.raises(ConfigError, match="graph must be True or False, got 'no'"):
        resolve_config(None, {"graph": "no"}, env=env)


def test_a_bad_option_is_an_error_naming_it():
    with torch.no_grad(), pytest.raises(Exception, match="unknown option.*'toppn'"):
        torch.compile(Block(graph_break=False), backend="ascendc_pack", options={"toppn": 2})(torch.randn(2, 32))


def test_dynamo_reset_forgets_the_graphs(cache):
    """By its registered name, so torch._dynamo.reset() reaches the backend."""
    m = Block(graph_break=False).eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        torch.compile(m, backend="ascendc_pack", options={"cache_dir": str(cache)})(x)
        assert len(backend.graphs()) == 1
        torch._dynamo.reset()
        assert backend.graphs() == []
        out = torch.compile(m, backend="ascendc_pack", options={"cache_dir": str(cache)})(x)
        close(out, m(x))  # compiled again: every kernel from the cache
    counts = backend.counts()
    assert counts.graphs == 1 and counts.kernels_compiled == 0 and counts.cache_hits > 0


SCRIPT = textwrap.dedent("""\
    import json, sys, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).eval()
    x = torch.randn(16, 32)
    # torch finds the backend by its entry point (TORCH_LOGS naming our logger imports the package)
    assert "ascendc_pack" not in sys.modules or "TORCH_LOGS" in sys.argv[2:]
    with torch.no_grad():
        f = torch.compile(model, backend="ascendc_pack", options={"topn": 2, "cache_dir": sys.argv[1]})
        ok = [torch.allclose(f(x), model(x), rtol=1e-5, atol=1e-5) for _ in range(3)]
    from ascendc_pack.dynamo import backend
    c = backend.counts()
    print(json.dumps({"ok": all(ok), "graphs": c.graphs, "compiled": c.kernels_compiled, "hits": c.cache_hits,
                      "profiled": c.kernels_profiled, "tactics": c.tactics_profiled, "fallbacks": c.fallbacks}))
""")


def _libraries(cache: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in cache.rglob("*.so")}


def test_a_second_process_compiles_and_profiles_nothing(tmp_path):
    """Run 1 compiles and tunes (PGO on the first call); run 2, same cache, fresh process, reads
    every choice back: zero compiles, zero kernels or tactics profiled, no new library. Torch finds
    the backend by its entry point. Logging: run 1 with TORCH_LOGS=inductor (torch_npu's way, mapped
    onto logger ascendc_pack), run 2 with TORCH_LOGS=ascendc_pack (torch's parsing of our name)."""
    script, cache = tmp_path / "run.py", tmp_path / "cache"
    script.write_text(SCRIPT)

    def run(logs: str):
        env = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
        env["TORCH_LOGS"] = logs
        p = subprocess.run([sys.executable, str(script), str(cache)] + (["TORCH_LOGS"] if "ascendc" in logs else []),
                           capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr

    first, log1 = run("inductor")
    assert first["ok"] and first["graphs"] == 1 and first["fallbacks"] == 0
    assert first["compiled"] > 0 and first["profiled"] > 0 and first["tactics"] > 0
    assert "Autotune completed" in log1 and "graph 0/0" in log1  # INFO lines of logger ascendc_pack
    libraries = _libraries(cache)
    second, log2 = run("ascendc_pack")
    assert second["ok"] and second["graphs"] == 1
    assert (second["compiled"], second["profiled"], second["tactics"]) == (0, 0, 0)
    assert second["hits"] == first["compiled"] + first["hits"]
    assert _libraries(cache) == libraries
    assert "graph 0/0" in log2 and "Autotune completed" not in log2 and "cached choice" in log2
    assert "capture: reused" in log2  # the FX graph's capture_state() keys the capture cache
