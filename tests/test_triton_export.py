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
    """Stand-in for Triton's triton_python_backend_utils (the documented API only)."""
    import numpy as np
    import torch.utils.dlpack


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
            return torch.utils.dlpack.to_dlpack(torch.from_numpy(self._array))

        @staticmethod
        def from_dlpack(name, capsule):
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


def _args(export):
    return {"model_config": json.dumps(_config_json(export)), "model_instance_kind": "CPU",
            "model_instance_device_id": "0", "model_repository": str(export.model_dir),
            "model_version": "1", "model_name": export.model_dir.name}


def _config_json(export):
    """What Triton passes as model_config: the JSON form of the exported config (tests/test_triton_server.py
    checks against a real tritonserver that its JSON has these fields and values)."""
    import ascendc_pack_runtime as rt
    from ascendc_pack_runtime.batching import batch_spec

    m = rt.load(export.bundle)
    try:
        return model_config(export.model_dir.name, m.input_specs, m.output_specs, batch=batch_spec(m.manifest))
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
        print(json.dumps({{"runtime": ascendc_pack_runtime.__file__, "error": r.has_error()}}))
    """)
    env = {"PATH": "/usr/bin:/bin", "ASCENDC_PACK_RUNTIME_CACHE": str(tmp_path / "rt"), "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", script, json.dumps(_args(e))], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["runtime"].startswith(str(e.model_dir / "1" / "ascendc_pack_runtime")) and not out["error"]
    with torch.no_grad():
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), loaded.module(torch.from_numpy(x.copy())).numpy(),
                                   atol=1e-4, rtol=1e-4)

