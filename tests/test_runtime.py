"""The minimal runtime: load(), Model calls, input checks, extraction cache, concurrency."""

from __future__ import annotations

import hashlib
import multiprocessing
import threading
from pathlib import Path

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.package.bundle import write_bundle
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.pipeline import compare_outputs
from ascendc_pack_runtime.bundle import open_bundle

from .bundle_fixtures import build_examples, clone_inputs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_examples(tmp_path_factory)


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "runtime_cache"


def test_specs_and_repr(built, cache):
    b = built["inplace"]
    model = rt.load(b.bundle, cache_dir=cache)
    assert [(s.name, s.shape, s.dtype) for s in model.input_specs] == \
        [("x", (512, 2048), torch.float32), ("bias", (2048,), torch.float32)]
    assert [s.shape for s in model.output_specs] == [(512, 2048), (2048,)]
    assert model.manifest["mutations"] == [{"input": "x", "index": 0, "value": "add"}]
    assert "inplace" in repr(model) and "x: float32[512, 2048]" in repr(model)


def test_wrong_inputs_raise_value_error_and_the_model_survives(built, cache):
    b = built["mlp"]
    model = rt.load(b.bundle, cache_dir=cache)
    (x,) = clone_inputs(b.loaded.example_inputs)
    with pytest.raises(ValueError, match="takes 1 input"):
        model()
    with pytest.raises(ValueError, match="takes 1 input"):
        model(x, x)
    with pytest.raises(ValueError, match=r"shape \[256, 512\], expected \[256, 1024\]"):
        model(x[:, :512])
    with pytest.raises(ValueError, match="dtype torch.float64"):
        model(x.double())
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        model(x.tolist())
    with pytest.raises(ValueError, match="on meta"):
        model(torch.empty(256, 1024, device="meta"))
    with torch.no_grad():
        expected = b.loaded.module(x)
    assert compare_outputs(expected, model(x), atol=1e-4, rtol=1e-4) is None


def test_non_contiguous_inputs_and_mutation_write_back(built, cache):
    b = built["inplace"]
    model = rt.load(b.bundle, cache_dir=cache)
    x0, bias = b.loaded.example_inputs
    x_eager = x0.t().contiguous().t()          # same values, column-major
    x_run = x0.t().contiguous().t()
    assert not x_run.is_contiguous()
    with torch.no_grad():
        expected = b.loaded.module(x_eager, bias.clone())
    got = model(x_run, bias.clone())
    assert compare_outputs(expected, got, atol=1e-5, rtol=1e-5) is None
    assert torch.equal(x_run, x_eager)          # the mutation reached the caller's tensor
    assert x_run.stride() == x_eager.stride()


def test_inputs_off_the_fast_path_give_eager_results(built, cache):
    """Grad-requiring and negative-view inputs leave the copy-free fast path
    (``Model._fits``): the bundle still computes eager's values and builds no autograd graph."""
    b = built["mlp"]
    model = rt.load(b.bundle, cache_dir=cache)
    (x,) = clone_inputs(b.loaded.example_inputs)
    with torch.no_grad():
        expected = b.loaded.module(x)
        expected_neg = b.loaded.module(-x)
    assert model._fits((x,)) and not model._fits((x.requires_grad_(),))
    got = model(x)
    assert not got.requires_grad and compare_outputs(expected, got, atol=1e-4, rtol=1e-4) is None
    x = x.detach()
    neg = torch._neg_view(x)  # the values of -x, stored as x with the negative bit set
    assert neg.is_neg() and not model._fits((neg,))
    assert compare_outputs(expected_neg, model(neg), atol=1e-4, rtol=1e-4) is None


def test_outputs_are_fresh_per_call(built, cache):
    b = built["transformer_block"]
    model = rt.load(b.bundle, cache_dir=cache)
    (x,) = clone_inputs(b.loaded.example_inputs)
    first = model(x)
    keep = first.clone()
    second = model(x * 0.5)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, keep)


def test_extraction_is_content_addressed_and_reused(built, cache):
    b = built["add_sum"]
    sha = hashlib.sha256(b.bundle.read_bytes()).hexdigest()
    first = open_bundle(b.bundle, cache_dir=cache)
    assert first.directory == cache / sha and first.extracted
    again = open_bundle(b.bundle, cache_dir=cache)
    assert again.directory == first.directory and not again.extracted
    # a damaged extraction is detected (sizes) and replaced
    (first.directory / "graph.cpp").write_text("damaged")
    healed = open_bundle(b.bundle, cache_dir=cache)
    assert healed.extracted
    assert (healed.directory / "graph.cpp").stat().st_size == healed.manifest["members"]["graph.cpp"]["size"]
    # verify="full" rehashes: same-size tampering is caught too
    data = bytearray((healed.directory / "tuning.json").read_bytes())
    data[0] ^= 1
    (healed.directory / "tuning.json").write_bytes(bytes(data))
    assert not open_bundle(b.bundle, cache_dir=cache, verify="sizes").extracted
    assert open_bundle(b.bundle, cache_dir=cache, verify="full").extracted
    assert sorted(p.name for p in cache.iterdir()) == [sha]


