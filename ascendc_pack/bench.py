"""Benchmarks (never tests): ``python -m ascendc_pack.bench {kernels,model} ...``.

``kernels``: for every fused kernel of the examples, on the arguments it gets in a real run,
the median microseconds of each candidate, of eager PyTorch running the same ATen ops, of
``torch.compile`` (Inductor, default mode) on the same ops, and of a memory copy of the same
number of bytes; plus effective GB/s. Contenders are timed in interleaved rounds in one
process; every number is a median over rounds.

``model MODEL.py`` (also ``ascendc-pack bench MODEL.py``): the whole model, side by side in one
run: eager PyTorch, ``torch.compile`` (Inductor, default mode), AOTInductor (``torch.export`` ->
``aoti_compile_and_package`` -> ``.pt2`` -> ``aoti_load_package``), ONNX Runtime CPU
(``torch.onnx.export`` -> ``InferenceSession``, intra-op threads = cores, spinning off), and the
``.ascpack`` bundle built with ``--topn 1`` and with ``--topn N`` (loaded by the runtime). It
reports per-call latency (median, p90), ratios bundle / contender, build times, artifact sizes,
cold start (a new process: import torch, load the artifact, first output; ``.pt2`` vs
``.ascpack``) and, per fused kernel, the winner's and candidate 0's PGO time and the effective
bandwidth against a same-size memory copy.

Measurement protocol of ``model`` (see ``docs/PERFORMANCE.md``):

* Every artifact is built in its own fresh process with its own empty cache directory, so build
  times are cold-cache times and no build leaves state (threads, caches) behind.
* By default every contender runs in its own worker process (``--same-process`` turns that
  off). ONNX Runtime's thread pool, Inductor's and libgomp's threads and allocator state then
  cannot slow another contender (DESIGN 6: ORT spinning doubled eager's time in one process).
  Only one worker runs at a time: the parent asks each worker in turn for one sample.
* Interleaved rounds: every round times every contender once, in a rotated order, with a short
  pause between samples so idle OpenMP threads of the previous worker have stopped spinning. A
  sample is ``number`` back-to-back calls (``number`` chosen per contender so a sample lasts
  about ``--sample-ms``), each call timed on its own. Median and p90 are over all timed calls
  of all rounds; a ratio is bundle median / contender median.
* Every worker first checks its output against eager's on the example inputs (max abs diff);
  a contender that fails to build, load or run is reported failed with the reason and the
  suite goes on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["add_sum", "mlp", "transformer_block", "cond_model", "inplace", "conv_block"]


def _time(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e6


def interleaved_medians(contenders: dict, rounds: int = 15, target_us: float = 2000.0) -> dict[str, float]:
    """Median microseconds per call of each contender, timed in interleaved rounds."""
    numbers = {}
    for name, fn in contenders.items():
        fn()
        fn()
        once = max(_time(fn, 1), 1.0)
        numbers[name] = max(1, min(2000, int(target_us / once)))
    samples = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            samples[name].append(_time(contenders[name], numbers[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def _kernel_bytes(spec) -> int:
    """Unique bytes a kernel moves; ``spec`` is a KernelSpec or its JSON (from a build worker)."""
    from .fusion_ir import KernelSpec
    from .tiling import kernel_bytes

    return kernel_bytes(spec if isinstance(spec, KernelSpec) else KernelSpec.from_json(spec))


def _compiled_reference(step):
    """torch.compile of the kernel's ATen steps (Inductor, default mode)."""
    from .executor import run_reference_fused

    def fn(*args):
        return run_reference_fused(step, list(args))

    return torch.compile(fn, dynamic=False)


