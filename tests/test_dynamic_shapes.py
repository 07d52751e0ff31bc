"""Dynamic shapes end to end (docs/DESIGN.md §2.10): a model with a dynamic batch and sequence
length built once (its buckets tuned by PGO, the generic plan with jit kernels), then loaded in
a fresh process and compared with eager at the buckets, off the buckets and at both ends of the
ranges; sizes outside the ranges refused by the Python runtime and by graph.so itself; jit
kernels against their ATen steps at many sizes; the CLI's --dynamic-batch form; and a static
bundle exactly as before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.config import BuildConfig
from ascendc_pack.dynamic import build_file

from .conftest import EXAMPLES

ENCODER = EXAMPLES / "dynamic_encoder.py"


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dynamic")
    result = build_file(ENCODER, topn=2, output=root / "enc.ascpack", cache_dir=root / "cache", jobs=2)
    return result, root


def test_bundle_records_dims_buckets_and_plans(encoder):
    result, root = encoder
    m = rt.read_manifest(result.output)
    assert m.format_version == 2 and m.graph is None
    assert [(d.name, d.min, d.max) for d in m.dynamic.dims] == [("batch", 1, 16), ("seq", 4, 64)]
    assert m.dynamic.batch.dim == "batch" and m.dynamic.batch.inputs == (0, 1) and m.dynamic.batch.outputs == (0,)
    # per input and output the dynamic dim of each dim, and the buckets' sizes (what serving reads)
    assert m.dynamic.inputs == (("batch", "seq", None), ("batch", "seq")) and m.dynamic.outputs == (("batch", "seq", None),)
    assert m.dynamic.buckets == ((2, 16), (1, 8), (4, 32))
    assert [p.label() for p in m.dynamic.plans] == ["bucket batch=2 seq=16", "bucket batch=1 seq=8",
                                                    "bucket batch=4 seq=32", "generic"]
    assert [s.shape for s in m.inputs] == [("batch", "seq", 32), ("batch", "seq")]
    assert m.outputs[0].shape == ("batch", "seq", 32)
    kernels = {(k.name, k.kernel_key): k for k in m.kernels}
    generic = m.dynamic.plans[-1]
    jit = [kernels[k] for k in generic.kernels]
    assert jit and all(k.tiling_repr == "lanes=16;sched=jit" for k in jit)
    # its GEMMs by a weight are oneDNN linear (a weight reordered at load), its attention ATen's
    assert generic.graph.memory["steps"]["tactic"] == 4 == generic.graph.memory["steps"]["tactic_load"]
    assert "aten.addmm.default" not in generic.graph.aten_ops
    assert generic.graph.aten_ops["aten.scaled_dot_product_attention.default"] == 1
    for p in m.dynamic.plans[:-1]:   # every bucket tuned by PGO as a static build: candidates timed
        ks = [kernels[k] for k in p.kernels]
        assert ks and all(not k.tiling_repr.endswith("sched=jit") for k in ks)
        assert any(k.visited and len(k.candidates) == 2 and all(c.median_us is not None for c in k.candidates)
                   for k in ks)
        assert p.tactics and all(t.visited for t in p.tactics)
    # each kernel and weight is stored once however many plans use it
    assert len(m.kernels) == len(set(kernels)) and len(m.weights.tensors) == 12
    assert len({w for p in m.dynamic.plans for w in p.weights}) == 12
    from ascendc_pack_runtime.tools import inspect_bundle

    text, rc = inspect_bundle(result.output)
    assert rc == 0 and "dynamic  batch in [1, 16], seq in [4, 64]" in text and "[3] generic" in text
    assert "x: float32[batch, seq, 32]" in text and "jit: sizes as arguments" in text
    checks = {c.label for c in result.verification}
    assert {"example inputs", "example inputs (generic plan)"} <= checks


FRESH = """
import json, sys, torch
sys.path.insert(0, {examples!r})
import ascendc_pack_runtime as rt
from ascendc_pack_runtime.accuracy import check_outputs, first_problem, relative_error
import dynamic_encoder as de
m = rt.load({bundle!r})
eager = de.get_model().eval()
out = []
for b, s in {shapes!r}:
    x, mask = de._inputs(b, s, 100 + 7 * b + s)
    with torch.no_grad():
        want = eager(x, mask)
    got = m(x, mask)
    problem = first_problem(check_outputs(["out"], [want], [got]))
    out.append([b, s, m.plan_for(x, mask), problem, relative_error(got, want)])
bad = []
for b, s in [(17, 8), (2, 3), (2, 65), (0, 8)]:
    try:
        m(*de._inputs(b, s, 0)) if b else m(torch.zeros(0, 8, 32), torch.zeros(0, 8, dtype=torch.long))
        bad.append(None)
    except ValueError as e:
        bad.append(str(e))