def test_env_cache_dir(built, tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDC_PACK_RUNTIME_CACHE", str(tmp_path / "from_env"))
    model = rt.load(built["add_sum"].bundle)
    assert model.directory.parent == tmp_path / "from_env"


def test_concurrent_extraction_threads(built, cache):
    b = built["cond_model"]
    results, errors = [], []

    def worker():
        try:
            results.append(open_bundle(b.bundle, cache_dir=cache))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({r.directory for r in results}) == 1
    assert [p.name for p in cache.iterdir()] == [results[0].directory.name]


def _extract_in_child(args):
    path, cache = args
    return str(open_bundle(path, cache_dir=cache).directory)


def test_concurrent_extraction_processes(built, cache):
    b = built["mlp"]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        dirs = pool.map(_extract_in_child, [(b.bundle, cache)] * 3)
    assert len(set(dirs)) == 1
    assert [p.name for p in cache.iterdir()] == [Path(dirs[0]).name]
    model = rt.load(b.bundle, cache_dir=cache)
    (x,) = clone_inputs(b.loaded.example_inputs)
    with torch.no_grad():
        assert compare_outputs(b.loaded.module(x), model(x), atol=1e-4, rtol=1e-4) is None


def test_two_models_of_one_graph_in_one_process(built, tmp_path, cache):
    """Same graph.so (same namespace), different weights: each Model keeps its own state."""
    b = built["cond_model"]
    weights2 = {k: v * 0.5 for k, v in b.weights.items()}
    other = write_bundle(b.fused, weights2, b.choices, tmp_path / "half.ascpack", b.config)
    m1 = rt.load(b.bundle, cache_dir=cache)
    m2 = rt.load(other, cache_dir=cache)
    m1b = rt.load(b.bundle, cache_dir=cache)
    assert m1.manifest["graph"]["namespace"] == m2.manifest["graph"]["namespace"]
    for inputs in b.loaded.all_input_sets:
        ref1 = run_model(b.fused, b.weights, clone_inputs(inputs))
        ref2 = run_model(b.fused, weights2, clone_inputs(inputs))
        assert compare_outputs(ref1, m1(*clone_inputs(inputs)), atol=1e-4, rtol=1e-4) is None
        assert compare_outputs(ref2, m2(*clone_inputs(inputs)), atol=1e-4, rtol=1e-4) is None
        assert compare_outputs(ref1, m1b(*clone_inputs(inputs)), atol=1e-4, rtol=1e-4) is None


def test_threads_share_one_model_safely(built, cache):
    b = built["mlp"]
    model = rt.load(b.bundle, cache_dir=cache)
    xs = [torch.randn(256, 1024, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    with torch.no_grad():
        expected = [b.loaded.module(x) for x in xs]
    got = [None] * len(xs)

    def worker(i):
        for _ in range(3):
            got[i] = model(xs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e, g in zip(expected, got):
        assert compare_outputs(e, g, atol=1e-4, rtol=1e-4) is None


def test_close_and_context_manager(built, cache):
    b = built["add_sum"]
    with rt.load(b.bundle, cache_dir=cache) as model:
        model(*clone_inputs(b.loaded.example_inputs))
    with pytest.raises(RuntimeError, match="closed"):
        model(*clone_inputs(b.loaded.example_inputs))
    model.close()  # idempotent


def test_a_model_collected_inside_a_torch_export_releases_its_graph_outside_the_trace(built, cache):
    """Garbage collection can close a model in the middle of someone else's torch.export: the
    release must run (the graph state is gone) and must not be traced into their graph (a stray
    node there once broke torch.export's dynamic-shape check: CI's flaky IndexError)."""
    import gc

    b = built["add_sum"]
    holder = [rt.load(b.bundle, cache_dir=cache)]
    ops, handle = holder[0]._ops, holder[0]._handle
    inputs = list(clone_inputs(b.loaded.example_inputs))
    assert ops.run(handle, inputs)  # live before

    class DropsTheModel(torch.nn.Module):
        def forward(self, x):
            holder.clear()
            gc.collect()
            return x * 2

    ep = torch.export.export(DropsTheModel(), (torch.randn(3),), strict=False)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets == ["aten.mul.Tensor"], targets
    with pytest.raises(RuntimeError, match="not loaded"):
        ops.run(handle, inputs)


def test_errors_share_one_base_class():
    for cls in (rt.BundleNotFoundError, rt.BundleFormatError, rt.BundleIntegrityError,
                rt.UnsafeMemberError, rt.IncompatibleBundleError, rt.BundleLoadError):
        assert issubclass(cls, rt.BundleError)
    assert issubclass(rt.UnsafeMemberError, rt.BundleIntegrityError)
