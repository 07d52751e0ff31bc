"""The contenders of the model benchmark: what each one is, how its artifact is built, and how it
is loaded, checked against eager and called inside its worker process.

=================  ==========================================================================
id                 what runs
=================  ==========================================================================
eager              the model file's module, ``torch.no_grad``
compile            ``torch.compile(module)`` (Inductor, default mode); its build is the first call
compile_freeze     ``torch.compile(module, options={"freezing": True})``: weights constant-folded
compile_ascendc    ``torch.compile(module, backend="ascendc_pack", options={"topn": N})``: our pipeline
                   behind dynamo (docs/DESIGN.md §2.11; its C++ graph after the first call), its own
                   empty cache; its build is the first call (compile + PGO + graph); not a peer of the
                   bundles (the same kernels: its ratio is what dynamo and the call path cost)
aoti               ``torch.export`` -> ``aoti_compile_and_package`` -> ``.pt2`` -> ``aoti_load_package``
ort                ``torch.onnx.export(dynamo=True)`` -> ONNX Runtime CPU, intra-op threads = usable
                   cores, ``session.intra_op.allow_spinning=0`` (and inter-op)
ov_f32, ov         ``openvino.convert_model(module, example_input=...)`` -> ``.xml``/``.bin`` (weights
                   kept float32) -> ``Core.compile_model(..., "CPU")`` with ``INFERENCE_NUM_THREADS`` =
                   usable cores, ``PERFORMANCE_HINT`` LATENCY; ``ov_f32`` with
                   ``INFERENCE_PRECISION_HINT`` f32, ``ov`` with OpenVINO's default precision (bfloat16
                   on a CPU with AVX512_BF16 or AMX: docs/DESIGN.md §8)
bundle1, bundleN   the ``.ascpack`` built with ``--topn 1`` / ``--topn N``, ``ascendc_pack_runtime.load``
bundleN_bf16       the ``.ascpack`` built with ``--topn N --precision bf16`` (default accuracy budget): its
                   peer is the fastest contender computing in the precision it ended up in
bundleN_ftz        the ``.ascpack`` built with ``--topn N --flush-denormals`` (denormals flushed to zero,
                   as OpenVINO always does; float32 otherwise)
ort_int8           ONNX Runtime on the ONNX model statically quantized by ``onnxruntime.quantization``
                   (QDQ, int8 weights per channel, uint8 activations, MinMax calibration on the model
                   file's example and calibration inputs: the same inputs ``--precision int8`` calibrates on)
bundleN_int8       the ``.ascpack`` built with ``--topn N --precision int8 --accuracy-budget 0.02``
                   (:data:`INT8_BUDGET`: int8 costs more error than bfloat16; ONNX Runtime's static int8
                   measures 1.8 % on resnet18 and more on the transformers)
=================  ==========================================================================
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ascendc_pack.bench.machine import host_cores
from ascendc_pack.bench.stats import lead_in, time_calls


@dataclass(frozen=True)
class Kind:
    """One contender: its id, its label (``{n}`` is the tuned bundle's topn) and the artifact
    built for it before timing (None: nothing is built ahead)."""

    cid: str
    label: str
    artifact: str | None
    bundle: bool = False
    peer: bool = True
    #: the precision it computes in: ``fp32`` (the model's own dtype), or ``default`` when the
    #: runtime decides by host (OpenVINO); the worker reports what it really ran (``precision``)
    precision: str = "fp32"
    #: run when no ``--contenders`` are given (an opt-in variant is not)
    default: bool = True


CONTENDERS = (
    Kind("eager", "eager", None),
    Kind("compile", "torch.compile", None),
    Kind("compile_freeze", "torch.compile freezing", None),
    Kind("compile_ascendc", "torch.compile ascendc_pack --topn {n}", None, peer=False),
    Kind("aoti", "AOTInductor (.pt2)", "aoti"),
    Kind("ort", "ONNX Runtime (no spin)", "onnx"),
    Kind("ov_f32", "OpenVINO f32", "openvino"),
    Kind("ov", "OpenVINO default", "openvino", precision="default"),
    Kind("bundle1", ".ascpack --topn 1", "bundle1", bundle=True),
    Kind("bundleN", ".ascpack --topn {n}", "bundleN", bundle=True),
    Kind("bundleN_bf16", ".ascpack --topn {n} --precision bf16", "bundleN_bf16", bundle=True, precision="default"),
    Kind("bundleN_ftz", ".ascpack --topn {n} --flush-denormals", "bundleN_ftz", bundle=True, default=False),
    Kind("ort_int8", "ONNX Runtime int8 (static)", "onnx_int8", precision="int8", default=False),
    Kind("bundleN_int8", ".ascpack --topn {n} --precision int8 --accuracy-budget 0.02", "bundleN_int8", bundle=True,
         precision="default", default=False),
)
INT8_BUDGET = 0.02
"""The accuracy budget of the ``bundleN_int8`` contender (docs/PRECISION.md "Which budget")."""
BY_ID = {k.cid: k for k in CONTENDERS}
#: contender ids in report order
MODEL_CONTENDERS = tuple(BY_ID)
#: what runs without ``--contenders``
DEFAULT_CONTENDERS = tuple(k.cid for k in CONTENDERS if k.default)
#: the contenders a bundle is compared with (bundle ÷ best peer)
PEERS = tuple(k.cid for k in CONTENDERS if not k.bundle and k.peer)
BUNDLES = tuple(k.cid for k in CONTENDERS if k.bundle)
#: the precision a contender computes in when it is the model's own (float32 models: float32)
NATIVE = "fp32"
#: a low-precision contender (bfloat16, float16, int8) is reported WRONG only above this relative
#: error of its outputs (a broken conversion, not rounding); below it is timed and its error shown
LOW_PRECISION_SANITY = 0.25


def label(cid: str, topn: int) -> str:
    """The label of contender ``cid`` in reports."""
    return BY_ID[cid].label.format(n=topn)


def reason(exc: BaseException) -> str:
    """One line naming an exception: type and the first non-empty line of its message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def file_size(path: Path) -> int:
    """Bytes of an artifact; an ONNX model's external data file and an OpenVINO model's ``.bin``
    count too."""
    size = path.stat().st_size
    for data in (path.with_name(path.name + ".data"), path.with_suffix(".bin") if path.suffix == ".xml" else None):
        if data is not None and data.exists():
            size += data.stat().st_size
    return size


# ---- building the artifacts (each in a fresh process, run by the parent) -----------------------

def build_artifact(kind: str, model_file: str, out_dir: str, topn: int = 1, cache_dir: str | None = None,
                   tag: str = "") -> dict:
    """Build one contender's artifact from a model file; returns path, size and build seconds.

    ``kind``: ``aoti`` (``.pt2``), ``onnx`` (``.onnx``), ``openvino`` (``.xml`` + ``.bin``), ``bundle1`` / ``bundleN`` (``.ascpack``
    built with ``--topn 1`` / ``--topn topn``, with the kernel cache ``cache_dir``, default a
    directory of its own under ``out_dir``). A bundle build also returns its per-stage seconds,
    the number of candidate compiles and its kernel choices. ``tag`` goes into the file name
    (a warm rebuild next to the cold build).
    """
    from ascendc_pack.frontend.loader import load_model_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra: dict = {}
    if kind in ("aoti", "onnx", "onnx_int8", "openvino"):
        loaded = load_model_file(model_file)
        module, inputs = loaded.module, tuple(t.clone() for t in loaded.example_inputs)
        t0 = time.perf_counter()
        with torch.no_grad():
            if kind == "aoti":
                path = out / f"{loaded.name}{tag}.pt2"
                ep = torch.export.export(module, inputs)
                torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
            elif kind == "openvino":
                import openvino as ov

                path = out / f"{loaded.name}{tag}.xml"
                ov_model = ov.convert_model(module, example_input=inputs)
                # weights stay float32 (save_model compresses them to float16 by default)
                ov.save_model(ov_model, str(path), compress_to_fp16=False)
            elif kind == "onnx_int8":
                path = out / f"{loaded.name}{tag}.int8.onnx"
                _ort_quantize(module, inputs, loaded.all_input_sets, path)
            else:
                path = out / f"{loaded.name}{tag}.onnx"
                torch.onnx.export(module, inputs, str(path), dynamo=True, verbose=False)
        seconds = time.perf_counter() - t0
    elif kind in ("bundle1", "bundleN", "bundleN_bf16", "bundleN_int8", "bundleN_ftz"):
        from ascendc_pack.dynamic import build_file  # as the CLI: a model declaring dynamic dims builds dynamic
        from ascendc_pack.bench.kernels import choices_json

        n = 1 if kind == "bundle1" else topn
        low = {"bundleN_bf16": "bf16", "bundleN_int8": "int8"}.get(kind)
        ftz = kind == "bundleN_ftz"
        path = out / f"{Path(model_file).stem}.topn{n}{'.' + low if low else ''}{'.ftz' if ftz else ''}{tag}.ascpack"
        t0 = time.perf_counter()
        result = build_file(model_file, topn=n, output=path, cache_dir=cache_dir or str(out / f"cache-topn{n}"),
                            precision=low, accuracy_budget=INT8_BUDGET if low == "int8" else None,
                            flush_denormals=ftz)
        # like AOTInductor's compile and torch.compile's first call: without loading the model file
        seconds = time.perf_counter() - t0 - result.seconds.get("load", 0.0)
        if result.precision is not None:
            extra["precision_record"] = result.precision.to_json()
        extra.update(stages=dict(result.seconds), candidate_compiles=result.kernels_compiled,
                     cache_hits=result.cache_hits, fallbacks=len(result.fallbacks),
                     kernels=choices_json(result.choices))
    else:
        raise ValueError(f"unknown artifact kind {kind!r}")
    return {"artifact": str(path), "size": file_size(path), "build_s": seconds, **extra}


# ---- checking outputs against eager ------------------------------------------------------------

def flat_outputs(out) -> list:
    """The output tensors of any contender as one flat list (ONNX Runtime's numpy arrays too)."""
    from torch.utils import _pytree as pytree

    if isinstance(out, list) and out and not isinstance(out[0], torch.Tensor) and hasattr(out[0], "dtype"):
        return [torch.from_numpy(o) if hasattr(o, "__array__") else o for o in out]  # ONNX Runtime
    return pytree.tree_flatten(out)[0]


def compare(expected: list, actual: list, expected64: list | None = None,
            precision: str = NATIVE) -> tuple[str, float | None, float | None]:
    """("ok" | "wrong: ...", max abs error, relative error) of flattened outputs.

    In the model's own precision (``NATIVE``) by the project's accuracy rule
    (``ascendc_pack_runtime.accuracy``: dtype- and magnitude-aware, float64 second look). A
    low-precision contender (OpenVINO's bfloat16 default) cannot meet that rule: it is wrong only
    when its relative error (``accuracy.relative_error``, the worst output) exceeds
    :data:`LOW_PRECISION_SANITY` or NaN/infinities differ, and the error is reported beside its time."""
    from ascendc_pack_runtime.accuracy import check_outputs, first_problem, relative_error

    if len(expected) != len(actual):
        return f"wrong: {len(actual)} outputs, eager has {len(expected)}", None, None
    for i, (e, a) in enumerate(zip(expected, actual)):
        if not isinstance(e, torch.Tensor) and e != a:
            return f"wrong: output {i} is {a!r}, eager {e!r}", None, None
    idx = [i for i, e in enumerate(expected) if isinstance(e, torch.Tensor)]
    rel = max((relative_error(expected[i], torch.as_tensor(actual[i])) for i in idx), default=0.0)
    refs = [expected64[i] for i in idx] if expected64 and len(expected64) == len(expected) else None
    checks = check_outputs([f"output {i}" for i in idx], [expected[i] for i in idx],
                           [torch.as_tensor(actual[i]) for i in idx], refs)
    finite = [c.max_error for c in checks if c.max_error != float("inf")]
    err = max(finite) if finite else None
    if precision != NATIVE:
        ok = rel <= LOW_PRECISION_SANITY
        return ("ok" if ok else f"wrong: relative error {rel:.3g} of a {precision} contender is above "
                f"{LOW_PRECISION_SANITY:g} (a broken conversion, not rounding)"), err, rel
    problem = first_problem(checks)
    return (f"wrong: {problem}" if problem else "ok"), err, rel


def reference(model_file: str, data: str) -> dict:
    """Run eager once on a copy of the example inputs and save inputs, outputs, the inputs after
    the call (in-place updates) and, where the model runs in float64, a float64 run's outputs
    (the accuracy rule's second look) to ``data``."""
    import copy

    from ascendc_pack.frontend.loader import load_model_file

    loaded = load_model_file(model_file)
    inputs = list(loaded.example_inputs)
    after = [t.clone() for t in inputs]
    with torch.no_grad():
        expected = flat_outputs(loaded.module(*after))
        try:
            module64 = copy.deepcopy(loaded.module).double()
            ins64 = [t.double() if t.is_floating_point() else t.clone() for t in inputs]
            expected64 = flat_outputs(module64(*ins64))
        except Exception:  # noqa: BLE001 - a model that cannot run in float64 gets no second look
            expected64 = None
    torch.save({"inputs": inputs, "expected": expected, "inputs_after": after, "expected64": expected64}, data)
    return {"inputs": [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in inputs]}


# ---- one contender inside its worker process ---------------------------------------------------

class Contender:
    """One contender inside its worker process: the callable bound to its inputs."""

    def __init__(self):
        self.fn = None
        self.precision = NATIVE  # what the loaded contender computes in (set by _make)

    def setup(self, cid: str, model_file: str, data: str, artifact: str | None = None,
              warmup_s: float = 0.2, options: dict | None = None) -> dict:
        """Load the contender, run it once on a fresh copy of the inputs (timed, compared with
        eager), warm it up and estimate microseconds per call. Runs with grad mode off.
        ``options``: the ``torch.compile`` options of ``compile_ascendc``."""
        saved = torch.load(data, weights_only=True)
        inputs, expected = saved["inputs"], saved["expected"]
        t0 = time.perf_counter()
        make = self._make(cid, model_file, artifact, inputs, options)
        load_s = time.perf_counter() - t0
        check_ins = [t.clone() for t in inputs]
        check_fn = make(check_ins)
        t0 = time.perf_counter()
        out = check_fn()
        first_s = time.perf_counter() - t0
        precision = self.precision
        check, err, rel = compare(expected, flat_outputs(out), saved.get("expected64"), precision)
        for i, (want, got) in enumerate(zip(saved.get("inputs_after", inputs), check_ins)):
            if check == "ok" and not torch.equal(want, got):
                check = f"wrong: input {i} after the call differs from eager's (in-place update)"
        del out, check_fn
        self.fn = make([t.clone() for t in inputs])
        times: list[float] = []
        t_end = time.perf_counter() + warmup_s
        while len(times) < 3 or time.perf_counter() < t_end:
            times += time_calls(self.fn, 1)
        return {"load_s": load_s, "first_call_s": first_s, "check": check, "max_error": err, "rel_error": rel,
                "precision": precision, "est_us": statistics.median(times), "threads": torch.get_num_threads()}

    def _make(self, cid: str, model_file: str, artifact: str | None, inputs: list, options: dict | None = None):
        """A function that binds the loaded contender to one set of input tensors."""
        from ascendc_pack.frontend.loader import load_model_file

        if cid in ("eager", "compile", "compile_freeze", "compile_ascendc"):
            module = load_model_file(model_file).module
            if cid == "compile":
                module = torch.compile(module)
            elif cid == "compile_ascendc":  # by name, as a user would: the entry point finds it
                module = torch.compile(module, backend="ascendc_pack", options=options)
            elif cid == "compile_freeze":
                # torch._inductor.config.freezing for this compiled module only (no global change)
                module = torch.compile(module, options={"freezing": True})
            return lambda ins: (lambda: module(*ins))
        if cid == "aoti":
            runner = torch._inductor.aoti_load_package(artifact)
            return lambda ins: (lambda: runner(*ins))
        if cid in BUNDLES:
            import ascendc_pack_runtime as rt

            model = rt.load(artifact)
            self.precision = bundle_precision(model.contract)
            return lambda ins: (lambda: model(*ins))
        if cid in ("ort", "ort_int8"):
            self.precision = BY_ID[cid].precision
            return _ort_binder(artifact, load_model_file(model_file).module, len(inputs))
        if cid in ("ov", "ov_f32"):
            bind, self.precision = _openvino_binder(artifact, f32=cid == "ov_f32")
            return bind
        raise ValueError(f"unknown contender {cid!r}")

    def time(self, number: int, lead_in_ms: float = 0.0) -> list[float]:
        """Microseconds of each of ``number`` back-to-back calls, after ``lead_in_ms`` of untimed
        calls (:func:`~.stats.lead_in`)."""
        lead_in(self.fn, lead_in_ms * 1e3)
        return time_calls(self.fn, number)

    def handle(self, msg: dict) -> dict:
        """One request of the parent: ``reference``, ``build``, ``setup`` or ``time``."""
        try:
            if msg["cmd"] == "reference":
                return {"ok": True, **reference(**msg["args"])}
            if msg["cmd"] == "build":
                return {"ok": True, **build_artifact(**msg["args"])}
            if msg["cmd"] == "setup":
                return {"ok": True, **self.setup(**msg["args"])}
            if msg["cmd"] == "time":
                return {"ok": True, "us": self.time(int(msg["number"]), float(msg.get("lead_in_ms", 0.0)))}
            return {"ok": False, "error": f"unknown command {msg['cmd']!r}"}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which goes on
            return {"ok": False, "error": reason(exc)}


def _ort_binder(artifact: str, module: torch.nn.Module, n_inputs: int, threads: int | None = None):
    """ONNX Runtime session (intra-op threads = ``threads``, default the usable cores; spinning
    off) and a binder of input tensors (numpy views) to it."""
    import inspect

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or host_cores()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    sess = ort.InferenceSession(artifact, opts, providers=["CPUExecutionProvider"])
    wanted = [i.name for i in sess.get_inputs()]
    params = list(inspect.signature(module.forward).parameters)
    if len(wanted) == n_inputs:
        names = wanted
    elif set(wanted) <= set(params[:n_inputs]):  # the exporter dropped unused inputs
        names = params[:n_inputs]
    else:
        raise RuntimeError(f"ONNX inputs {wanted} do not match the model's {n_inputs} inputs")

    def bind(ins):
        feed = {n: t.numpy() for n, t in zip(names, ins) if n in wanted}
        return lambda: sess.run(None, feed)

    return bind


def _ort_quantize(module: torch.nn.Module, inputs: tuple, input_sets: list, path: Path) -> None:
    """Export ``module`` to ONNX and quantize it statically to ``path`` (QDQ; int8 weights per
    channel, uint8 activations; MinMax ranges over ``input_sets``), after ONNX Runtime's
    recommended pre-processing (shape inference, graph optimization)."""
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        fp32, pre = Path(tmp) / "model.onnx", Path(tmp) / "model.pre.onnx"
        torch.onnx.export(module, inputs, str(fp32), dynamo=True, verbose=False)
        quant_pre_process(str(fp32), str(pre))
        import onnx

        names = [i.name for i in onnx.load(str(pre), load_external_data=False).graph.input]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.sets = iter([dict(zip(names, (t.numpy() for t in s))) for s in input_sets])

            def get_next(self):
                return next(self.sets, None)

        quantize_static(str(pre), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


#: OpenVINO's ``INFERENCE_PRECISION_HINT`` element types -> the precision names of the reports
OV_PRECISIONS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i8": "int8"}


def _openvino_binder(artifact: str, f32: bool, threads: int | None = None):
    """An OpenVINO CPU model compiled for latency (``threads``, default the usable cores; float32
    with ``f32``, else OpenVINO's default precision) and a binder of input tensors to one infer
    request; also the precision it runs in (``fp32``, ``bf16``, ...)."""
    import openvino as ov

    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads or host_cores()}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = ov.Core().compile_model(artifact, "CPU", config)
    hint = str(compiled.get_property("INFERENCE_PRECISION_HINT"))  # e.g. "<Type: 'bfloat16'>" or "bf16"
    name = hint.split("'")[1] if "'" in hint else hint
    precision = OV_PRECISIONS.get({"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(name, name), name)
    outputs = list(compiled.outputs)

    def bind(ins):
        request = compiled.create_infer_request()
        feed = [t.numpy() for t in ins]

        def call():
            res = request.infer(feed)
            return [res[o] for o in outputs]

        return call

    return bind, precision


def bundle_precision(manifest) -> str:
    """The precision a loaded bundle computes in (its manifest's ``precision.computes``: ``fp32``,
    ``bf16``, ``bf16+int8``...); ``fp32`` for a bundle without a precision record."""
    record = getattr(manifest, "precision", None)
    return getattr(record, "computes", None) or NATIVE
