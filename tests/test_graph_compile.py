"""The graph stage's compile: graph.cpp is data (no torch header), the interpreter object is built
once per toolchain and shared, concurrent builds compile once, progress is reported, failures
are typed errors that leave nothing behind."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

import ascendc_pack.graph.compile as graph_compile
import ascendc_pack.toolchain.cxx as toolchain
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import CompileError
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.graph.plan import KernelRef, kernel_io, plan_graph
from ascendc_pack.pipeline import capture_file
from ascendc_pack.graph.render import compile_graph, render_graph, start_graph_runtime

from .conftest import EXAMPLES


def _graph(name: str):
    """graph.cpp of an example; every fused kernel gets a placeholder library (not loaded here)."""
    _, captured = capture_file(EXAMPLES / f"{name}.py")
    model = fuse(captured.model)
    refs = {}
    for step in model.program.fused_steps():
        ins, outs = kernel_io(step)
        refs[step.name] = KernelRef(step.name, "0" * 32, f"kernels/{step.name}/{'0' * 32}/kernel.so", 64,
                                    len(ins), len(outs))
    return model, refs, render_graph(model, refs)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("graph_cache")


def test_graph_cpp_is_data_and_the_plan_is_values():
    model, refs, src = _graph("transformer_block")
    includes = [line for line in src.source.splitlines() if line.startswith("#include")]
    assert includes == ['#include "ascendc_pack/graph_program.h"']
    assert src.namespace in src.source and "@NAMESPACE@" not in src.source
    plan = plan_graph(model, refs)
    with pytest.raises(AttributeError):
        plan.bufs[0].label = "x"  # frozen
    assert len(plan.memory.placements) == len(plan.bufs) == len(plan.memory.lifetimes)
    assert render_graph(model, refs).source == src.source  # deterministic


def test_concurrent_cold_builds_compile_once_with_progress(cache, monkeypatch):
    """Two threads build the same graph on a cold cache: the interpreter object and graph.so are
    each compiled once (per-directory lock), both report progress and get the same library."""
    _, _, src = _graph("mlp")
    config = BuildConfig.resolve(topn=1, cache_dir=cache, jobs=1)
    calls = []
    real = toolchain.compile_atomically

    def counting(command, output, **kw):
        calls.append(Path(output).name)
        return real(command, output, **kw)

    monkeypatch.setattr(graph_compile, "compile_atomically", counting)
    ticks: dict[int, list[float]] = {0: [], 1: []}
    results = [None, None]

    def build(i):
        results[i] = compile_graph(src, config, progress=ticks[i].append)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == ["graph.so", "graph_interp.o"]
    assert results[0].path == results[1].path and results[0].path.is_file()
    built = [r for r in results if not r.cached]
    assert len(built) == 1 and built[0].compile_seconds > 0
    t = ticks[results.index(built[0])]
    assert t and t == sorted(t) and t[-1] <= built[0].compile_seconds
    assert not list(cache.rglob("*.tmp"))


def test_new_graph_reuses_the_interpreter_object(cache, monkeypatch):
    config = BuildConfig.resolve(topn=1, cache_dir=cache, jobs=1)
    obj = start_graph_runtime(config).result(timeout=600)
    assert obj.is_file() and obj.parent.parent.name == graph_compile.INTERP_SUBDIR
    _, _, src = _graph("add_sum")
    calls = []
    real = toolchain.compile_atomically
    monkeypatch.setattr(graph_compile, "compile_atomically",
                        lambda command, output, **kw: calls.append(command(Path(output))) or real(command, output, **kw))
    lib = compile_graph(src, config)
    assert len(calls) == 1 and str(obj) in calls[0]  # graph.cpp + link, nothing else
    again = compile_graph(src, config)
    assert again.cached and again.compile_seconds == 0.0 and again.path == lib.path and len(calls) == 1


def test_compile_failure_is_a_typed_error_and_leaves_nothing(cache):
    config = BuildConfig.resolve(topn=1, cache_dir=cache, jobs=1)
    _, _, src = _graph("add_sum")
    broken = replace(src, source=src.source.replace("AP_GRAPH_PROGRAM_VERSION,", "AP_NO_SUCH_THING,"))
    with pytest.raises(CompileError, match=r"compiling graph\.cpp failed \(exit code 1\)(.|\n)*AP_NO_SUCH_THING"):
        compile_graph(broken, config)
    assert not list(cache.rglob("*.tmp"))
    with pytest.raises(CompileError, match="not found on PATH"):
        compile_graph(src, config, cxx="no-such-g++")


def test_compile_timeout_kills_the_compiler(tmp_path):
    out = tmp_path / "x.o"
    with pytest.raises(toolchain.CompilerTimeout, match="timed out after 0.5 s"):
        toolchain.compile_atomically(lambda tmp: ["sleep", "30"], out, timeout_s=0.5)
    assert not out.exists() and not list(tmp_path.iterdir())
