"""Triton Inference Server Python-backend model for an ``.ascpack`` bundle.

``ascendc-pack export-triton`` copies this file to ``<repo>/<name>/1/model.py`` next to the
bundle (``model.ascpack``) and, by default, a copy of the ``ascendc_pack_runtime`` package. It
only works inside Triton's Python backend, which provides ``triton_python_backend_utils``;
the Python there needs torch (the release named in the bundle's manifest), numpy and
zstandard.

Per model instance: ``initialize`` loads the bundle (verified, extracted into
``$ASCENDC_PACK_RUNTIME_CACHE``), checks that ``config.pbtxt`` names the manifest's tensors, and
warms the model up with one call. ``execute`` answers every request on its own: a request
whose inputs do not fit (missing, unknown, wrong datatype or shape) gets an ``INVALID_ARG``
error response that says what the model expects, and the other requests still run.
"""

import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "ascendc_pack_runtime" / "__init__.py").is_file():
    sys.path.insert(0, str(_HERE))  # the runtime copied next to this file wins

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils.dlpack  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

import ascendc_pack_runtime as rt  # noqa: E402
from ascendc_pack_runtime import v2  # noqa: E402

BUNDLE_PARAMETER = "ascpack_bundle"
DEFAULT_BUNDLE = "model.ascpack"


def _error(message, code_name="INVALID_ARG"):
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class TritonPythonModel:
    """Serves one bundle; Triton runs one of these per instance (instance_group count)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        kind = str(args.get("model_instance_kind", "CPU")).upper()
        if "GPU" in kind:
            raise pb_utils.TritonModelException(
                f"{args.get('model_name')}: this bundle runs on the CPU; set instance_group kind: KIND_CPU")
        params = config.get("parameters") or {}
        file = (params.get(BUNDLE_PARAMETER) or {}).get("string_value") or DEFAULT_BUNDLE
        version = str(args.get("model_version") or _HERE.name)
        candidates = [_HERE / file]
        if args.get("model_repository"):
            candidates.append(Path(args["model_repository"]) / version / file)
        path = next((p for p in candidates if p.is_file()), candidates[0])
        try:
            self.model = rt.load(path)
        except rt.BundleError as e:
            raise pb_utils.TritonModelException(f"{args.get('model_name')}: cannot load {path}: {e}") from None
        self.name = args.get("model_name") or self.model.name
        self.inputs = self.model.input_specs
        self.outputs = self.model.output_specs
        self._check_config(config)
        self._output_index = {s.name: i for i, s in enumerate(self.outputs)}
        self.model.run_flat(*[torch.zeros(s.shape, dtype=s.dtype) for s in self.inputs])  # warm-up

    def _check_config(self, config):
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            listed = [e.get("name") for e in config.get(kind) or []]
            names = [s.name for s in specs]
            if listed and sorted(listed) != sorted(names):
                raise pb_utils.TritonModelException(
                    f"config.pbtxt lists {kind}s {listed}, the bundle has {v2.signature(specs)}; "
                    "re-export the repository with ascendc-pack export-triton")
            for s in specs:
                v2.v2_datatype(s)  # refuses dtypes Triton cannot carry

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._execute_one(request))
            except v2.RequestError as e:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e))))
            except Exception as e:  # noqa: BLE001 - one request's failure must not fail the batch
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=_error(f"{type(e).__name__}: {e}", "INTERNAL")))
        return responses

    def _execute_one(self, request):
        known = {s.name for s in self.inputs}
        sent = [t.name() for t in request.inputs()] if hasattr(request, "inputs") else []
        extra = [n for n in sent if n not in known]
        if extra:
            raise v2.RequestError(f"model {self.name!r} has no input(s) {extra}; its inputs are "
                                  f"{v2.signature(self.inputs)}")
        tensors = []
        for spec in self.inputs:
            t = pb_utils.get_input_tensor_by_name(request, spec.name)
            if t is None:
                raise v2.RequestError(f"missing input {v2.describe(spec)}; model {self.name!r} takes "
                                      f"{v2.signature(self.inputs)}")
            tensors.append(self._to_torch(spec, t))
        flat = self.model.run_flat(*tensors)
        wanted = list(range(len(self.outputs)))
        if hasattr(request, "requested_output_names"):
            names = list(request.requested_output_names() or [])
            if names:
                unknown = [n for n in names if n not in self._output_index]
                if unknown:
                    raise v2.RequestError(f"model {self.name!r} has no output(s) {unknown}; its outputs are "
                                          f"{v2.signature(self.outputs)}")
                wanted = [self._output_index[n] for n in names]
        out = [self._to_triton(self.outputs[i], flat[i]) for i in wanted]
        return pb_utils.InferenceResponse(output_tensors=out)

    @staticmethod
    def _to_torch(spec, tensor):
        if spec.dtype == torch.bfloat16:  # numpy has no bfloat16: through DLPack
            t = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                raise v2.RequestError(f"input {spec.name!r} is {t.dtype}{list(t.shape)}, expected {v2.describe(spec)}")
            return t.clone()
        arr = tensor.as_numpy()
        want = v2.NUMPY_DTYPES[v2.v2_datatype(spec)]
        if arr.dtype != want:
            raise v2.RequestError(f"input {spec.name!r} has datatype {arr.dtype}, expected "
                                  f"{v2.v2_datatype(spec)} ({want})")
        if tuple(arr.shape) != spec.shape:
            raise v2.RequestError(f"input {spec.name!r} has shape {list(arr.shape)}, expected "
                                  f"{list(spec.shape)} (the bundle was built for static shapes)")
        # a private, writable copy: the model may write into its inputs (in-place ops)
        return torch.from_numpy(np.array(arr, copy=True, order="C"))

    @staticmethod
    def _to_triton(spec, t):
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            return pb_utils.Tensor.from_dlpack(spec.name, torch.utils.dlpack.to_dlpack(t))
        return pb_utils.Tensor(spec.name, t.numpy())

    def finalize(self):
        model = getattr(self, "model", None)
        if model is not None:
            model.close()
