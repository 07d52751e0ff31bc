"""`ascendc-pack export-triton`: the model repository, and its model.py run against a stand-in of
Triton's `triton_python_backend_utils` (tritonserver does not run on these machines).

The stand-in implements the documented Python-backend API that model.py uses
(triton-inference-server/python_backend README): `Tensor(name, ndarray)` with `name()`,
`as_numpy()`, `to_dlpack()`, `Tensor.from_dlpack`; `InferenceRequest` with `inputs()`,
`requested_output_names()`, `request_id()`; `get_input_tensor_by_name`;
`InferenceResponse(output_tensors, error=None)` with `output_tensors()`, `has_error()`,
`error()`; `TritonError(message, code)` with the codes; `TritonModelException`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ascendc_pack.cli.main import main
from ascendc_pack.package.triton_export import export_triton, render_config
from ascendc_pack_runtime.model import TensorSpec
from ascendc_pack_runtime.triton_config import model_config

from .serve_helpers import build_bundles

STUB = textwrap.dedent('''
    """Stand-in for Triton's triton_python_backend_utils (the documented API only; like the real
    one it imports numpy, not torch, when it is imported)."""
    import numpy as np


    class TritonModelException(Exception):
        pass


    class TritonError:
        UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

        def __init__(self, message, code=1):
            self._message, self._code = message, code

        def message(self):
            return self._message

        def code(self):
            return self._code


    class Tensor:
        def __init__(self, name, array):
            if not isinstance(name, str) or not isinstance(array, np.ndarray):
                raise TritonModelException("Tensor(name: str, array: numpy.ndarray)")
            self._name, self._array = name, array

        def name(self):
            return self._name

        def as_numpy(self):
            return self._array

        def to_dlpack(self):
            import torch.utils.dlpack
            return torch.utils.dlpack.to_dlpack(torch.from_numpy(self._array))

        @staticmethod
        def from_dlpack(name, capsule):
            import torch.utils.dlpack
            t = torch.utils.dlpack.from_dlpack(capsule)
            return Tensor(name, t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy())


    class InferenceRequest:
        def __init__(self, inputs, requested_output_names=(), request_id=""):
            self._inputs, self._out, self._id = list(inputs), list(requested_output_names), request_id

        def inputs(self):
            return self._inputs

        def requested_output_names(self):
            return self._out

        def request_id(self):
            return self._id


    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None):
            self._outputs, self._error = list(output_tensors or []), error

        def output_tensors(self):
            return self._outputs

        def has_error(self):
            return self._error is not None

        def error(self):
            return self._error


    def get_input_tensor_by_name(request, name):
        return next((t for t in request.inputs() if t.name() == name), None)


    def get_output_tensor_by_name(response, name):
        return next((t for t in response.output_tensors() if t.name() == name), None)
''')


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return build_bundles(tmp_path_factory, ["mlp", "transformer_block"])


@pytest.fixture
def pb_utils(tmp_path, monkeypatch):
    path = tmp_path / "triton_python_backend_utils.py"
    path.write_text(STUB)
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", mod)
    return mod


def _load_model_py(path):
    spec = importlib.util.spec_from_file_location(f"triton_model_{abs(hash(str(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(export, **options):
    return {"model_config": json.dumps(_config_json(export, **options)), "model_instance_kind": "CPU",
            "model_instance_device_id": "0", "model_repository": str(export.model_dir),
            "model_version": "1", "model_name": export.model_dir.name}


def _config_json(export, **options):
    """What Triton passes as model_config: the JSON form of the exported config (tests/test_triton_server.py
    checks against a real tritonserver that its JSON has these fields and values)."""
    import ascendc_pack_runtime as rt
    from ascendc_pack_runtime.batching import batch_spec

    m = rt.load(export.bundle)
    try:
        return model_config(export.model_dir.name, m.input_specs, m.output_specs, batch=batch_spec(m.manifest),
                            **options)
    finally:
        m.close()


def test_render_config_types_dims_and_scalars():
    ins = [TensorSpec("x", (2, 3), torch.float32), TensorSpec("ids", (4,), torch.int64),
           TensorSpec("mask", (4,), torch.bool), TensorSpec("h", (8,), torch.bfloat16)]
    outs = [TensorSpec("sum", (), torch.float16)]
    text = render_config("m", ins, outs, instances=3)
    assert 'name: "m"\nbackend: "python"\nmax_batch_size: 0\n' in text
    for name, t, dims in (("x", "TYPE_FP32", "[ 2, 3 ]"), ("ids", "TYPE_INT64", "[ 4 ]"),
                          ("mask", "TYPE_BOOL", "[ 4 ]"), ("h", "TYPE_BF16", "[ 8 ]")):
        assert f'    name: "{name}"\n    data_type: {t}\n    dims: {dims}\n' in text
    assert '    name: "sum"\n    data_type: TYPE_FP16\n    dims: [ 1 ]\n  }' in text   # 0-d: [1], no reshape
    assert "count: 3\n    kind: KIND_CPU" in text
    with pytest.raises(ValueError, match="complex64"):
        render_config("m", [TensorSpec("z", (2,), torch.complex64)], outs)


def test_export_layout_and_config(bundles, tmp_path):
    bundle, _ = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo", instances=2)
    assert e.model_dir == tmp_path / "repo" / "mlp"
    files = sorted(p.relative_to(e.model_dir).as_posix() for p in e.model_dir.rglob("*") if p.is_file())
    assert {"config.pbtxt", "1/model.py", "1/model.ascpack", "1/ascendc_pack_runtime/__init__.py",
            "1/ascendc_pack_runtime/v2.py"} <= set(files)
    assert e.bundle.read_bytes() == bundle.read_bytes()
    text = e.config.read_text()
    assert 'name: "mlp"' in text and 'backend: "python"' in text and "count: 2" in text
    assert '    name: "x"\n    data_type: TYPE_FP32\n    dims: [ 256, 1024 ]' in text
    # existing directory: refused without --force, replaced with it; no temp dirs left
    with pytest.raises(Exception, match="already exists; pass --force"):
        export_triton(bundle, tmp_path / "repo")
    export_triton(bundle, tmp_path / "repo", force=True, vendor_runtime=False)
    assert not (e.model_dir / "1" / "ascendc_pack_runtime").exists()
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["mlp"]


def test_export_cli(bundles, tmp_path):
    from click.testing import CliRunner

    bundle, _ = bundles["transformer_block"]
    r = CliRunner().invoke(main, ["export-triton", str(bundle), "-o", str(tmp_path / "repo"), "--name", "tb"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "repo" / "tb" / "1" / "model.py").is_file()
    assert "max_batch_size 0: static shapes, one call per request" in r.output
    assert f"ascendc-pack triton-setup triton_backend --repo {tmp_path / 'repo'}" in r.output   # the next step
    r = CliRunner().invoke(main, ["export-triton", str(tmp_path / "nope.ascpack"), "-o", str(tmp_path / "r2")])
    assert r.exit_code == 1 and "nope.ascpack" in r.output
    r = CliRunner().invoke(main, ["export-triton", str(bundle), "-o", str(tmp_path / "r3"), "--name", "../x"])
    assert r.exit_code == 1 and "cannot be a Triton model directory" in r.output


@pytest.mark.parametrize("name", ["mlp", "transformer_block"])
def test_model_py_matches_eager(bundles, tmp_path, pb_utils, name):
    bundle, loaded = bundles[name]
    e = export_triton(bundle, tmp_path / "repo")
    mod = _load_model_py(e.model_py)
    model = mod.TritonPythonModel()
    model.initialize(_args(e))
    in_name, out_name = model.inputs[0].name, model.outputs[0].name
    (x,) = [t.numpy() for t in loaded.example_inputs]
    with torch.no_grad():
        ref = loaded.module(torch.from_numpy(x.copy())).numpy()
    x2 = np.random.default_rng(0).standard_normal(x.shape, dtype=np.float32)
    with torch.no_grad():
        ref2 = loaded.module(torch.from_numpy(x2.copy())).numpy()
    reqs = [pb_utils.InferenceRequest([pb_utils.Tensor(in_name, x)]),
            pb_utils.InferenceRequest([pb_utils.Tensor(in_name, x2)], requested_output_names=[out_name])]
    responses = model.execute(reqs)
    assert len(responses) == 2 and not any(r.has_error() for r in responses)
    for r, want in zip(responses, (ref, ref2)):
        (out,) = r.output_tensors()
        assert out.name() == out_name and out.as_numpy().dtype == np.float32
        np.testing.assert_allclose(out.as_numpy(), want, atol=1e-4, rtol=1e-4)
    model.finalize()


def test_model_py_bad_requests_get_errors_and_the_batch_goes_on(bundles, tmp_path, pb_utils):
    bundle, loaded = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo")
    model = _load_model_py(e.model_py).TritonPythonModel()
    model.initialize(_args(e))
    x = loaded.example_inputs[0].numpy()
    T, R = pb_utils.Tensor, pb_utils.InferenceRequest
    cases = [
        (R([]), "missing input 'x' (FP32 [256, 1024])"),
        (R([T("x", x), T("y", x)]), "no input(s) ['y']"),
        (R([T("x", x.astype(np.float64))]), "datatype float64, expected FP32"),
        (R([T("x", x[:, :512])]), "shape [256, 512], expected [256, 1024]"),
        (R([T("x", x)], requested_output_names=["nope"]), "no output(s) ['nope']"),
    ]
    good = R([T("x", x)])
    responses = model.execute([c for c, _ in cases] + [good])
    assert len(responses) == len(cases) + 1
    for (_, words), r in zip(cases, responses):
        assert r.has_error(), words
        assert words in r.error().message() and r.error().code() == pb_utils.TritonError.INVALID_ARG
    assert not responses[-1].has_error()
    with torch.no_grad():
        np.testing.assert_allclose(responses[-1].output_tensors()[0].as_numpy(),
                                   loaded.module(torch.from_numpy(x.copy())).numpy(), atol=1e-4, rtol=1e-4)
    # a read-only input buffer (Triton's shared memory) is copied, not written
    ro = x.copy()
    ro.flags.writeable = False
    assert not model.execute([R([T("x", ro)])])[0].has_error()


def test_model_py_refuses_a_gpu_instance_and_a_mismatched_config(bundles, tmp_path, pb_utils):
    bundle, _ = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo")
    mod = _load_model_py(e.model_py)
    with pytest.raises(pb_utils.TritonModelException, match="KIND_CPU"):
        mod.TritonPythonModel().initialize(dict(_args(e), model_instance_kind="GPU"))
    args = _args(e)
    cfg = json.loads(args["model_config"])
    cfg["input"] = [{"name": "renamed"}]
    with pytest.raises(pb_utils.TritonModelException, match="config.pbtxt lists inputs"):
        mod.TritonPythonModel().initialize(dict(args, model_config=json.dumps(cfg)))


def test_model_py_uses_the_vendored_runtime_in_a_fresh_process(bundles, tmp_path):
    """As in Triton's stub process: only model.py's directory and the stand-in on sys.path."""
    bundle, loaded = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo")
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (stub_dir / "triton_python_backend_utils.py").write_text(STUB)
    x = loaded.example_inputs[0].numpy()
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        import numpy as np
        sys.path.insert(0, {str(stub_dir)!r})
        import triton_python_backend_utils as pb_utils
        spec = importlib.util.spec_from_file_location("model", {str(e.model_py)!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        import ascendc_pack_runtime
        m = mod.TritonPythonModel()
        m.initialize(json.loads(sys.argv[1]))
        (r,) = m.execute([pb_utils.InferenceRequest([pb_utils.Tensor("x", np.load({str(tmp_path / 'x.npy')!r}))])])
        np.save({str(tmp_path / 'y.npy')!r}, r.output_tensors()[0].as_numpy())
        print(json.dumps({{"runtime": ascendc_pack_runtime.__file__, "error": r.has_error(),
                          "policy": ascendc_pack_runtime.WAIT_POLICY.source}}))
    """)
    env = {"PATH": "/usr/bin:/bin", "ASCENDC_PACK_RUNTIME_CACHE": str(tmp_path / "rt"), "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", script, json.dumps(_args(e))], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["runtime"].startswith(str(e.model_dir / "1" / "ascendc_pack_runtime")) and not out["error"]
    # model.py imported the runtime before torch: its OpenMP wait policy applied, and it said so
    assert out["policy"] == "runtime"
    assert "OpenMP wait policy: OMP_WAIT_POLICY=PASSIVE (set by ascendc_pack_runtime" in p.stderr, p.stderr[-2000:]
    with torch.no_grad():
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), loaded.module(torch.from_numpy(x.copy())).numpy(),
                                   atol=1e-4, rtol=1e-4)