print(json.dumps({{"calls": out, "refused": bad}}))
"""


def test_serving_and_triton_export_batch_on_the_declared_batch_dim(encoder, tmp_path):
    """The manifest's batch dim is what serving and the Triton export batch on (tests/test_serve_batching.py
    and tests/test_triton_server.py run the servers)."""
    from ascendc_pack.package.triton_export import export_triton
    from ascendc_pack_runtime.kserve_model import AscpackModel

    result, _ = encoder
    model = AscpackModel(result.output, cache_dir=tmp_path / "rt")
    try:
        assert model.batch is not None and model.batch.max_batch == 16
    finally:
        model.stop()
    export = export_triton(result.output, tmp_path / "repo")
    config = export.config.read_text()
    assert export.max_batch_size == 16 and "max_batch_size: 16" in config and "dynamic_batching" in config


def test_fresh_process_matches_eager_on_and_off_the_buckets(encoder):
    result, _ = encoder
    shapes = [(2, 16), (1, 8), (4, 32),                      # the buckets
              (3, 17), (5, 9), (2, 33),                       # off the buckets
              (1, 4), (16, 64), (1, 64), (16, 4)]             # both ends of both ranges
    script = FRESH.format(examples=str(EXAMPLES), bundle=str(result.output), shapes=shapes)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    plans = {(b, s): plan for b, s, plan, *_ in res["calls"]}
    assert plans[(2, 16)] == "bucket batch=2 seq=16" and plans[(4, 32)] == "bucket batch=4 seq=32"
    assert all(plans[k] == "generic" for k in shapes[3:])
    assert [c[3] for c in res["calls"]] == [None] * len(shapes), res["calls"]
    r = res["refused"]
    assert "input 0 (x) dim 0 (batch) is 17, outside the declared range [1, 16]" in r[0]
    assert "input 0 (x) dim 1 (seq) is 3, outside the declared range [4, 64]" in r[1]
    assert "dim 1 (seq) is 65" in r[2] and "dim 0 (batch) is 0" in r[3]


def test_profile_follows_the_plan_a_call_runs(encoder):
    """``run --profile`` on a dynamic bundle (it raised AttributeError: a dynamic bundle has no
    one graph): the steps of the plan the inputs pick, a bucket's or the generic one."""
    from ascendc_pack_runtime.tools import run_bundle

    result, _ = encoder
    m = rt.load(result.output)
    try:
        for shape, plan in (((2, 16), "bucket batch=2 seq=16"), ((3, 17), "generic")):
            inputs = (torch.randn(*shape, 32), torch.ones(*shape, dtype=torch.long))
            assert m.plan_for(*inputs) == plan
            prof = rt.profile_steps(m, inputs, calls=2, warmup=1)
            assert prof.calls == 2 and prof.steps and 0 < prof.steps_us <= prof.call_median_us
    finally:
        m.close()
    lines, rc, res = run_bundle(result.output, repeat=1, profile=2)
    assert rc == 0 and res["profile"].calls == 2, lines


def test_precision_is_searched_per_bucket_and_the_generic_plan_stays_float32(tmp_path):
    """``--precision bf16`` on a dynamic model (before: a PackError): each bucket's steps are
    chosen on its own input sets under the budget, the manifest records the worst error and what
    the steps need, verification and a fresh process hold the buckets to the budget and the
    generic plan (float32) to float32's rule; a budget too tight for any step gives float32 and
    says why, bucket by bucket."""
    from ascendc_pack.tactics.dispatch.lowp import bf16_offered
    from ascendc_pack_runtime.tools import inspect_bundle

    budget = 0.01
    result = build_file(ENCODER, topn=1, precision="bf16", accuracy_budget=budget, output=tmp_path / "bf.ascpack",
                        cache_dir=tmp_path / "cache", jobs=2)
    m = rt.read_manifest(result.output)
    assert m.precision is not None and m.precision.requested == "bf16" and m.precision.input_sets == 3
    assert m.precision.error <= budget and result.precision.error == m.precision.error
    steps = [c.precision for p in m.dynamic.plans for t in p.tactics or () for c in [t.candidates[t.chosen_index]]]
    if bf16_offered() is None:  # a host with native bfloat16: steps switch, their features are required
        assert "bf16" in steps and m.precision.computes == "bf16" and m.precision.error > 0
        assert set(m.precision.requires) <= set(m.target.isa) and m.precision.requires
        assert "bf16 x" in inspect_bundle(result.output)[0]
    assert m.dynamic.plans[-1].kind == "generic" and not m.dynamic.plans[-1].tactics
    shapes = [(2, 16), (4, 32), (3, 17), (16, 64)]
    script = FRESH.format(examples=str(EXAMPLES), bundle=str(result.output), shapes=shapes)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])["calls"]
    assert [c[2] for c in calls] == ["bucket batch=2 seq=16", "bucket batch=4 seq=32", "generic", "generic"]
    assert all(c[4] <= budget for c in calls[:2]), calls
    assert all(c[3] is None for c in calls[2:]), calls  # the generic plan: float32's accuracy rule  # the generic plan computes in float32
    tight = build_file(ENCODER, topn=1, precision="bf16", accuracy_budget=1e-7, output=tmp_path / "tight.ascpack",
                       cache_dir=tmp_path / "cache", jobs=2)
    assert rt.read_manifest(tight.output).precision.computes == "fp32" and tight.precision.error == 0
    text = tight.precision.describe()
    assert "every step stays float32" in text and "bucket batch=2 seq=16: " in text