def bench_kernels(examples: list[str], topn: int, cache_dir: str | None, rounds: int) -> str:
    from .config import BuildConfig
    from .executor import run_model, run_reference_fused
    from .kernels import FusedKernel, prepare_kernels
    from .fuse import fuse
    from .pipeline import capture_file
    from ascendc_pack_runtime.kernels import KernelLibrary

    config = BuildConfig.resolve(topn=topn, cache_dir=cache_dir)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; median us over {rounds} "
             "interleaved rounds; GB/s = (unique bytes read + written) / time",
             f"{'kernel':<46} {'contender':<44} {'us':>9} {'GB/s':>7} {'vs compile':>10}"]
    for ex in examples:
        loaded, captured = capture_file(ROOT / "examples" / f"{ex}.py")
        fused = fuse(captured.model)
        kernels = prepare_kernels(fused.program, config)
        args_of: dict[str, list] = {}

        def record(step, args):
            args_of.setdefault(step.name, [a.clone() for a in args])
            return run_reference_fused(step, args)

        for inputs in loaded.all_input_sets:
            run_model(fused, captured.weights, [t.clone() for t in inputs], run_fused=record)
        lines.append(f"== {ex}")
        for name, kc in kernels.items():
            if name not in args_of:
                continue
            args = args_of[name]
            nbytes = _kernel_bytes(kc.step.kernel)
            contenders = {}
            for i, cc in enumerate(kc.compiled.candidates):
                if not cc.ok:
                    continue
                k = FusedKernel(kc.step.kernel, KernelLibrary(cc.so_path, cc.candidate.kernel_key))
                ins, outs = k.prepare_inputs(list(args)), k.allocate_outputs()
                contenders[f"#{i} {cc.candidate.tiling_repr}"] = (lambda k=k, ins=ins, outs=outs: k(ins, outs))
            step = kc.step
            contenders["eager"] = lambda step=step: run_reference_fused(step, list(args))
            compiled = _compiled_reference(step)
            contenders["torch.compile"] = lambda: compiled(*args)
            src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8)
            dst = torch.empty_like(src)
            contenders["memcpy (same bytes)"] = lambda: dst.copy_(src)
            med = interleaved_medians(contenders, rounds=rounds)
            best = min((v, k) for k, v in med.items() if k.startswith("#"))
            for label, us in med.items():
                gbs = nbytes / us / 1e3
                ratio = med["torch.compile"] / us
                mark = " <- best" if label == best[1] else ""
                lines.append(f"{name[:46]:<46} {label[:44]:<44} {us:9.1f} {gbs:7.1f} {ratio:9.2f}x{mark}")
            lines.append(f"{'':<46} {'best / copy bandwidth':<44} {med['memcpy (same bytes)'] / best[0] * 100:8.0f}%")
    return "\n".join(lines)


# --- model benchmark: eager vs torch.compile vs AOTInductor vs ONNX Runtime vs the bundle -------

#: contender ids in report order; labels come from :func:`_label`.
MODEL_CONTENDERS = ("eager", "compile", "aoti", "ort", "bundle1", "bundleN")
ARTIFACT_OF = {"aoti": "aoti", "ort": "onnx", "bundle1": "bundle1", "bundleN": "bundleN"}


def _label(cid: str, topn: int) -> str:
    return {"eager": "eager", "compile": "torch.compile", "aoti": "AOTInductor (.pt2)",
            "ort": "ONNX Runtime", "bundle1": ".ascpack --topn 1",
            "bundleN": f".ascpack --topn {topn}"}[cid]


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _reason(exc: BaseException) -> str:
    """One line naming an exception: type and the first non-empty line of its message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _file_size(path: Path) -> int:
    """Bytes of an artifact; an ONNX model's external data file counts too."""
    size = path.stat().st_size
    data = path.with_name(path.name + ".data")
    return size + (data.stat().st_size if data.exists() else 0)


# ---- building the artifacts (run in a fresh process by the parent) ----------------------------

def build_artifact(kind: str, model_file: str, out_dir: str, topn: int = 1) -> dict:
    """Build one contender's artifact from a model file; returns path, size and build seconds.

    ``kind``: ``aoti`` (``.pt2``), ``onnx`` (``.onnx``), ``bundle1`` / ``bundleN`` (``.ascpack``
    built with ``--topn 1`` / ``--topn topn``, each with its own kernel cache under ``out_dir``).
    """
    from .loader import load_model_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra: dict = {}
    if kind in ("aoti", "onnx"):
        loaded = load_model_file(model_file)
        module, inputs = loaded.module, tuple(t.clone() for t in loaded.example_inputs)
        t0 = time.perf_counter()
        with torch.no_grad():
            if kind == "aoti":
                path = out / f"{loaded.name}.pt2"
                ep = torch.export.export(module, inputs)
                torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
            else:
                path = out / f"{loaded.name}.onnx"
                torch.onnx.export(module, inputs, str(path), dynamo=True, verbose=False)
        seconds = time.perf_counter() - t0
    elif kind in ("bundle1", "bundleN"):
        from .pipeline import build_file

        n = 1 if kind == "bundle1" else topn
        path = out / f"{Path(model_file).stem}.topn{n}.ascpack"
        t0 = time.perf_counter()
        result = build_file(model_file, topn=n, output=path, cache_dir=str(out / f"cache-topn{n}"))
        seconds = time.perf_counter() - t0
        extra["stages"] = dict(result.seconds)
        extra["kernels"] = {name: {"spec": ch.spec.to_json(), **ch.to_json()} for name, ch in result.choices.items()}
    else:
        raise ValueError(f"unknown artifact kind {kind!r}")
    return {"artifact": str(path), "size": _file_size(path), "build_s": seconds, **extra}


# ---- one contender: load, check against eager, time calls -------------------------------------