def test_model_py_refuses_a_backend_that_corrupts_tensors(bundles, tmp_path, pb_utils, monkeypatch):
    """numpy 2 under tritonserver 2.51's stub: tensors from the C++ side arrive with wrong strides
    ([1, 2, 3, 4] as [1, 1, 1, 1], seen on the real server); initialize's probe catches it."""
    bundle, _ = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo")
    mod = _load_model_py(e.model_py)
    broken = staticmethod(lambda name, capsule: pb_utils.Tensor(name, np.ones(4, np.float32)))
    monkeypatch.setattr(pb_utils.Tensor, "from_dlpack", broken)
    with pytest.raises(pb_utils.TritonModelException,
                       match=r"hands tensors to numpy .* came back as \[1.0, 1.0, 1.0, 1.0\].*pip install 'numpy<2'"):
        mod.TritonPythonModel().initialize(_args(e))


@pytest.mark.parametrize("change, words", [
    (lambda c: c.update(max_batch_size=4), "max_batch_size is 4, but the bundle has static shapes"),
    (lambda c: c.update(dynamic_batching={"preferred_batch_size": [2]}), "dynamic_batching is set but max_batch_size"),
    (lambda c: c["input"][0].update(dims=[128, 1024]), "input 'x' dims are [128, 1024], the bundle's are [256, 1024]"),
    (lambda c: c["output"][0].update(data_type="TYPE_FP16"), "output 'output_0' data_type is TYPE_FP16"),
    (lambda c: c["parameters"].update(ascpack_threads={"string_value": "zero"}), "parameter ascpack_threads is 'zero'"),
])
def test_model_py_refuses_a_config_that_contradicts_the_bundle(bundles, tmp_path, pb_utils, change, words):
    bundle, _ = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo")
    args = _args(e)
    cfg = json.loads(args["model_config"])
    change(cfg)
    with pytest.raises(pb_utils.TritonModelException, match=re.escape(words)):
        _load_model_py(e.model_py).TritonPythonModel().initialize(dict(args, model_config=json.dumps(cfg)))