def test_graph_so_checks_the_ranges_itself(encoder):
    """The generic graph binds the dims from its inputs and refuses sizes outside the ranges
    even when called directly (no Python checks in front of it)."""
    result, _ = encoder
    m = rt.load(result.output)
    try:
        state = m._generic
        x, mask = torch.randn(20, 8, 32), torch.ones(20, 8, dtype=torch.long)
        with pytest.raises(RuntimeError, match=r"input 0 \(x\) dim 0 \(batch\) is 20, outside the declared range "
                                               r"\[1, 16\]"):
            state.ops.run(state.handle, [x, mask])
        with pytest.raises(RuntimeError, match=r"dim 0 \(batch\) is 3, another input's is 2"):
            state.ops.run(state.handle, [torch.randn(2, 8, 32), torch.ones(3, 8, dtype=torch.long)])
        # and a bucket's static graph refuses any other shape (its sizes are constants)
        bucket = m._states[0]
        with pytest.raises(RuntimeError, match=r"has shape \[3, 8, 32\], expected \[2, 16, 32\]"):
            bucket.ops.run(bucket.handle, [torch.randn(3, 8, 32), torch.ones(3, 8, dtype=torch.long)])
    finally:
        m.close()


def test_jit_kernels_match_their_aten_steps_at_many_sizes(tmp_path):
    """Every jit kernel of a generic program (reductions over a dynamic dim: softmax, mean,
    layer_norm; broadcasting a [batch, 1, 1, seq] mask; transposes) against its own ATen steps,
    batch 1 included, with the tiling its host function picks."""
    from torch.export import Dim

    from ascendc_pack.backends.registry import get_backend
    from ascendc_pack.frontend.capture_dynamic import capture_symbolic
    from ascendc_pack.frontend.dynamic import parse_declaration
    from ascendc_pack.frontend.executor import run_aten
    from ascendc_pack.ir.program import AtenStep
    from ascendc_pack.ir.symbolic import evaluate, is_symbolic
    from ascendc_pack.kernels.fused.jit import JitKernel, compile_jit, is_jit
    from ascendc_pack.passes.fuse import fuse

    class M(torch.nn.Module):
        def forward(self, x, mask):
            s = torch.softmax(x @ x.transpose(1, 2) + (1 - mask[:, None, :].float()) * -1e4, -1)
            return torch.nn.functional.layer_norm(s @ x, (x.shape[-1],)) + x.mean(1, keepdim=True), s.sum(0)

    x, mask = torch.randn(2, 6, 8), torch.ones(2, 6, dtype=torch.long)
    b, s = Dim("batch", min=1, max=16), Dim("seq", min=2, max=40)
    decl = parse_declaration(({0: b, 1: s}, {0: b, 1: s}), (x, mask), ["x", "mask"], "t")
    fused = fuse(capture_symbolic(M(), (x, mask), decl).model)
    steps = {st.name: st for st in fused.program.fused_steps() if is_jit(st.kernel)}
    config = BuildConfig.resolve(cache_dir=tmp_path, jobs=2)
    compiled = compile_jit([st.kernel for st in steps.values()], config, get_backend("cpu"))
    assert len(steps) >= 3 and any(st.kernel.reductions for st in steps.values())
    values = fused.program.values

    def at(a, sizes):
        if isinstance(a, (list, tuple)):
            return type(a)(at(v, sizes) for v in a)
        return evaluate(a, sizes) if is_symbolic(a) else a

    scheds = set()
    for name, st in steps.items():
        kernel = JitKernel(st.kernel, compiled[name].candidates[0].so_path)
        for sizes in ({"batch": 1, "seq": 2}, {"batch": 3, "seq": 7}, {"batch": 16, "seq": 40}, {"batch": 5, "seq": 33}):
            g = torch.Generator().manual_seed(sizes["seq"])
            env = {}
            for n in st.inputs:
                v = values[n]
                shape, stride = [evaluate(d, sizes) for d in v.shape], [evaluate(d, sizes) for d in v.stride]
                t = torch.randn(shape, generator=g) if v.dtype == "float32" else \
                    torch.randint(0, 2, shape, generator=g).to(getattr(torch, v.dtype))
                env[n] = torch.empty_strided(shape, stride, dtype=t.dtype).copy_(t)
            ref = dict(env)
            for step in st.steps:
                run_aten(AtenStep(step.op, at(step.args, sizes), {k: at(v, sizes) for k, v in step.kwargs.items()},
                                  step.outputs, step.multi), ref)
            outs = kernel([env[n] for n in st.inputs], sizes)
            for o, n in zip(outs, st.outputs):
                torch.testing.assert_close(o, ref[n], rtol=1e-5, atol=1e-5, msg=f"{name} at {sizes}")
            t = kernel.tiling(sizes)
            scheds.add(t["sched"])
            assert 1 <= t["block_dim"] <= config.effective_cores and t["rows_per_task"] >= 1
    assert "row" in scheds