def _flat_outputs(out) -> list:
    from torch.utils import _pytree as pytree

    if isinstance(out, list) and out and not isinstance(out[0], torch.Tensor) and hasattr(out[0], "dtype"):
        return [torch.from_numpy(o) if hasattr(o, "__array__") else o for o in out]  # ONNX Runtime
    return pytree.tree_flatten(out)[0]


def _compare(expected: list, actual: list) -> tuple[str, float | None]:
    """("ok" | "mismatch: ...", max abs diff) of flattened outputs."""
    if len(expected) != len(actual):
        return f"mismatch: {len(actual)} outputs, eager has {len(expected)}", None
    worst = 0.0
    problem = None
    for i, (e, a) in enumerate(zip(expected, actual)):
        if not isinstance(e, torch.Tensor):
            if e != a:
                problem = problem or f"mismatch: output {i} is {a!r}, eager {e!r}"
            continue
        a = torch.as_tensor(a)
        if tuple(a.shape) != tuple(e.shape):
            return f"mismatch: output {i} has shape {list(a.shape)}, eager {list(e.shape)}", None
        diff = (a.double() - e.double()).abs().nan_to_num(0.0)
        worst = max(worst, diff.max().item() if diff.numel() else 0.0)
        if not torch.allclose(a.to(e.dtype), e, atol=1e-3, rtol=1e-3, equal_nan=True):
            problem = problem or f"mismatch: output {i} differs from eager (max abs diff {worst:.3g})"
    return problem or "ok", worst


class Contender:
    """One contender inside its (worker) process: the callable, its inputs and its timings."""

    def __init__(self):
        self.fn = None

    def setup(self, cid: str, model_file: str, data: str, artifact: str | None = None,
              warmup_s: float = 0.2) -> dict:
        """Load the contender, run it once on a fresh copy of the inputs (timed, compared with
        eager), warm it up and estimate microseconds per call. Runs with grad mode off (the
        caller's job: the worker turns it off for good, ``_Local`` around each request)."""
        saved = torch.load(data, weights_only=True)
        inputs, expected = saved["inputs"], saved["expected"]
        t0 = time.perf_counter()
        make = self._make(cid, model_file, artifact, inputs)
        load_s = time.perf_counter() - t0
        check_ins = [t.clone() for t in inputs]
        check_fn = make(check_ins)
        t0 = time.perf_counter()
        out = check_fn()
        first_s = time.perf_counter() - t0
        check, diff = _compare(expected, _flat_outputs(out))
        for i, (want, got) in enumerate(zip(saved.get("inputs_after", inputs), check_ins)):
            if check == "ok" and not torch.equal(want, got):
                check = f"mismatch: input {i} after the call differs from eager's (in-place update)"
        del out, check_fn
        self.fn = make([t.clone() for t in inputs])
        times = []
        t_end = time.perf_counter() + warmup_s
        while len(times) < 3 or time.perf_counter() < t_end:
            times.append(_call_us(self.fn))
        return {"load_s": load_s, "first_call_s": first_s, "check": check, "max_abs_diff": diff,
                "est_us": statistics.median(times), "threads": torch.get_num_threads()}

    @staticmethod
    def _make(cid: str, model_file: str, artifact: str | None, inputs: list):
        """A function that binds the loaded contender to one set of input tensors."""
        if cid in ("eager", "compile"):
            from .loader import load_model_file

            module = load_model_file(model_file).module
            if cid == "compile":
                module = torch.compile(module)
            return lambda ins: (lambda: module(*ins))
        if cid == "aoti":
            runner = torch._inductor.aoti_load_package(artifact)
            return lambda ins: (lambda: runner(*ins))
        if cid in ("bundle1", "bundleN"):
            import ascendc_pack_runtime as rt

            model = rt.load(artifact)
            return lambda ins: (lambda: model(*ins))
        if cid == "ort":
            import inspect

            import onnxruntime as ort

            from .loader import load_model_file

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = host_cores()
            opts.inter_op_num_threads = 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
            sess = ort.InferenceSession(artifact, opts, providers=["CPUExecutionProvider"])
            wanted = [i.name for i in sess.get_inputs()]
            params = list(inspect.signature(load_model_file(model_file).module.forward).parameters)
            if len(wanted) == len(inputs):
                names = wanted
            elif set(wanted) <= set(params[:len(inputs)]):  # the exporter dropped unused inputs
                names = params[:len(inputs)]
            else:
                raise RuntimeError(f"ONNX inputs {wanted} do not match the model's {len(inputs)} inputs")

            def bind(ins):
                feed = {n: t.numpy() for n, t in zip(names, ins) if n in wanted}
                return lambda: sess.run(None, feed)

            return bind
        raise ValueError(f"unknown contender {cid!r}")

    def time(self, number: int) -> list[float]:
        """Microseconds of each of ``number`` back-to-back calls."""
        return [_call_us(self.fn) for _ in range(number)]

    @staticmethod
    def reference(model_file: str, data: str) -> dict:
        """Run eager once on a copy of the example inputs; save inputs and outputs to ``data``."""
        from .loader import load_model_file

        loaded = load_model_file(model_file)
        inputs = list(loaded.example_inputs)
        after = [t.clone() for t in inputs]
        with torch.no_grad():
            expected = loaded.module(*after)
        torch.save({"inputs": inputs, "expected": _flat_outputs(expected), "inputs_after": after}, data)
        return {"inputs": [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in inputs]}

    def handle(self, msg: dict) -> dict:
        """One request of the parent: ``reference``, ``build``, ``setup`` or ``time``."""
        try:
            if msg["cmd"] == "reference":
                return {"ok": True, **self.reference(**msg["args"])}
            if msg["cmd"] == "build":
                return {"ok": True, **build_artifact(**msg["args"])}
            if msg["cmd"] == "setup":
                return {"ok": True, **self.setup(**msg["args"])}
            if msg["cmd"] == "time":
                return {"ok": True, "us": self.time(int(msg["number"]))}
            return {"ok": False, "error": f"unknown command {msg['cmd']!r}"}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which goes on
            return {"ok": False, "error": _reason(exc)}