def test_model_py_caps_threads_per_instance(bundles, tmp_path, pb_utils):
    bundle, _ = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "r1", instances=2)
    m = _load_model_py(e.model_py).TritonPythonModel()
    m.initialize(_args(e, instances=2))
    assert m.model.threads == max(1, torch.get_num_threads() // 2)   # like serve --workers 2
    m.finalize()
    e = export_triton(bundle, tmp_path / "r2", threads=1)
    assert 'key: "ascpack_threads"\n  value: { string_value: "1" }' in e.config.read_text()
    m = _load_model_py(e.model_py).TritonPythonModel()
    m.initialize(_args(e, threads=1))
    assert m.model.threads == 1
    m.finalize()


def test_model_py_runs_a_batch_of_requests_as_one_call(bundles, tmp_path, pb_utils):
    """The batching path of execute(), around the eager mlp (it takes any rows: each of its 256
    rows is an item of 1024): Triton's grouped requests become one call, every request gets its
    rows back, a request that does not fit gets INVALID_ARG and the others still run. (A bundle
    with a batch dim, and Triton's own batcher in front, come with dynamic shapes.)"""
    from ascendc_pack_runtime.batching import BatchedTensor, BatchSpec

    bundle, loaded = bundles["mlp"]
    e = export_triton(bundle, tmp_path / "repo")
    model = _load_model_py(e.model_py).TritonPythonModel()
    model.initialize(_args(e))
    assert model.batch is None   # a static bundle does not batch
    model.batch = BatchSpec((BatchedTensor("x", torch.float32, (1024,)),),
                            (BatchedTensor("output_0", torch.float32, (1024,)),), max_batch=512)
    calls = []

    def eager(*inputs):
        calls.append(tuple(inputs[0].shape))
        with torch.no_grad():
            return [loaded.module(*inputs)]

    model.run = eager
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((n, 1024), dtype=np.float32) for n in (1, 3, 256, 2)]
    T, R = pb_utils.Tensor, pb_utils.InferenceRequest
    bad = R([T("x", rng.standard_normal((2, 512), dtype=np.float32))])
    responses = model.execute([R([T("x", x)]) for x in xs[:2]] + [bad] + [R([T("x", x)]) for x in xs[2:]])
    assert calls == [(262, 1024)]   # one call for the four requests that fit
    assert responses[2].has_error() and responses[2].error().code() == pb_utils.TritonError.INVALID_ARG
    assert "'x' has shape [2, 512], expected 'x' (float32[rows, 1024])" in responses[2].error().message()
    for x, r in zip(xs, responses[:2] + responses[3:]):
        assert not r.has_error()
        (out,) = r.output_tensors()
        with torch.no_grad():
            want = loaded.module(torch.from_numpy(x.copy())).numpy()
        assert out.as_numpy().shape == x.shape
        np.testing.assert_allclose(out.as_numpy(), want, rtol=1e-5, atol=1e-5)
    model.finalize()


def test_static_bundles_do_not_batch(bundles):
    """batch_spec is None for every bundle built today: export writes max_batch_size 0."""
    import ascendc_pack_runtime as rt
    from ascendc_pack_runtime.batching import batch_spec

    for name in ("mlp", "transformer_block"):
        m = rt.load(bundles[name][0])
        assert batch_spec(m.manifest) is None
        m.close()