def test_cli_dynamic_batch_builds_buckets_and_a_generic_plan(tmp_path):
    from click.testing import CliRunner

    from ascendc_pack.cli.main import main

    model = tmp_path / "mlp_small.py"
    model.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        def get_model():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
        def get_example_inputs():
            return (torch.randn(3, 16, generator=torch.Generator().manual_seed(1)),)
    """))
    out = tmp_path / "mlp.ascpack"
    result = CliRunner().invoke(main, ["build", str(model), "--dynamic-batch", "1:16", "--buckets", "2,8",
                                       "--cache-dir", str(tmp_path / "c"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    m = rt.load(out)
    try:
        assert m.plans == ["bucket batch=2", "bucket batch=8", "generic"] and m.batch == "batch"
        sys.path.insert(0, str(tmp_path))
        import mlp_small
        eager = mlp_small.get_model().eval()
        for n in (1, 2, 5, 8, 16):
            x = torch.randn(n, 16)
            with torch.no_grad():
                torch.testing.assert_close(m(x), eager(x), rtol=1e-4, atol=1e-5)
        assert m.plan_for(torch.randn(8, 16)) == "bucket batch=8" and m.plan_for(torch.randn(5, 16)) == "generic"
    finally:
        m.close()
        sys.path.remove(str(tmp_path))


def test_a_static_bundle_is_as_before(tmp_path):
    """No dynamic dims: the same pipeline as before, format_version 1, one graph.so, no dims in
    graph.cpp, loaded as a plain Model."""
    result = build_file(EXAMPLES / "add_sum.py", output=tmp_path / "a.ascpack", cache_dir=tmp_path / "c")
    m = rt.read_manifest(result.output)
    assert m.format_version == 1 and m.dynamic is None and m.graph.library == "graph.so"
    assert "dynamic" not in json.dumps(m.to_json())
    model = rt.load(result.output)
    try:
        assert type(model) is rt.Model
        src = (model.directory / "graph.cpp").read_text()
        assert "AP_SYM" not in src and "kDims" not in src
        x, y = torch.randn(32, 1024), torch.randn(1, 1024)
        torch.testing.assert_close(model(x, y), torch.add(x, y).sum())
        with pytest.raises(ValueError, match="the bundle was built for static shapes"):
            model(torch.randn(4, 1024), y)
    finally:
        model.close()


def test_generic_plan_with_a_cond_and_an_input_mutation(tmp_path):
    """ascendc_pack.build_dynamic with torch.export's own dynamic_shapes: a torch.cond (both
    branches) and an in-place update of an input, off the buckets."""
    from torch.export import Dim

    import ascendc_pack

    class M(torch.nn.Module):
        def forward(self, x, bias):
            x.add_(bias)
            return torch.cond(x.mean() > 0, lambda t: torch.softmax(t * 2, -1), lambda t: torch.tanh(t).sum(0)
                              .expand_as(t) + t, (x,))

    g = torch.Generator().manual_seed(0)
    sets = [(torch.randn(4, 8, generator=g) + 1, torch.randn(8, generator=g)),
            (torch.randn(6, 8, generator=g) - 1, torch.randn(8, generator=g))]
    result = ascendc_pack.build_dynamic(M(), sets, ({0: Dim("rows", min=1, max=64)}, None),
                                        output=tmp_path / "m.ascpack", cache_dir=tmp_path / "c", name="condmut")
    m = rt.load(result.output)
    try:
        assert m.plans == ["bucket rows=4", "bucket rows=6", "generic"] and m.batch is None
        for rows, shift in ((1, 1.0), (5, -1.0), (64, 1.0), (6, 1.0)):
            x, b = torch.randn(rows, 8) + shift, torch.randn(8)
            mine, theirs = x.clone(), x.clone()
            out = m(mine, b)
            ref = M()(theirs, b)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(mine, theirs)   # the input written back
        assert m.plan_for(torch.randn(6, 8), torch.randn(8)) == "bucket rows=6"
    finally:
        m.close()