def _call_us(fn) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def _serve() -> None:
    """Worker main: JSON requests on stdin, JSON replies on the original stdout. Anything else
    the process prints (torch, Inductor, ORT) goes to stderr, i.e. the worker's log file."""
    import json

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_grad_enabled(False)  # every contender runs for inference
    worker = Contender()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        reply = worker.handle(msg)
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


class WorkerError(RuntimeError):
    """A worker process died, hung or answered garbage."""


class _Local:
    """A contender in this process (``--same-process``), with the worker's interface."""

    def __init__(self):
        self.contender = Contender()

    def request(self, msg: dict, timeout: float) -> dict:
        with torch.no_grad():
            return self.contender.handle(msg)

    def close(self) -> None:
        self.contender = None


class _Worker:
    """A contender in its own process: ``python -m ascendc_pack.bench _serve``."""

    def __init__(self, env: dict, log: Path):
        import subprocess

        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "ascendc_pack.bench", "_serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log_file, env={**os.environ, **env})
        self._buf = b""

    def request(self, msg: dict, timeout: float) -> dict:
        import json
        import select

        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"worker exited ({self._tail()})") from None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerError(f"no answer within {timeout:.0f} s; killed ({self._tail()})")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.proc.wait()
                    raise WorkerError(f"worker exited with code {self.proc.returncode} ({self._tail()})")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise WorkerError(f"bad answer {line[:200]!r}") from None

    def _tail(self) -> str:
        try:
            self._log_file.flush()
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        return f"log {self.log}: {lines[-1][:200]}" if lines else f"log {self.log} is empty"

    def close(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"cmd": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


# ---- cold start --------------------------------------------------------------------------------

_COLD_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
kind, artifact, data = sys.argv[1:4]
inputs = torch.load(data, weights_only=True)["inputs"]
t2 = time.perf_counter()
if kind == "pt2":
    m = torch._inductor.aoti_load_package(artifact)
else:
    import ascendc_pack_runtime as rt
    m = rt.load(artifact)
t3 = time.perf_counter()
with torch.no_grad():
    out = m(*inputs)
t4 = time.perf_counter()
print("@@COLD " + json.dumps({"import_s": t1 - t0, "load_s": t3 - t2, "first_call_s": t4 - t3}), flush=True)
"""


def cold_start(kind: str, artifact: str, data: str, env: dict, log: Path | None = None,
               timeout: float = 600.0) -> dict:
    """One new process: import torch, load the artifact, return the first output. ``total_s`` is
    from spawning the process to reading its first output (interpreter teardown excluded)."""
    import json
    import subprocess
    import tempfile
    import threading

    err_file = open(log, "a") if log is not None else tempfile.TemporaryFile("w+")
    with err_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", _COLD_SCRIPT, kind, artifact, data],
                                stdout=subprocess.PIPE, stderr=err_file, text=True, env={**os.environ, **env})
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        result = None
        try:
            for line in proc.stdout:
                if line.startswith("@@COLD ") and result is None:
                    result = {"total_s": time.perf_counter() - t0, **json.loads(line[7:])}
            proc.wait()
        finally:
            timer.cancel()
        if result is not None:
            return result
        if proc.returncode == -9:
            raise WorkerError(f"cold start of {artifact} took over {timeout:.0f} s; killed")
        err_file.flush()
        err_file.seek(0) if log is None else None
        text = err_file.read() if log is None else Path(log).read_text(errors="replace")
    last = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raise WorkerError(f"cold start failed (exit {proc.returncode}): {last[-1][:200] if last else 'no output'}")


# ---- the machine -------------------------------------------------------------------------------

ISA_PREFIXES = ("sse4", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon", "bf16", "vnni")


def machine_info() -> dict:
    """CPU model, cores, ISA flags and caches (from ``lscpu``), memory, kernel, tool versions."""
    import platform
    import subprocess

    info: dict = {"cores": host_cores(), "machine": platform.machine(), "kernel": platform.release(),
                  "python": platform.python_version(), "torch": torch.__version__}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    fields = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    info["cpu"] = fields.get("Model name") or platform.processor() or "unknown"
    for key in ("CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "Hypervisor vendor",
                "L1d cache", "L1i cache", "L2 cache", "L3 cache"):
        if key in fields:
            info[key] = fields[key]
    flags = fields.get("Flags", "").split()
    info["isa"] = " ".join(f for f in flags if f.startswith(ISA_PREFIXES))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    for mod in ("onnxruntime", "onnx", "onnxscript"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - not installed
            info[mod] = None
    try:
        info["g++"] = subprocess.run(["g++", "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        info["g++"] = None
    return info


# ---- the suite ---------------------------------------------------------------------------------

def bench_model(model_file: str | Path, *, topn: int = 4, repeat: int = 20, cold_runs: int = 5,
                sample_ms: float = 50.0, contenders: list[str] | None = None, same_process: bool = False,
                work_dir: str | Path | None = None, timeout: float = 1800.0, log=None) -> dict:
    """Benchmark one model file against every contender (see the module docstring).

    Returns a JSON-serializable dict: ``contenders`` (per id: status, reason, latency stats,
    build seconds, artifact size, check against eager), ``cold_start``, ``kernels``, ``config``.
    A contender that fails is reported with its reason; nothing here raises for it.
    """
    import shutil
    import tempfile

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    model_file = Path(model_file).resolve()
    if not model_file.is_file() or model_file.suffix != ".py":
        from .errors import ModelFileError

        raise ModelFileError(f"{model_file}: no such file or not a .py file. Pass the path of a model.py "
                             "file defining get_model() and get_example_inputs().")
    chosen = list(contenders or MODEL_CONTENDERS)
    unknown = [c for c in chosen if c not in MODEL_CONTENDERS]
    if unknown:
        raise ValueError(f"unknown contenders {unknown}; choose from {', '.join(MODEL_CONTENDERS)}")
    if topn == 1 and "bundle1" in chosen and "bundleN" in chosen:
        chosen.remove("bundleN")  # the same bundle twice
    chosen = [c for c in MODEL_CONTENDERS if c in chosen]
    own_dir = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="ascpack-bench-")) if own_dir else Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    runtime_cache = str(work / "runtime-cache")

    def env_of(cid: str) -> dict:
        # every process gets its own empty Inductor cache: cold builds, no cross-talk
        return {"TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{cid}"),
                "ASCENDC_PACK_RUNTIME_CACHE": runtime_cache}

    def process(cid: str, what: str):
        return _Local() if same_process else _Worker(env_of(cid), work / "logs" / f"{what}-{cid}.log")

    res = {cid: {"label": _label(cid, topn), "status": "ok", "reason": None} for cid in chosen}

    def fail(cid: str, why: str) -> None:
        res[cid]["status"], res[cid]["reason"] = "failed", why
        log(f"  {res[cid]['label']}: FAILED: {why}")

    result = {"model": str(model_file), "name": model_file.stem, "contenders": res, "cold_start": {},
              "kernels": [], "config": {"topn": topn, "repeat": repeat, "cold_runs": cold_runs,
                                        "sample_ms": sample_ms, "same_process": same_process,
                                        "cores": host_cores(), "torch_threads": torch.get_num_threads()}}
    try:
        t_start = time.perf_counter()
        result["loadavg_start"] = list(os.getloadavg())
        # 0. eager's outputs on the example inputs, the reference of every contender (in a worker:
        #    the user's code never runs in this process unless --same-process)
        data = work / "data.pt"
        worker = process("eager", "reference")
        try:
            reply = worker.request({"cmd": "reference", "args": {"model_file": str(model_file),
                                                                 "data": str(data)}}, timeout)
        except WorkerError as exc:
            reply = {"ok": False, "error": str(exc)}
        finally:
            worker.close()
        if not reply.get("ok"):
            for cid in chosen:
                fail(cid, f"eager reference run: {reply.get('error')}")
            chosen = []
        else:
            result["inputs"] = reply["inputs"]

        # 1. build every artifact, each in a fresh process with empty caches
        for cid in chosen:
            if cid not in ARTIFACT_OF:
                continue
            log(f"  building {res[cid]['label']} ...")
            worker = process(cid, "build")
            try:
                reply = worker.request({"cmd": "build", "args": {
                    "kind": ARTIFACT_OF[cid], "model_file": str(model_file), "out_dir": str(work / cid),
                    "topn": topn}}, timeout)
            except WorkerError as exc:
                reply = {"ok": False, "error": str(exc)}
            finally:
                worker.close()
            if not reply.get("ok"):
                fail(cid, f"build: {reply.get('error')}")
                continue
            res[cid].update(artifact=reply["artifact"], size=reply["size"], build_s=reply["build_s"])
            if "stages" in reply:
                res[cid]["stages"] = reply["stages"]
                res[cid]["kernel_choices"] = reply["kernels"]

        # 2. start one worker per contender, one after another (the first call is timed)
        workers = {}
        for cid in chosen:
            if res[cid]["status"] != "ok":
                continue
            log(f"  loading {res[cid]['label']} ...")
            worker = process(cid, "run")
            try:
                reply = worker.request({"cmd": "setup", "args": {
                    "cid": cid, "model_file": str(model_file), "data": str(data),
                    "artifact": res[cid].get("artifact")}}, timeout)
            except WorkerError as exc:
                reply = {"ok": False, "error": str(exc)}
            if not reply.get("ok"):
                worker.close()
                fail(cid, f"load/run: {reply.get('error')}")
                continue
            reply.pop("ok")
            res[cid].update(reply)
            if cid == "compile":
                res[cid]["build_s"] = reply["first_call_s"]  # compiles on the first call
            if reply["check"] != "ok":
                log(f"  {res[cid]['label']}: {reply['check']}")
            workers[cid] = worker

        # 3. interleaved rounds
        numbers = {cid: max(1, min(100000, round(sample_ms * 1e3 / max(res[cid]["est_us"], 0.01))))
                   for cid in workers}
        samples: dict[str, list[list[float]]] = {cid: [] for cid in workers}
        log(f"  timing {len(workers)} contenders, {repeat} interleaved rounds ...")
        for r in range(repeat):
            order = list(workers)
            order = order[r % len(order):] + order[:r % len(order)] if order else order
            for cid in order:
                if cid not in workers:
                    continue
                time.sleep(0.02)  # let the previous worker's OpenMP threads stop spinning
                try:
                    reply = workers[cid].request({"cmd": "time", "number": numbers[cid]}, timeout)
                except WorkerError as exc:
                    reply = {"ok": False, "error": str(exc)}
                if not reply.get("ok"):
                    workers.pop(cid).close()
                    fail(cid, f"timing round {r + 1}: {reply.get('error')}")
                    continue
                samples[cid].append(reply["us"])
        for cid, worker in workers.items():
            worker.close()
        for cid, rounds_us in samples.items():
            if res[cid]["status"] != "ok" or not rounds_us:
                continue
            calls = [us for s in rounds_us for us in s]
            res[cid].update(median_us=statistics.median(calls), p90_us=_percentile(calls, 90),
                            min_us=min(calls), calls=len(calls), number=numbers[cid], rounds=len(rounds_us),
                            round_medians_us=[statistics.median(s) for s in rounds_us])
        for cid in ("bundle1", "bundleN"):
            if cid in res and res[cid].get("median_us"):
                for other, r in res.items():
                    if r.get("median_us"):
                        r[f"ratio_{cid}"] = res[cid]["median_us"] / r["median_us"]

        # 4. cold start: a new process imports torch, loads the artifact, returns the first output
        cold_of = [("pt2", "aoti"), ("ascpack", "bundleN" if "bundleN" in res else "bundle1")]
        cold_env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cold"),
                    "ASCENDC_PACK_RUNTIME_CACHE": str(work / "runtime-cache-cold")}
        runs: dict[str, list[dict]] = {}
        errors: dict[str, str] = {}
        active = [(k, cid) for k, cid in cold_of if cid in res and res[cid]["status"] == "ok" and cold_runs > 0]
        if active:
            log(f"  cold start, {cold_runs} runs each ...")
        for i in range(cold_runs):
            for kind, cid in (active if i % 2 == 0 else active[::-1]):
                if kind in errors:
                    continue
                try:
                    runs.setdefault(kind, []).append(cold_start(kind, res[cid]["artifact"], str(data), cold_env,
                                                                work / "logs" / f"cold-{kind}.log"))
                except WorkerError as exc:
                    errors[kind] = str(exc)
        for kind, cid in cold_of:
            if cid in res and res[cid]["status"] != "ok" and cold_runs > 0:
                result["cold_start"][kind] = {"of": cid, "label": res[cid]["label"], "runs": [],
                                              "error": f"not run: {res[cid]['label']} failed"}
        for kind, cid in active:
            entry = {"of": cid, "label": res[cid]["label"], "runs": runs.get(kind, [])}
            if kind in errors:
                entry["error"] = errors[kind]
            if entry["runs"]:
                for key in ("total_s", "import_s", "load_s", "first_call_s"):
                    entry[f"median_{key}"] = statistics.median(r[key] for r in entry["runs"])
                entry["first_total_s"] = entry["runs"][0]["total_s"]
            result["cold_start"][kind] = entry

        # 5. fused kernels of the tuned bundle: PGO times vs a same-size memory copy
        kcid = "bundleN" if res.get("bundleN", {}).get("kernel_choices") else "bundle1"
        choices = res.get(kcid, {}).get("kernel_choices") or {}
        if choices:
            copies = {}
            rows = []
            for name, ch in choices.items():
                nbytes = _kernel_bytes(ch["spec"])
                times = [r["median_us"] for r in ch["results"]]
                rows.append({"kernel": name, "bytes": nbytes, "candidates": len(times),
                             "chosen_index": ch["chosen_index"], "visited": ch["visited"],
                             "tiling": ch["candidate"]["tiling_repr"],
                             "winner_us": times[ch["chosen_index"]] if times else None,
                             "cand0_us": times[0] if times else None})
                if nbytes not in copies:
                    src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8)
                    dst = torch.empty_like(src)
                    copies[nbytes] = (lambda src=src, dst=dst: dst.copy_(src))
            copy_us = interleaved_medians(copies, rounds=max(3, repeat)) if copies else {}
            for row in rows:
                row["copy_us"] = copy_us.get(row["bytes"])
                if row["winner_us"]:
                    row["gbs"] = row["bytes"] / row["winner_us"] / 1e3
                    row["copy_gbs"] = row["bytes"] / row["copy_us"] / 1e3
                    row["pct_of_copy"] = 100.0 * row["copy_us"] / row["winner_us"]
            result["kernels"] = rows
            result["kernels_of"] = kcid
        result["loadavg_end"] = list(os.getloadavg())
        result["seconds"] = time.perf_counter() - t_start
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            result["work_dir"] = str(work)
    return result


# ---- the report --------------------------------------------------------------------------------

def _fmt_us(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt_s(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _fmt_mb(v) -> str:
    return "-" if v is None else f"{v / 1e6:.2f}"


def _fmt_ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}" if v >= 0.1 else f"{v:.2g}"


def _fmt_diff(v) -> str:
    return "-" if v is None else f"{v:.1e}"


def contender_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the latency table (shared by the text report and PERFORMANCE.md)."""
    topn = result["config"]["topn"]
    ratio_cols = [c for c in ("bundleN", "bundle1") if c in result["contenders"]
                  and result["contenders"][c].get("median_us")]
    head = ["contender", "median us", "p90 us", "calls"]
    head += [f"{_label(c, topn)} / x" for c in ratio_cols]
    head += ["build s", "size MB", "max abs diff", "status"]
    rows = []
    for cid, r in result["contenders"].items():
        status = r["status"] if r["status"] != "ok" else (r.get("check") or "ok")
        if r.get("reason"):
            status = f"FAILED: {r['reason']}"
        row = [r["label"], _fmt_us(r.get("median_us")), _fmt_us(r.get("p90_us")),
               str(r.get("calls", "-"))]
        row += [_fmt_ratio(r.get(f"ratio_{c}")) for c in ratio_cols]
        row += [_fmt_s(r.get("build_s")), _fmt_mb(r.get("size")), _fmt_diff(r.get("max_abs_diff")), status]
        rows.append(row)
    return head, rows


def cold_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    head = ["artifact", "runs", "median total s", "first run s", "import torch s", "load s", "first call s", "note"]
    rows = []
    for kind, e in result["cold_start"].items():
        rows.append([f".{kind} ({e['label']})", str(len(e["runs"])), _fmt_s(e.get("median_total_s")),
                     _fmt_s(e.get("first_total_s")), _fmt_s(e.get("median_import_s")),
                     _fmt_s(e.get("median_load_s")), _fmt_s(e.get("median_first_call_s")),
                     e["error"] if e.get("error", "").startswith("not run") else
                     f"FAILED: {e['error']}" if e.get("error") else ""])
    return head, rows


def kernel_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    head = ["kernel", "cands", "best", "winner us", "cand0 us", "cand0 / winner", "KiB", "GB/s",
            "copy GB/s", "% of copy", "visited"]
    rows = []
    for k in result["kernels"]:
        w, c0 = k["winner_us"], k["cand0_us"]
        rows.append([k["kernel"], str(k["candidates"]), str(k["chosen_index"]), _fmt_us(w), _fmt_us(c0),
                     _fmt_ratio(c0 / w) if w and c0 else "-", f"{k['bytes'] / 1024:.0f}",
                     f"{k['gbs']:.1f}" if k.get("gbs") else "-",
                     f"{k['copy_gbs']:.1f}" if k.get("copy_gbs") else "-",
                     f"{k['pct_of_copy']:.0f}%" if k.get("pct_of_copy") else "-",
                     "yes" if k["visited"] else "no"])
    return head, rows


def _text_table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    # the last column (status / note / visited) is free text: never pad it
    fmt = lambda cells: "  ".join(c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [fmt(head), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def format_report(result: dict) -> str:
    """The text report of :func:`bench_model`."""
    cfg = result["config"]
    mode = "all contenders in one process" if cfg["same_process"] else "one process per contender"
    lines = [f"model {result['model']}  inputs {', '.join(result.get('inputs', []))}",
             f"torch {torch.__version__}, {cfg['cores']} cores, {cfg['torch_threads']} torch threads; {mode}; "
             f"{cfg['repeat']} interleaved rounds, ~{cfg['sample_ms']:.0f} ms per sample; median/p90 over all "
             f"timed calls; ratio = bundle median / contender median (< 1: the bundle is faster)"]
    if "loadavg_start" in result:
        lines.append(f"load average at start {result['loadavg_start'][0]:.2f}, at end "
                     f"{result.get('loadavg_end', [float('nan')])[0]:.2f} (1 min)")
    lines += ["", *_text_table(*contender_rows(result))]
    if result["cold_start"]:
        lines += ["", "cold start: new process -> import torch -> load artifact -> first output", *_text_table(*cold_rows(result))]
    if result["kernels"]:
        lines += ["", f"fused kernels of {_label(result['kernels_of'], cfg['topn'])} (PGO medians at build "
                      "time; GB/s = unique bytes read + written / winner time; copy = same-size memory copy now)",
                  *_text_table(*kernel_rows(result))]
    return "\n".join(lines)


def bench_model_main(model_file: str, topn: int = 4, repeat: int = 20, cold_runs: int = 5,
                     sample_ms: float = 50.0, contenders: str | None = None, same_process: bool = False,
                     work_dir: str | None = None, json_path: str | None = None) -> dict:
    """CLI body shared by ``ascendc-pack bench`` and ``python -m ascendc_pack.bench model``."""
    import json

    result = bench_model(model_file, topn=topn, repeat=repeat, cold_runs=cold_runs, sample_ms=sample_ms,
                         contenders=contenders.split(",") if contenders else None,
                         same_process=same_process, work_dir=work_dir)
    print(format_report(result))
    sys.stdout.flush()
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
    if not any(c["status"] == "ok" for c in result["contenders"].values()):
        from .errors import PackError

        raise PackError("every contender failed (reasons above)")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ascendc_pack.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernels", help="every candidate of every fused kernel vs eager, torch.compile, memcpy")
    k.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated example names")
    k.add_argument("--topn", type=int, default=10)
    k.add_argument("--rounds", type=int, default=15)
    k.add_argument("--cache-dir", default=None)
    m = sub.add_parser("model", help="a model file: eager, torch.compile, AOTInductor, ONNX Runtime, bundles")
    m.add_argument("model_file")
    m.add_argument("--topn", type=int, default=4, help="candidates per kernel of the tuned bundle (default 4)")
    m.add_argument("--repeat", type=int, default=20, help="interleaved timing rounds (default 20)")
    m.add_argument("--cold-runs", type=int, default=5, help="cold-start processes per artifact (default 5)")
    m.add_argument("--sample-ms", type=float, default=50.0, help="target length of one sample (default 50)")
    m.add_argument("--contenders", default=None, help=f"comma-separated subset of {','.join(MODEL_CONTENDERS)}")
    m.add_argument("--same-process", action="store_true", help="time every contender in this process")
    m.add_argument("--work-dir", default=None, help="keep artifacts and worker logs here (default: a temp dir)")
    m.add_argument("--json", dest="json_path", default=None, help="also write the raw results as JSON")
    sub.add_parser("_serve", help="(internal) a contender worker process")
    args = parser.parse_args(argv)
    if args.what == "_serve":
        _serve()
    elif args.what == "model":
        from .errors import PackError

        try:
            bench_model_main(args.model_file, topn=args.topn, repeat=args.repeat, cold_runs=args.cold_runs,
                             sample_ms=args.sample_ms, contenders=args.contenders,
                             same_process=args.same_process,
                             work_dir=args.work_dir, json_path=args.json_path)
        except (PackError, ValueError) as exc:
            sys.exit(f"error: {exc}")
    elif args.what == "kernels":
        print(bench_kernels(args.examples.split(","), args.topn, args.cache_dir, args.rounds))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
