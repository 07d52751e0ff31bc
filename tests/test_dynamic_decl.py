"""Dynamic dims without a build (docs/DESIGN.md §2.10): declarations in a model file and on the
command line and their errors, the size expressions of generic plans (symbolic helpers, the
interpreter's postfix code), the jit tiling's C port against the Python cost model, and the
version-2 manifest contract."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import random
import subprocess

import pytest
import torch
from click.testing import CliRunner
from torch.export import Dim

from ascendc_pack.cli.main import main
from ascendc_pack.errors import ModelFileError, PackError
from ascendc_pack.frontend.dynamic import (DynamicShapeError, batch_declaration, group_buckets, parse_buckets,
                                           parse_declaration, parse_range, resize_batch)
from ascendc_pack.frontend.loader import load_model_file
from ascendc_pack.ir import symbolic as sym
from ascendc_pack.kernels.fused.tiling import Target, estimate_us
from ascendc_pack.toolchain.cxx import runtime_include_dir

from .conftest import EXAMPLES

X, MASK = torch.randn(2, 16, 8), torch.ones(2, 16, dtype=torch.long)


def decl(spec, inputs=(X, MASK), names=("x", "mask")):
    return parse_declaration(spec, inputs, list(names), "get_dynamic_shapes()")


# ----------------------------------------------------------------------------- declarations


def test_declaration_forms_agree_and_bind_sizes():
    b, s = Dim("batch", min=1, max=32), Dim("seq", min=4, max=64)
    forms = [({0: b, 1: s}, {0: b, 1: s}), [(b, s, None), (b, s)], {"x": {0: b, 1: s}, "mask": (b, s)}]
    decls = [decl(f) for f in forms]
    assert all(d == decls[0] for d in decls)
    d = decls[0]
    assert [x.name for x in d.dims] == ["batch", "seq"] and d.inputs == (("batch", "seq", None), ("batch", "seq"))
    assert d.sizes_of((torch.zeros(3, 5, 8), torch.zeros(3, 5))) == {"batch": 3, "seq": 5}
    assert d.batch_dim() == "batch" and d.batch_dim([("batch", None)]) == "batch"
    assert d.batch_dim([(None, "batch")]) is None        # an output not led by the batch: no batch dim
    spec = d.torch_spec()
    assert spec[0][0].__name__ == "batch" and (spec[0][1].min, spec[0][1].max) == (4, 64) and 2 not in spec[0]


@pytest.mark.parametrize("shapes, problem", [
    (((33, 5, 8), (33, 5)), "input 0 (x) dim 0 (batch) is 33, outside the declared range [1, 32]"),
    (((2, 3, 8), (2, 3)), "input 0 (x) dim 1 (seq) is 3, outside the declared range [4, 64]"),
    (((2, 5, 8), (3, 5)), "input 1 (mask) dim 0 (batch) is 3 but input 0 (x) dim 0 is 2"),
    (((2, 5), (2, 5)), "input 0 (x) has 2 dims, the declaration 3"),
])
def test_inputs_outside_the_declaration_are_refused_by_name(shapes, problem):
    d = decl(({0: Dim("batch", min=1, max=32), 1: Dim("seq", min=4, max=64)},
              {0: Dim("batch", min=1, max=32), 1: Dim("seq", min=4, max=64)}))
    with pytest.raises(DynamicShapeError) as e:
        d.sizes_of(shapes, "call")
    assert problem in str(e.value)


@pytest.mark.parametrize("spec, problem", [
    (({0: 2 * Dim("batch", min=1, max=8)}, None), "a derived dim (2*batch) is not supported"),
    (({0: Dim.AUTO}, None), "has no declared range"),
    (({0: Dim("batch")}, None), "has no finite max"),
    (({0: Dim("batch", min=0, max=8)}, None), "min=0; declare min >= 1"),
    (({0: Dim("batch", min=3, max=8)}, None), "the example input's size 2 is outside batch in [3, 8]"),
    (({0: "batch"}, None), "is str, not a torch.export.Dim"),
    (({5: Dim("batch", min=1, max=8)}, None), "dim 5 is not a dim of the example input"),
    (({0: Dim("batch", min=1, max=8)},), "has 1 entries but the model takes 2 inputs"),
    ({"y": {0: Dim("batch", min=1, max=8)}}, "names ['y'], which are not inputs of forward() (x, mask)"),
    (({0: Dim("b", min=1, max=8)}, {0: Dim("b", min=1, max=9)}), "declared twice with different ranges"),
    ((None, None), "declares no dynamic dim"),
    ("batch", "returned str; return a tuple with one entry per input"),
])
def test_bad_declarations_name_the_problem_and_the_fix(spec, problem):
    with pytest.raises(DynamicShapeError) as e:
        decl(spec)
    assert problem in str(e.value)


def test_model_file_declaration_and_buckets(write_model):
    loaded = load_model_file(EXAMPLES / "dynamic_encoder.py")
    assert [d.describe() for d in loaded.dynamic.dims] == ["batch in [1, 16]", "seq in [4, 64]"]
    buckets = group_buckets(loaded.dynamic, loaded.all_input_sets)
    assert list(buckets) == [(2, 16), (1, 8), (4, 32)]   # every distinct shape is a bucket
    # a static model still refuses calibration inputs of another shape, and says how to declare them
    path = write_model("""
        import torch
        def get_model(): return torch.nn.Linear(4, 4)
        def get_example_inputs(): return (torch.randn(2, 4),)
        def get_calibration_inputs(): return [(torch.randn(3, 4),)]
    """)
    with pytest.raises(ModelFileError, match="declare the dims that vary with get_dynamic_shapes"):
        load_model_file(path)


@pytest.mark.parametrize("extra, problem", [
    ("def get_calibration_inputs(): return [(torch.randn(40, 4),)]",
     "get_calibration_inputs()[0]: input 0 (input) dim 0 (batch) is 40, outside the declared range [1, 8]"),
    ("def get_calibration_inputs(): return [(torch.randn(3, 5),)]",
     "input 0 (input) dim 1 is 5, the example input's is 4, and that dim is not declared dynamic"),
    ("def get_calibration_inputs(): return [(torch.randn(3, 4, dtype=torch.float64),)]", "is torch.float64"),
])
def test_model_file_bad_input_sets(write_model, extra, problem):
    path = write_model(f"""
        import torch
        from torch.export import Dim
        def get_model(): return torch.nn.Linear(4, 4)
        def get_example_inputs(): return (torch.randn(2, 4),)
        def get_dynamic_shapes(): return ({{0: Dim("batch", min=1, max=8)}},)
        {extra}
    """)
    with pytest.raises(ModelFileError) as e:
        load_model_file(path)
    assert problem in str(e.value) and str(path) in str(e.value)


def test_cli_form_parsing_and_input_sets():
    assert parse_range("1:32") == (1, 32) and parse_buckets("32, 1,8,8", 1, 32) == [1, 8, 32]
    for text in ("32", "0:4", "8:2", "a:b"):
        with pytest.raises(DynamicShapeError, match="expected MIN:MAX"):
            parse_range(text)
    with pytest.raises(DynamicShapeError, match=r"\[64\] outside the dynamic range \[1, 32\]"):
        parse_buckets("1,64", 1, 32)
    d = batch_declaration((X, MASK), ["x", "mask"], 1, 32)
    assert d.inputs == (("batch", None, None), ("batch", None)) and d.batch_dim() == "batch"
    x5, m5 = resize_batch((X, MASK), 5)
    assert x5.shape == (5, 16, 8) and torch.equal(x5[2:4], X) and torch.equal(x5[:1], X[:1])
    with pytest.raises(DynamicShapeError, match="dim 0 differ"):
        batch_declaration((X, torch.ones(3, 16)), ["x", "mask"], 1, 32)
    with pytest.raises(DynamicShapeError, match="is a scalar and has no batch dim"):
        batch_declaration((X, torch.tensor(1.0)), ["x", "t"], 1, 32)


@pytest.mark.parametrize("args, problem", [
    (["--buckets", "1,2"], "--buckets needs --dynamic-batch MIN:MAX"),
    (["--dynamic-batch", "8"], "expected MIN:MAX"),
    (["--dynamic-batch", "1:4", "--buckets", "2,9"], "[9] outside the dynamic range [1, 4]"),
    (["--dynamic-batch", "3:4"], "the example inputs' batch 2 is outside it"),
])
def test_cli_bad_dynamic_options_are_clean_errors(tmp_path, write_model, args, problem):
    path = write_model("""
        import torch
        def get_model(): return torch.nn.Linear(4, 4)
        def get_example_inputs(): return (torch.randn(2, 4),)
    """)
    result = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(tmp_path), *args])
    assert result.exit_code == 1 and problem in result.output, result.output
    # inputs whose dim 0 differ have no batch dim: the model file must declare its dims
    result = CliRunner().invoke(main, ["build", str(EXAMPLES / "add_sum.py"), "--dynamic-batch", "1:64",
                                       "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1 and "dim 0 differ ([32, 1]); it is not one batch dim" in result.output


def test_cli_and_model_file_declarations_do_not_mix(tmp_path):
    result = CliRunner().invoke(main, ["build", str(EXAMPLES / "dynamic_encoder.py"), "--dynamic-batch", "1:4",
                                       "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1 and "declares its dynamic dims (get_dynamic_shapes()); drop --dynamic-batch" \
        in result.output


# ----------------------------------------------------------------------------- size expressions


def test_expressions_print_evaluate_and_bound():
    b, s = sym.dim_symbol("batch"), sym.dim_symbol("seq")
    exprs = [b * s * 64, 4 * s ** 2 + b, sym.simplify((b - 1) * 256 * s + 256 * s), 7, b]
    dims = {"batch": 3, "seq": 11}
    for e in exprs:
        code = sym.postfix(e, ["batch", "seq"].index)
        assert sym.eval_postfix(code, [3, 11]) == sym.evaluate(e, dims)
    assert sym.bounds(exprs[2], {"batch": (1, 32), "seq": (8, 256)}) == (256 * 8, 256 * 32 * 256)
    assert sym.order_key(b * 64) > sym.order_key(s) > 1000
    with pytest.raises(sym.SymbolicError, match="can shrink when a dynamic dim grows"):
        sym.bounds(100 - b, {"batch": (1, 4)})
    assert sym.c_expr(b * s * 64, lambda n: f"d_{n}") == "(INT64_C(64) * d_batch * d_seq)"
    assert sym.to_json(b * 2) == {"sym": "Mul(Integer(2), Symbol('batch', integer=True, positive=True))"}
    assert sym.to_json(sym.simplify(b - b + 3)) == 3 and sym.symbols_of([b, [s * 2, 3]]) == {"batch", "seq"}


# ----------------------------------------------------------------------------- jit tiling


def _c_chooser(tmp_path):
    src = tmp_path / "choose.cpp"
    src.write_text('#include "ascendc_pack/jit_tiling.h"\nextern "C" int choose(const ap_jit_problem *p, '
                   'int32_t t, ap_jit_tiling *o) { return ap_jit_choose(p, t, o); }\nextern "C" double est('
                   'const ap_jit_problem *p, int s, int bd, int64_t rpt) { return ap_jit_estimate(p, s, bd, rpt); }\n')
    so = tmp_path / "choose.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", f"-I{runtime_include_dir()}", str(src), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


class _Problem(ctypes.Structure):
    _fields_ = [("rows", ctypes.c_int64), ("inner", ctypes.c_int64), ("bytes", ctypes.c_double),
                ("flops", ctypes.c_double), ("passes", ctypes.c_int32), ("n_red", ctypes.c_int32),
                ("lanes", ctypes.c_int32), ("cores", ctypes.c_int32)] + \
        [(f, ctypes.c_double) for f in ("mem", "cache", "l2", "task", "parallel", "barrier")]


class _Tiling(ctypes.Structure):
    _fields_ = [("sched", ctypes.c_int32), ("block_dim", ctypes.c_int32), ("rows_per_task", ctypes.c_int64),
                ("tile", ctypes.c_int64)]


def test_host_tiling_is_the_static_cost_model(tmp_path, monkeypatch):
    """ap_jit_estimate (C) equals tiling.estimate_us (Python) on the same problem, and
    ap_jit_choose picks the cheapest of the static candidates' space (row: 1/4/16/64 rows per task,
    split) for every core cap."""
    import ascendc_pack.kernels.fused.tiling as tiling
    from ascendc_pack.ir.fusion import KernelSpec, LoadNode, KernelInput, KernelOutput, OpNode, ReduceNode

    lib = _c_chooser(tmp_path)
    lib.est.restype = ctypes.c_double
    # a jit kernel runs every schedule on an OpenMP team (a static kernel's row schedule: the task
    # pool), so the static model it mirrors is the one whose pool costs a team's wake-up
    target = Target(cores=4, pool_overhead_us=Target.parallel_overhead_us)
    rng = random.Random(0)
    for _ in range(40):
        rows, inner = rng.choice([1, 3, 8, 100, 4096]), rng.choice([1, 7, 64, 1000, 20000])
        red = rng.random() < 0.5
        nodes = (LoadNode(0, 0, (inner, 1), 0, "float32"), ReduceNode(1, "sum", (0,), "float32") if red else
                 OpNode(1, "exp", (0,), "float32"))
        outs = (KernelOutput("float32", (rows, 1) if red else (rows, inner), 1, (1, 0) if red else (inner, 1)),)
        spec = KernelSpec((rows, inner), (1,) if red else (), (KernelInput("float32", (rows, inner), (inner, 1)),),
                          outs, nodes)
        p = _Problem(rows, inner, float(tiling.kernel_bytes(spec)), tiling._flops_per_element(spec),
                     max(1, tiling._passes(spec)), int(red), 16, target.cores, target.mem_gbps_per_core,
                     target.cache_gbps_per_core, target.l2_bytes, target.task_overhead_us,
                     target.parallel_overhead_us, target.barrier_us)
        for sched, bd, rpt in itertools.product(("row", "split"), (1, 2, 4), (1, 16)):
            params = {"sched": sched, "bd": bd, "rpt": rpt, "omp": "static", "lanes": 16}
            py = estimate_us(spec, params, target)
            c = lib.est(ctypes.byref(p), 0 if sched == "row" else 1, bd, rpt)
            assert c == pytest.approx(py, rel=1e-9), (rows, inner, red, params)
        for cap in (0, 1, 2):
            t = _Tiling()
            assert lib.choose(ctypes.byref(p), cap, ctypes.byref(t)) == 0
            best = min(estimate_us(spec, params, target) for params in tiling._space(spec, min(4, cap or 4))
                       if params["sched"] != "col" and params.get("omp", "static") == "static"
                       and params.get("tile", 4096) in (4096, t.tile or 4096))
            got = estimate_us(spec, {"sched": ("row", "split")[t.sched], "bd": t.block_dim, "rpt": t.rows_per_task,
                                     "omp": "static", "lanes": 16}, target)
            assert got == pytest.approx(best, rel=1e-9) and 1 <= t.block_dim <= (cap or 4)


# ----------------------------------------------------------------------------- the contract


def _v2_manifest():
    from ascendc_pack_runtime import manifest as contract

    g = lambda i: contract.Graph(f"plans/{i}/graph.so", f"plans/{i}/graph.cpp", f"ascpack_000000000{i}", 1, (), {})  # noqa: E731
    members = {n: contract.Member(0, "0" * 64) for n in ("weights.bin", *(f"plans/{i}/graph.{e}" for i in range(2)
                                                                          for e in ("so", "cpp")))}
    dyn = contract.Dynamic((contract.DynDim("batch", 1, 8),), (("batch", None),), (("batch", None),), ((2,),),
                           contract.BatchDims("batch", (0,), (0,)),
                           (contract.Plan("bucket", {"batch": 2}, g(0), (), ()), contract.Plan("generic", None, g(1), (), ())))
    return contract.Manifest(
        format_version=2, producer=contract.Producer("ascendc-pack", "0"), model_name="m", backend="cpu",
        target=contract.Target("x86_64", "native", (), "g++"), torch=contract.TorchBuild("2.13.0", True),
        core_limit=None, cores=2, topn=1, inputs=(contract.IOSpec("x", ("batch", 4), "float32"),),
        outputs=(contract.IOSpec("y", ("batch", "batch*4"), "float32"),), mutations=(), out_spec="[]",
        weights=contract.Weights("weights.bin", 64, ()), graph=None, kernels=(), members=members, dynamic=dyn)


def test_version_2_manifest_round_trips_and_refuses_inconsistencies():
    from ascendc_pack_runtime import manifest as contract
    from ascendc_pack_runtime.errors import ManifestFieldError

    m = _v2_manifest().validate()
    doc = m.to_json()
    again = contract.Manifest.from_json(doc)
    assert again == m and again.dynamic.bucket({"batch": 2}).kind == "bucket" and again.dynamic.generic is not None
    assert again.dynamic.bucket({"batch": 3}) is None
    assert "graph" not in doc and m.libraries() == ["plans/0/graph.so", "plans/1/graph.so"]
    plans = doc["dynamic"]["plans"]
    bad = [({"dynamic": {**doc["dynamic"], "plans": plans[::-1]}}, "is generic but not the last plan"),
           ({"graph": plans[0]["graph"]}, "is set in a dynamic bundle"),
           ({"format_version": 1}, "field 'inputs[0].shape[0]' is 'batch', not an integer"),
           ({"dynamic": {**doc["dynamic"], "plans": [{**plans[0], "sizes": {"batch": 9}}, plans[1]]}},
            "is 9, outside [1, 8]"),
           ({"dynamic": {**doc["dynamic"], "plans": [{**plans[0], "sizes": {"seq": 2}}, plans[1]]}},
            "names dims ['seq'], the bundle declares ['batch']"),
           ({"dynamic": {**doc["dynamic"], "plans": [
               {**plans[0], "kernels": [{"name": "k", "kernel_key": "0" * 32}]}, plans[1]]}},
            "names kernels ['k'] that 'kernels' does not list"),
           ({"dynamic": {**doc["dynamic"], "plans": [{**plans[0], "weights": [3]}, plans[1]]}},
            "names weights [3], the bundle has 0"),
           ({"dynamic": {**doc["dynamic"], "batch": {"dim": "batch", "inputs": [0], "outputs": [1]}}},
            "lists [1], whose dim 0 is not 'batch'"),
           ({"inputs": [{"name": "x", "shape": ["seq", 4], "dtype": "float32"}]},
            "not an integer in [0, 2**48) or one of the declared dims ['batch']"),
           ({"dynamic": {**doc["dynamic"], "buckets": [[3]]}}, "is [[3]], the buckets' plans have [[2]]"),
           ({"dynamic": {**doc["dynamic"], "inputs": [[None, None]]}},
            "field 'dynamic.inputs[0]' is [None, None], not the dims of inputs[0].shape ['batch', 4]"),
           ({"dynamic": {**doc["dynamic"], "outputs": [["seq", None]]}}, "names dims ['seq'] that are not declared"),
           ({"dynamic": {**doc["dynamic"], "inputs": []}}, "has 0 entries, the bundle has 1 inputs")]
    for patch, problem in bad:
        with pytest.raises(ManifestFieldError) as e:
            contract.Manifest.from_json({**doc, **patch})
        assert problem in str(e.value), (patch, str(e.value))


def test_errors_are_pack_errors():
    assert issubclass(DynamicShapeError, PackError) and issubclass(sym.SymbolicError, PackError)
