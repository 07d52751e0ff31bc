"""Triton Inference Server Python-backend model for an ``.ascpack`` bundle.

``ascendc-pack export-triton`` copies this file to ``<repo>/<name>/1/model.py`` next to the
bundle (``model.ascpack``) and, by default, a copy of the ``ascendc_pack_runtime`` package. It
only works inside Triton's Python backend, which provides ``triton_python_backend_utils``.
The backend's stub runs model.py with the first ``python3`` on ``PATH``; that Python needs
torch (the release named in the bundle's manifest), zstandard and **numpy < 2**: with numpy 2,
tritonserver 2.51's stub (nvidia-pytriton 0.7.0) hands the model wrong tensors (``[1, 2, 3, 4]``
arrives as ``[1, 1, 1, 1]``), so ``initialize`` sends a probe tensor through the backend and
refuses to start when it comes back changed (:func:`check_tensor_transport`).

Per model instance (one stub process each): ``initialize`` imports the runtime before torch,
so the runtime's OpenMP wait policy applies (:mod:`ascendc_pack_runtime.threads`), loads the
bundle (verified, extracted into ``$ASCENDC_PACK_RUNTIME_CACHE``) with a thread cap per
instance (parameter ``ascpack_threads``, else torch's threads // the config's instance count),
refuses a ``config.pbtxt`` that contradicts the bundle (:func:`.triton_config.check_config`),
warms the model up with one call and logs one line: the cap, the wait policy, the batching.

``execute`` decodes each request on its own: one whose inputs do not fit (missing, unknown,
wrong datatype or shape) gets an ``INVALID_ARG`` error that says what the model expects, and
the others still run. A bundle with a batch dim (:func:`.batching.batch_spec`) runs the
requests Triton's dynamic batcher grouped as one call and cuts each request's rows back out
(:func:`.batching.run_merged`); a static bundle runs one call per request.
"""

import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "ascendc_pack_runtime" / "__init__.py").is_file():
    sys.path.insert(0, str(_HERE))  # the runtime copied next to this file wins

# First, before torch: libgomp reads OMP_WAIT_POLICY once, when torch loads it.
import ascendc_pack_runtime as rt  # noqa: E402  isort: skip

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils.dlpack  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from ascendc_pack_runtime import batching, triton_config, v2  # noqa: E402
from ascendc_pack_runtime.threads import check_threads, per_instance_threads  # noqa: E402


def _error(message, code_name="INVALID_ARG"):
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def _log(message):
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(message)
    else:
        print(message, file=sys.stderr, flush=True)


def check_tensor_transport(pb=None):
    """Send ``[1, 2, 3, 4]`` through the backend's tensor type and DLPack, the path request
    tensors take; a :class:`TritonModelException` naming numpy's version and the fix when it
    comes back changed (numpy 2 with tritonserver 2.51's stub)."""
    pb = pb or pb_utils
    probe = np.arange(1, 5, dtype=np.float32)
    try:
        back = pb.Tensor.from_dlpack("probe", pb.Tensor("probe", probe).to_dlpack()).as_numpy()
        ok = back.shape == probe.shape and bool(np.array_equal(back, probe))
        got = back.tolist()
    except Exception as e:  # noqa: BLE001 - any failure here is the same problem
        ok, got = False, f"{type(e).__name__}: {e}"
    if not ok:
        raise pb.TritonModelException(
            f"the Triton Python backend hands tensors to numpy {np.__version__} wrongly in this server's Python "
            f"({sys.executable}): a probe {probe.tolist()} came back as {got}; tritonserver 2.51 (nvidia-pytriton "
            "0.7.0) needs numpy < 2 there: pip install 'numpy<2' into that Python (pip install "
            "'ascendc-pack[triton]' pins it)")


def _parameter(config, key):
    return ((config.get("parameters") or {}).get(key) or {}).get("string_value") or None


class TritonPythonModel:
    """Serves one bundle; Triton runs one of these per instance (instance_group count)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        name = args.get("model_name") or config.get("name")
        kind = str(args.get("model_instance_kind", "CPU")).upper()
        if "GPU" in kind:
            raise pb_utils.TritonModelException(
                f"{name}: this bundle runs on the CPU; set instance_group kind: KIND_CPU")
        check_tensor_transport()
        threads = self._threads(config, name)
        file = _parameter(config, triton_config.BUNDLE_PARAMETER) or triton_config.DEFAULT_BUNDLE
        version = str(args.get("model_version") or _HERE.name)
        candidates = [_HERE / file]
        if args.get("model_repository"):
            candidates.append(Path(args["model_repository"]) / version / file)
        path = next((p for p in candidates if p.is_file()), candidates[0])
        try:
            self.model = rt.load(path, threads=threads)
        except rt.BundleError as e:
            raise pb_utils.TritonModelException(f"{name}: cannot load {path}: {e}") from None
        self.name = name or self.model.name
        self.inputs = self.model.input_specs
        self.outputs = self.model.output_specs
        self.batch = batching.batch_spec(self.model.manifest)
        try:
            for s in self.inputs + self.outputs:
                v2.v2_datatype(s)  # refuses dtypes Triton cannot carry
            triton_config.check_config(config, self.inputs, self.outputs, self.batch)
        except ValueError as e:
            raise pb_utils.TritonModelException(f"{self.name}: {e}") from None
        self.run = self.model.run_flat
        self._output_index = {s.name: i for i, s in enumerate(self.outputs)}
        sizes = rt.model_parts.example_sizes(self.model)
        self.run(*[torch.zeros(rt.model_parts.concrete_shape(s, sizes), dtype=s.dtype) for s in self.inputs])  # warm-up
        cap = f"at most {self.model.threads} thread(s) per call" if self.model.threads else "no thread cap"
        batch = (f"batches up to {config.get('max_batch_size')} rows (bundle: {self.batch.max_batch}, preferred "
                 f"{list(self.batch.preferred)})" if self.batch and config.get("max_batch_size") else "no batching")
        _log(f"ascendc-pack: {self.name} loaded {path.name} ({self.model.bundle_sha256[:12]}), {cap}, {batch}; "
             f"{rt.WAIT_POLICY.describe()}")

    @staticmethod
    def _threads(config, name):
        """The per-instance thread cap: parameter ascpack_threads, else cores // instances."""
        text = _parameter(config, triton_config.THREADS_PARAMETER)
        if text is not None:
            try:
                return check_threads(int(text), f"parameter {triton_config.THREADS_PARAMETER}")
            except ValueError as e:
                raise pb_utils.TritonModelException(
                    f"{name}: config.pbtxt parameter {triton_config.THREADS_PARAMETER} is {text!r}: {e}") from None
        groups = config.get("instance_group") or [{"count": 1}]
        return per_instance_threads(sum(int(g.get("count", 1)) for g in groups))

    def execute(self, requests):
        responses = [None] * len(requests)
        decoded = []
        for k, request in enumerate(requests):
            try:
                decoded.append((k, self._decode(request)))
            except v2.RequestError as e:
                responses[k] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
            except Exception as e:  # noqa: BLE001 - one request's failure must not fail the others
                responses[k] = pb_utils.InferenceResponse(
                    output_tensors=[], error=_error(f"{type(e).__name__}: {e}", "INTERNAL"))
        tensors = [t for _, (t, _) in decoded]
        if self.batch is None:
            results = [self._call(t) for t in tensors]
        else:
            results = batching.run_merged(self.run, self.batch, tensors)
        for (k, (_, wanted)), result in zip(decoded, results):
            if isinstance(result, Exception):
                code = "INVALID_ARG" if isinstance(result, (v2.RequestError, batching.BatchError)) else "INTERNAL"
                text = str(result) if code == "INVALID_ARG" else f"{type(result).__name__}: {result}"
                responses[k] = pb_utils.InferenceResponse(output_tensors=[], error=_error(text, code))
            else:
                out = [self._to_triton(self.outputs[i], result[i]) for i in wanted]
                responses[k] = pb_utils.InferenceResponse(output_tensors=out)
        return responses

    def _call(self, tensors):
        try:
            return self.run(*tensors)
        except Exception as e:  # noqa: BLE001 - returned as this request's error
            return e

    def _decode(self, request):
        """(input tensors in the model's order, indices of the outputs to return)."""
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
            tensors.append(self._to_torch(spec, t, static=self.batch is None))
        wanted = list(range(len(self.outputs)))
        names = list(request.requested_output_names() or []) if hasattr(request, "requested_output_names") else []
        if names:
            unknown = [n for n in names if n not in self._output_index]
            if unknown:
                raise v2.RequestError(f"model {self.name!r} has no output(s) {unknown}; its outputs are "
                                      f"{v2.signature(self.outputs)}")
            wanted = [self._output_index[n] for n in names]
        return tensors, wanted

    @staticmethod
    def _to_torch(spec, tensor, static=True):
        """A private, writable torch copy (the model may write into its inputs); the shape is
        checked here for a static bundle, by the batch spec otherwise."""
        if spec.dtype == torch.bfloat16:  # numpy has no bfloat16: through DLPack
            t = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            if static and spec.shape == () and tuple(t.shape) == (1,):   # a 0-d input travels as dims [1]
                t = t.reshape(())
            if t.dtype != spec.dtype or (static and tuple(t.shape) != spec.shape):
                raise v2.RequestError(f"input {spec.name!r} is {t.dtype}{list(t.shape)}, expected {v2.describe(spec)}")
            return t.clone()
        arr = tensor.as_numpy()
        want = v2.NUMPY_DTYPES[v2.v2_datatype(spec)]
        if arr.dtype != want:
            raise v2.RequestError(f"input {spec.name!r} has datatype {arr.dtype}, expected "
                                  f"{v2.v2_datatype(spec)} ({want})")
        if static and spec.shape == () and arr.shape == (1,):   # a 0-d input travels as dims [1]
            arr = arr.reshape(())
        if static and tuple(arr.shape) != spec.shape:
            raise v2.RequestError(f"input {spec.name!r} has shape {list(arr.shape)}, expected "
                                  f"{list(spec.shape)} (the bundle was built for static shapes)")
        return torch.from_numpy(np.array(arr, copy=True, order="C"))

    def _to_triton(self, spec, t):
        t = t.detach().contiguous()
        if t.dim() == 0 and self.batch is None:   # 0-d travels as dims [1] (Triton has no scalars)
            t = t.reshape(1)
        if t.dtype == torch.bfloat16:
            return pb_utils.Tensor.from_dlpack(spec.name, torch.utils.dlpack.to_dlpack(t))
        return pb_utils.Tensor(spec.name, t.numpy())

    def finalize(self):
        model = getattr(self, "model", None)
        if model is not None:
            model.close()
